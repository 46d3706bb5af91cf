"""Unit tests of the roofline additions to clusterlab.bench."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from clusterlab import bench, devices

from conftest import DEVICES


def test_program_cost_counts_matmul_flops_and_bytes():
    a, b = jnp.ones((64, 32)), jnp.ones((32, 16))
    cost = bench.program_cost(jax.jit(jnp.matmul), a, b)
    assert cost.flops == 2 * 64 * 32 * 16
    assert cost.bytes_accessed == 4 * (64 * 32 + 32 * 16 + 64 * 16)
    assert cost.n_devices == 1
    assert cost.flops_per_byte == pytest.approx(cost.flops / cost.bytes_accessed)


def test_program_cost_of_a_sharded_program_adds_up_all_devices():
    mesh = devices.mesh((4,), ("data",), DEVICES[:4])
    a = devices.shard(jnp.ones((64, 32)), mesh, P("data"))  # a: f32[64/4, 32] per device
    cost = bench.program_cost(jax.jit(jnp.matmul), a, jnp.ones((32, 16)))
    assert cost.n_devices == 4
    assert cost.flops == 2 * 64 * 32 * 16


def test_program_cost_needs_a_jitted_function():
    with pytest.raises(ValueError, match="jax.jit"):
        bench.program_cost(lambda a, b: a @ b, jnp.ones((2, 2)), jnp.ones((2, 2)))


def test_achieved_flops_divides_compiled_flops_by_the_median_time():
    achieved = bench.matmul_achieved(64, repeats=3)
    assert achieved.cost.flops == 2 * 64**3
    assert achieved.flops_per_s == pytest.approx(achieved.cost.flops / achieved.timing.median_s)
    assert achieved.bytes_per_s == pytest.approx(
        achieved.cost.bytes_accessed / achieved.timing.median_s)
    with pytest.raises(ValueError, match="positive matrix size"):
        bench.matmul_achieved(0)


def test_measured_ceilings_are_positive_and_finite():
    roof = bench.measure_roofline(DEVICES[0], sizes=(64, 128), nbytes=2**20, repeats=3)
    assert roof.device_kind == f"{DEVICES[0].platform}:{DEVICES[0].device_kind}"
    assert roof.dtype == "float32"
    for value in (roof.peak_flops_per_s, roof.memory_bytes_per_s):
        assert value > 0 and math.isfinite(value)
    assert roof.ridge_flops_per_byte == pytest.approx(roof.peak_flops_per_s
                                                      / roof.memory_bytes_per_s)
    assert "GFLOP/s" in str(roof)
    with pytest.raises(ValueError, match="at least one matrix size"):
        bench.peak_matmul_flops_per_s(sizes=())
    with pytest.raises(ValueError, match="at least 4 bytes"):
        bench.memory_bandwidth_bytes_per_s(nbytes=2)


def test_roofline_is_the_lesser_of_the_two_ceilings():
    roof = bench.Roofline("test:x", peak_flops_per_s=100e9, memory_bytes_per_s=10e9,
                          dtype="float32")
    assert roof.ridge_flops_per_byte == 10.0
    assert roof.attainable_flops_per_s(1.0) == 10e9       # memory-bound
    assert roof.attainable_flops_per_s(10.0) == 100e9     # the ridge
    assert roof.attainable_flops_per_s(1000.0) == 100e9   # compute-bound
    np.testing.assert_allclose(roof.attainable_flops_per_s(np.array([0.5, 20.0])),
                               [5e9, 100e9])
    with pytest.raises(ValueError, match="negative"):
        roof.attainable_flops_per_s(-1.0)


def test_rooflines_measures_each_device_kind_once():
    found = bench.rooflines(DEVICES, sizes=(64,), nbytes=2**16, repeats=2)
    assert list(found) == [f"{DEVICES[0].platform}:{DEVICES[0].device_kind}"]
