"""The alpha-beta model of collective communication, and lines fitted to measurements.

A message of ``nbytes`` bytes sent over one link costs ``alpha + nbytes * beta`` seconds:
``alpha`` is the fixed start-up latency of one step, ``beta = 1 / bandwidth`` the time per byte.
A collective algorithm is a sequence of such steps, so its cost is (number of steps) * alpha +
(bytes each device sends over its link) * beta. These functions teach the algorithms on one
level of links (and lab 09's two levels in sequence); across nodes NCCL's own model is
:func:`clusterlab.analytic.costmodel.cluster_collective`.

References:
    Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in
    MPICH", IJHPCA 19(1), 2005. https://doi.org/10.1177/1094342005051521
    NVIDIA nccl-tests, doc/PERFORMANCE.md. https://github.com/NVIDIA/nccl-tests
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from clusterlab import _checks

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
       "send_recv")
Op = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
             "send_recv"]
# The ops that clusterlab.device.collectives runs on devices: OPS less "reduce", since XLA has no
# reduce-to-one-device collective (its all-reduce does that work and more); and the ways it runs
# them (XLA's built-in collective, or one built by hand from ppermute).
RUNNABLE_OPS = tuple(op for op in OPS if op != "reduce")
IMPLEMENTATIONS = ("builtin", "ring", "recursive_doubling")

# Which algorithms the model knows for each op. "ring" is NCCL's default for large messages;
# "recursive_doubling"/"recursive_halving" and "rabenseifner" are MPICH's (Thakur et al. 2005);
# "tree" is a binomial tree (log2 n rounds, the whole message each round). "in_network" is a
# switch that reduces (NVIDIA SHARP on InfiniBand, NVLink SHARP in NVSwitch): each device sends
# its buffer up once and receives the result once (Graham et al. 2016).
ALGORITHMS = {
    "all_reduce": ("ring", "recursive_doubling", "rabenseifner", "tree", "in_network"),
    "all_gather": ("ring", "recursive_doubling"),
    "reduce_scatter": ("ring", "recursive_halving"),
    "all_to_all": ("ring", "pairwise"),
    "broadcast": ("ring", "tree"),
    "reduce": ("ring", "tree"),
    "send_recv": ("ring",),
}
Algorithm = Literal["ring", "recursive_doubling", "recursive_halving", "rabenseifner", "tree",
                    "in_network", "pairwise"]


def _check_op(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"Unknown collective {op!r}. Known collectives: {', '.join(OPS)}.")


def _check_positive_array(name: str, values: np.ndarray) -> None:
    """:func:`clusterlab._checks.positive` for every element of ``values``."""
    for value in np.ravel(values):
        _checks.positive(name, value)


def busbw_factor(op: Op, n_devices: int) -> float:
    """The factor nccl-tests multiplies algbw by to get bus bandwidth.

    Args:
        op: one of :data:`OPS`.
        n_devices: number of devices taking part.

    Returns:
        ``2(n-1)/n`` for all-reduce, ``(n-1)/n`` for all-gather, reduce-scatter and all-to-all,
        ``1`` for broadcast, reduce and send/recv.

    References:
        nccl-tests, doc/PERFORMANCE.md, "Bus bandwidth".
    """
    _check_op(op)
    n_devices = _checks.count("n_devices", n_devices)
    if op == "all_reduce":
        return 2 * (n_devices - 1) / n_devices
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n_devices - 1) / n_devices
    return 1.0


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: the buffer size divided by the time (nccl-tests)."""
    _checks.positive("nbytes", nbytes)
    _checks.positive("seconds", seconds)
    return nbytes / seconds


def busbw(op: Op, nbytes: float, seconds: float, n_devices: int) -> float:
    """Bus bandwidth in bytes/s: ``algbw * busbw_factor(op, n)``, comparable to the link speed."""
    return algbw(nbytes, seconds) * busbw_factor(op, n_devices)


def _log2_exact(n_devices: int, algorithm: str) -> int:
    steps = int(round(math.log2(n_devices)))
    if 2**steps != n_devices:
        raise ValueError(
            f"The {algorithm!r} algorithm needs a power-of-two device count, got n_devices={n_devices}. "
            f"Use algorithm='ring', or n_devices in (2, 4, 8, 16, ...).")
    return steps


def collective_steps_and_bytes(op: Op, nbytes: float, n_devices: int,
                               algorithm: Algorithm = "ring") -> tuple[int, float]:
    """Latency steps and bytes each device sends, for one collective under one algorithm.

    Args:
        op: one of :data:`OPS`.
        nbytes: full buffer in bytes, as nccl-tests counts it (see the module docstring).
        n_devices: number of devices.
        algorithm: one of ``ALGORITHMS[op]``.

    Returns:
        ``(steps, bytes_on_the_wire_per_device)``; the time is ``steps * alpha + bytes * beta``.
    """
    _check_op(op)
    n_devices = _checks.count("n_devices", n_devices)
    _checks.positive("nbytes", nbytes)
    if algorithm not in ALGORITHMS[op]:
        raise ValueError(f"Unknown algorithm {algorithm!r} for {op}. "
                         f"Known algorithms for {op}: {', '.join(ALGORITHMS[op])}.")
    if n_devices == 1:
        return 0, 0.0
    share = (n_devices - 1) / n_devices * nbytes
    if op == "send_recv":
        return 1, float(nbytes)
    if op == "all_reduce":
        if algorithm == "ring":  # reduce-scatter then all-gather, n-1 steps each
            return 2 * (n_devices - 1), 2 * share
        if algorithm == "in_network":  # up to the reducing switch, and back down
            return 2, float(nbytes)
        log_n = _log2_exact(n_devices, algorithm)
        if algorithm == "recursive_doubling":  # whole buffer exchanged in each of log2 n rounds
            return log_n, log_n * float(nbytes)
        if algorithm == "rabenseifner":  # recursive halving then recursive doubling
            return 2 * log_n, 2 * share
        return 2 * log_n, 2 * log_n * float(nbytes)  # tree: reduce then broadcast
    if op in ("all_gather", "reduce_scatter"):
        if algorithm == "ring":
            return n_devices - 1, share
        return _log2_exact(n_devices, algorithm), share
    if op == "all_to_all":
        return n_devices - 1, share
    # broadcast and reduce
    if algorithm == "ring":  # a pipelined chain: bandwidth term of one full buffer
        return n_devices - 1, float(nbytes)
    log_n = _log2_exact(n_devices, algorithm)
    return log_n, log_n * float(nbytes)


def collective_time(op: Op, nbytes: float, n_devices: int, bandwidth: float, latency: float = 0.0,
                    algorithm: Algorithm = "ring") -> float:
    """Predicted time in seconds of one collective under the alpha-beta model.

    Args:
        op: one of :data:`OPS`.
        nbytes: full buffer in bytes, as nccl-tests counts it (see the module docstring).
        n_devices: number of devices.
        bandwidth: link bandwidth in bytes/s, per device, per direction.
        latency: alpha, seconds per step.
        algorithm: one of ``ALGORITHMS[op]``; the default ring is NCCL's for large messages.

    Returns:
        Seconds. For the ring all-reduce: ``2(n-1) * latency + 2(n-1)/n * nbytes / bandwidth``.

    References:
        Thakur, Rabenseifner & Gropp (2005), Table 1 and sections 4.1-4.5.
    """
    _checks.positive("bandwidth", bandwidth)
    _checks.positive("latency", latency, allow_zero=True)
    steps, wire_bytes = collective_steps_and_bytes(op, nbytes, n_devices, algorithm)
    return steps * latency + wire_bytes / bandwidth


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted line ``time = alpha + beta * nbytes``.

    Attributes:
        alpha: start-up time in seconds.
        beta: seconds per byte; ``1 / beta`` is the bandwidth in bytes/s.
    """

    alpha: float
    beta: float

    @property
    def bandwidth(self) -> float:
        """Asymptotic bandwidth in bytes/s (``1 / beta``)."""
        return math.inf if self.beta == 0 else 1.0 / self.beta

    def predict(self, nbytes: float | Sequence[float]) -> np.ndarray | float:
        """Predicted seconds for messages of ``nbytes`` bytes."""
        values = self.alpha + self.beta * np.asarray(nbytes, dtype=float)
        return float(values) if values.ndim == 0 else values


def fit_alpha_beta(nbytes: Sequence[float], seconds: Sequence[float]) -> AlphaBeta:
    """Fit ``seconds = alpha + beta * nbytes`` to measurements.

    Message sizes span several decades, so the fit minimises the *relative* error of each point;
    an ordinary least-squares fit would let the largest message decide alpha. Both parameters are
    kept non-negative.

    Args:
        nbytes: message sizes in bytes (at least two distinct values).
        seconds: measured times in seconds, one per size.

    Returns:
        The fitted :class:`AlphaBeta`.
    """
    sizes = np.asarray(nbytes, dtype=float)
    times = np.asarray(seconds, dtype=float)
    if sizes.shape != times.shape or sizes.ndim != 1:
        raise ValueError(f"nbytes and seconds must be 1-D and of equal length, got shapes "
                         f"{sizes.shape} and {times.shape}.")
    if len(np.unique(sizes)) < 2:
        raise ValueError("Fitting alpha and beta needs at least two distinct message sizes.")
    _check_positive_array("nbytes", sizes)
    _check_positive_array("seconds", times)
    weights = 1.0 / times
    design = np.stack([np.ones_like(sizes), sizes], axis=1) * weights[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(sizes), rcond=None)
    if alpha < 0:  # latency too small to resolve: a pure bandwidth line
        ratio = sizes / times
        alpha, beta = 0.0, float(np.sum(ratio) / np.sum(ratio**2))
    elif beta < 0:  # bandwidth too large to resolve: a pure latency line
        alpha, beta = float(np.sum(weights) / np.sum(weights**2)), 0.0
    return AlphaBeta(alpha=float(alpha), beta=float(beta))


@dataclass(frozen=True, eq=False)
class HeldOutFit:
    """An alpha-beta line fitted on some message sizes and judged on sizes it did not see.

    Attributes:
        model: the :class:`AlphaBeta` fitted to the sizes that were not held out.
        held_out_bytes: f64[k], the held-out message sizes in bytes.
        measured_s: f64[k], their measured times in seconds.
        predicted_s: f64[k], the model's times for them in seconds.
    """

    model: AlphaBeta
    held_out_bytes: np.ndarray
    measured_s: np.ndarray
    predicted_s: np.ndarray

    @property
    def relative_errors(self) -> np.ndarray:
        """f64[k]: ``(predicted - measured) / measured``; +0.1 means the model is 10% too slow."""
        return (self.predicted_s - self.measured_s) / self.measured_s

    @property
    def median_abs_error(self) -> float:
        """Median of the absolute relative errors over the held-out sizes."""
        return float(np.median(np.abs(self.relative_errors)))

    @property
    def max_abs_error(self) -> float:
        """Largest absolute relative error over the held-out sizes."""
        return float(np.max(np.abs(self.relative_errors)))


def fit_held_out(nbytes: Sequence[float], seconds: Sequence[float],
                 held_out: Sequence[bool] | Sequence[int]) -> HeldOutFit:
    """Fit ``seconds = alpha + beta * nbytes`` without some sizes, then predict those sizes.

    A model that only reproduces the points it was fitted to proves little; holding sizes out
    (every other one to test interpolation, the largest ones to test extrapolation) shows how
    well it predicts.

    Args:
        nbytes: f[m], message sizes in bytes.
        seconds: f[m], measured times in seconds, one per size.
        held_out: which sizes to leave out of the fit: a boolean mask of length m, or indices.

    Returns:
        A :class:`HeldOutFit` with the model and its predictions for the held-out sizes.

    Raises:
        ValueError: when nothing is held out, or fewer than two distinct sizes remain to fit.
    """
    sizes = np.asarray(nbytes, dtype=float)
    times = np.asarray(seconds, dtype=float)
    if sizes.shape != times.shape or sizes.ndim != 1:
        raise ValueError(f"nbytes and seconds must be 1-D and of equal length, got shapes "
                         f"{sizes.shape} and {times.shape}.")
    selector = np.asarray(held_out)
    if selector.dtype == bool:
        if selector.shape != sizes.shape:
            raise ValueError(f"A held_out mask needs one entry per size ({sizes.size}), got "
                             f"shape {selector.shape}.")
        mask = selector
    else:
        mask = np.zeros(sizes.shape, dtype=bool)
        mask[selector.astype(int)] = True
    if not mask.any():
        raise ValueError("fit_held_out needs at least one held-out size to predict.")
    model = fit_alpha_beta(sizes[~mask], times[~mask])
    return HeldOutFit(model=model, held_out_bytes=sizes[mask], measured_s=times[mask],
                      predicted_s=np.asarray(model.predict(sizes[mask]), dtype=float))


def collective_alpha_beta(op: Op, n_devices: int, bandwidth: float, latency: float = 0.0,
                          algorithm: Algorithm = "ring") -> AlphaBeta:
    """One collective algorithm as a line ``time = alpha + beta * nbytes``.

    Every algorithm of :func:`collective_steps_and_bytes` sends a fixed number of steps and a
    number of bytes proportional to the buffer, so its time is a straight line in ``nbytes``:
    ``alpha = steps * latency`` and ``beta = (bytes sent per buffer byte) / bandwidth``.

    Args:
        op: one of :data:`OPS`.
        n_devices: number of devices.
        bandwidth: link bandwidth in bytes/s, per device, per direction.
        latency: seconds per step.
        algorithm: one of ``ALGORITHMS[op]``.

    Returns:
        The :class:`AlphaBeta` whose ``predict(nbytes)`` equals :func:`collective_time`.
    """
    _checks.positive("bandwidth", bandwidth)
    _checks.positive("latency", latency, allow_zero=True)
    steps, wire_bytes_per_byte = collective_steps_and_bytes(op, 1.0, n_devices, algorithm)
    return AlphaBeta(alpha=steps * latency, beta=wire_bytes_per_byte / bandwidth)


def crossover_bytes(first: AlphaBeta, second: AlphaBeta) -> float:
    """The message size in bytes at which two alpha-beta lines take the same time.

    Below it the line with the smaller ``alpha`` is faster, above it the one with the smaller
    ``beta`` (e.g. recursive doubling below, ring above, for an all-reduce).

    Args:
        first: one line, e.g. ``collective_alpha_beta(..., algorithm="ring")`` or a fit.
        second: the other line.

    Returns:
        ``(second.alpha - first.alpha) / (first.beta - second.beta)`` when that is a positive
        size; ``math.inf`` when the lines do not cross at any positive size (one is at least as
        fast as the other for every message).
    """
    if first.beta == second.beta:
        return math.inf
    size = (second.alpha - first.alpha) / (first.beta - second.beta)
    return float(size) if size > 0 else math.inf


def hierarchical_all_reduce_time(nbytes: float, gpus_per_node: int, n_nodes: int,
                                 intra_bandwidth: float, inter_bandwidth: float, *,
                                 intra_latency: float = 0.0, inter_latency: float = 0.0) -> float:
    """Two-level all-reduce run as three phases one after the other (lab 09's algorithm).

    This prices :func:`clusterlab.device.collectives.hierarchical_all_reduce` as written: the phases
    do not overlap, and latency is the caller's. It is *not* how NCCL runs an all-reduce across
    nodes (channels per NIC, NVLink and network pipelined, NVLS): for that, and for every
    cluster number in the chapters, the planner and the CLI, use :func:`cluster_collective`.

    After the ring reduce-scatter over the node's fast links (NVLink), GPU ``i`` of every node
    holds its node's sum of one ``1/gpus_per_node`` share; the GPUs with the same ``i`` (one per
    node, each behind its own NIC) all-reduce that share across nodes; a ring all-gather inside
    each node spreads the result. Each phase is a ring under :func:`collective_time`.

    Args:
        nbytes: the buffer each GPU all-reduces, in bytes.
        gpus_per_node: GPUs inside one node.
        n_nodes: nodes taking part.
        intra_bandwidth: bytes/s per GPU per direction inside a node (NVLink).
        inter_bandwidth: bytes/s per GPU per direction between nodes (its NIC's share).
        intra_latency: alpha of one step inside a node, seconds.
        inter_latency: alpha of one step between nodes, seconds.

    Returns:
        Seconds for the whole all-reduce.

    References:
        Jeaugey, "Massively Scale Your Deep Learning Training with NCCL 2.4", NVIDIA blog, 2019;
        Thakur et al. 2005.
    """
    gpus_per_node = _checks.count("gpus_per_node", gpus_per_node)
    n_nodes = _checks.count("n_nodes", n_nodes)
    intra_s = (collective_time("reduce_scatter", nbytes, gpus_per_node, intra_bandwidth,
                               intra_latency)
               + collective_time("all_gather", nbytes, gpus_per_node, intra_bandwidth,
                                 intra_latency))
    inter_s = collective_time("all_reduce", nbytes / gpus_per_node, n_nodes, inter_bandwidth,
                              inter_latency)
    return intra_s + inter_s



def link_from_fit(fit: AlphaBeta, op: Op, n_devices: int,
                  algorithm: Algorithm = "ring") -> tuple[float, float]:
    """The link behind a measured line: invert :func:`collective_alpha_beta`.

    A collective that takes ``steps`` latency steps and sends ``w`` bytes per buffer byte has the
    line ``alpha = steps * latency``, ``beta = w / bandwidth``; a fitted line therefore gives
    the link's ``bandwidth = w / beta`` and ``latency = alpha / steps``.

    Args:
        fit: a line fitted to the collective's measured times (:func:`fit_alpha_beta`).
        op: the collective that was measured, one of :data:`OPS`.
        n_devices: devices it ran over (at least 2).
        algorithm: the algorithm to read the line with.

    Returns:
        ``(bandwidth_bytes_per_s, latency_s)`` of one link; the bandwidth is ``inf`` when the
        fit has no bandwidth term.
    """
    if n_devices < 2:
        raise ValueError(f"A collective over n_devices={n_devices} device moves nothing; fit a level with at "
                         "least 2 devices.")
    steps, wire_bytes_per_byte = collective_steps_and_bytes(op, 1.0, n_devices, algorithm)
    bandwidth = math.inf if fit.beta == 0 else wire_bytes_per_byte / fit.beta
    return bandwidth, fit.alpha / steps


@dataclass(frozen=True)
class TwoLevelModel:
    """Links inside a host and between hosts, fitted to measured sweeps, and the all-reduces
    they predict.

    This is lab 09's fitted two-level alpha-beta form (phases in sequence, one link rate per
    level, no protocol or NVLS). It describes the hosts it was fitted on; to predict a real
    cluster use :func:`cluster_collective`, the one model of NCCL across nodes.

    Attributes:
        devices_per_host: devices in one host (processes' local devices).
        n_hosts: hosts (processes).
        intra_bandwidth: bytes/s per device per direction inside a host.
        intra_latency: seconds per step inside a host.
        inter_bandwidth: bytes/s per device per direction between hosts.
        inter_latency: seconds per step between hosts.
    """

    devices_per_host: int
    n_hosts: int
    intra_bandwidth: float
    intra_latency: float
    inter_bandwidth: float
    inter_latency: float

    def intra_all_reduce_s(self, nbytes: float | Sequence[float]) -> np.ndarray | float:
        """A ring all-reduce of ``nbytes`` per device among the devices of one host."""
        return self._map(nbytes, lambda b: collective_time(
            "all_reduce", b, self.devices_per_host, self.intra_bandwidth, self.intra_latency))

    def inter_all_reduce_s(self, nbytes: float | Sequence[float]) -> np.ndarray | float:
        """A ring all-reduce of ``nbytes`` per device among one device of each host."""
        return self._map(nbytes, lambda b: collective_time(
            "all_reduce", b, self.n_hosts, self.inter_bandwidth, self.inter_latency))

    def flat_all_reduce_s(self, nbytes: float | Sequence[float]) -> np.ndarray | float:
        """One ring over every device: each step waits for its slowest link, a network one."""
        n = self.devices_per_host * self.n_hosts
        slow_bandwidth = min(self.intra_bandwidth, self.inter_bandwidth)
        slow_latency = max(self.intra_latency, self.inter_latency)
        return self._map(nbytes, lambda b: collective_time("all_reduce", b, n, slow_bandwidth,
                                                           slow_latency))

    def hierarchical_all_reduce_s(self, nbytes: float | Sequence[float]) -> np.ndarray | float:
        """Reduce-scatter inside, all-reduce across, all-gather inside
        (:func:`hierarchical_all_reduce_time`)."""
        return self._map(nbytes, lambda b: hierarchical_all_reduce_time(
            b, self.devices_per_host, self.n_hosts, self.intra_bandwidth, self.inter_bandwidth,
            intra_latency=self.intra_latency, inter_latency=self.inter_latency))

    @staticmethod
    def _map(nbytes, fn):
        values = np.asarray(nbytes, dtype=float)
        out = np.vectorize(fn, otypes=[float])(values)
        return float(out) if out.ndim == 0 else out


def fit_two_level(intra_nbytes: Sequence[float], intra_s: Sequence[float],
                  inter_nbytes: Sequence[float], inter_s: Sequence[float], *,
                  devices_per_host: int, n_hosts: int) -> TwoLevelModel:
    """Fit the links of a two-level cluster from two measured all-reduce sweeps.

    ``intra`` is an all-reduce over the devices of one host (all hosts at once), ``inter`` one
    over the hosts (one all-reduce per device index, all at once, as in the middle phase of the
    hierarchical all-reduce). Each sweep is fitted with :func:`fit_alpha_beta` and read as a
    ring with :func:`link_from_fit`.

    Args:
        intra_nbytes, intra_s: per-device buffer sizes in bytes and seconds, inside a host.
        inter_nbytes, inter_s: the same across hosts.
        devices_per_host: devices per host (at least 2, or there is no intra level to fit).
        n_hosts: hosts (at least 2).

    Returns:
        The fitted :class:`TwoLevelModel`.

    References:
        Thakur et al. 2005; Jeaugey 2019 (NCCL's hierarchical algorithms).
    """
    devices_per_host = int(devices_per_host)
    n_hosts = int(n_hosts)
    if devices_per_host < 2 or n_hosts < 2:
        raise ValueError(f"A two-level fit needs at least 2 devices per host and 2 hosts, got "
                         f"{devices_per_host} and {n_hosts}; with one level, use "
                         "fit_alpha_beta.")
    intra_bw, intra_lat = link_from_fit(fit_alpha_beta(intra_nbytes, intra_s), "all_reduce",
                                        devices_per_host)
    inter_bw, inter_lat = link_from_fit(fit_alpha_beta(inter_nbytes, inter_s), "all_reduce",
                                        n_hosts)
    return TwoLevelModel(devices_per_host, n_hosts, intra_bw, intra_lat, inter_bw, inter_lat)


