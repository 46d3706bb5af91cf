"""Timing harness and collective sweeps.

Rules every measurement here follows: compile and warm up first, block until the result is
ready, repeat, and report the median with the spread (25th to 75th percentile). Numbers from
simulated CPU devices measure this host, not a GPU fabric: compare them with the host's own
ceiling (:func:`memcpy_bandwidth`) measured in the same run.
"""

from __future__ import annotations

import re
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

from clusterlab import collectives, costmodel


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


_SIZE_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text: str) -> int:
    """Parse a byte count as nccl-tests does: ``4K`` is 4096 bytes, ``64M`` is 64 MiB.

    Raises:
        ValueError: for anything that is not a positive number with an optional K/M/G/T.
    """
    match = _SIZE_PATTERN.match(str(text))
    if not match:
        raise ValueError(f"Cannot read {text!r} as a size in bytes; write a number with an "
                         "optional K, M, G or T (powers of 1024), e.g. 4K or 64M.")
    value = float(match.group(1)) * _UNITS[match.group(2).upper()]
    if value < 1 or value != int(value):
        raise ValueError(f"A size must be a positive whole number of bytes, got {text!r}.")
    return int(value)


def format_bytes(nbytes: float) -> str:
    """``4096`` -> ``'4 KiB'``: binary units, as in nccl-tests' size arguments."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


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
        op: one of :data:`clusterlab.collectives.RUNNABLE_OPS`.
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
