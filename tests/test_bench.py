"""clusterlab.device.bench: timing statistics, the timing harness, sizes, sweeps and the table, the
roofline's program costs and the host's measured ceilings."""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from clusterlab.analytic import costmodel, tables
from clusterlab.device import bench, collectives, devices
from conftest import DEVICES, sub_mesh

# --- Timing statistics ------------------------------------------------------------------------


def test_timing_statistics_odd_count():
    timing = bench.Timing((0.004, 0.001, 0.003, 0.002, 0.005))
    assert timing.median_s == pytest.approx(0.003)
    assert timing.p25_s == pytest.approx(0.002)   # sorted: 1 2 3 4 5 ms, index 1 of 0..4
    assert timing.p75_s == pytest.approx(0.004)   # index 3
    assert timing.relative_spread == pytest.approx((0.004 - 0.002) / 0.003)
    assert str(timing) == "median 3.000 ms (IQR 2.000-4.000 ms, n=5)"


def test_timing_statistics_even_count_interpolates():
    timing = bench.Timing((4.0, 1.0, 3.0, 2.0))
    assert timing.median_s == pytest.approx((2.0 + 3.0) / 2)
    assert timing.p25_s == pytest.approx(1.0 + 0.75 * (2.0 - 1.0))  # position 0.75 of 0..3
    assert timing.p75_s == pytest.approx(3.0 + 0.25 * (4.0 - 3.0))  # position 2.25
    assert timing.relative_spread == pytest.approx((3.25 - 1.75) / 2.5)


def test_timing_of_identical_samples_has_no_spread():
    timing = bench.Timing((2e-3,) * 4)
    assert (timing.median_s, timing.p25_s, timing.p75_s) == (2e-3, 2e-3, 2e-3)
    assert timing.relative_spread == 0.0


def test_timing_of_zero_samples():
    # time_per_iteration clamps a step too fast to resolve to 0 s; its spread must not crash.
    assert bench.Timing((0.0, 0.0, 0.0)).relative_spread == 0.0
    assert bench.Timing((0.0, 0.0, 0.0, 1e-6)).relative_spread == float("inf")


# --- time_fn, time_per_iteration, memcpy_bandwidth --------------------------------------------

class _Waitable:
    """A result whose block_until_ready is counted and takes ``wait_s`` seconds."""

    def __init__(self, log: list, wait_s: float = 0.0):
        self.log, self.wait_s = log, wait_s

    def block_until_ready(self):
        self.log.append("wait")
        time.sleep(self.wait_s)
        return self


@pytest.mark.parametrize("warmup, repeats", [(0, 1), (2, 10), (3, 4)])
def test_time_fn_calls_warmup_plus_repeats_times_and_waits(warmup, repeats):
    calls, waits = [], []

    def fn(a, b):
        calls.append((a, b))
        return _Waitable(waits)

    timing = bench.time_fn(fn, 1, "two", warmup=warmup, repeats=repeats)
    assert calls == [(1, "two")] * (warmup + repeats)
    assert len(waits) == warmup + repeats
    assert len(timing.samples_s) == repeats
    assert all(s >= 0 for s in timing.samples_s)


def test_time_fn_times_the_wait_not_just_the_call():
    timing = bench.time_fn(lambda: _Waitable([], wait_s=0.005), warmup=0, repeats=3)
    assert min(timing.samples_s) >= 0.005


@pytest.mark.parametrize("warmup, repeats", [(-1, 5), (0, 0), (2, -3)])
def test_time_fn_rejects_bad_counts(warmup, repeats):
    with pytest.raises(ValueError, match=rf"Need warmup >= 0 and repeats >= 1, got "
                                         rf"warmup={warmup}, repeats={repeats}"):
        bench.time_fn(lambda: None, warmup=warmup, repeats=repeats)


def test_time_per_iteration_on_one_device():
    x = jnp.ones((256,), jnp.float32)
    timing = bench.time_per_iteration(lambda z: z * 0.5 + 1.0, x, iterations=4, warmup=1,
                                      repeats=3)
    assert len(timing.samples_s) == 3
    assert all(s >= 0 for s in timing.samples_s)


def test_time_per_iteration_of_a_collective():
    mesh = sub_mesh(4)
    all_reduce = collectives.make_collective("all_reduce", mesh, "x")
    x = jnp.ones((4 * 64,), jnp.float32)
    timing = bench.time_per_iteration(lambda z: all_reduce(z) / 4, x, iterations=3, warmup=1,
                                      repeats=2)
    assert len(timing.samples_s) == 2
    assert all(s >= 0 for s in timing.samples_s)


def test_time_per_iteration_rejects_short_loops_and_bad_counts():
    x = jnp.ones(4)
    with pytest.raises(ValueError, match="needs iterations >= 2, got 1"):
        bench.time_per_iteration(lambda z: z, x, iterations=1)
    with pytest.raises(ValueError, match="repeats >= 1"):
        bench.time_per_iteration(lambda z: z, x, repeats=0)


def test_memcpy_bandwidth():
    timing = bench.memcpy_bandwidth(2**20, repeats=3)
    assert len(timing.samples_s) == 3
    assert all(s > 0 for s in timing.samples_s)


@pytest.mark.parametrize("nbytes", [0, -1, -2**20])
def test_memcpy_bandwidth_rejects_non_positive_sizes(nbytes):
    with pytest.raises(ValueError, match=rf"needs a positive size, got {nbytes} bytes"):
        bench.memcpy_bandwidth(nbytes)


# --- sizes ----------------------------------------------------------------------------------

def test_sizes_as_text_have_one_path_tables():
    # Labs call tables.parse_size and tables.format_bytes (tests/test_tables.py tests them);
    # bench once offered them as a second path.
    assert tables.parse_size.__module__ == "clusterlab.analytic.tables"
    assert not hasattr(bench, "parse_size") and not hasattr(bench, "format_bytes")


@pytest.mark.parametrize("args, expected", [
    ((4096, 65536), [4096, 8192, 16384, 32768, 65536]),
    ((4096, 4096), [4096]),
    ((4096, 100_000), [4096, 8192, 16384, 32768, 65536]),
    ((1, 64, 4), [1, 4, 16, 64]),
    ((3, 100, 3), [3, 9, 27, 81]),
])
def test_message_sizes(args, expected):
    assert bench.message_sizes(*args) == expected


@pytest.mark.parametrize("smallest, largest", [(0, 10), (-1, 10), (10, 5)])
def test_message_sizes_rejects_bad_ranges(smallest, largest):
    with pytest.raises(ValueError, match=rf"Need 0 < smallest <= largest, got {smallest} and "
                                         rf"{largest} bytes"):
        bench.message_sizes(smallest, largest)


@pytest.mark.parametrize("factor", [1, 0, -2])
def test_message_sizes_rejects_small_factors(factor):
    with pytest.raises(ValueError, match=rf"step factor must be at least 2, got {factor}"):
        bench.message_sizes(4, 64, factor)


# --- sweep and the table --------------------------------------------------------------------

# nccl-tests' count column is the count NCCL is called with: the whole buffer's elements for
# all-reduce, broadcast and send/recv; per device (size / itemsize / n) for all-gather,
# reduce-scatter and all-to-all.
@pytest.mark.parametrize("op, implementation, n, dtype, counts", [
    ("all_reduce", "builtin", 4, "float32", [4096 // 4, 8192 // 4, 16384 // 4]),
    ("all_reduce", "ring", 4, "float32", [4096 // 4, 8192 // 4, 16384 // 4]),
    ("all_reduce", "recursive_doubling", 8, "int32", [4096 // 4, 8192 // 4, 16384 // 4]),
    ("all_gather", "ring", 8, "bfloat16", [4096 // 2 // 8, 8192 // 2 // 8, 16384 // 2 // 8]),
    ("reduce_scatter", "builtin", 2, "float32", [4096 // 4 // 2, 8192 // 4 // 2,
                                                 16384 // 4 // 2]),
])
def test_sweep_rows(op, implementation, n, dtype, counts):
    sizes = [4096, 8192, 16384]
    rows = bench.sweep(op, sizes, sub_mesh(n), "x", implementation=implementation, dtype=dtype,
                       warmup=1, repeats=2, progress=False)
    assert len(rows) == len(sizes)
    for row, nbytes, count in zip(rows, sizes, counts):
        assert (row.op, row.nbytes, row.count, row.dtype, row.n_devices) == (
            op, nbytes, count, dtype, n)
        assert len(row.timing.samples_s) == 2
        assert row.algbw_bytes_per_s == pytest.approx(nbytes / row.timing.median_s)
        assert row.busbw_bytes_per_s == pytest.approx(
            row.algbw_bytes_per_s * costmodel.busbw_factor(op, n))
    if op == "all_reduce":
        assert rows[0].busbw_bytes_per_s == pytest.approx(rows[0].algbw_bytes_per_s
                                                          * 2 * (n - 1) / n)


SWEEP_COUNTS = [  # 1 KiB on 4 devices, float32
    ("all_reduce", 1024 // 4), ("all_gather", 1024 // 4 // 4), ("reduce_scatter", 1024 // 4 // 4),
    ("all_to_all", 1024 // 4 // 4), ("broadcast", 1024 // 4), ("send_recv", 1024 // 4),
]


def test_sweep_counts_cover_every_runnable_op():
    assert {op for op, _ in SWEEP_COUNTS} == set(costmodel.RUNNABLE_OPS)


@pytest.mark.parametrize("op, count", SWEEP_COUNTS)
def test_sweep_runs_every_op(op, count):
    rows = bench.sweep(op, [1024], sub_mesh(4), "x", warmup=1, repeats=1, progress=False)
    assert [(r.op, r.nbytes, r.count, r.n_devices) for r in rows] == [(op, 1024, count, 4)]


def test_sweep_rejects_sizes_that_do_not_split():
    with pytest.raises(ValueError, match=r"all_gather of 4096 bytes on 3 devices needs a "
                                         r"multiple of 12 bytes"):
        bench.sweep("all_gather", [4096], sub_mesh(3), "x", progress=False)


def test_format_table_by_hand():
    rows = [
        # 1 MiB all-reduce on 8 devices in 1 ms: algbw 2**20 / 1e-3 = 1.048576 GB/s,
        # busbw 1.048576 * 2 * 7 / 8 = 1.835008 GB/s.
        bench.SweepRow("all_reduce", 2**20, 2**18, "float32", 8, bench.Timing((1e-3,) * 3)),
        # 4 KiB in 10, 20, 30 us: median 20 us, IQR 15-25 us = 50%; algbw 4096 / 2e-5 = 0.2048
        bench.SweepRow("all_reduce", 4096, 1024, "float32", 8,
                       bench.Timing((1e-5, 2e-5, 3e-5))),
    ]
    lines = bench.format_table(rows).splitlines()
    assert len(lines) == 3
    assert lines[0].split() == ["size", "(B)", "count", "type", "time", "(us)", "spread",
                                "algbw", "(GB/s)", "busbw", "(GB/s)"]
    assert lines[1].split() == ["1048576", "262144", "float32", "1000.0", "0%", "1.049", "1.835"]
    assert lines[2].split() == ["4096", "1024", "float32", "20.0", "50%", "0.205", "0.358"]



# --- time_interleaved and interleaved_ratios ------------------------------------------------------

def test_time_interleaved_times_each_function():
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
    with pytest.raises(ValueError, match="at least one"):
        bench.time_interleaved({}, jnp.ones(4))


class _FakeClock:
    """perf_counter that advances only when a fake function 'runs' (no real timing involved)."""

    def __init__(self):
        self.now_s = 0.0

    def perf_counter(self):
        return self.now_s


def test_interleaved_ratios_divides_each_runs_medians(monkeypatch):
    clock = _FakeClock()
    monkeypatch.setattr(bench, "time", clock)
    calls = {"fast": 0, "slow": 0}
    rounds_per_run = 1 + 5  # warmup + repeats

    def fake(name, cost_s):
        def fn(x):
            run = calls[name] // rounds_per_run  # 0, 1, 2: the slow one gets slower each run
            calls[name] += 1
            clock.now_s += cost_s(run)
            return x
        return fn

    fns = {"fast": fake("fast", lambda run: 1.0), "slow": fake("slow", lambda run: 2.0 + run)}
    result = bench.interleaved_ratios(fns, 0, baseline="fast", runs=3, warmup=1, repeats=5)
    assert list(result) == ["slow"]
    assert result["slow"].ratios == (2.0, 3.0, 4.0)
    assert (result["slow"].median, result["slow"].low, result["slow"].high) == (3.0, 2.0, 4.0)
    assert str(result["slow"]) == "slow / fast: 3.00x (median of 3 runs; 2.00-4.00x)"
    assert calls == {"fast": 18, "slow": 18}


@pytest.mark.parametrize("fns, baseline, runs, message", [
    ({"a": abs, "b": abs}, "c", 3, "baseline 'c' is not among the functions timed: a, b"),
    ({"a": abs}, "a", 3, "at least one function to compare"),
    ({"a": abs, "b": abs}, "a", 0, "runs must be at least 1"),
])
def test_interleaved_ratios_rejects_bad_arguments(fns, baseline, runs, message):
    with pytest.raises(ValueError, match=message):
        bench.interleaved_ratios(fns, 1.0, baseline=baseline, runs=runs)


# --- the roofline: program costs, achieved FLOP/s, the host's ceilings ----------------------------

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
