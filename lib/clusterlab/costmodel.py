"""The alpha-beta model of collective communication.

A message of ``nbytes`` bytes sent over one link costs ``alpha + nbytes * beta`` seconds:
``alpha`` is the fixed start-up latency of one step, ``beta = 1 / bandwidth`` the time per byte.
A collective algorithm is a sequence of such steps, so its cost is (number of steps) * alpha +
(bytes each device sends over its link) * beta.

Conventions follow nccl-tests (``doc/PERFORMANCE.md``):

* ``nbytes`` is the *full buffer* as nccl-tests prints it in its ``size`` column: the per-device
  buffer for all-reduce, broadcast, reduce, all-to-all and send/recv; the gathered output for
  all-gather; the input that is scattered for reduce-scatter.
* ``bandwidth`` is in bytes/s, per device, per direction (unidirectional).
* ``algbw = nbytes / time``; ``busbw = algbw * busbw_factor(op, n)``. With the ring algorithm and
  no latency, busbw equals the link bandwidth, which is why nccl-tests reports it.

Across nodes, :func:`cluster_collective` is the one model of how NCCL runs a collective: NCCL
2.30.7's own tuning model (:mod:`clusterlab._nccl`: rings, trees, NVLS, NVLS-tree, CollNet, PAT;
LL/LL128/Simple), validated against published nccl-tests rows by regime
(:func:`validation_by_regime`); the planner, the chapters and ``python -m clusterlab expect``
use it. The alpha-beta functions above it teach the algorithms on one level of links.

References:
    Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in
    MPICH", IJHPCA 19(1), 2005. https://doi.org/10.1177/1094342005051521
    NVIDIA nccl-tests, doc/PERFORMANCE.md. https://github.com/NVIDIA/nccl-tests
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import NamedTuple, Sequence

import numpy as np

from clusterlab import _checks, _nccl
from clusterlab.published import nccl_tests

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
       "send_recv")

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


def _check_op(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"Unknown collective {op!r}. Known collectives: {', '.join(OPS)}.")


def _check_devices(n: int) -> None:
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"The number of devices must be a positive integer, got {n!r}.")


def _check_positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    if not np.all(np.isfinite(value)) or np.any(value < 0) or (not allow_zero and np.any(value == 0)):
        bound = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name} must be {bound} and finite, got {value!r}.")


def busbw_factor(op: str, n: int) -> float:
    """The factor nccl-tests multiplies algbw by to get bus bandwidth.

    Args:
        op: one of :data:`OPS`.
        n: number of devices taking part.

    Returns:
        ``2(n-1)/n`` for all-reduce, ``(n-1)/n`` for all-gather, reduce-scatter and all-to-all,
        ``1`` for broadcast, reduce and send/recv.

    References:
        nccl-tests, doc/PERFORMANCE.md, "Bus bandwidth".
    """
    _check_op(op)
    _check_devices(n)
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: the buffer size divided by the time (nccl-tests)."""
    _check_positive("nbytes", nbytes)
    _check_positive("seconds", seconds)
    return nbytes / seconds


def busbw(op: str, nbytes: float, seconds: float, n: int) -> float:
    """Bus bandwidth in bytes/s: ``algbw * busbw_factor(op, n)``, comparable to the link speed."""
    return algbw(nbytes, seconds) * busbw_factor(op, n)


def _log2_exact(n: int, algorithm: str) -> int:
    steps = int(round(math.log2(n)))
    if 2**steps != n:
        raise ValueError(
            f"The {algorithm!r} algorithm needs a power-of-two device count, got n={n}. "
            f"Use algorithm='ring', or n in (2, 4, 8, 16, ...).")
    return steps


def collective_steps_and_bytes(op: str, nbytes: float, n: int,
                               algorithm: str = "ring") -> tuple[int, float]:
    """Latency steps and bytes each device sends, for one collective under one algorithm.

    Args:
        op: one of :data:`OPS`.
        nbytes: full buffer in bytes, as nccl-tests counts it (see the module docstring).
        n: number of devices.
        algorithm: one of ``ALGORITHMS[op]``.

    Returns:
        ``(steps, bytes_on_the_wire_per_device)``; the time is ``steps * alpha + bytes * beta``.
    """
    _check_op(op)
    _check_devices(n)
    _check_positive("nbytes", nbytes)
    if algorithm not in ALGORITHMS[op]:
        raise ValueError(f"Unknown algorithm {algorithm!r} for {op}. "
                         f"Known algorithms for {op}: {', '.join(ALGORITHMS[op])}.")
    if n == 1:
        return 0, 0.0
    share = (n - 1) / n * nbytes
    if op == "send_recv":
        return 1, float(nbytes)
    if op == "all_reduce":
        if algorithm == "ring":  # reduce-scatter then all-gather, n-1 steps each
            return 2 * (n - 1), 2 * share
        if algorithm == "in_network":  # up to the reducing switch, and back down
            return 2, float(nbytes)
        log_n = _log2_exact(n, algorithm)
        if algorithm == "recursive_doubling":  # whole buffer exchanged in each of log2 n rounds
            return log_n, log_n * float(nbytes)
        if algorithm == "rabenseifner":  # recursive halving then recursive doubling
            return 2 * log_n, 2 * share
        return 2 * log_n, 2 * log_n * float(nbytes)  # tree: reduce then broadcast
    if op in ("all_gather", "reduce_scatter"):
        if algorithm == "ring":
            return n - 1, share
        return _log2_exact(n, algorithm), share
    if op == "all_to_all":
        return n - 1, share
    # broadcast and reduce
    if algorithm == "ring":  # a pipelined chain: bandwidth term of one full buffer
        return n - 1, float(nbytes)
    log_n = _log2_exact(n, algorithm)
    return log_n, log_n * float(nbytes)


def collective_time(op: str, nbytes: float, n: int, bandwidth: float, latency: float = 0.0,
                    algorithm: str = "ring") -> float:
    """Predicted time in seconds of one collective under the alpha-beta model.

    Args:
        op: one of :data:`OPS`.
        nbytes: full buffer in bytes, as nccl-tests counts it (see the module docstring).
        n: number of devices.
        bandwidth: link bandwidth in bytes/s, per device, per direction.
        latency: alpha, seconds per step.
        algorithm: one of ``ALGORITHMS[op]``; the default ring is NCCL's for large messages.

    Returns:
        Seconds. For the ring all-reduce: ``2(n-1) * latency + 2(n-1)/n * nbytes / bandwidth``.

    References:
        Thakur, Rabenseifner & Gropp (2005), Table 1 and sections 4.1-4.5.
    """
    _check_positive("bandwidth", bandwidth)
    _check_positive("latency", latency, allow_zero=True)
    steps, wire_bytes = collective_steps_and_bytes(op, nbytes, n, algorithm)
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
    _check_positive("nbytes", sizes)
    _check_positive("seconds", times)
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


def collective_alpha_beta(op: str, n: int, bandwidth: float, latency: float = 0.0,
                          algorithm: str = "ring") -> AlphaBeta:
    """One collective algorithm as a line ``time = alpha + beta * nbytes``.

    Every algorithm of :func:`collective_steps_and_bytes` sends a fixed number of steps and a
    number of bytes proportional to the buffer, so its time is a straight line in ``nbytes``:
    ``alpha = steps * latency`` and ``beta = (bytes sent per buffer byte) / bandwidth``.

    Args:
        op: one of :data:`OPS`.
        n: number of devices.
        bandwidth: link bandwidth in bytes/s, per device, per direction.
        latency: seconds per step.
        algorithm: one of ``ALGORITHMS[op]``.

    Returns:
        The :class:`AlphaBeta` whose ``predict(nbytes)`` equals :func:`collective_time`.
    """
    _check_positive("bandwidth", bandwidth)
    _check_positive("latency", latency, allow_zero=True)
    steps, wire_bytes_per_byte = collective_steps_and_bytes(op, 1.0, n, algorithm)
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

    This prices :func:`clusterlab.collectives.hierarchical_all_reduce` as written: the phases
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
    _check_devices(gpus_per_node)
    _check_devices(n_nodes)
    intra_s = (collective_time("reduce_scatter", nbytes, gpus_per_node, intra_bandwidth,
                               intra_latency)
               + collective_time("all_gather", nbytes, gpus_per_node, intra_bandwidth,
                                 intra_latency))
    inter_s = collective_time("all_reduce", nbytes / gpus_per_node, n_nodes, inter_bandwidth,
                              inter_latency)
    return intra_s + inter_s


def sharded_data_parallel_bytes_per_step(n_params: float, bytes_per_param: float, n: int,
                                         zero_stage: int) -> float:
    """Bytes each device sends per training step under data parallelism with ZeRO stage 0-3.

    With ``Psi = n_params * bytes_per_param`` (the bytes of all parameters, or of all gradients)
    and ring collectives (:func:`collective_steps_and_bytes`):

    * stage 0 (plain data parallelism): one all-reduce of the gradients, ``2 (n-1)/n Psi``;
    * stages 1 and 2: a reduce-scatter of the gradients (each device keeps the sum of its shard)
      and, after the update, an all-gather of the parameters: also ``2 (n-1)/n Psi``;
    * stage 3: parameters are all-gathered before the forward pass and again before the
      backward pass (they are freed in between), and the gradients reduce-scattered:
      ``3 (n-1)/n Psi``, 1.5 times plain data parallelism.

    Args:
        n_params: number of parameters.
        bytes_per_param: bytes per parameter and per gradient element as communicated (2 for
            BF16, 4 for FP32).
        n: data-parallel degree, the devices the states are sharded across.
        zero_stage: 0, 1, 2 or 3.

    Returns:
        Bytes sent per device per step (equal to the bytes received).

    References:
        Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
        Models", SC 2020, Section 7 (communication analysis of ZeRO-DP).
        https://arxiv.org/abs/1910.02054
    """
    _check_positive("n_params", n_params)
    _check_positive("bytes_per_param", bytes_per_param)
    _check_devices(n)
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be one of (0, 1, 2, 3), got {zero_stage!r}.")
    psi_bytes = float(n_params) * float(bytes_per_param)
    if n == 1:
        return 0.0
    if zero_stage == 0:
        return collective_steps_and_bytes("all_reduce", psi_bytes, n)[1]
    gather_bytes = collective_steps_and_bytes("all_gather", psi_bytes, n)[1]
    scatter_bytes = collective_steps_and_bytes("reduce_scatter", psi_bytes, n)[1]
    return (2 if zero_stage == 3 else 1) * gather_bytes + scatter_bytes


def data_parallel_bytes_per_step(n_params: float, bytes_per_grad: float, n: int) -> float:
    """Bytes each device sends per step of plain data parallelism: ``2 (n-1)/n`` of a gradient.

    One ring all-reduce of the gradient (``n_params * bytes_per_grad`` bytes) per step; the
    compiled program shows the buffer reduced (the gradient), the ring sends ``2 (n-1)/n`` of
    it and receives as much. Bucketing the gradient does not change the bytes, only how many
    all-reduces carry them.

    Args:
        n_params: number of parameters (= gradient elements).
        bytes_per_grad: bytes per gradient element as communicated (4 for FP32, 2 for BF16).
        n: data-parallel devices.

    Returns:
        Bytes sent per device per step; 0 for one device.

    References:
        Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
        workstations", JPDC 69(2), 2009. https://doi.org/10.1016/j.jpdc.2008.09.002
    """
    _check_positive("n_params", n_params)
    _check_positive("bytes_per_grad", bytes_per_grad)
    _check_devices(n)
    if n == 1:
        return 0.0
    return collective_steps_and_bytes("all_reduce", float(n_params) * float(bytes_per_grad), n)[1]


def gradient_buckets(total_bytes: int, bucket_bytes: int) -> list[int]:
    """Sizes in bytes of the buckets a gradient of ``total_bytes`` is cut into.

    ``ceil(total / bucket)`` buckets, all full but the last (as
    :func:`clusterlab.collectives.all_reduce_gradients` cuts them). Each is one all-reduce, so
    under a fitted per-call line ``t = alpha + beta * bytes`` the gradient costs
    ``len(buckets) * alpha + beta * total_bytes``: small buckets pay the latency many times.

    Args:
        total_bytes: bytes of the whole gradient.
        bucket_bytes: bytes per bucket.

    Returns:
        The bucket sizes, summing to ``total_bytes``.
    """
    _check_positive("total_bytes", total_bytes)
    _check_positive("bucket_bytes", bucket_bytes)
    total, bucket = int(total_bytes), int(bucket_bytes)
    full, rest = divmod(total, bucket)
    return [bucket] * full + ([rest] if rest else [])


# --- Tensor and pipeline parallelism -------------------------------------------------------------

class TensorParallelTraffic(NamedTuple):
    """The all-reduces of one tensor-parallel training step (Megatron style).

    Attributes:
        forward_all_reduces: all-reduces in the forward pass (one per column-then-row pair).
        backward_all_reduces: all-reduces in the backward pass.
        all_reduce_bytes: the buffer of each, in bytes: tokens * d_model * bytes_per_element.
        tp: devices on the tensor-parallel axis.
    """

    forward_all_reduces: int
    backward_all_reduces: int
    all_reduce_bytes: float
    tp: int

    @property
    def all_reduces(self) -> int:
        return self.forward_all_reduces + self.backward_all_reduces

    @property
    def total_bytes(self) -> float:
        """Bytes all-reduced per step, counted as nccl-tests counts a buffer."""
        return self.all_reduces * self.all_reduce_bytes

    @property
    def sent_bytes_per_device(self) -> float:
        """Bytes each device sends per step with ring all-reduces: 2(tp-1)/tp of the total."""
        if self.tp == 1:
            return 0.0
        return self.all_reduces * collective_steps_and_bytes("all_reduce", self.all_reduce_bytes,
                                                             self.tp)[1]


def tensor_parallel_bytes_per_step(tokens: int, d_model: int, n_pairs: int, tp: int, *,
                                   bytes_per_element: int = 4,
                                   first_input_needs_grad: bool = True) -> TensorParallelTraffic:
    """All-reduces of a Megatron tensor-parallel training step: count and bytes.

    Each column-parallel then row-parallel pair (an MLP block; attention is a second pair in a
    transformer layer) all-reduces its output forward (``g``) and the gradient of its input
    backward (``f``), each a buffer of ``tokens * d_model`` elements: per transformer layer
    4 all-reduces of ``B*S*D`` elements per step (Shoeybi et al. 2019). When the first pair's
    input is the data itself (no LayerNorm or embedding before it), nobody needs that gradient
    and its backward all-reduce disappears: ``2 n_pairs - 1``.

    Args:
        tokens: B*S, tokens (or examples) in the batch each device processes.
        d_model: D, the width of the activations all-reduced.
        n_pairs: column-then-row pairs in the model (MLP blocks; 2 per transformer layer).
        tp: devices on the tensor-parallel axis; with 1 there is nothing to all-reduce.
        bytes_per_element: 4 for fp32, 2 for bf16.
        first_input_needs_grad: whether the gradient of the first pair's input is computed.

    Returns:
        A :class:`TensorParallelTraffic`.

    References:
        Shoeybi et al., "Megatron-LM", 2019, Section 3. https://arxiv.org/abs/1909.08053
        Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
        Megatron-LM", SC 2021, Section 3.2. https://arxiv.org/abs/2104.04473
    """
    tokens = _checks.count("tokens", tokens)
    d_model = _checks.count("d_model", d_model)
    n_pairs = _checks.count("n_pairs", n_pairs)
    tp = _checks.count("tp", tp)
    bytes_per_element = _checks.count("bytes_per_element", bytes_per_element)
    if tp == 1:
        return TensorParallelTraffic(0, 0, float(tokens * d_model * bytes_per_element), 1)
    backward = n_pairs if first_input_needs_grad else n_pairs - 1
    return TensorParallelTraffic(n_pairs, backward, float(tokens * d_model * bytes_per_element),
                                 tp)


PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved")


def check_pipeline(stages: int, microbatches: int, schedule: str, *,
                   virtual_stages: int = 1) -> tuple[int, int, int]:
    """Validate a pipeline's shape; return ``(p, m, v)``.

    Args:
        stages: p, at least 1.
        microbatches: m, at least 1; a multiple of p for the interleaved schedule with v > 1,
            which runs micro-batches in groups of p (Narayanan et al. 2021, Section 2.2.2).
        schedule: one of :data:`PIPELINE_SCHEDULES`.
        virtual_stages: v, model chunks per device, at least 1; above 1 only when interleaved.
    """
    if schedule not in PIPELINE_SCHEDULES:
        raise ValueError(f"Unknown pipeline schedule {schedule!r}; known: "
                         f"{', '.join(PIPELINE_SCHEDULES)}.")
    p = _checks.count("stages", stages)
    m = _checks.count("microbatches", microbatches)
    v = _checks.count("virtual_stages", virtual_stages)
    if v > 1 and schedule != "interleaved":
        raise ValueError(f"virtual_stages = {v} needs schedule='interleaved'; {schedule!r} runs "
                         "one model chunk per device (virtual_stages=1).")
    if v > 1 and m % p:
        raise ValueError(f"The interleaved schedule runs micro-batches in groups of p = {p}: "
                         f"m = {m} is not a multiple of {p}. Use m = {-(-m // p) * p} (or "
                         "virtual_stages=1).")
    return p, m, v


def _check_pipeline(stages: int, microbatches: int, schedule: str) -> tuple[int, int]:
    if schedule == "interleaved":
        raise ValueError("Activation counts are modelled for 'gpipe' and '1f1b'; count an "
                         "interleaved schedule's with parallel.pipeline.make_schedule("
                         "...).held_microbatches().")
    return check_pipeline(stages, microbatches, schedule)[:2]


def pipeline_bubble_fraction(stages: int, microbatches: int, schedule: str = "gpipe", *,
                             virtual_stages: int = 1) -> float:
    """The fraction of a pipeline step each stage idles: ``(p-1) / (v m + p - 1)``.

    With p stages and m micro-batches, and every stage taking the same time per micro-batch, a
    step lasts ``m + p - 1`` forward slots and as many backward slots, of which each stage works
    ``m``. GPipe and 1F1B idle alike (v = 1); 1F1B only changes the order of the work, which
    bounds the activations a stage holds (:func:`pipeline_activation_microbatches`). The
    interleaved 1F1B schedule gives each device v model chunks (virtual stages) of ``1/v`` of its
    layers: filling and draining the pipeline then takes ``p - 1`` chunk passes of ``1/v`` of a
    slot each, so the bubble shrinks v-fold against the work, at the price of v times as many
    point-to-point messages.

    Args:
        stages: p, pipeline stages (devices along the pipeline).
        microbatches: m, micro-batches per step; a multiple of p when interleaved with v > 1.
        schedule: ``"gpipe"``, ``"1f1b"`` or ``"interleaved"``.
        virtual_stages: v, model chunks per device (``"interleaved"`` only), at least 1.

    Returns:
        The idle fraction, in [0, 1).

    References:
        Huang et al., "GPipe", NeurIPS 2019, Section 2.2. https://arxiv.org/abs/1811.06965
        Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
        Megatron-LM", SC 2021, Sections 2.2.1 and 2.2.2 (interleaved: bubble ``(p-1)/(v m)`` of
        the ideal time). https://arxiv.org/abs/2104.04473
    """
    p, m, v = check_pipeline(stages, microbatches, schedule, virtual_stages=virtual_stages)
    return (p - 1) / (v * m + p - 1)


def pipeline_activation_microbatches(stages: int, microbatches: int, schedule: str = "gpipe", *,
                                     stage: int = 0) -> int:
    """The most micro-batches whose activations one stage holds at once.

    GPipe runs all m forwards before any backward, so every stage holds all m. 1F1B starts the
    backward of a micro-batch as soon as it can and lets stage ``s`` run at most ``p - s``
    forwards ahead of its backwards: stage 0 holds ``min(p, m)``, the last stage 1.

    Args:
        stages: p.
        microbatches: m.
        schedule: ``"gpipe"`` or ``"1f1b"``.
        stage: which stage, 0 (the first, which holds the most) to p-1.

    Returns:
        A number of micro-batches; times the bytes of one micro-batch's stashed activations it
        is the stage's activation memory.

    References:
        Narayanan et al., SC 2021, Section 2.2.1 (1F1B limits in-flight micro-batches to p).
    """
    p, m = _check_pipeline(stages, microbatches, schedule)
    if not 0 <= stage < p:
        raise ValueError(f"stage must be in [0, {p - 1}] for {p} stages, got {stage!r}.")
    return m if schedule == "gpipe" else min(p - stage, m)


def link_from_fit(fit: AlphaBeta, op: str, n: int, algorithm: str = "ring") -> tuple[float, float]:
    """The link behind a measured line: invert :func:`collective_alpha_beta`.

    A collective that takes ``steps`` latency steps and sends ``w`` bytes per buffer byte has the
    line ``alpha = steps * latency``, ``beta = w / bandwidth``; a fitted line therefore gives
    the link's ``bandwidth = w / beta`` and ``latency = alpha / steps``.

    Args:
        fit: a line fitted to the collective's measured times (:func:`fit_alpha_beta`).
        op: the collective that was measured, one of :data:`OPS`.
        n: devices it ran over (at least 2).
        algorithm: the algorithm to read the line with.

    Returns:
        ``(bandwidth_bytes_per_s, latency_s)`` of one link; the bandwidth is ``inf`` when the
        fit has no bandwidth term.
    """
    if n < 2:
        raise ValueError(f"A collective over n={n} device moves nothing; fit a level with at "
                         "least 2 devices.")
    steps, wire_bytes_per_byte = collective_steps_and_bytes(op, 1.0, n, algorithm)
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


# --- One model of collectives across nodes: NCCL 2.30.7's own tuning model -----------------------
#
# cluster_collective prices a collective the way NCCL prices it when it picks an algorithm and a
# protocol: clusterlab._nccl is a port of ncclTopoTuneModel and ncclTopoGetAlgoTime of one
# release (NCCL_RELEASE), fed with the graphs its topology search would find on the node. No
# bandwidth or efficiency below is fitted to a published row; LAUNCH_OVERHEAD_S is the one
# fitted constant. validation_table holds the model against every published row, by regime.

#: The NCCL release whose tuning rules cluster_collective follows.
NCCL_RELEASE = _nccl.RELEASE
#: Achievable fraction of line rate of one NVLink and one NIC, as NCCL 2.30.7 counts them, for
#: the flow model (clusterlab.fabric) and line-rate arithmetic: an NVLink4 link is 20.6 of its
#: 25 GB/s (topo.h SM90_NVLINK_BW; S. Jeaugey, nccl-tests issue 212: "NCCL can get an effective
#: NVLink bandwidth of 370GB/s" of 450), and NCCL's search runs a 400 Gb/s NIC's channel at
#: 48 of its 50 GB/s (search.cc sm90SpeedArrayInter; 24 of 25 for 200 Gb/s, 12 of 12.5 for
#: 100 Gb/s; D. Addison, nccl-tests issue 290: "you should see 46-48GB/s per NIC"), so the flow
#: model's uncontended ring equals cluster_collective's.
NVLINK_EFFICIENCY = _nccl.NVLINK_BW_PER_LINK[90] / 25.0
NIC_EFFICIENCY = 48.0 / 50.0
#: Fixed cost of one collective call that NCCL's model leaves out (kernel launch, the
#: benchmark's synchronisation), in seconds: fitted to the 8x H200 sweep of stas00's
#: all_reduce_bench.py (a PyTorch benchmark, not nccl-tests) at <= 16 MiB, the rows with role
#: "set"; :func:`fit_launch_overhead` recomputes it and a test checks it.
LAUNCH_OVERHEAD_S = 23.0e-6

PROTOCOLS = _nccl.PROTOCOLS
#: Algorithms as NCCL_ALGO names them (lower case), plus "pairwise" for all-to-all, which
#: NCCL runs as grouped send/receive, outside its tuning model.
CLUSTER_ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree", "collnet_direct", "collnet_chain",
                      "pat", "pairwise")
#: What a PCIe link carries as NCCL's topology counts it, GB/s per direction: 12 for Gen3 x16
#: (topo.h PCI_BW), 24 for Gen4 and 48 for Gen5 (NCCL_DEBUG=INFO topology dumps, e.g.
#: NVIDIA/nccl issue 1189: "PCI[48.0]" on an H20 server, issue 1499: "PCI[24.0]").
_NCCL_PCI_GBPS = {"PCIe3x16": 12.0, "PCIe4x16": 24.0, "PCIe5x16": 48.0, "PCIe6x16": 96.0}
#: NVLink's per-link line rate per direction by generation (hardware.LINKS: 6, 12, 18, 18 links).
_NVLINK_LINK_LINE = {2: 25e9, 3: 25e9, 4: 25e9, 5: 50e9}
#: A healthy run's margin below the band that the model's validated error sets (run to run
#: noise of one nccl-tests measurement).
BAND_MARGIN = 0.05
#: Fewer test rows than this in a regime, and the regime counts as unvalidated.
MIN_VALIDATION_ROWS = 3
#: The band used where a regime has no validation: a healthy run lies above
#: ``(1 - UNVALIDATED_BAND) * expected``.
UNVALIDATED_BAND = 0.5
SIZE_CLASSES = ("< 1 MiB", "1 MiB - 1 GiB", ">= 1 GiB")
#: The published rows' fabrics, and PCIe for a node whose GPUs talk over PCIe.
FABRICS = ("NVLink", "PCIe") + nccl_tests.FABRICS[1:]


@dataclass(frozen=True)
class Regime:
    """Where a prediction lies, for reporting the model's error there."""

    nodes: str          # "1 node", "2 nodes" or ">2 nodes"
    fabric: str         # the network crossed: one of FABRICS (NVLink or PCIe on one node)
    ops: str            # "all_reduce", "all_gather/reduce_scatter" or "all_to_all"
    sizes: str          # one of SIZE_CLASSES

    def __str__(self) -> str:
        return f"{self.nodes}, {self.fabric}, {self.ops}, {self.sizes}"


def regime(op: str, nbytes: float, n_nodes: int, fabric: str) -> Regime:
    """The :class:`Regime` of one collective (see :func:`validation_by_regime`)."""
    if fabric not in FABRICS:
        raise ValueError(f"Unknown fabric {fabric!r}; use one of {', '.join(FABRICS)}.")
    return Regime(nccl_tests.node_class(n_nodes), fabric, nccl_tests.op_family(op),
                  SIZE_CLASSES[(nbytes >= 2**20) + (nbytes >= 2**30)])


def fabric_of(nic: str | None, n_nodes: int, intra_kind: str = "nvlink") -> str:
    """The fabric a configuration crosses: NVLink/PCIe on one node, else by the NIC's name
    (``IB-*``: InfiniBand; ``Ethernet-*``: Ethernet, unless told RoCE or EFA)."""
    if n_nodes == 1:
        return "NVLink" if intra_kind == "nvlink" else "PCIe"
    return "InfiniBand" if (nic or "").startswith("IB-") else "Ethernet"


@dataclass(frozen=True)
class CollectiveEstimate:
    """What :func:`cluster_collective` expects of one collective on one cluster.

    Attributes:
        op: the collective.
        nbytes: buffer in bytes, as nccl-tests counts it (its ``size`` column).
        n_nodes, gpus_per_node: the cluster (``n = n_nodes * gpus_per_node`` ranks).
        time_s: expected seconds.
        algbw: ``nbytes / time_s`` in bytes/s.
        busbw: ``algbw * busbw_factor(op, n)`` in bytes/s (what nccl-tests prints).
        algorithm: what NCCL 2.30.7 would run (NCCL_ALGO's names, lower case; "pairwise":
            all-to-all's grouped send/receive).
        protocol: LL, LL128 or Simple.
        low_busbw: below this a measured busbw is low: the model's largest over-prediction of a
            healthy published row in this regime, less ``BAND_MARGIN``
            (``UNVALIDATED_BAND`` where the regime has no validation).
        high_busbw: the line-rate busbw of the links a ring (or NVLS) uses; above it a
            measurement needs in-network reduction (NVLS, SHARP) or a 2-node tree.
        bottleneck: what sets the time in NCCL's model: "latency" (more than half of it), or
            the term that set the bandwidth: "NVLink", "PCIe", "network", or one of NCCL's caps
            ("LL cap", "LL128 channel cap", "tree channel cap", "NVLS-tree channel cap").
        regime: where the estimate lies (:class:`Regime`).
        validated: whether the regime has at least ``MIN_VALIDATION_ROWS`` published test rows.
        nccl_release: the NCCL release whose rules priced it.
    """

    op: str
    nbytes: float
    n_nodes: int
    gpus_per_node: int
    time_s: float
    algbw: float
    busbw: float
    algorithm: str
    protocol: str
    low_busbw: float
    high_busbw: float
    bottleneck: str
    regime: Regime | None = None
    validated: bool = False
    nccl_release: str = NCCL_RELEASE

    @property
    def n_gpus(self) -> int:
        return self.n_nodes * self.gpus_per_node


@dataclass(frozen=True)
class _Fabric:
    intra_line: float       # node link per GPU per direction, bytes/s (line rate)
    intra_kind: str         # "nvlink" or "pcie"
    intra_nccl_gbps: float  # the node link as NCCL's topology counts it, GB/s
    nic_line: float         # one NIC's line rate, bytes/s (0 on one node)
    nics: int               # NICs per node
    pcie_nccl_gbps: float   # one GPU's PCIe link as NCCL counts it, GB/s
    nvswitch: bool          # NVSwitch multicast (NVLS) possible

    @property
    def net_line(self) -> float:
        return self.nic_line * self.nics


def _fabric(gpu_spec, gpus_per_node, n_nodes, nic, nics_per_node, intra_node_link,
            intra_node_bytes_per_s, network_bytes_per_s=None):
    from clusterlab import hardware

    compcap = _nccl.COMPUTE_CAPABILITY.get(gpu_spec.name, 90)
    per_link = _nccl.NVLINK_BW_PER_LINK[max(c for c in _nccl.NVLINK_BW_PER_LINK
                                            if c <= compcap)]
    # An accelerator without NVLink (generation 0, e.g. a TPU in the planner's validation) is
    # counted as NVLink4 would be; its estimates lie in no validated regime anyway.
    nvlink_fraction = per_link * 1e9 / _NVLINK_LINK_LINE.get(gpu_spec.nvlink_generation, 25e9)
    if intra_node_bytes_per_s is not None:
        intra_line = _checks.positive("intra_node_bytes_per_s", intra_node_bytes_per_s)
        kind, intra_nccl = "nvlink", intra_line * nvlink_fraction / 1e9
    elif intra_node_link is not None:
        intra = hardware.link(intra_node_link)
        intra_line = intra.bytes_per_s
        if intra.name.startswith("PCIe"):
            kind, intra_nccl = "pcie", _NCCL_PCI_GBPS[intra.name]
        else:
            kind, intra_nccl = "nvlink", intra_line * nvlink_fraction / 1e9
    else:
        intra_line, kind = gpu_spec.nvlink_bytes_per_s, "nvlink"
        intra_nccl = intra_line * nvlink_fraction / 1e9
    nic_line, nics = 0.0, 0
    if n_nodes > 1 and network_bytes_per_s is not None:
        if nic is not None:
            raise ValueError("Give nic and nics_per_node, or network_bytes_per_s, not both.")
        nics = gpus_per_node
        nic_line = _checks.positive("network_bytes_per_s", network_bytes_per_s) / nics
    elif n_nodes > 1:
        if nic is None:
            raise ValueError(f"{n_nodes} nodes need a network: give nic (one of "
                             f"{', '.join(hardware.LINKS)}) and nics_per_node.")
        nics = gpus_per_node if nics_per_node is None else _checks.count("nics_per_node",
                                                                         nics_per_node)
        nic_line = hardware.link(nic).bytes_per_s
    nvswitch = (kind == "nvlink" and intra_line == gpu_spec.nvlink_bytes_per_s
                and compcap >= 90)
    return _Fabric(intra_line, kind, intra_nccl, nic_line, nics,
                   _NCCL_PCI_GBPS.get(gpu_spec.pcie, 48.0), nvswitch)


def _topology(gpu_spec, fabric: _Fabric, n_nodes: int, gpus_per_node: int, sharp: bool):
    return _nccl.graphs(compcap=_nccl.COMPUTE_CAPABILITY.get(gpu_spec.name, 90),
                        n_nodes=n_nodes, gpus_per_node=gpus_per_node,
                        intra_gbps=fabric.intra_nccl_gbps, nvlink=fabric.intra_kind == "nvlink",
                        nvswitch=fabric.nvswitch, nic_gbps=fabric.nic_line / 1e9,
                        nics_per_node=fabric.nics, pcie_gbps=fabric.pcie_nccl_gbps, sharp=sharp)


def _all_to_all(nbytes, fabric: _Fabric, topo, n_nodes, gpus_per_node):
    """All-to-all as grouped send/receive (NCCL runs it outside its tuning model): each GPU
    sends ``(g-1)/n`` of the buffer over its node link and ``(n-g)/n`` over its share of the
    node's network channels, both at once; latency: a ring Simple step per group of 8 peers.
    This is the course's estimate, not NCCL's."""
    g, n = gpus_per_node, n_nodes * gpus_per_node
    t_intra = (g - 1) / n * nbytes / (fabric.intra_nccl_gbps * 1e9)
    t_net = 0.0
    if n_nodes > 1:
        per_gpu_net = topo.ring.n_channels * topo.ring.bw_inter * 1e9 / g
        t_net = (n - g) / n * nbytes / per_gpu_net
    hw = _nccl._HW_LAT["net" if n_nodes > 1 else fabric.intra_kind]["ring"][2]
    latency_s = (_nccl._BASE_LAT["ring"][2] + math.ceil((n - 1) / 8) * hw) * 1e-6
    bound = "network" if t_net > t_intra else ("NVLink" if fabric.intra_kind == "nvlink"
                                               else "PCIe")
    return latency_s + LAUNCH_OVERHEAD_S + max(t_intra, t_net), latency_s, bound


def _high_busbw(op, algorithm, fabric: _Fabric, n_nodes, n) -> float:
    """The line-rate busbw of the links ``algorithm`` loads.

    A ring's busbw cannot pass the slower of its links. NVLS reduces in the switch, so its
    algbw (not busbw) is bound by NVLink. On two nodes a tree, NVLS-tree or CollNet sends each
    node's buffer across the network once each way, so its algbw is bound by all of a node's
    NICs together (and NVLink): busbw can reach ``2(n-1)/n`` times that.
    """
    line = fabric.intra_line if n_nodes == 1 else min(fabric.intra_line, fabric.net_line)
    factor = busbw_factor("all_reduce", n)
    if algorithm == "nvls":
        return factor * fabric.intra_line
    if op == "all_reduce" and (n_nodes == 2 and algorithm in ("tree", "nvls_tree")
                               or algorithm.startswith("collnet")):
        return factor * min(fabric.intra_line, fabric.net_line)
    return line


def cluster_collective(op: str, nbytes: float, *, gpu, n_nodes: int = 1,
                       gpus_per_node: int = 8, nic: str | None = None,
                       nics_per_node: int | None = None, intra_node_link: str | None = None,
                       intra_node_bytes_per_s: float | None = None,
                       network_bytes_per_s: float | None = None, algorithm: str = "auto",
                       protocol: str = "auto", sharp: bool = False,
                       fabric: str | None = None) -> CollectiveEstimate:
    """Expected time and bus bandwidth of one NCCL collective on ``n_nodes x gpus_per_node`` GPUs.

    NCCL prices every algorithm and protocol with its own model and runs the fastest; this is
    that model, from NCCL 2.30.7 (``NCCL_RELEASE``; :mod:`clusterlab._nccl` cites
    ``src/graph/tuning.cc`` line by line), plus ``LAUNCH_OVERHEAD_S`` per call:

    * **The graphs.** NCCL's topology search finds channels and a per-channel bandwidth for
      each algorithm; here they come from the node's links as NCCL counts them (an NVLink4 link
      is 20.6 GB/s, so 370.8 GB/s per H100; a 400 Gb/s NIC is 50, searched at 48). That
      derivation is the one approximation of NCCL's code (``_nccl.graphs``).
    * **The ring** is one flat ring over all ``n`` ranks per channel: across nodes each channel
      crosses every node's network twice per all-reduce, whatever the node count.
    * **The tree** sends each byte up and down a tree of nodes once each way; on two nodes its
      intra-node bandwidth may reach twice the network's (search.cc), and NVLS-tree's network
      bandwidth is doubled (tuning.cc "Handle 2 node case of NVLSTree"), which is why on two
      nodes busbw can pass the NICs' line rate with no in-network reduction.
    * **NVLS** (NVLink SHARP, one node of H100/H200/B200) at NCCL's per-architecture efficiency
      (0.85 Hopper, 0.74 Blackwell); **NVLS-tree** across NVSwitch nodes; **CollNet** (IB SHARP)
      with ``sharp=True``; **PAT** for all-gather/reduce-scatter at one GPU per node.
    * **Protocols**: LL at half of Simple capped by ``llMaxBws``, LL128 at 92% capped per
      channel, on by default on NVLink nodes (Hopper and Blackwell included).
    * **All-to-all** is grouped send/receive, which NCCL does not price: a course estimate
      (each GPU's node link and network share in parallel).

    The errors per regime against published rows (:func:`validation_by_regime`) set the band;
    a regime with fewer than ``MIN_VALIDATION_ROWS`` rows is unvalidated (``validated=False``).

    Args:
        op: ``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"`` or ``"all_to_all"``.
        nbytes: the buffer in bytes, as nccl-tests' ``size`` column counts it.
        gpu: a name in :data:`clusterlab.hardware.GPUS` or a :class:`~clusterlab.hardware.GPU`.
        n_nodes: nodes.
        gpus_per_node: GPUs taking part in each node.
        nic: a name in :data:`clusterlab.hardware.LINKS` for one NIC port (needed when
            ``n_nodes > 1``), e.g. ``"IB-NDR"``, ``"Ethernet-400G"``.
        nics_per_node: NICs per node NCCL uses; default one per GPU.
        intra_node_link: a name in ``LINKS`` replacing the GPU's NVLink (e.g. ``"PCIe4x16"``).
        intra_node_bytes_per_s: or the node link's per-direction line rate directly (NVLS
            stays possible only at the GPU's own NVLink rate).
        network_bytes_per_s: instead of ``nic``/``nics_per_node``: the line rate of all of a
            node's NICs together, per direction, taken as one NIC per GPU.
        algorithm: ``"auto"`` or one of :data:`CLUSTER_ALGORITHMS` to force it (as
            ``NCCL_ALGO`` does); ``"collnet_*"`` need ``sharp=True``.
        protocol: ``"auto"`` or one of :data:`PROTOCOLS` (as ``NCCL_PROTO``).
        sharp: whether the network reduces in its switches (InfiniBand SHARP, NCCL CollNet).
        fabric: the network's kind for the validation regime, one of :data:`FABRICS`
            (default: by the NIC's name).

    Returns:
        A :class:`CollectiveEstimate` (time, algbw, busbw, algorithm, protocol, band, regime).

    Raises:
        ValueError: unknown names, a network missing for several nodes, or an algorithm that
            NCCL does not run there (e.g. NVLS across nodes without SHARP).

    References:
        NVIDIA NCCL v2.30.7-1 ``src/graph`` (tuning.cc, search.cc, topo.h); nccl-tests
        ``doc/PERFORMANCE.md``; :mod:`clusterlab.published.nccl_tests`.
    """
    estimate = _estimate(op, nbytes, gpu=gpu, n_nodes=n_nodes, gpus_per_node=gpus_per_node,
                         nic=nic, nics_per_node=nics_per_node, intra_node_link=intra_node_link,
                         intra_node_bytes_per_s=intra_node_bytes_per_s,
                         network_bytes_per_s=network_bytes_per_s, algorithm=algorithm,
                         protocol=protocol, sharp=sharp)
    if estimate.n_gpus == 1:
        return estimate
    kind = "pcie" if (intra_node_link or "").startswith("PCIe") else "nvlink"
    return _with_band(estimate, regime(op, estimate.nbytes, n_nodes,
                                       fabric or fabric_of(nic, n_nodes, kind)))


def _with_band(estimate: CollectiveEstimate, where: Regime) -> CollectiveEstimate:
    """The estimate with its regime and the band that the regime's validation sets."""
    errors = regime_errors().get(where, ())
    validated = len(errors) >= MIN_VALIDATION_ROWS
    if validated:
        low = estimate.busbw / (1 + max(errors)) * (1 - BAND_MARGIN)
    else:
        low = estimate.busbw * (1 - UNVALIDATED_BAND)
    return replace(estimate, low_busbw=low, regime=where, validated=validated)


def _estimate(op, nbytes, *, gpu, n_nodes, gpus_per_node, nic, nics_per_node, intra_node_link,
              intra_node_bytes_per_s, network_bytes_per_s, algorithm, protocol, sharp):
    """:func:`cluster_collective` without the band."""
    from clusterlab import hardware

    if op not in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        raise ValueError(f"cluster_collective prices all_reduce, all_gather, reduce_scatter "
                         f"and all_to_all, got {op!r}.")
    nbytes = _checks.positive("nbytes", nbytes)
    n_nodes = _checks.count("n_nodes", n_nodes)
    gpus_per_node = _checks.count("gpus_per_node", gpus_per_node)
    gpu_spec = gpu if isinstance(gpu, hardware.GPU) else hardware.gpu(gpu)
    if algorithm != "auto" and algorithm not in CLUSTER_ALGORITHMS:
        raise ValueError(f"Unknown algorithm {algorithm!r}; use 'auto' or one of "
                         f"{', '.join(CLUSTER_ALGORITHMS)}.")
    if protocol != "auto" and protocol not in PROTOCOLS:
        raise ValueError(f"Unknown protocol {protocol!r}; use 'auto' or one of "
                         f"{', '.join(PROTOCOLS)}.")
    fabric = _fabric(gpu_spec, gpus_per_node, n_nodes, nic, nics_per_node, intra_node_link,
                     intra_node_bytes_per_s, network_bytes_per_s)
    n = n_nodes * gpus_per_node
    if n == 1:
        return CollectiveEstimate(op, nbytes, n_nodes, gpus_per_node, 0.0, math.inf, math.inf,
                                  "none", "none", math.inf, math.inf, "none")
    topo = _topology(gpu_spec, fabric, n_nodes, gpus_per_node, sharp)
    factor = busbw_factor(op, n)
    high = _high_busbw(op, "ring", fabric, n_nodes, n)
    if op == "all_to_all":
        if algorithm not in ("auto", "pairwise"):
            raise ValueError(f"NCCL runs all_to_all as grouped send/receive; use "
                             f"algorithm='auto' or 'pairwise', not {algorithm!r}.")
        seconds, latency, bound = _all_to_all(nbytes, fabric, topo, n_nodes, gpus_per_node)
        bound = "latency" if latency + LAUNCH_OVERHEAD_S > seconds / 2 else bound
        alg = nbytes / seconds
        return CollectiveEstimate(op, nbytes, n_nodes, gpus_per_node, seconds, alg,
                                  alg * factor, "pairwise", "Simple", 0.0, high, bound)
    options = _nccl.tune(topo, op)
    if algorithm != "auto":
        options = [t for t in options if t.algorithm == algorithm]
        if not options:
            raise ValueError(f"NCCL {NCCL_RELEASE} does not run {op} with algorithm "
                             f"{algorithm!r} on {n_nodes} x {gpus_per_node} {gpu_spec.name}"
                             + (" (collnet needs sharp=True)" if algorithm.startswith("collnet")
                                else "") + "; use algorithm='auto'.")
    if protocol != "auto":
        options = [t for t in options if t.protocol == protocol]
        if not options:
            raise ValueError(f"No protocol {protocol!r} for {algorithm!r} here; use "
                             "protocol='auto'.")
    timed = [(_nccl.algo_time_us(topo, op, t, nbytes) * 1e-6 + LAUNCH_OVERHEAD_S, t)
             for t in options]
    seconds, best = min(timed, key=lambda pair: pair[0])
    latency = best.latency_us * 1e-6 + LAUNCH_OVERHEAD_S
    bottleneck = "latency" if latency > seconds / 2 else best.bound
    alg = nbytes / seconds
    bus = alg * factor
    high = _high_busbw(op, best.algorithm, fabric, n_nodes, n)
    return CollectiveEstimate(op, nbytes, n_nodes, gpus_per_node, seconds, alg, bus,
                              best.algorithm, best.protocol, 0.0, max(high, bus), bottleneck)


def all_reduce_time(nbytes: float, *, gpu, n_nodes: int, gpus_per_node: int = 8,
                    nic: str | None = None, nics_per_node: int | None = None,
                    intra_node_link: str | None = None,
                    intra_node_bytes_per_s: float | None = None,
                    network_bytes_per_s: float | None = None, sharp: bool = False) -> float:
    """Seconds of an all-reduce of ``nbytes`` per GPU: ``cluster_collective(...).time_s``."""
    return _estimate("all_reduce", nbytes, gpu=gpu, n_nodes=n_nodes,
                     gpus_per_node=gpus_per_node, nic=nic, nics_per_node=nics_per_node,
                     intra_node_link=intra_node_link,
                     intra_node_bytes_per_s=intra_node_bytes_per_s,
                     network_bytes_per_s=network_bytes_per_s, algorithm="auto",
                     protocol="auto", sharp=sharp).time_s


@dataclass(frozen=True)
class ValidationRow:
    """One published measurement beside the model (:func:`validation_table`)."""

    system: str
    op: str
    size_bytes: int
    published_gbps: float
    model_gbps: float
    model_algorithm: str
    role: str
    source: str
    regime: Regime
    provenance: str
    nccl_version: str | None
    published_algorithm: str

    @property
    def error(self) -> float:
        """``(model - published) / published``; +0.1: the model expects 10% more busbw."""
        return (self.model_gbps - self.published_gbps) / self.published_gbps


def _model_row(row) -> ValidationRow:
    estimate = _estimate(
        row.op, row.size_bytes, gpu=row.gpu, n_nodes=row.n_nodes,
        gpus_per_node=row.gpus_per_node, nic=row.nic,
        nics_per_node=row.nics_per_node or None, intra_node_link=None,
        intra_node_bytes_per_s=row.intra_node_link_bytes_per_s, network_bytes_per_s=None,
        algorithm=row.algorithm, protocol="auto", sharp=False)
    return ValidationRow(row.system, row.op, row.size_bytes, row.busbw_gbps,
                         estimate.busbw / 1e9, estimate.algorithm, row.role, row.source,
                         regime(row.op, row.size_bytes, row.n_nodes, row.fabric),
                         row.provenance, row.nccl_version, row.algorithm)


def validation_table(role: str | None = "test") -> list[ValidationRow]:
    """The model beside every published nccl-tests row (of one role, by default the tests).

    Args:
        role: ``"test"`` (rows nothing was fitted to), ``"set"`` (the rows that set
            ``LAUNCH_OVERHEAD_S``), ``"unhealthy"`` (logs of systems their threads call
            broken) or None (all healthy rows).

    Returns:
        One :class:`ValidationRow` per published row, in the order of
        :data:`clusterlab.published.nccl_tests.ROWS`.
    """
    return [_model_row(row) for row in nccl_tests.rows(role)]


@dataclass(frozen=True)
class RegimeError:
    """The model's error over the test rows of one :class:`Regime`."""

    regime: Regime
    rows: int
    median_abs: float        # median |error|
    lowest: float            # most negative error (the model under-predicts)
    highest: float           # most positive error (the model over-predicts)
    sources: int             # distinct sources (URLs) among the rows

    @property
    def validated(self) -> bool:
        return self.rows >= MIN_VALIDATION_ROWS


def validation_by_regime(rows: Sequence[ValidationRow] | None = None) -> list[RegimeError]:
    """The model's error per regime (nodes, fabric, op family, size class) over test rows.

    Rows forced to an algorithm NCCL would not pick still count: they test that algorithm's
    price. Rows that set a parameter (``role="set"``) are left out: their error proves nothing.
    """
    rows = validation_table("test") if rows is None else [r for r in rows if r.role == "test"]
    groups: dict[Regime, list[ValidationRow]] = {}
    for r in rows:
        groups.setdefault(r.regime, []).append(r)
    out = []
    for where in sorted(groups, key=str):
        errors = [r.error for r in groups[where]]
        out.append(RegimeError(where, len(errors), float(np.median(np.abs(errors))),
                               min(errors), max(errors),
                               len({r.source.split(" ")[0] for r in groups[where]})))
    return out


@functools.lru_cache(maxsize=1)
def _regime_errors(launch_overhead_s: float) -> dict[Regime, tuple[float, ...]]:
    return {e.regime: tuple(r.error for r in validation_table("test") if r.regime == e.regime)
            for e in validation_by_regime()}


def regime_errors() -> dict[Regime, tuple[float, ...]]:
    """Each regime's errors over its test rows (cached; the band of :func:`cluster_collective`)."""
    return _regime_errors(LAUNCH_OVERHEAD_S)


def format_regime_errors(errors: Sequence[RegimeError]) -> str:
    """A fixed-width table of :func:`validation_by_regime`."""
    lines = [f"{'regime':<58} {'rows':>4} {'sources':>7} {'median':>7} {'range':>15}"]
    for e in errors:
        lines.append(f"{str(e.regime):<58} {e.rows:4d} {e.sources:7d} "
                     f"{100 * e.median_abs:6.1f}% {100 * e.lowest:+6.1f}..{100 * e.highest:+.1f}%")
    return "\n".join(lines)


def format_validation_table(rows: Sequence[ValidationRow]) -> str:
    """A fixed-width table of :func:`validation_table` rows: system, op, size, published and
    model busbw (GB/s), the algorithm the model picks, and the error."""
    lines = [f"{'system':<52} {'op':<14} {'size':>9} {'published':>9} {'model':>8} "
             f"{'algorithm':>9} {'error':>7}"]
    for r in rows:
        size = (f"{r.size_bytes / 2**30:g} GiB" if r.size_bytes >= 2**30
                else f"{r.size_bytes / 2**20:g} MiB" if r.size_bytes >= 2**20
                else f"{r.size_bytes / 2**10:g} KiB")
        lines.append(f"{r.system[:52]:<52} {r.op:<14} {size:>9} {r.published_gbps:9.2f} "
                     f"{r.model_gbps:8.2f} {r.model_algorithm:>9} {100 * r.error:+6.1f}%")
    return "\n".join(lines)


def median_abs_error(rows: Sequence[ValidationRow], *, min_bytes: float = 0,
                     max_bytes: float = math.inf) -> float:
    """Median of ``|error|`` over the rows whose size lies in ``[min_bytes, max_bytes]``."""
    errors = [abs(r.error) for r in rows if min_bytes <= r.size_bytes <= max_bytes]
    if not errors:
        raise ValueError(f"No rows between {min_bytes} and {max_bytes} bytes.")
    return float(np.median(errors))


def fit_launch_overhead(step_s: float = 0.5e-6, max_s: float = 100e-6) -> float:
    """Refit :data:`LAUNCH_OVERHEAD_S` on the ``role="set"`` sweep rows (<= 16 MiB).

    Tries overheads from 0 to ``max_s`` in steps of ``step_s`` and keeps the one with the
    smallest median ``|log(model / published)|`` over those rows.

    Returns:
        The overhead in seconds (the module constant is this value, rounded to ``step_s``).
    """
    global LAUNCH_OVERHEAD_S
    sweep = [r for r in nccl_tests.rows("set") if r.size_bytes <= 16 * 2**20]
    saved, best = LAUNCH_OVERHEAD_S, (math.inf, 0.0)
    try:
        for k in range(int(round(max_s / step_s)) + 1):
            LAUNCH_OVERHEAD_S = k * step_s
            score = float(np.median([abs(math.log(_model_row(r).model_gbps / r.busbw_gbps))
                                     for r in sweep]))
            if score < best[0] - 1e-12:
                best = (score, LAUNCH_OVERHEAD_S)
    finally:
        LAUNCH_OVERHEAD_S = saved
    return best[1]
