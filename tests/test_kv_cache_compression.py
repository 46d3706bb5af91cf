"""KV-cache compression in clusterlab.analytic.memory.kv_cache_bytes: GQA, MLA and FP8, against the papers."""

from __future__ import annotations

import pytest

from clusterlab.analytic import memory

# DeepSeek-V3 (arXiv 2412.19437, Section 4.2 hyper-parameters): 61 layers, 128 attention heads of
# 128 (d_h), KV compression dimension d_c = 512, decoupled RoPE key d_h^R = 64.
V3_LAYERS, V3_HEADS, V3_HEAD_DIM, V3_DC, V3_DR = 61, 128, 128, 512, 64


def test_mla_matches_deepseek_v2_table_1_row():
    # DeepSeek-V2 (arXiv 2405.04434) Table 1, row "MLA (Ours)": KV cache per token
    # (d_c + d_h^R) l elements, "about (9/2) d_h l" with d_c = 4 d_h and d_h^R = d_h / 2.
    elements = memory.kv_cache_bytes(V3_LAYERS, V3_HEADS, V3_HEAD_DIM, 1, 1, bytes_per_element=1,
                                      latent_dim=V3_DC, rope_key_dim=V3_DR)
    assert elements == (V3_DC + V3_DR) * V3_LAYERS == 35_136
    assert elements == 9 / 2 * V3_HEAD_DIM * V3_LAYERS       # exact here: 576 = 4.5 * 128
    bf16 = memory.kv_cache_bytes(V3_LAYERS, V3_HEADS, V3_HEAD_DIM, 1, 1,
                                 latent_dim=V3_DC, rope_key_dim=V3_DR)
    assert bf16 == 70_272
    print(f"DeepSeek-V3 MLA cache: {elements:,} elements = {bf16:,} BF16 bytes per token: holds")


def test_mla_over_mha_of_the_same_model():
    # Table 1, row "Multi-Head Attention (MHA)": 2 n_h d_h l elements per token.
    mha = memory.kv_cache_bytes(V3_LAYERS, V3_HEADS, V3_HEAD_DIM, 1, 1)
    mla = memory.kv_cache_bytes(V3_LAYERS, V3_HEADS, V3_HEAD_DIM, 1, 1,
                                latent_dim=V3_DC, rope_key_dim=V3_DR)
    assert mha == 2 * V3_HEADS * V3_HEAD_DIM * V3_LAYERS * 2 == 3_997_696
    assert mha / mla == pytest.approx(2 * 128 * 128 / 576)     # 56.9x
    assert 56 < mha / mla < 57
    print(f"MHA / MLA cache ratio for DeepSeek-V3's shape: {mha / mla:.1f}x: holds")


def test_scaling_with_tokens_batch_and_fp8():
    one = memory.kv_cache_bytes(61, 128, 128, 1, 1, latent_dim=512, rope_key_dim=64)
    many = memory.kv_cache_bytes(61, 128, 128, 4096, 3, latent_dim=512, rope_key_dim=64)
    assert many == one * 4096 * 3
    fp8 = memory.kv_cache_bytes(61, 128, 128, 4096, 3, bytes_per_element=1,
                                latent_dim=512, rope_key_dim=64)
    assert 2 * fp8 == many
    # MLA's heads and head_dim drop out of the count.
    assert memory.kv_cache_bytes(61, 1, 1, 7, 2, latent_dim=512, rope_key_dim=64) == \
        memory.kv_cache_bytes(61, 128, 128, 7, 2, latent_dim=512, rope_key_dim=64)
    assert memory.kv_cache_bytes(61, 128, 128, 7, 2, latent_dim=512) == 512 * 61 * 7 * 2 * 2


def test_gqa_and_mqa_rows():
    # Table 1, rows GQA (2 n_g d_h l) and MQA (2 d_h l); Llama 3 70B: 80 layers, 8 KV heads.
    assert memory.kv_cache_bytes(80, 8, 128, 1, 1) == 2 * 8 * 128 * 80 * 2 == 327_680
    assert memory.kv_cache_bytes(80, 1, 128, 1, 1) * 8 == memory.kv_cache_bytes(80, 8, 128, 1, 1)
    # FP8 halves BF16.
    assert memory.kv_cache_bytes(80, 8, 128, 100, 2, bytes_per_element=1) * 2 == \
        memory.kv_cache_bytes(80, 8, 128, 100, 2)


@pytest.mark.parametrize("kwargs, match", [
    (dict(latent_dim=0), "latent_dim"),
    (dict(latent_dim=512.5), "latent_dim"),
    (dict(latent_dim=512, rope_key_dim=-1), "rope_key_dim"),
    (dict(rope_key_dim=64), "pass latent_dim"),
])
def test_bad_mla_input_names_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        memory.kv_cache_bytes(61, 128, 128, 1, 1, **kwargs)
