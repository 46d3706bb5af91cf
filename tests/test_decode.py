"""clusterlab.device.decode: the KV cache against recomputation, its bytes against the formula, and
tensor-parallel generation against one device, with its all-reduces counted from the compiled
program."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clusterlab.analytic import memory, serving
from clusterlab.device import bench, decode, devices, hlo, models
from clusterlab.device.parallel import tensor
from conftest import sub_mesh

AXIS = "model"
V, D, NH, H, L, S = 64, 32, 4, 64, 2, 24
B, T, N_NEW = 3, 6, 10


@pytest.fixture(scope="module")
def params():
    return decode.init_params(jax.random.key(0), vocab_size=V, d_model=D, n_heads=NH,
                              d_hidden=H, n_layers=L, max_len=S)


@pytest.fixture(scope="module")
def prompt():
    return jax.random.randint(jax.random.key(1), (B, T), 0, V)


@pytest.fixture(scope="module")
def generated(params, prompt):
    return np.asarray(decode.generate(params, prompt, N_NEW))


def test_init_shapes(params):
    assert params["embed"].shape == (V, D) and params["pos"].shape == (S, D)
    assert params["unembed"].shape == (D, V) and len(params["layers"]) == L
    assert params["layers"][0]["wq"].shape == (D, NH, D // NH)
    assert decode.max_len_of(params) == S


def test_generate_equals_recomputation(params, prompt, generated):
    reference = np.asarray(decode.generate_without_cache(params, prompt, N_NEW))
    assert generated.shape == (B, N_NEW) and generated.dtype == np.int32
    np.testing.assert_array_equal(generated, reference)
    assert len(np.unique(generated)) > 3  # the model does not just repeat one token


def test_prefill_and_decode_steps_equal_forward(params, prompt, generated):
    sequence = jnp.concatenate([prompt, jnp.asarray(generated)], axis=1)  # i32[B, T + N_NEW]
    reference = np.asarray(decode.forward(params, sequence))
    logits, cache = decode.prefill(params, prompt)
    np.testing.assert_allclose(logits, reference[:, :T], rtol=1e-5, atol=1e-5)
    for position in range(T, T + N_NEW - 1):
        logits, cache = decode.decode_step(params, cache, sequence[:, position], position)
        np.testing.assert_allclose(logits, reference[:, position], rtol=1e-5, atol=1e-5)


def test_a_cache_not_kept_changes_the_logits(params, prompt, generated):
    # Negative control: discarding the updated cache leaves position T unwritten (zeros).
    sequence = jnp.concatenate([prompt, jnp.asarray(generated)], axis=1)
    reference = np.asarray(decode.forward(params, sequence))
    _, cache = decode.prefill(params, prompt)
    _, _ = decode.decode_step(params, cache, sequence[:, T], T)  # updated cache dropped
    logits, _ = decode.decode_step(params, cache, sequence[:, T + 1], T + 1)
    assert np.max(np.abs(np.asarray(logits) - reference[:, T + 1])) > 1e-2


def test_decode_loop_equals_generate(params, prompt, generated):
    logits, cache = decode.prefill(params, prompt)
    first = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
    tokens, _ = decode.decode_loop(params, cache, first, T, N_NEW - 1)
    np.testing.assert_array_equal(np.asarray(tokens), generated[:, 1:])


def test_shorter_cache_same_tokens(params, prompt, generated):
    short = decode.generate(params, prompt, N_NEW, cache_len=T + N_NEW - 1)
    np.testing.assert_array_equal(np.asarray(short), generated)


@pytest.mark.parametrize("cache_len", [None, 16])
def test_cache_shapes_and_bytes_equal_formula(params, prompt, cache_len):
    _, cache = decode.prefill(params, prompt, cache_len=cache_len)
    length = S if cache_len is None else cache_len
    assert len(cache.k) == len(cache.v) == L
    for array in (*cache.k, *cache.v):
        assert array.shape == (B, NH, length, D // NH) and array.dtype == jnp.float32
    expected = memory.kv_cache_bytes(L, NH, D // NH, length, B, bytes_per_element=4)
    assert models.param_bytes(cache) == expected
    assert models.param_bytes(decode.empty_cache(params, B, cache_len)) == expected


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_generate_equals_single_device(params, prompt, generated, tp):
    mesh = sub_mesh(tp, AXIS)
    sharded = decode.shard_model(params, mesh, AXIS)
    assert sharded["layers"][0]["wq"].sharding.shard_shape((D, NH, D // NH)) == (D, NH // tp,
                                                                                 D // NH)
    tokens = decode.make_tp_generate(params, mesh, AXIS, n_new=N_NEW)(sharded, prompt)
    np.testing.assert_array_equal(np.asarray(tokens), generated)


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_all_reduces_per_token(params, prompt, tp):
    mesh = sub_mesh(tp, AXIS)
    sharded = decode.shard_model(params, mesh, AXIS)
    logits, cache = decode.make_tp_prefill(params, mesh, AXIS)(sharded, prompt)
    assert set(devices.per_device_bytes(cache).values()) == {
        memory.kv_cache_bytes(L, NH, D // NH, S, B, bytes_per_element=4) // tp}
    step = decode.make_tp_decode_step(params, mesh, AXIS)
    token = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
    ops = hlo.compiled_collectives(step, sharded, cache, token, jnp.int32(T))
    per_token = serving.tensor_parallel_all_reduces_per_token(L)
    assert [op.kind for op in ops] == ["all-reduce"] * per_token
    assert all(op.bytes == B * D * 4 for op in ops)  # f32[B, 1, D] each
    # The whole generation: one forward pass per token, each with 2 L all-reduces.
    generate = decode.make_tp_generate(params, mesh, AXIS, n_new=N_NEW)
    executed = hlo.summarize(hlo.executed_collectives(generate, sharded, prompt))
    assert executed["all-reduce"].n_ops == N_NEW * per_token


def test_tensor_parallel_without_all_reduce_is_caught(params, prompt, generated):
    mesh = sub_mesh(2, AXIS)
    sharded = decode.shard_model(params, mesh, AXIS)
    no_g = tensor.MegatronOps(tensor.MEGATRON.copy, lambda x, axis_name: x)
    with pytest.raises(ValueError, match="already varies"):  # refused by replication checking
        decode.make_tp_generate(params, mesh, AXIS, n_new=N_NEW, ops=no_g)(sharded, prompt)
    unchecked = decode.make_tp_generate(params, mesh, AXIS, n_new=N_NEW, ops=no_g,
                                        check_vma=False)
    assert not np.array_equal(np.asarray(unchecked(sharded, prompt)), generated)


def test_one_device_mesh_equals_single_device(params, prompt, generated):
    mesh = sub_mesh(1, AXIS)
    tokens = decode.make_tp_generate(params, mesh, AXIS, n_new=N_NEW)(
        decode.shard_model(params, mesh, AXIS), prompt)
    np.testing.assert_array_equal(np.asarray(tokens), generated)


def test_mesh_that_does_not_divide_heads(params):
    with pytest.raises(ValueError, match="n_heads = 4 does not divide by 8"):
        decode.shard_model(params, sub_mesh(8, AXIS), AXIS)
    with pytest.raises(ValueError, match="n_heads = 4 does not divide by 8"):
        decode.make_tp_generate(params, sub_mesh(8, AXIS), AXIS, n_new=2)
    with pytest.raises(ValueError, match="not in the mesh"):
        decode.check_mesh(params, sub_mesh(2, "data"), AXIS)


def test_tensor_parallel_generate_checks_the_room_in_the_cache(params, prompt):
    mesh = sub_mesh(2, AXIS)
    generate = decode.make_tp_generate(params, mesh, AXIS, n_new=S)
    with pytest.raises(ValueError, match="cache positions"):
        generate(decode.shard_model(params, mesh, AXIS), prompt)


def test_input_errors(params, prompt):
    with pytest.raises(ValueError, match="n_new"):
        decode.generate(params, prompt, 0)
    with pytest.raises(ValueError, match="cache positions"):
        decode.generate(params, prompt, S)
    with pytest.raises(ValueError, match="integer array"):
        decode.prefill(params, jnp.zeros((B, T), jnp.float32))
    with pytest.raises(ValueError, match="integer array"):
        decode.generate(params, jnp.zeros((T,), jnp.int32), 2)
    with pytest.raises(ValueError, match="more than the cache holds"):
        decode.prefill(params, jnp.zeros((B, S + 1), jnp.int32))
    with pytest.raises(ValueError, match="cache_len"):
        decode.prefill(params, prompt, cache_len=S + 1)
    _, cache = decode.prefill(params, prompt, cache_len=8)
    with pytest.raises(ValueError, match="outside the cache"):
        decode.decode_step(params, cache, prompt[:, 0], 8)
    with pytest.raises(ValueError, match="n_steps"):
        decode.decode_loop(params, cache, prompt[:, 0], T, 0)
    with pytest.raises(ValueError, match="d_model"):
        decode.init_params(jax.random.key(0), vocab_size=V, d_model=30, n_heads=4, d_hidden=H,
                           n_layers=L, max_len=S)
    with pytest.raises(ValueError, match="max_len"):
        decode.init_params(jax.random.key(0), vocab_size=V, d_model=D, n_heads=NH, d_hidden=H,
                           n_layers=L, max_len=0)


def test_compiled_decode_step_flops_are_the_serving_formula():
    # lab 11's decoder (d 768, 8 heads, 2 layers, vocabulary 2048), one step at batch 1 over a
    # 64-position cache: XLA's FLOPs within 5% of serving.decode_flops_per_token (2N over the
    # weights that multiply every token, plus attention over the cache)
    lab = decode.init_params(jax.random.key(0), vocab_size=2048, d_model=768, n_heads=8,
                             d_hidden=3072, n_layers=2, max_len=2048)
    n_matmul = models.param_count({k: v for k, v in lab.items() if k not in ("embed", "pos")})
    cost = bench.program_cost(jax.jit(decode.decode_step), lab, decode.empty_cache(lab, 1, 64),
                              jnp.zeros((1,), jnp.int32), jnp.int32(8))
    formula = serving.decode_flops_per_token(n_matmul, n_layers=2, seq_len=64, d_attn=768)
    assert cost.flops == pytest.approx(formula, rel=0.05)
