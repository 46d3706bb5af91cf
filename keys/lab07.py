"""Answer key of lab 07, the data path and checkpoints (instructor-only: student copies leave
keys/ out).

``lab07.4`` is the prefetching loader's timeline: the student's ``prefetch_timeline(load_s,
compute_s, depth)`` (f32[N], f32[N], an int32 scalar) returns when each step ends, f32[N], for
one loader worker with a queue of ``depth`` batches (:func:`_reference_timeline` states the
model). The hidden tests run it on lengths (12 and 23), load patterns and depths (0 to 9) the
lab does not show: no prefetching, steady loads either side of the step, a slow file every
k-th batch that a shallow queue cannot hide, random times, and a depth beyond the run's
length. Each is compared with the model computed step by step in float64, within 1e-5.
"""

from typing import NamedTuple

import numpy as np

from clusterlab.analytic import reliability, storage
from clusterlab.course import grading

# a 25 ms step on 256 samples of 150 kB each
_KNEE_BYTES_PER_S = storage.required_read_bytes_per_s(1, 256 / 0.025, 150e3)
_LOAD_AT_HALF_MS = storage.load_time_s(256 * 150e3, _KNEE_BYTES_PER_S / 2) * 1e3


def _reference_timeline(load_s: np.ndarray, compute_s: np.ndarray, depth: int) -> np.ndarray:
    """When each step ends: batch i is loaded after batch i - 1 and after the step that used
    batch i - depth - 1 ended (its buffer is free); step i starts once step i - 1 has ended and
    batch i is loaded."""
    loaded, ended = [], []
    for i, (load, compute) in enumerate(zip(load_s.astype(np.float64),
                                            compute_s.astype(np.float64))):
        buffer_free = ended[i - depth - 1] if i - depth - 1 >= 0 else 0.0
        loaded.append(max(loaded[-1] if loaded else 0.0, buffer_free) + load)
        ended.append(max(ended[-1] if ended else 0.0, loaded[-1]) + compute)
    return np.array(ended)


class _Timeline(NamedTuple):
    """One hidden test: its name, the load and compute times f32[N], the queue's depth."""

    name: str
    load_s: np.ndarray
    compute_s: np.ndarray
    depth: int


def _slow_file_every(k: int, n: int, fast_s: float, slow_s: float) -> np.ndarray:
    loads = np.full(n, fast_s, np.float32)
    loads[k - 1::k] = slow_s
    return loads


def _timelines(n: int, seed: int) -> list[_Timeline]:
    """The hidden tests on N = n batches."""
    rng = np.random.default_rng(grading.hidden_seed(seed))
    step = np.full(n, 0.02, np.float32)
    random_loads = rng.uniform(0.005, 0.05, n).astype(np.float32)
    random_steps = rng.uniform(0.01, 0.03, n).astype(np.float32)
    slow = _slow_file_every(5, n, 0.012, 0.06)
    return [
        _Timeline(f"no prefetching (depth 0) on {n} random batches", random_loads,
                  random_steps, 0),
        _Timeline(f"depth 1, steady loads slower than the step, {n} batches",
                  np.full(n, 0.031, np.float32), step, 1),
        _Timeline(f"depth 1, a slow file every 5th of {n} batches", slow, step, 1),
        _Timeline(f"depth 4, a slow file every 5th of {n} batches", slow, step, 4),
        _Timeline(f"depth 3 on {n} random batches", random_loads, random_steps, 3),
        _Timeline(f"depth 9, deeper than needed, on {n} random batches", random_loads,
                  random_steps, 9),
    ]


_LENGTHS = ((12, 701), (23, 702))   # the lab shows 64 batches


def _check_prefetch_timeline(programs) -> None:
    for program, (n, seed) in zip(programs, _LENGTHS):
        for test in _timelines(n, seed):
            expected = _reference_timeline(test.load_s, test.compute_s, test.depth)
            got = program(test.load_s, test.compute_s, np.int32(test.depth))
            grading.require_close(
                f"{test.name}: when each step ends", got, expected, rtol=1e-5,
                hint="batch i may start loading once batch i - 1 is loaded and the step that "
                     "used batch i - depth - 1 has ended (not started); step i waits for step "
                     "i - 1 and for batch i. Depth 0 is no prefetching.")


KEY = {
    "lab07.1": grading.close(_KNEE_BYTES_PER_S / 1e9, name="read bandwidth at the knee (GB/s)",
                             hint="What must arrive for each step, and how long is a step? "
                                  "GB is 10^9 bytes, kB 10^3."),
    "lab07.2": grading.close(storage.starved_step_time_s(25.0, _LOAD_AT_HALF_MS, prefetch=False),
                             name="step time without prefetching (ms)",
                             hint="How long does loading one batch take at half the bandwidth? "
                                  "Without prefetching the GPU waits for it, then computes."),
    "lab07.3": grading.close(reliability.young_interval_s(30.0, 3 * 3600.0),
                             name="checkpoint interval (s)",
                             hint="Young's formula balances the time spent writing checkpoints "
                                  "against the work a failure loses; put both times in seconds."),
    "lab07.4": grading.code(
        _check_prefetch_timeline, name="prefetch timeline",
        hint="Keep when each batch is loaded and when each step ends, one batch at a time "
             "(jax.lax.fori_loop), and read the step end depth + 1 batches back.",
        exports=[grading.Export(args=[((n,), "float32"), ((n,), "float32"), ((), "int32")],
                                n_devices=1) for n, _ in _LENGTHS]),
    # no references: the library's prefetch model (storage.starved_step_time_s) prices a
    # steady state from two floats; it has no per-batch timeline
}
