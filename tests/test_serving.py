"""Tests of clusterlab.serving and memory.kv_cache_bytes: hand-derived values and error paths."""

from __future__ import annotations

import pytest

from clusterlab import memory, serving

# Llama-3-70B-like: 80 layers, 8 KV heads of 128 (Meta's config.json); 64 query heads x 128.
L, KV_HEADS, HEAD_DIM, D_ATTN, N_70B = 80, 8, 128, 8192, 70e9


def test_kv_cache_bytes_formula():
    per_token = memory.kv_cache_bytes(L, KV_HEADS, HEAD_DIM, 1, 1)
    assert per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert memory.kv_cache_bytes(L, KV_HEADS, HEAD_DIM, 4096, 3) == 3 * 4096 * per_token
    fp8 = memory.kv_cache_bytes(L, KV_HEADS, HEAD_DIM, 4096, 1, bytes_per_value=1)
    assert fp8 == 4096 * per_token // 2
    assert isinstance(memory.kv_cache_bytes(L, KV_HEADS, HEAD_DIM, 3, 1, bytes_per_value=0.5), int)
    assert memory.kv_cache_bytes(L, KV_HEADS, HEAD_DIM, 0, 8) == 0
    # Multi-head attention (64 KV heads) caches 8x what GQA with 8 KV heads does.
    mha = memory.kv_cache_bytes(L, 64, HEAD_DIM, 10, 1)
    assert mha == 8 * memory.kv_cache_bytes(L, 8, HEAD_DIM, 10, 1)


@pytest.mark.parametrize("args, kwargs, match", [
    ((0, 8, 128, 1, 1), {}, "n_layers"),
    ((80, 0, 128, 1, 1), {}, "n_kv_heads"),
    ((80, 8, 12.5, 1, 1), {}, "head_dim"),
    ((80, 8, 128, -1, 1), {}, "seq_len"),
    ((80, 8, 128, 1, -2), {}, "batch"),
    ((80, 8, 128, 1, 1), {"bytes_per_value": 0}, "bytes_per_value"),
])
def test_kv_cache_bytes_errors(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        memory.kv_cache_bytes(*args, **kwargs)


def test_decode_step_bytes():
    assert serving.decode_step_bytes(140e9, 0) == 140e9
    assert serving.decode_step_bytes(140e9, 10e9) == 150e9
    with pytest.raises(ValueError, match="param_bytes"):
        serving.decode_step_bytes(0, 1e9)
    with pytest.raises(ValueError, match="kv_cache_bytes"):
        serving.decode_step_bytes(1e9, -1)


def test_decode_flops_per_token():
    assert serving.decode_flops_per_token(N_70B) == 140e9
    with_attention = serving.decode_flops_per_token(N_70B, n_layers=L, seq_len=4096, d_attn=D_ATTN)
    assert with_attention == 140e9 + 4 * 80 * 4096 * 8192
    assert serving.decode_flops_per_token(N_70B, n_layers=L, seq_len=0, d_attn=D_ATTN) == 140e9


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_params=0), "n_params"),
    (dict(n_params=1e9, n_layers=-1, d_attn=8), "n_layers"),
    (dict(n_params=1e9, n_layers=2), "together"),
    (dict(n_params=1e9, d_attn=8, seq_len=4), "together"),
    (dict(n_params=1e9, seq_len=4), "together"),
])
def test_decode_flops_per_token_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        serving.decode_flops_per_token(**kwargs)


def test_decode_arithmetic_intensity_rises_with_batch():
    kv = memory.kv_cache_bytes(L, KV_HEADS, HEAD_DIM, 1024, 1)
    # Batch 1, BF16 weights, no cache: 2N FLOPs over 2N bytes = 1 FLOP/byte.
    assert serving.decode_arithmetic_intensity(1, 2 * N_70B, 0, N_70B) == pytest.approx(1.0)
    values = [serving.decode_arithmetic_intensity(b, 2 * N_70B, kv, N_70B) for b in (1, 8, 64, 512)]
    assert values == sorted(values) and len(set(values)) == 4
    assert values[2] == pytest.approx(64 * 2 * N_70B / (2 * N_70B + 64 * kv))
    # The limit with a huge batch: 2N FLOPs per sequence over one sequence's cache.
    big = serving.decode_arithmetic_intensity(10**9, 2 * N_70B, kv, N_70B)
    assert big == pytest.approx(2 * N_70B / kv, rel=1e-3)
    with pytest.raises(ValueError, match="batch"):
        serving.decode_arithmetic_intensity(0, 2 * N_70B, kv, N_70B)
    with pytest.raises(ValueError, match="kv_cache_bytes_per_sequence"):
        serving.decode_arithmetic_intensity(1, 2 * N_70B, -5, N_70B)


def test_tensor_parallel_all_reduces_per_token():
    assert serving.tensor_parallel_all_reduces_per_token(80) == 160
    assert serving.tensor_parallel_all_reduces_per_token(1) == 2
    with pytest.raises(ValueError, match="n_layers"):
        serving.tensor_parallel_all_reduces_per_token(0)
