"""Unit tests of the helpers that labs 00 and 02 added to clusterlab."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from clusterlab import collectives, costmodel, devices
from conftest import sub_mesh


def test_collective_alpha_beta_matches_collective_time():
    for algorithm in ("ring", "recursive_doubling", "rabenseifner", "tree"):
        line = costmodel.collective_alpha_beta("all_reduce", 8, 10e9, 5e-6, algorithm)
        for nbytes in (1024, 2**20, 3 * 2**24):
            expected = costmodel.collective_time("all_reduce", nbytes, 8, 10e9, 5e-6, algorithm)
            assert line.predict(nbytes) == pytest.approx(expected, rel=1e-12)


def test_collective_alpha_beta_ring_values():
    line = costmodel.collective_alpha_beta("all_reduce", 4, 2e9, 1e-5, "ring")
    assert line.alpha == pytest.approx(6 * 1e-5)          # 2(p-1) steps
    assert line.beta == pytest.approx(2 * 3 / 4 / 2e9)    # 2(p-1)/p bytes per byte


def test_collective_alpha_beta_rejects_bad_bandwidth():
    with pytest.raises(ValueError, match="bandwidth"):
        costmodel.collective_alpha_beta("all_reduce", 8, 0.0)


def test_crossover_ring_vs_recursive_doubling_closed_form():
    alpha, bandwidth, p = 20e-6, 5e9, 8
    ring = costmodel.collective_alpha_beta("all_reduce", p, bandwidth, alpha, "ring")
    doubling = costmodel.collective_alpha_beta("all_reduce", p, bandwidth, alpha,
                                               "recursive_doubling")
    # 2(p-1) a + 2(p-1)/p n b = log2(p) (a + n b)
    #   =>  n = (2(p-1) - log2 p) a / ((log2 p - 2(p-1)/p) b)
    expected = (14 - 3) * alpha / ((3 - 1.75) / bandwidth)
    assert costmodel.crossover_bytes(ring, doubling) == pytest.approx(expected)
    assert costmodel.crossover_bytes(doubling, ring) == pytest.approx(expected)
    below, above = expected / 2, expected * 2
    assert doubling.predict(below) < ring.predict(below)
    assert ring.predict(above) < doubling.predict(above)


def test_crossover_none_when_one_line_always_wins():
    fast = costmodel.AlphaBeta(alpha=1e-6, beta=1e-10)
    slow = costmodel.AlphaBeta(alpha=2e-6, beta=2e-10)
    assert math.isinf(costmodel.crossover_bytes(fast, slow))
    assert math.isinf(costmodel.crossover_bytes(fast, costmodel.AlphaBeta(5e-6, 1e-10)))


def test_hlo_op_count_ring_and_doubling():
    mesh = sub_mesh(4, "ring")
    x = devices.shard(jnp.arange(4 * 8, dtype=jnp.float32), mesh, P("ring"))
    ring = collectives.make_collective("all_reduce", mesh, "ring", implementation="ring")
    doubling = collectives.make_collective("all_reduce", mesh, "ring",
                                           implementation="recursive_doubling")
    # the ring's two phases are loops: one collective-permute each, executed 4 - 1 times
    assert collectives.hlo_op_count(ring, x) == 2
    assert len(collectives.executed_collectives(ring, x)) == 2 * (4 - 1)
    assert collectives.hlo_op_count(doubling, x) == 2
    assert collectives.hlo_op_count(ring, x, op="all-reduce") == 0


def test_hlo_op_count_finds_the_all_reduce_jit_inserts():
    mesh = sub_mesh(4, "data")
    x = devices.shard(jnp.arange(16.0), mesh, P("data"))
    total = jax.jit(jnp.sum)
    assert collectives.hlo_op_count(total, x, op="all-reduce") == 1
    np.testing.assert_allclose(total(x), 120.0)


def test_hlo_op_count_needs_jit():
    with pytest.raises(TypeError, match="jax.jit"):
        collectives.hlo_op_count(jnp.sum, jnp.ones(4))


def test_time_interleaved_times_each_function():
    from clusterlab import bench

    calls = []

    def make(name):
        def fn(x):
            calls.append(name)
            return x + 1
        return fn

    timings = bench.time_interleaved({"a": make("a"), "b": make("b")}, jnp.ones(4),
                                     warmup=1, repeats=3)
    assert set(timings) == {"a", "b"}
    assert all(len(t.samples_s) == 3 and t.median_s >= 0 for t in timings.values())
    assert calls == ["a", "b"] * 4          # one warm-up round, then 3 rounds, taking turns


def test_time_interleaved_needs_functions():
    from clusterlab import bench

    with pytest.raises(ValueError, match="at least one"):
        bench.time_interleaved({}, jnp.ones(4))
