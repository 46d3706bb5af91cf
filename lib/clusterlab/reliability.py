"""Failures that grow with the number of GPUs, checkpoint intervals, and stragglers.

A synchronous training job stops when any one of its GPUs (or their hosts, links, switches)
fails. With independent failures at a constant rate (exponentially distributed times between
failures), the failure rates add: ``n`` GPUs that each fail once every ``M`` seconds on average
fail together once every ``M / n`` seconds. Checkpointing trades a fixed cost now (writing the
checkpoint, ``delta`` seconds) against work lost later (on average half an interval plus the
restart), and the interval that balances the two is Young's ``sqrt(2 * delta * M)``.

Times are in seconds (``_s``); rates in events per second (``_per_s``). ``checkpoint_write_s``
is the time the job is stalled writing one checkpoint; ``interval_s`` is the compute time between
two checkpoints (not counting the write).

References:
    Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974.
    https://doi.org/10.1145/361147.361115
    Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
    Future Generation Computer Systems 22(3), 2006. https://doi.org/10.1016/j.future.2004.11.016
    Dubey et al., "The Llama 3 Herd of Models", 2024, Sec. 3.3.4.
    https://arxiv.org/abs/2407.21783
"""

from __future__ import annotations

import math

import numpy as np
from clusterlab._checks import count as _count, positive as _positive

__all__ = [
    "cluster_mtbf_s", "failure_rate_per_s", "expected_failures", "probability_no_failure",
    "mtbf_from_failures_s", "young_interval_s", "daly_interval_s", "expected_lost_fraction",
    "synchronous_step_times_s",
]


def cluster_mtbf_s(per_gpu_mtbf_s: float, n_gpus: int) -> float:
    """Mean time between failures of a job that stops when any of ``n_gpus`` fails.

    Independent failures at constant rates add up: ``n`` GPUs fail ``n`` times as often as one.

    Args:
        per_gpu_mtbf_s: mean time between failures of one GPU (with its share of host, network
            and software failures), in seconds (> 0).
        n_gpus: number of GPUs the job needs all of (integer >= 1).

    Returns:
        ``per_gpu_mtbf_s / n_gpus`` in seconds.

    Raises:
        ValueError: if the MTBF is not positive or ``n_gpus`` is not a positive integer.

    References:
        Young 1974; Dubey et al. 2024 (Llama 3), Sec. 3.3.4.
    """
    return _positive("per_gpu_mtbf_s", per_gpu_mtbf_s) / _count("n_gpus", n_gpus)


def failure_rate_per_s(per_gpu_mtbf_s: float, n_gpus: int = 1) -> float:
    """Failures per second of ``n_gpus`` GPUs: ``n_gpus / per_gpu_mtbf_s``.

    Args:
        per_gpu_mtbf_s: mean time between failures of one GPU in seconds (> 0).
        n_gpus: number of GPUs (integer >= 1); 1 gives the rate of one GPU.

    Returns:
        The failure rate in failures per second (the reciprocal of :func:`cluster_mtbf_s`).

    Raises:
        ValueError: if the MTBF is not positive or ``n_gpus`` is not a positive integer.

    References:
        Young 1974 (Poisson failures).
    """
    return 1.0 / cluster_mtbf_s(per_gpu_mtbf_s, n_gpus)


def expected_failures(n_gpus: int, per_gpu_mtbf_s: float, duration_s: float) -> float:
    """Expected number of failures of ``n_gpus`` GPUs over ``duration_s`` seconds.

    Args:
        n_gpus: number of GPUs (integer >= 1).
        per_gpu_mtbf_s: mean time between failures of one GPU in seconds (> 0).
        duration_s: length of the run in seconds (>= 0).

    Returns:
        ``n_gpus * duration_s / per_gpu_mtbf_s`` (the mean of a Poisson count).

    Raises:
        ValueError: on a non-positive MTBF, a negative duration or a bad ``n_gpus``.

    References:
        Dubey et al. 2024 (Llama 3), Sec. 3.3.4.
    """
    duration = _positive("duration_s", duration_s, allow_zero=True)
    return duration * failure_rate_per_s(per_gpu_mtbf_s, n_gpus)


def probability_no_failure(n_gpus: int, per_gpu_mtbf_s: float, duration_s: float) -> float:
    """Probability that ``n_gpus`` GPUs run ``duration_s`` seconds without a single failure.

    Args:
        n_gpus: number of GPUs (integer >= 1).
        per_gpu_mtbf_s: mean time between failures of one GPU in seconds (> 0).
        duration_s: length of the run in seconds (>= 0).

    Returns:
        ``exp(-expected_failures(...))``, the Poisson probability of zero events.

    Raises:
        ValueError: as :func:`expected_failures`.

    References:
        Young 1974 (Poisson failures).
    """
    return math.exp(-expected_failures(n_gpus, per_gpu_mtbf_s, duration_s))


def mtbf_from_failures_s(n_failures: int, duration_s: float, n_units: int = 1) -> float:
    """Per-unit MTBF implied by ``n_failures`` observed on ``n_units`` units over ``duration_s``.

    The inverse of :func:`expected_failures`: ``n_units * duration_s / n_failures``. With
    ``n_units=1`` it is the MTBF of the whole system that was observed.

    Args:
        n_failures: failures observed (integer >= 1).
        duration_s: observation time in seconds (> 0).
        n_units: number of units (e.g. GPUs) the failures are spread over (integer >= 1).

    Returns:
        The mean time between failures of one unit, in seconds.

    Raises:
        ValueError: if ``n_failures`` or ``n_units`` is not a positive integer or the duration is
            not positive.

    References:
        Dubey et al. 2024 (Llama 3), Sec. 3.3.4: 419 unexpected interruptions in 54 days on
        16,384 H100 GPUs.
    """
    failures = _count("n_failures", n_failures)
    return _count("n_units", n_units) * _positive("duration_s", duration_s) / failures


def young_interval_s(checkpoint_write_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum compute time between checkpoints, ``sqrt(2 * delta * M)``.

    It minimises :func:`expected_lost_fraction` (with any restart time, which does not depend on
    the interval). Accurate when ``checkpoint_write_s`` is much smaller than ``mtbf_s``.

    Args:
        checkpoint_write_s: seconds the job stalls to write one checkpoint, ``delta`` (> 0).
        mtbf_s: mean time between failures of the whole job, ``M``, in seconds (> 0).

    Returns:
        The interval in seconds.

    Raises:
        ValueError: if either argument is not positive and finite.

    References:
        Young 1974, https://doi.org/10.1145/361147.361115.
    """
    delta = _positive("checkpoint_write_s", checkpoint_write_s)
    mtbf = _positive("mtbf_s", mtbf_s)
    return math.sqrt(2.0 * delta * mtbf)


def daly_interval_s(checkpoint_write_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum compute time between checkpoints.

    ``sqrt(2 delta M) * [1 + (1/3) sqrt(delta / 2M) + (1/9) (delta / 2M)] - delta`` when
    ``delta < 2M``, else ``M``. It accounts for failures during the checkpoint write and for the
    time already spent, and stays sensible when ``delta`` is not small against ``M``.

    Args:
        checkpoint_write_s: seconds the job stalls to write one checkpoint, ``delta`` (> 0).
        mtbf_s: mean time between failures of the whole job, ``M``, in seconds (> 0).

    Returns:
        The interval in seconds.

    Raises:
        ValueError: if either argument is not positive and finite.

    References:
        Daly 2006, the higher-order (perturbation) solution,
        https://doi.org/10.1016/j.future.2004.11.016.
    """
    delta = _positive("checkpoint_write_s", checkpoint_write_s)
    mtbf = _positive("mtbf_s", mtbf_s)
    if delta >= 2.0 * mtbf:
        return mtbf
    ratio = delta / (2.0 * mtbf)
    return math.sqrt(2.0 * delta * mtbf) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - delta


def expected_lost_fraction(interval_s, checkpoint_write_s: float, mtbf_s: float,
                           restart_s: float = 0.0):
    """First-order fraction of wall-clock time lost to checkpoints and failures.

    ``delta / tau`` is spent writing checkpoints; each failure (one every ``M`` seconds) costs on
    average half an interval of redone work plus the restart, ``(tau / 2 + R) / M``. The sum is
    minimal at Young's interval. The model is first order: it holds while ``tau``, ``delta`` and
    ``R`` are much smaller than ``M``; values near or above 1 mean the job hardly progresses.

    Args:
        interval_s: compute time between checkpoints, ``tau``, in seconds (> 0); a float or an
            array of intervals (e.g. for a plot).
        checkpoint_write_s: seconds to write one checkpoint, ``delta`` (>= 0).
        mtbf_s: mean time between failures of the whole job, ``M``, in seconds (> 0).
        restart_s: seconds from a failure until training runs again, ``R`` (>= 0): detection,
            rescheduling, loading the checkpoint.

    Returns:
        ``delta / tau + (tau / 2 + R) / M``; a float for a scalar interval, else an array of the
        same shape.

    Raises:
        ValueError: if an interval or ``mtbf_s`` is not positive, or a time is negative.

    References:
        Young 1974, https://doi.org/10.1145/361147.361115.
    """
    tau = np.asarray(interval_s, dtype=float)
    if tau.size == 0 or not np.all(np.isfinite(tau)) or np.any(tau <= 0):
        raise ValueError(f"interval_s must be positive and finite, got {interval_s!r}.")
    delta = _positive("checkpoint_write_s", checkpoint_write_s, allow_zero=True)
    mtbf = _positive("mtbf_s", mtbf_s)
    restart = _positive("restart_s", restart_s, allow_zero=True)
    lost = delta / tau + (tau / 2.0 + restart) / mtbf
    return float(lost) if lost.ndim == 0 else lost


def synchronous_step_times_s(n_gpus: int, n_steps: int, *, mean_step_s: float,
                             std_step_s: float, seed: int = 0) -> np.ndarray:
    """Simulated step times of synchronous training: every step waits for the slowest GPU.

    Each GPU's time per step is drawn independently from a normal distribution (clipped at
    zero); the step ends when the last GPU finishes, so the step time is the maximum over GPUs.
    For normal noise the expected maximum grows like ``mean + std * sqrt(2 ln n)``.

    Args:
        n_gpus: number of GPUs that synchronise every step (integer >= 1).
        n_steps: number of steps to simulate (integer >= 1).
        mean_step_s: mean compute time of one GPU per step, in seconds (> 0).
        std_step_s: standard deviation of one GPU's time per step, in seconds (>= 0).
        seed: seed of the random generator, so results repeat.

    Returns:
        ``f64[n_steps]``: the synchronous step times in seconds.

    Raises:
        ValueError: if a count is not a positive integer or a time is out of range.

    References:
        Dean & Barroso, "The Tail at Scale", CACM 56(2), 2013.
        https://doi.org/10.1145/2408776.2408794
    """
    n = _count("n_gpus", n_gpus)
    steps = _count("n_steps", n_steps)
    mean = _positive("mean_step_s", mean_step_s)
    std = _positive("std_step_s", std_step_s, allow_zero=True)
    rng = np.random.default_rng(seed)
    out = np.empty(steps)  # f64[n_steps]
    chunk = max(1, 2**22 // n)  # bound memory to ~32 MiB per chunk of steps
    for start in range(0, steps, chunk):
        stop = min(steps, start + chunk)
        per_gpu_s = np.clip(rng.normal(mean, std, size=(stop - start, n)), 0.0, None)
        # per_gpu_s: f64[stop - start, n_gpus]
        out[start:stop] = per_gpu_s.max(axis=1)
    return out
