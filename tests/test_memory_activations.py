"""Activation memory of a transformer layer (Korthikanti et al.) and measured shard bytes."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from clusterlab.analytic import memory
from clusterlab.device import devices
from conftest import sub_mesh

GPT3 = dict(seq_len=2048, micro_batch=1, hidden=12288, n_heads=96)


def test_no_parallelism_gpt3_by_hand():
    # 5 a s / h = 5 * 96 * 2048 / 12288 = 80, so 34 + 80 = 114 bytes per token and hidden unit
    assert memory.transformer_layer_activation_bytes(**GPT3) == 2048 * 12288 * 114


def test_tensor_and_sequence_parallel_and_recompute():
    sbh = 2048 * 12288
    t = 8
    assert memory.transformer_layer_activation_bytes(**GPT3, tensor_parallel=t) == pytest.approx(
        sbh * (10 + 24 / t + 80 / t))
    assert memory.transformer_layer_activation_bytes(
        **GPT3, tensor_parallel=t, sequence_parallel=True) == pytest.approx(sbh * (34 + 80) / t)
    assert memory.transformer_layer_activation_bytes(
        **GPT3, tensor_parallel=t, sequence_parallel=True,
        recompute="selective") == pytest.approx(sbh * 34 / t)
    assert memory.transformer_layer_activation_bytes(**GPT3, recompute="full") == 2 * sbh


def test_bad_input():
    with pytest.raises(ValueError, match="recompute"):
        memory.transformer_layer_activation_bytes(**GPT3, recompute="some")
    with pytest.raises(ValueError, match="tensor_parallel"):
        memory.transformer_layer_activation_bytes(**GPT3, tensor_parallel=0)


def test_grouped_query_attention_keeps_smaller_k_and_v():
    """K and V, 2 s b h bytes each of the 34, shrink to g / a: Llama 3 405B's 8 of 128 heads
    keep 34 - 4 * 15/16 = 30.25 s b h (selective: no scores), sequence parallel over 8."""
    shape = dict(seq_len=8192, micro_batch=1, hidden=16384, n_heads=128, tensor_parallel=8,
                 sequence_parallel=True, recompute="selective")
    multi_head = memory.transformer_layer_activation_bytes(**shape)
    grouped = memory.transformer_layer_activation_bytes(**shape, n_kv_heads=8)
    assert multi_head == 8192 * 16384 * 34 / 8
    assert grouped == 8192 * 16384 * 30.25 / 8
    assert memory.transformer_layer_activation_bytes(**shape, n_kv_heads=128) == multi_head
    with pytest.raises(ValueError, match="exceeds the 128 attention heads"):
        memory.transformer_layer_activation_bytes(**shape, n_kv_heads=256)


def test_per_device_bytes_replicated_and_split():
    mesh = sub_mesh(4, "data")
    split = devices.shard(jnp.zeros((8, 16), jnp.float32), mesh, P("data"))
    replicated = devices.shard(jnp.zeros((10,), jnp.float32), mesh, P())
    measured = devices.per_device_bytes({"a": split, "b": replicated})
    assert measured == {d.id: 8 * 16 * 4 // 4 + 40 for d in mesh.devices.flat}
    with pytest.raises(ValueError, match="jax.Array"):
        devices.per_device_bytes([1.0])
