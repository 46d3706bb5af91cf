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
    Dubey et al., "The Llama 3 Herd of Models", 2024, Sec. 3.3.4 and Table 5.
    https://arxiv.org/abs/2407.21783
    Kokolis et al., "Revisiting Reliability in Large-Scale Machine Learning Research Clusters",
    HPCA 2025 (effective training time ratio). https://arxiv.org/abs/2410.21680
"""

from __future__ import annotations

import math

import numpy as np
from clusterlab._checks import count as _count, positive as _positive

__all__ = [
    "cluster_mtbf_s", "failure_rate_per_s", "expected_failures", "probability_no_failure",
    "mtbf_from_failures_s", "young_interval_s", "daly_interval_s", "expected_lost_fraction",
    "synchronous_step_times_s", "goodput_fraction", "interruption_shares",
    "spare_nodes_needed", "LLAMA3_405B_INTERRUPTIONS",
]

# Root causes of the 419 unexpected interruptions of Llama 3 405B pre-training (54 days,
# 16,384 H100 GPUs): component -> (category, interruptions), as Table 5 of Dubey et al. 2024
# lists them. The counts add up to 419; the table's percentage for "Faulty GPU" (30.1%) does not
# match its count (148 / 419 = 35.3%), so shares are computed from the counts.
LLAMA3_405B_INTERRUPTIONS: dict[str, tuple[str, int]] = {
    "Faulty GPU": ("GPU", 148),
    "GPU HBM3 memory": ("GPU", 72),
    "Software bug": ("Dependency", 54),
    "Network switch/cable": ("Network", 35),
    "Host maintenance": ("Unplanned maintenance", 32),
    "GPU SRAM memory": ("GPU", 19),
    "GPU system processor": ("GPU", 17),
    "NIC": ("Host", 7),
    "NCCL watchdog timeouts": ("Unknown", 7),
    "Silent data corruption": ("GPU", 6),
    "GPU thermal interface + sensor": ("GPU", 6),
    "SSD": ("Host", 3),
    "Power supply": ("Host", 3),
    "Server chassis": ("Host", 2),
    "IO expansion board": ("Host", 2),
    "Dependency": ("Dependency", 2),
    "CPU": ("Host", 2),
    "System memory": ("Host", 2),
}


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
    tau, delta, mtbf, restart = _checkpoint_times(interval_s, checkpoint_write_s, mtbf_s,
                                                  restart_s)
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


def goodput_fraction(interval_s, checkpoint_write_s: float, mtbf_s: float,
                     restart_s: float = 0.0):
    """Fraction of wall-clock time spent on useful training, with failures, checkpoints, restarts.

    Daly's complete model for failures at a constant rate (exponential times between failures):
    a segment of ``tau`` seconds of work followed by a ``delta``-second checkpoint is retried
    until it completes without a failure, and every failure costs a restart of ``R`` seconds
    (which a failure can interrupt too). The expected wall time per segment is
    ``M exp(R/M) (exp((tau + delta)/M) - 1)``, so the goodput is

    ``tau / (M exp(R/M) (exp((tau + delta)/M) - 1))``.

    Without failures (``M`` to infinity) it is ``tau / (tau + delta)``; to first order in
    ``tau/M``, ``delta/tau`` and ``R/M`` it is ``1 - expected_lost_fraction(...)``; unlike the
    first-order model it stays in (0, 1) when the interval or the restart approaches ``M``.

    Args:
        interval_s: compute time between checkpoints, ``tau``, in seconds (> 0); a float or an
            array (e.g. for a plot).
        checkpoint_write_s: seconds the job stalls to write one checkpoint, ``delta`` (>= 0).
        mtbf_s: mean time between failures of the whole job, ``M``, in seconds (> 0).
        restart_s: seconds from a failure until training runs again, ``R`` (>= 0).

    Returns:
        Goodput in (0, 1]; a float for a scalar interval, else an array of the same shape.

    Raises:
        ValueError: if an interval or ``mtbf_s`` is not positive, or a time is negative.

    References:
        Daly 2006, the complete model of the wall-clock time,
        https://doi.org/10.1016/j.future.2004.11.016; Kokolis et al. 2025 (the same ratio as the
        effective training time ratio, ETTR), https://arxiv.org/abs/2410.21680.
    """
    tau, delta, mtbf, restart = _checkpoint_times(interval_s, checkpoint_write_s, mtbf_s,
                                                  restart_s)
    # expm1 keeps the no-failure limit exact when (tau + delta) / M is tiny.
    wall_s = mtbf * math.exp(restart / mtbf) * np.expm1((tau + delta) / mtbf)
    good = tau / wall_s
    return float(good) if good.ndim == 0 else good


def interruption_shares(interruptions: dict[str, tuple[str, int]] | None = None
                        ) -> dict[str, float]:
    """Share of interruptions per category, largest first.

    Args:
        interruptions: ``{component: (category, count)}``; defaults to
            :data:`LLAMA3_405B_INTERRUPTIONS`. Counts are non-negative integers, not all zero.

    Returns:
        ``{category: count / total}``, sorted by decreasing share; the shares add up to 1.

    Raises:
        ValueError: if a count is not a non-negative integer or all counts are zero.

    References:
        Dubey et al. 2024 (Llama 3), Table 5, https://arxiv.org/abs/2407.21783.
    """
    table = LLAMA3_405B_INTERRUPTIONS if interruptions is None else interruptions
    per_category: dict[str, int] = {}
    for component, (category, n) in table.items():
        per_category[category] = per_category.get(category, 0) + _count(
            f"count of {component!r}", n, minimum=0)
    total = sum(per_category.values())
    if total == 0:
        raise ValueError("interruptions must hold at least one interruption; all counts are 0.")
    return {category: n / total
            for category, n in sorted(per_category.items(), key=lambda kv: -kv[1])}


def spare_nodes_needed(n_nodes: int, node_mtbf_s: float, repair_s: float, *,
                       confidence: float = 0.99) -> int:
    """Hot spare nodes that cover the nodes under repair with a given probability.

    Each of ``n_nodes`` nodes fails at rate ``1 / node_mtbf_s`` and takes ``repair_s`` to come
    back, so the number of nodes out for repair at a random moment is Poisson with mean
    ``n_nodes * repair_s / node_mtbf_s`` (while that mean is a small part of the cluster). The
    answer is the smallest ``k`` with ``P(out <= k) >= confidence``: with ``k`` spares a failed
    node is replaced at once instead of waiting for its repair.

    Args:
        n_nodes: nodes the job runs on (integer >= 1).
        node_mtbf_s: mean time between failures of one node, in seconds (> 0); for ``g`` GPUs per
            node with a per-GPU MTBF ``m``, ``m / g`` (:func:`cluster_mtbf_s`).
        repair_s: seconds from a node's failure until it is back in the pool (> 0).
        confidence: probability that no failure waits for a spare, in (0, 1).

    Returns:
        The number of spare nodes.

    Raises:
        ValueError: on a bad count, a non-positive time, or a confidence outside (0, 1).

    References:
        Dubey et al. 2024 (Llama 3), Sec. 3.3.4 (failures per day at 16,384 GPUs).
    """
    nodes = _count("n_nodes", n_nodes)
    mean = nodes * _positive("repair_s", repair_s) / _positive("node_mtbf_s", node_mtbf_s)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}.")
    if mean >= nodes:
        raise ValueError(
            f"repair_s / node_mtbf_s must be well below 1 (a node is repaired long before it "
            f"fails again), got {repair_s!r} / {node_mtbf_s!r}.")
    from scipy.stats import poisson  # imported here: scipy is only needed for this quantile

    return int(poisson.ppf(confidence, mean))


def _checkpoint_times(interval_s, checkpoint_write_s, mtbf_s, restart_s):
    """Validated (interval array, write, MTBF, restart) of the checkpoint-interval models."""
    tau = np.asarray(interval_s, dtype=float)
    if tau.size == 0 or not np.all(np.isfinite(tau)) or np.any(tau <= 0):
        raise ValueError(f"interval_s must be positive and finite, got {interval_s!r}.")
    return (tau, _positive("checkpoint_write_s", checkpoint_write_s, allow_zero=True),
            _positive("mtbf_s", mtbf_s), _positive("restart_s", restart_s, allow_zero=True))
