"""Timing harness and collective sweeps.

Rules every measurement here follows: compile and warm up first, block until the result is
ready, repeat, and report the median with the spread (25th to 75th percentile). Numbers from
simulated CPU devices measure this host, not a GPU fabric: compare them with the host's own
ceiling (:func:`memcpy_bandwidth`) measured in the same run. The same holds for matmuls: each
GEMM of a layer (:func:`clusterlab.analytic.gemm.transformer_layer_gemms`) is timed against the
device's roofline measured in the same run (:func:`measure_roofline`, :func:`time_gemms`).
"""

from __future__ import annotations

import functools
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tqdm.std import TqdmWarning

with warnings.catch_warnings():
    # In Jupyter without ipywidgets, tqdm.auto warns on import (then uses a text bar); the
    # warning would end up in the stored stderr of every lab.
    warnings.simplefilter("ignore", TqdmWarning)
    from tqdm.auto import tqdm

from clusterlab.analytic import costmodel
from clusterlab.analytic.gemm import Gemm
from clusterlab.device import collectives
# Sizes as text are pure formatting (tables, with no JAX); bench's names since the first labs.


@dataclass(frozen=True)
class Timing:
    """Repeated measurements of one thing, in seconds."""

    samples_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return float(np.median(self.samples_s))

    @property
    def p25_s(self) -> float:
        return float(np.percentile(self.samples_s, 25))

    @property
    def p75_s(self) -> float:
        return float(np.percentile(self.samples_s, 75))

    @property
    def relative_spread(self) -> float:
        """Interquartile range over the median: 0.1 means the middle half lies within 10%."""
        spread_s = self.p75_s - self.p25_s
        if self.median_s == 0:  # time_per_iteration clamps unresolvable steps to 0 s
            return 0.0 if spread_s == 0 else float("inf")
        return spread_s / self.median_s

    def __str__(self) -> str:
        return (f"median {self.median_s * 1e3:.3f} ms (IQR {self.p25_s * 1e3:.3f}-"
                f"{self.p75_s * 1e3:.3f} ms, n={len(self.samples_s)})")


def _check_counts(warmup: int, repeats: int) -> None:
    if warmup < 0 or repeats < 1:
        raise ValueError(f"Need warmup >= 0 and repeats >= 1, got warmup={warmup}, "
                         f"repeats={repeats}.")


def time_fn(fn: Callable[..., object], *args, warmup: int = 2, repeats: int = 10) -> Timing:
    """Time ``fn(*args)``: ``warmup`` untimed calls (compilation), then ``repeats`` timed ones.

    Each call is waited for with ``jax.block_until_ready``, so the time covers the computation,
    not just its dispatch.
    """
    _check_counts(warmup, repeats)
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append(time.perf_counter() - start)
    return Timing(tuple(samples))


def time_per_iteration(step: Callable[[jax.Array], jax.Array], x: jax.Array, *,
                       iterations: int = 16, warmup: int = 2, repeats: int = 10) -> Timing:
    """Time one application of ``step`` by looping it inside a single jitted program.

    Python dispatch costs tens of microseconds, as much as a small collective. Running
    ``step`` ``iterations`` times in a ``fori_loop`` and subtracting a one-iteration loop
    leaves the cost of the step alone: ``(T(iterations) - T(1)) / (iterations - 1)``.

    Args:
        step: a function from an array to an array of the same shape, dtype and sharding.
        x: its input.
        iterations: loop length, at least 2.

    Returns:
        A :class:`Timing` of per-iteration seconds, one sample per repeat.
    """
    if iterations < 2:
        raise ValueError(f"time_per_iteration needs iterations >= 2, got {iterations}.")
    _check_counts(warmup, repeats)

    def looped(k):
        return jax.jit(lambda y: jax.lax.fori_loop(0, k, lambda _, z: step(z), y))

    long_loop, short_loop = looped(iterations), looped(1)
    for _ in range(warmup):
        jax.block_until_ready((long_loop(x), short_loop(x)))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(long_loop(x))
        middle = time.perf_counter()
        jax.block_until_ready(short_loop(x))
        end = time.perf_counter()
        samples.append(max((middle - start) - (end - middle), 0.0) / (iterations - 1))
    return Timing(tuple(samples))


def memcpy_bandwidth(nbytes: int = 64 * 2**20, *, repeats: int = 10) -> Timing:
    """The host's copy speed: seconds to copy ``nbytes`` from one buffer to another.

    Divide ``nbytes`` by the median to get bytes copied per second (each byte is read once
    and written once). Collectives among simulated devices move data through this memory, so
    this is their ceiling.
    """
    if nbytes <= 0:
        raise ValueError(f"memcpy_bandwidth needs a positive size, got {nbytes} bytes.")
    source = np.ones(nbytes, dtype=np.uint8)
    target = np.empty_like(source)
    return time_fn(np.copyto, target, source, warmup=2, repeats=repeats)


def message_sizes(smallest: int, largest: int, factor: int = 2) -> list[int]:
    """Sizes from ``smallest`` to ``largest``, each ``factor`` times the last (nccl-tests -f)."""
    if smallest <= 0 or largest < smallest:
        raise ValueError(f"Need 0 < smallest <= largest, got {smallest} and {largest} bytes.")
    if factor < 2:
        raise ValueError(f"The step factor must be at least 2, got {factor}.")
    sizes = [smallest]
    while sizes[-1] * factor <= largest:
        sizes.append(sizes[-1] * factor)
    return sizes


@dataclass(frozen=True)
class SweepRow:
    """One line of an nccl-tests-style table."""

    op: str
    nbytes: int  # nccl-tests' size column: the full buffer
    count: int   # nccl-tests' count column: size/itemsize, divided by n_devices for
                 # all-gather, reduce-scatter and all-to-all (the per-device count NCCL gets)
    dtype: str
    n_devices: int
    timing: Timing

    @property
    def algbw_bytes_per_s(self) -> float:
        return costmodel.algbw(self.nbytes, self.timing.median_s)

    @property
    def busbw_bytes_per_s(self) -> float:
        return costmodel.busbw(self.op, self.nbytes, self.timing.median_s, self.n_devices)


def sweep(op: str, sizes_bytes: Sequence[int], mesh: Mesh, axis_name: str, *,
          implementation: str = "builtin", dtype: str = "float32", warmup: int = 2,
          repeats: int = 5, progress: bool = True) -> list[SweepRow]:
    """Time one collective over a range of message sizes, as nccl-tests does.

    Args:
        op: one of :data:`clusterlab.analytic.costmodel.RUNNABLE_OPS`.
        sizes_bytes: message sizes, the full buffer as nccl-tests counts it.
        mesh: the device mesh.
        axis_name: the axis to run the collective over.
        implementation: ``"builtin"``, ``"ring"`` or ``"recursive_doubling"``.
        dtype: element type of the buffers.
        progress: show a progress bar.

    Returns:
        One :class:`SweepRow` per size.
    """
    fn = collectives.make_collective(op, mesh, axis_name, implementation=implementation)
    n = mesh.shape[axis_name]
    itemsize = jnp.dtype(dtype).itemsize
    sharding = NamedSharding(mesh, P(axis_name))
    rows = []
    for nbytes in tqdm(list(sizes_bytes), desc=f"{op} ({implementation})", disable=not progress,
                       leave=False):
        per_device = collectives.per_device_elements(op, int(nbytes), n, itemsize)
        x = jax.device_put(jnp.ones((n * per_device,), dtype=dtype), sharding)
        timing = time_fn(fn, x, warmup=warmup, repeats=repeats)
        per_device_split = n if op in ("all_gather", "reduce_scatter", "all_to_all") else 1
        rows.append(SweepRow(op, int(nbytes), int(nbytes) // itemsize // per_device_split,
                             str(jnp.dtype(dtype)), n, timing))
    return rows


def format_table(rows: Sequence[SweepRow]) -> str:
    """An nccl-tests-style table: size, count, type, time, algbw, busbw (GB/s = 1e9 bytes/s)."""
    header = (f"{'size (B)':>12} {'count':>11} {'type':>8} {'time (us)':>11} "
              f"{'spread':>7} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}")
    lines = [header]
    for row in rows:
        lines.append(f"{row.nbytes:>12} {row.count:>11} {row.dtype:>8} "
                     f"{row.timing.median_s * 1e6:>11.1f} {row.timing.relative_spread:>7.0%} "
                     f"{row.algbw_bytes_per_s / 1e9:>13.3f} {row.busbw_bytes_per_s / 1e9:>13.3f}")
    return "\n".join(lines)


def time_interleaved(fns: dict[str, Callable[..., object]], *args, warmup: int = 2,
                     repeats: int = 10) -> dict[str, Timing]:
    """Time several functions on the same arguments, taking turns, to compare them fairly.

    Each round calls every function once, in order, so a change in the machine's load (other
    processes, frequency scaling) during the measurement falls on all of them alike, and their
    ratios stay meaningful even when the absolute times drift.

    Args:
        fns: name -> function, each called as ``fn(*args)`` and waited for with
            ``jax.block_until_ready``.
        *args: the arguments every function gets.
        warmup: untimed rounds first (compilation).
        repeats: timed rounds.

    Returns:
        name -> :class:`Timing`, one sample per round.
    """
    _check_counts(warmup, repeats)
    if not fns:
        raise ValueError("time_interleaved needs at least one function to time.")
    for _ in range(warmup):
        for fn in fns.values():
            jax.block_until_ready(fn(*args))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            samples[name].append(time.perf_counter() - start)
    return {name: Timing(tuple(values)) for name, values in samples.items()}


@dataclass(frozen=True)
class RatioRuns:
    """How many times as long one function took as a baseline, in several interleaved runs.

    Attributes:
        name: the function timed.
        baseline: the function it is compared with.
        ratios: per run, the function's median time over the baseline's median time.
    """

    name: str
    baseline: str
    ratios: tuple[float, ...]

    @property
    def median(self) -> float:
        return float(np.median(self.ratios))

    @property
    def low(self) -> float:
        return float(min(self.ratios))

    @property
    def high(self) -> float:
        return float(max(self.ratios))

    def __str__(self) -> str:
        return (f"{self.name} / {self.baseline}: {self.median:.2f}x (median of {len(self.ratios)} "
                f"runs; {self.low:.2f}-{self.high:.2f}x)")


def interleaved_ratios(fns: dict[str, Callable[..., object]], *args, baseline: str,
                       runs: int = 3, warmup: int = 2,
                       repeats: int = 9) -> dict[str, RatioRuns]:
    """Time functions against a baseline in several interleaved runs, and keep each run's ratios.

    Each run is one :func:`time_interleaved` (every round calls every function once), so load
    that changes during a run falls on all functions alike; repeating the run shows how much the
    ratio itself moves. Report the median ratio with its range, never one run's.

    Args:
        fns: name -> function, each called as ``fn(*args)``; must include ``baseline``.
        *args: the arguments every function gets.
        baseline: the name of the function the others are divided by.
        runs: independent interleaved runs (at least 1).
        warmup: untimed rounds at the start of each run.
        repeats: timed rounds per run.

    Returns:
        name -> :class:`RatioRuns`, for every function but the baseline.
    """
    if baseline not in fns:
        raise ValueError(f"The baseline {baseline!r} is not among the functions timed: "
                         f"{', '.join(fns)}. Pass one of them as baseline=.")
    if len(fns) < 2:
        raise ValueError("interleaved_ratios needs the baseline and at least one function to "
                         "compare with it.")
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}.")
    ratios: dict[str, list[float]] = {name: [] for name in fns if name != baseline}
    for _ in range(runs):
        timings = time_interleaved(fns, *args, warmup=warmup, repeats=repeats)
        for name in ratios:
            ratios[name].append(timings[name].median_s / timings[baseline].median_s)
    return {name: RatioRuns(name, baseline, tuple(values)) for name, values in ratios.items()}


# ----------------------------------------------------------------------------------------------
# The machine's own roofline: measured ceilings, and where a program lands under them.
#
# The roofline model bounds a program's FLOP/s by the lesser of the device's peak FLOP/s and its
# memory bandwidth times the program's arithmetic intensity (FLOPs per byte moved to and from
# memory). Both ceilings are measured here on the devices at hand, and a program's FLOPs and
# bytes come from XLA's cost analysis of the compiled program.
#
# References:
#     Williams, Waterman & Patterson, "Roofline: An Insightful Visual Performance Model for
#     Multicore Architectures", CACM 52(4), 2009. https://doi.org/10.1145/1498765.1498785
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProgramCost:
    """FLOPs and bytes of one call of a compiled program, from XLA's cost analysis."""

    flops: float            # floating-point operations of all devices together
    bytes_accessed: float   # bytes read and written in memory, all devices together
    n_devices: int          # devices the program runs on (XLA reports per device; x n_devices)

    @property
    def flops_per_byte(self) -> float:
        """Arithmetic intensity: FLOPs per byte of memory traffic."""
        return self.flops / self.bytes_accessed if self.bytes_accessed else float("inf")


def program_cost(jitted: Callable[..., object], *args) -> ProgramCost:
    """FLOPs and bytes accessed of ``jitted(*args)``, from the compiled program's cost analysis.

    For a program sharded over several devices XLA analyses the per-device program; the totals
    returned here multiply it by the number of devices.

    Args:
        jitted: a ``jax.jit`` -wrapped function.
        *args: its arguments (arrays or ``jax.ShapeDtypeStruct`` s, with their shardings).

    Returns:
        A :class:`ProgramCost`.

    Raises:
        ValueError: when ``jitted`` is not jitted or XLA reports no FLOP count.
    """
    if not hasattr(jitted, "lower"):
        raise ValueError("program_cost needs a jax.jit-wrapped function (it reads the compiled "
                         "program's cost analysis); wrap it with jax.jit first.")
    compiled = jitted.lower(*args).compile()
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older JAX: one dict per program
        analysis = analysis[0] if analysis else {}
    if not analysis or "flops" not in analysis:
        raise ValueError("XLA reported no cost analysis for this program on this backend.")
    shardings = [s for s in jax.tree.leaves(compiled.input_shardings)
                 if hasattr(s, "device_set")]
    n_devices = max([len(s.device_set) for s in shardings], default=1)
    return ProgramCost(flops=float(analysis["flops"]) * n_devices,
                       bytes_accessed=float(analysis.get("bytes accessed", 0.0)) * n_devices,
                       n_devices=n_devices)


@dataclass(frozen=True)
class Achieved:
    """A program's cost and its measured time: the FLOP/s and bytes/s it achieved."""

    cost: ProgramCost
    timing: Timing

    @property
    def flops_per_s(self) -> float:
        return self.cost.flops / self.timing.median_s

    @property
    def bytes_per_s(self) -> float:
        return self.cost.bytes_accessed / self.timing.median_s


def achieved_flops(jitted: Callable[..., object], *args, warmup: int = 2,
                   repeats: int = 10) -> Achieved:
    """Time ``jitted(*args)`` and divide its compiled FLOPs by the median time.

    Args:
        jitted: a ``jax.jit`` -wrapped function.
        *args: its arguments (arrays).
        warmup: untimed calls first (compilation).
        repeats: timed calls.

    Returns:
        An :class:`Achieved`: ``.flops_per_s``, ``.bytes_per_s``, ``.cost``, ``.timing``.
    """
    cost = program_cost(jitted, *args)
    return Achieved(cost, time_fn(jitted, *args, warmup=warmup, repeats=repeats))


def _on(device: jax.Device | None) -> jax.Device:
    return jax.devices()[0] if device is None else device


def matmul_achieved(n: int, *, dtype: str = "float32", device: jax.Device | None = None,
                    repeats: int = 5) -> Achieved:
    """FLOP/s of an ``n x n`` by ``n x n`` matmul (``2 n^3`` FLOPs) on one device.

    Args:
        n: the matrices' size.
        dtype: element type (on GPUs, float32 matmuls may run as TF32 at JAX's default
            precision; bfloat16 uses the tensor cores' full rate).
        device: where to run; default the first of ``jax.devices()``.
        repeats: timed calls.

    Returns:
        An :class:`Achieved`.
    """
    if n < 1:
        raise ValueError(f"matmul_achieved needs a positive matrix size, got {n}.")
    device = _on(device)
    key_a, key_b = jax.random.split(jax.random.key(0))
    a = jax.device_put(jax.random.normal(key_a, (n, n), dtype), device)  # a: [n, n]
    b = jax.device_put(jax.random.normal(key_b, (n, n), dtype), device)  # b: [n, n]
    return achieved_flops(jax.jit(jnp.matmul), a, b, repeats=repeats)


def peak_matmul_flops_per_s(device: jax.Device | None = None, *,
                            sizes: Sequence[int] = (256, 512, 1024, 2048),
                            dtype: str = "float32", repeats: int = 5) -> float:
    """The best matmul FLOP/s over a few sizes: the device's measured compute ceiling.

    Simulated CPU devices share the host's cores, so on them this is the host's ceiling (each
    simulated device can use all cores when it runs alone).

    Args:
        device: where to run; default the first of ``jax.devices()``.
        sizes: square matrix sizes to try (large enough to leave dispatch overhead behind).
        dtype: element type.
        repeats: timed calls per size.

    Returns:
        FLOP/s of the fastest size.
    """
    if not sizes:
        raise ValueError("peak_matmul_flops_per_s needs at least one matrix size.")
    return max(matmul_achieved(n, dtype=dtype, device=device, repeats=repeats).flops_per_s
               for n in sizes)


def memory_bandwidth_bytes_per_s(device: jax.Device | None = None, *,
                                 nbytes: int = 64 * 2**20, repeats: int = 10) -> float:
    """A device's streaming memory bandwidth: ``y = 2x + 1`` over ``nbytes`` of float32.

    The program reads ``nbytes`` and writes ``nbytes`` (XLA's cost analysis counts both), and
    does 2 FLOPs per 8 bytes, far below any ridge point: its time is memory traffic.

    Args:
        device: where to run; default the first of ``jax.devices()``.
        nbytes: bytes of the input (larger than the caches, so memory is measured, not cache).
        repeats: timed calls.

    Returns:
        Bytes read and written per second.
    """
    if nbytes < 4:
        raise ValueError(f"memory_bandwidth_bytes_per_s needs at least 4 bytes, got {nbytes}.")
    x = jax.device_put(jnp.ones((nbytes // 4,), jnp.float32), _on(device))  # x: f32[nbytes/4]
    return achieved_flops(jax.jit(lambda v: v * 2.0 + 1.0), x, repeats=repeats).bytes_per_s


@dataclass(frozen=True)
class Roofline:
    """Measured ceilings of one device kind."""

    device_kind: str             # e.g. "cpu:cpu" or "gpu:NVIDIA H200"
    peak_flops_per_s: float      # best measured matmul FLOP/s
    memory_bytes_per_s: float    # measured streaming bandwidth (read + write bytes per second)
    dtype: str                   # element type of the matmuls

    @property
    def ridge_flops_per_byte(self) -> float:
        """The intensity where the two ceilings meet: below it memory bounds, above it compute."""
        return self.peak_flops_per_s / self.memory_bytes_per_s

    def attainable_flops_per_s(self, flops_per_byte):
        """``min(peak, bandwidth * intensity)`` for one intensity or an array of them."""
        intensity = np.asarray(flops_per_byte, dtype=float)
        if np.any(intensity < 0):
            raise ValueError("Arithmetic intensity (FLOPs per byte) cannot be negative.")
        value = np.minimum(self.peak_flops_per_s, self.memory_bytes_per_s * intensity)
        return float(value) if value.ndim == 0 else value

    def __str__(self) -> str:
        return (f"{self.device_kind}: peak {self.peak_flops_per_s / 1e9:.1f} GFLOP/s "
                f"({self.dtype} matmul), memory {self.memory_bytes_per_s / 1e9:.1f} GB/s, "
                f"ridge {self.ridge_flops_per_byte:.1f} FLOP/byte")


def measure_roofline(device: jax.Device | None = None, *,
                     sizes: Sequence[int] = (256, 512, 1024, 2048), dtype: str = "float32",
                     nbytes: int = 64 * 2**20, repeats: int = 5) -> Roofline:
    """Measure one device's roofline: peak matmul FLOP/s and streaming memory bandwidth.

    Args:
        device: default the first of ``jax.devices()``.
        sizes, dtype: the matmuls of :func:`peak_matmul_flops_per_s`.
        nbytes: the buffer of :func:`memory_bandwidth_bytes_per_s`.
        repeats: timed calls per measurement.

    Returns:
        A :class:`Roofline`.

    References:
        Williams, Waterman & Patterson, CACM 2009. https://doi.org/10.1145/1498765.1498785
    """
    device = _on(device)
    return Roofline(
        device_kind=f"{device.platform}:{device.device_kind}",
        peak_flops_per_s=peak_matmul_flops_per_s(device, sizes=sizes, dtype=dtype,
                                                 repeats=repeats),
        memory_bytes_per_s=memory_bandwidth_bytes_per_s(device, nbytes=nbytes,
                                                        repeats=repeats),
        dtype=str(jnp.dtype(dtype)))


def rooflines(devices: Sequence[jax.Device] | None = None, **options) -> dict[str, Roofline]:
    """One measured :class:`Roofline` per device kind among ``devices`` (first device of each).

    Args:
        devices: default ``jax.devices()`` (GPUs where present) plus the host's first CPU.
        **options: passed to :func:`measure_roofline`.

    Returns:
        ``{"platform:device_kind": Roofline}``.
    """
    if devices is None:
        devices = list(jax.devices())
        if devices[0].platform != "cpu":
            devices.append(jax.devices("cpu")[0])
    first: dict[str, jax.Device] = {}
    for d in devices:
        first.setdefault(f"{d.platform}:{d.device_kind}", d)
    return {kind: measure_roofline(d, **options) for kind, d in first.items()}


# ----------------------------------------------------------------------------------------------
# Each GEMM of a layer on the roofline: the planner's per-GEMM rule (clusterlab.analytic.gemm) held
# to a measurement. A GEMM's time is bounded by the larger of its FLOPs at the peak and its bytes at
# the memory bandwidth; here both ceilings are the device's measured ones (a Roofline), and the
# GEMM's FLOPs and bytes are XLA's cost analysis of the compiled matmul.
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GemmOnRoofline:
    """One GEMM timed on a device and set against that device's measured roofline.

    Attributes:
        gemm: its shape, ``batch`` times ``A[m, k] @ B[k, n]`` (a
        :class:`clusterlab.analytic.gemm.Gemm`). cost: XLA's FLOPs and bytes of the compiled matmul
        (of ``dtype``, e.g. 4 bytes a value). timing: its measured seconds.
        ceilings: the roofline it is held to (peak FLOP/s and memory bytes/s).
    """

    gemm: Gemm
    cost: ProgramCost
    timing: Timing
    ceilings: Roofline

    @property
    def compute_s(self) -> float:
        """Seconds of its FLOPs at the peak (no memory limit)."""
        return self.cost.flops / self.ceilings.peak_flops_per_s

    @property
    def memory_s(self) -> float:
        """Seconds of its bytes at the memory bandwidth (no compute limit)."""
        return self.cost.bytes_accessed / self.ceilings.memory_bytes_per_s

    @property
    def bound_s(self) -> float:
        """Seconds the roofline allows: ``max(compute_s, memory_s)``."""
        return max(self.compute_s, self.memory_s)

    @property
    def bound_by(self) -> str:
        """``"compute"`` or ``"memory"``: the ceiling that sets :attr:`bound_s`."""
        return "compute" if self.compute_s >= self.memory_s else "memory"

    @property
    def flops_per_s(self) -> float:
        """Achieved FLOP/s: XLA's FLOPs over the median time (:class:`Achieved`'s)."""
        return Achieved(self.cost, self.timing).flops_per_s

    @property
    def of_bound(self) -> float:
        """The bound over the median time: 1 on the roofline, above 1 faster than it allows."""
        return self.bound_s / self.timing.median_s

    @property
    def of_peak(self) -> float:
        """The achieved FLOP/s over the peak."""
        return self.flops_per_s / self.ceilings.peak_flops_per_s


def _gemm_dims(g: Gemm) -> tuple[int, int, int, int]:
    """``(batch, m, n, k)`` as integers, or a ValueError: a GEMM with a fractional dimension (a
    tensor-parallel GPU's average share of heads) is a model's average, not a matmul to run."""
    dims = {"batch": g.batch, "m": g.m, "n": g.n, "k": g.k}
    fractional = [f"{name}={value}" for name, value in dims.items() if value != int(value)]
    if fractional:
        raise ValueError(f"GEMM {g.pass_} {g.name} has fractional dimensions "
                         f"({', '.join(fractional)}) and cannot run as a matmul; choose a "
                         f"tensor_parallel that divides n_heads and the widths.")
    return int(g.batch), int(g.m), int(g.n), int(g.k)


def gemm_operands(g: Gemm, device: jax.Device | None = None, *, dtype: str = "float32",
                  seed: int = 3) -> tuple[jax.Array, jax.Array]:
    """Random normal operands of one GEMM on ``device``: ``A`` of shape ``[batch, m, k]`` and
    ``B`` of ``[batch, k, n]``, of ``dtype``, so that ``jnp.matmul(A, B)`` is the GEMM.

    Raises:
        ValueError: when a dimension of ``g`` is fractional.
    """
    batch, m, n, k = _gemm_dims(g)
    key_a, key_b = jax.random.split(jax.random.key(seed))
    a = jax.random.normal(key_a, (batch, m, k), dtype)  # a: [batch, m, k]
    b = jax.random.normal(key_b, (batch, k, n), dtype)  # b: [batch, k, n]
    device = _on(device)
    return jax.device_put(a, device), jax.device_put(b, device)


@functools.cache
def _batched_matmul() -> Callable[..., jax.Array]:
    """One jitted ``jnp.matmul`` (built on first use: the library runs no JAX at import)."""
    return jax.jit(jnp.matmul)


def gemm_cost(g: Gemm, *, dtype: str = "float32") -> ProgramCost:
    """XLA's FLOPs and bytes of one GEMM compiled as ``jnp.matmul`` of ``[batch, m, k]`` by
    ``[batch, k, n]`` (from shapes alone: nothing runs). Its FLOPs are ``g.flops``, ``2 m n k``
    per multiplication; its bytes A, B and C once each at ``dtype``'s size.

    Raises:
        ValueError: when a dimension of ``g`` is fractional.
    """
    batch, m, n, k = _gemm_dims(g)
    return program_cost(_batched_matmul(), jax.ShapeDtypeStruct((batch, m, k), dtype),
                        jax.ShapeDtypeStruct((batch, k, n), dtype))


def time_gemms(gemms: Sequence[Gemm], roofline: Roofline, device: jax.Device | None = None, *,
               dtype: str = "float32", warmup: int = 1, repeats: int = 5,
               peak_from_fastest: bool = True) -> tuple[GemmOnRoofline, ...]:
    """Time each GEMM on one device, taking turns, and set it against the device's roofline.

    Each GEMM runs as ``jnp.matmul`` of random ``[batch, m, k]`` and ``[batch, k, n]`` operands
    of ``dtype`` (:func:`gemm_operands`); its FLOPs and bytes are XLA's cost analysis of that
    program (:func:`gemm_cost`). The GEMMs are timed with :func:`time_interleaved` (every round
    calls each once, each call waited for), so a change in the machine's load falls on all of
    them alike and their ratios, such as a layer's split of GEMM time, stay meaningful.

    Args:
        gemms: the GEMMs, e.g. :func:`clusterlab.analytic.gemm.transformer_layer_gemms` of a
        host-sized
            layer; whole-number dimensions.
        roofline: the device's measured ceilings (:func:`measure_roofline` on the same device,
            in the same run), of the same ``dtype``.
        device: where to run; default the first of ``jax.devices()``.
        dtype: element type of the operands.
        warmup: untimed rounds first (compilation).
        repeats: timed rounds.
        peak_from_fastest: a ceiling is the best rate seen: where a GEMM ran faster than
            ``roofline``'s peak (measured at another, busier moment of a shared machine), every
            row's ceilings get that GEMM's rate as their peak. False keeps ``roofline`` as given.

    Returns:
        One :class:`GemmOnRoofline` per GEMM, in the order of ``gemms``, all with the same
        ``ceilings``.

    Raises:
        ValueError: when ``gemms`` is empty, a dimension is fractional, or the roofline is of
            another dtype or device kind than the GEMMs.

    References:
        Williams, Waterman & Patterson, CACM 2009. https://doi.org/10.1145/1498765.1498785
    """
    if not gemms:
        raise ValueError("time_gemms needs at least one GEMM.")
    device = _on(device)
    kind = f"{device.platform}:{device.device_kind}"
    if roofline.device_kind != kind:
        raise ValueError(f"The roofline is {roofline.device_kind!r}'s but the GEMMs run on "
                         f"{kind!r}: measure the roofline on the same device "
                         f"(bench.measure_roofline).")
    if str(jnp.dtype(dtype)) != roofline.dtype:
        raise ValueError(f"The roofline's peak is of {roofline.dtype} matmuls but the GEMMs are "
                         f"{jnp.dtype(dtype)}: measure it with dtype={str(jnp.dtype(dtype))!r}.")
    costs = [gemm_cost(g, dtype=dtype) for g in gemms]
    operands = [gemm_operands(g, device, dtype=dtype) for g in gemms]
    matmul = _batched_matmul()
    timings = time_interleaved({str(i): functools.partial(matmul, *ops)
                                for i, ops in enumerate(operands)},
                               warmup=warmup, repeats=repeats)
    ceilings = roofline
    if peak_from_fastest:
        fastest_flops_per_s = max(c.flops / timings[str(i)].median_s
                                  for i, c in enumerate(costs))
        if fastest_flops_per_s > roofline.peak_flops_per_s:
            ceilings = Roofline(roofline.device_kind, fastest_flops_per_s,
                                roofline.memory_bytes_per_s, roofline.dtype)
    return tuple(GemmOnRoofline(g, c, timings[str(i)], ceilings)
                 for i, (g, c) in enumerate(zip(gemms, costs)))
