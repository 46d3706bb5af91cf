"""Tests of clusterlab.analytic.storage against hand-derived values."""

from __future__ import annotations

import pytest

from clusterlab.analytic import storage


def test_token_sample_bytes():
    assert storage.token_sample_bytes(4096) == 16384.0
    assert storage.token_sample_bytes(2048, bytes_per_token=2) == 4096.0
    with pytest.raises(ValueError, match="bytes_per_token"):
        storage.token_sample_bytes(2048, bytes_per_token=3)
    with pytest.raises(ValueError, match="seq_len"):
        storage.token_sample_bytes(0)


def test_required_read_scales_with_gpus():
    # 8 GPUs x 2,000 images/s x 100 kB = 1.6 GB/s; 1,024 GPUs need 128 times that.
    small = storage.required_read_bytes_per_s(8, 2000, 100e3)
    assert small == pytest.approx(1.6e9)
    assert storage.required_read_bytes_per_s(1024, 2000, 100e3) == pytest.approx(128 * small)


def test_max_gpus_fed_is_the_inverse():
    assert storage.max_gpus_fed(1.6e9, 2000, 100e3) == 8
    assert storage.max_gpus_fed(1.6e9 - 1, 2000, 100e3) == 7
    assert storage.max_gpus_fed(1e5, 2000, 100e3) == 0
    # 0.3 GB/s at 0.1 GB/s per GPU is 3 GPUs despite floating-point rounding.
    assert storage.max_gpus_fed(0.3e9, 1, 0.1e9) == 3


def test_step_time_with_and_without_prefetch():
    assert storage.starved_step_time_s(0.5, 0.2) == 0.5            # loading hidden
    assert storage.starved_step_time_s(0.5, 0.8) == 0.8            # storage-bound
    assert storage.starved_step_time_s(0.5, 0.2, prefetch=False) == pytest.approx(0.7)
    assert storage.starved_step_time_s(0.5, 0.0, prefetch=False) == 0.5


def test_data_utilization_knee():
    assert storage.data_utilization(0.5, 0.5) == 1.0               # exactly at the knee
    assert storage.data_utilization(0.5, 1.0) == pytest.approx(0.5)
    assert storage.data_utilization(0.5, 0.5, prefetch=False) == pytest.approx(0.5)
    assert storage.data_utilization(0.3, 0.1, prefetch=False) == pytest.approx(0.75)


def test_load_time_and_checkpoints():
    assert storage.load_time_s(10e9, 2e9) == pytest.approx(5.0)
    # 980 GB at 10 GB/s: 98 s; to write it in 5 minutes needs 980e9 / 300 bytes/s.
    assert storage.checkpoint_write_s(980e9, 10e9) == pytest.approx(98.0)
    assert storage.required_write_bytes_per_s(980e9, 300) == pytest.approx(980e9 / 300)
    need = storage.required_write_bytes_per_s(1e12, 60)
    assert storage.checkpoint_write_s(1e12, need) == pytest.approx(60)


@pytest.mark.parametrize("call, match", [
    (lambda: storage.required_read_bytes_per_s(0, 10, 10), "n_gpus"),
    (lambda: storage.required_read_bytes_per_s(4, -1, 10), "samples_per_s_per_gpu"),
    (lambda: storage.starved_step_time_s(0, 1), "compute_s"),
    (lambda: storage.starved_step_time_s(1, -1), "load_s"),
    (lambda: storage.checkpoint_write_s(1e9, 0), "write_bytes_per_s"),
    (lambda: storage.load_time_s(1e9, float("inf")), "read_bytes_per_s"),
    (lambda: storage.required_write_bytes_per_s(1e9, 0), "write_s"),
])
def test_invalid_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_tokens_per_s_per_gpu():
    # 1e15 FLOP/s at 40% MFU, 6 * 1e9 FLOPs per token: 4e14 / 6e9 tokens/s.
    assert storage.tokens_per_s_per_gpu(6e9, 1e15, 0.4) == pytest.approx(4e14 / 6e9)
    with pytest.raises(ValueError, match="mfu"):
        storage.tokens_per_s_per_gpu(6e9, 1e15, 1.5)
    with pytest.raises(ValueError, match="flops_per_token"):
        storage.tokens_per_s_per_gpu(0, 1e15, 0.5)


def test_host_memory_traffic_with_and_without_gpudirect_storage():
    # the bounce buffer: every byte written into CPU memory, then read out of it
    assert storage.host_memory_bytes_per_s(10e9, gpudirect_storage=False) == 20e9
    assert storage.host_memory_bytes_per_s(10e9, gpudirect_storage=True) == 0.0
    assert storage.host_memory_bytes_per_s(0.0, gpudirect_storage=False) == 0.0
    with pytest.raises(ValueError, match="io_bytes_per_s"):
        storage.host_memory_bytes_per_s(-1.0, gpudirect_storage=False)
    with pytest.raises(ValueError, match="io_bytes_per_s"):
        storage.host_memory_bytes_per_s(float("inf"), gpudirect_storage=True)


def test_sharded_checkpoint_write_is_limited_by_ports_then_by_storage():
    ckpt = 1e12
    # 10 nodes at 10 GB/s each: 10 s through the ports; the storage at 1 TB/s needs 1 s
    assert storage.sharded_checkpoint_write_s(ckpt, 10, node_write_bytes_per_s=10e9,
                                              storage_write_bytes_per_s=1e12) == 10.0
    # 1000 nodes: 0.1 s through the ports, the storage's 1 s dominates
    assert storage.sharded_checkpoint_write_s(ckpt, 1000, node_write_bytes_per_s=10e9,
                                              storage_write_bytes_per_s=1e12) == 1.0
    # the crossover at storage rate / node rate = 100 nodes
    assert storage.sharded_checkpoint_write_s(ckpt, 100, node_write_bytes_per_s=10e9,
                                              storage_write_bytes_per_s=1e12) == 1.0
    # one node and an unlimited-looking storage reduce to checkpoint_write_s
    assert storage.sharded_checkpoint_write_s(ckpt, 1, node_write_bytes_per_s=10e9,
                                              storage_write_bytes_per_s=1e15) == \
        storage.checkpoint_write_s(ckpt, 10e9)


@pytest.mark.parametrize("kwargs,match", [
    (dict(checkpoint_bytes=0.0), "checkpoint_bytes"),
    (dict(n_nodes=0), "n_nodes"),
    (dict(n_nodes=2.5), "n_nodes"),
    (dict(node_write_bytes_per_s=0.0), "node_write_bytes_per_s"),
    (dict(storage_write_bytes_per_s=-1.0), "storage_write_bytes_per_s"),
])
def test_sharded_checkpoint_write_errors(kwargs, match):
    args = dict(checkpoint_bytes=1e12, n_nodes=8, node_write_bytes_per_s=1e9,
                storage_write_bytes_per_s=1e11)
    args.update(kwargs)
    ckpt, nodes = args.pop("checkpoint_bytes"), args.pop("n_nodes")
    with pytest.raises(ValueError, match=match):
        storage.sharded_checkpoint_write_s(ckpt, nodes, **args)
