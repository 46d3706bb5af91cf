"""Answer key of lab 09, several hosts (instructor-only: student copies leave keys/ out).

``lab09.3`` is a heartbeat failure detector: the student's ``declared_dead_at(beats, now,
timeout_s)`` (f32[R, K] heartbeat times per rank, ascending and inf-padded; f32 scalars) returns
when each rank is declared dead, f32[R], or inf: the first moment it has been silent for
``timeout_s`` since time 0 or its latest beat, if that moment comes by ``now``
(:func:`_reference_dead_at`). The hidden tests run it on 5 and 7 ranks (the lab runs 4) with
logs it never shows: a rank silent since its last beat (the hung peer a job would otherwise
wait for forever), a slow rank beating within the timeout, a rank that never beat, a stall
after which the rank came back, a silence not yet long enough at ``now``, and the right rank
among several. Declared times must match within 1e-6 s, inf where inf.
"""

from typing import NamedTuple

import numpy as np

from clusterlab.analytic import costmodel
from clusterlab.course import grading


def _reference_dead_at(beats: np.ndarray, now: float, timeout_s: float) -> np.ndarray:
    """Per rank, the first silence of timeout_s (from 0 or a beat, before the next beat)
    whose end comes by ``now``; inf where none."""
    declared = np.full(beats.shape[0], np.inf)
    for rank, row in enumerate(beats.astype(np.float64)):
        times = row[np.isfinite(row)]
        for begins, ends in zip(np.concatenate([[0.0], times]), np.append(times, np.inf)):
            if ends > begins + timeout_s and begins + timeout_s <= now:
                declared[rank] = begins + timeout_s
                break
    return declared


class _Log(NamedTuple):
    """One hidden test: its name, the heartbeats f32[R, K] (inf-padded), now, the timeout."""

    name: str
    beats: np.ndarray
    now: float
    timeout_s: float


def _regular(rank_count: int, width: int, period_s: float, rng) -> np.ndarray:
    """Every rank beating every period_s, with a little jitter, until the log's width."""
    times = np.arange(1, width + 1) * period_s + rng.uniform(0, 0.1 * period_s, (rank_count, width))
    return np.sort(times, axis=1).astype(np.float32)


def _silent_from(beats: np.ndarray, rank: int, after_s: float) -> np.ndarray:
    row = beats[rank]
    beats[rank] = np.where(row > after_s, np.inf, row)
    beats[rank] = np.sort(beats[rank])
    return beats


def _logs(rank_count: int, width: int, seed: int) -> list[_Log]:
    """The hidden tests on R = rank_count ranks and K = width columns (timeout 1 s, beats
    every 0.1 s: the log covers about width / 10 s, at least 4 s)."""
    rng = np.random.default_rng(grading.hidden_seed(seed))
    period, timeout = 0.1, 1.0
    end = width * period
    hung = _silent_from(_regular(rank_count, width, period, rng), rank_count - 2, 0.7)
    slow = _regular(rank_count, width, period, rng)
    slow[1] = np.where(np.arange(width) * 0.9 + 0.9 < end, np.arange(width) * 0.9 + 0.9,
                       np.inf).astype(np.float32)                    # beats every 0.9 s
    never = _regular(rank_count, width, period, rng)
    never[0] = np.inf
    stalled = _regular(rank_count, width, period, rng)
    silent = ((stalled[2] > 0.4) & (stalled[2] < 1.9)) | (stalled[2] > 2.5)
    stalled[2] = np.sort(np.where(silent, np.inf, stalled[2]))        # two long silences
    recent = _silent_from(_regular(rank_count, width, period, rng), 3, end - 0.6)
    two = _silent_from(_silent_from(_regular(rank_count, width, period, rng), 1, 0.95), 4, 0.35)
    return [
        _Log(f"{rank_count} ranks, rank 1 slow (a beat every 0.9 s)", slow, end, timeout),
        _Log(f"{rank_count} ranks, rank {rank_count - 2} silent since its last beat", hung,
             end, timeout),
        _Log(f"{rank_count} ranks, rank 0 never beat", never, end, timeout),
        _Log(f"{rank_count} ranks, rank 2 silent from 0.4 to 1.9 s and from 2.5 s", stalled,
             end, timeout),
        _Log(f"{rank_count} ranks, rank 3 silent for 0.6 s of the 1 s timeout", recent, end,
             timeout),
        _Log(f"{rank_count} ranks, ranks 1 and 4 silent since 0.95 and 0.35 s", two, end,
             timeout),
    ]


_SHAPES = ((5, 40, 901), (7, 55, 902))    # (R, K, seed); the lab runs 4 ranks


def _check_declared_dead_at(programs) -> None:
    for program, (rank_count, width, seed) in zip(programs, _SHAPES):
        for log in _logs(rank_count, width, seed):
            expected = _reference_dead_at(log.beats, log.now, log.timeout_s)
            got = np.asarray(program(log.beats, np.float32(log.now), np.float32(log.timeout_s)),
                             np.float64)
            same = (got.shape == expected.shape
                    and np.array_equal(np.isinf(got), np.isinf(expected))
                    and np.allclose(got[np.isfinite(got)], expected[np.isfinite(expected)],
                                    rtol=0, atol=1e-6))
            if not same:
                raise grading.Refused(
                    f"{log.name}: the declared times: {np.round(got, 3).tolist()}, expected "
                    f"{np.round(expected, 3).tolist()}. Hint: a rank is dead a timeout after "
                    "its silence began (time 0 or a beat), if the next beat has not come by "
                    "then; a rank that stopped beating has no next beat, and a job whose "
                    "watchdog misses it waits forever. Slow beats within the timeout are alive.")


KEY = {
    # the inter-host phase: a ring all-reduce over 8 hosts of 1/8 of the 1 GiB buffer
    "lab09.1": grading.close(costmodel.collective_steps_and_bytes("all_reduce", 2**30 / 8, 8)[1],
                             name="network bytes per GPU",
                             hint="Which part of the buffer does each GPU carry across hosts, and "
                                  "among how many peers is that ring all-reduce?"),
    "lab09.2": grading.close(
        costmodel.hierarchical_all_reduce_time(2**30, 8, 8, 450e9, 50e9, intra_latency=3e-6,
                                               inter_latency=10e-6),
        name="hierarchical all-reduce time",
        hint="Build the two-level model with both links' bandwidths and latencies (bytes/s and "
             "seconds) and ask it for the hierarchical all-reduce of 2**30 bytes."),
    "lab09.3": grading.code(
        _check_declared_dead_at, name="dead-peer detector",
        hint="Every silence begins at time 0 or at a beat and ends at the next beat or never.",
        exports=[grading.Export(args=[((r, k), "float32"), ((), "float32"), ((), "float32")],
                                n_devices=1) for r, k, _ in _SHAPES]),
    # no references: the library has no heartbeat detector
}
