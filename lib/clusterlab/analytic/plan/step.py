"""The data-parallel step: compute plus the part of the gradient all-reduce left exposed.

Used by the fabric comparison (:mod:`clusterlab.analytic.plan.fabric_comparison`), which hides a
stated fraction of the all-reduce (chapter 8's eta), and by the planner
(:mod:`clusterlab.analytic.plan.prediction`), which models what hides instead: gradient buckets
reduced behind a window of compute (:func:`exposed_bucketed_reduce_s`; the window is the last
micro-batch's backward pass in Megatron, each micro-batch's passes under ZeRO-2 and 3).
Its FLOPs are the course's one MFU numerator,
:func:`clusterlab.analytic.flops.transformer_flops_per_token` (PaLM's ``6N + 12 L s d``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from clusterlab._checks import count, positive
from clusterlab.analytic import costmodel, flops
from clusterlab.catalog.hardware import GPU


@dataclass(frozen=True)
class StepTime:
    """One training step, split into compute and exposed communication.

    Attributes:
        compute_s: seconds of forward and backward computation.
        communication_s: seconds of communication not hidden behind the computation.
        model_flops: FLOPs of the step, ``B * flops.transformer_flops_per_token(...)``.
        n_devices: devices taking part.
        peak_flops_per_device: each device's peak FLOP/s.
        all_reduce: the gradient all-reduce's
        :class:`clusterlab.analytic.costmodel.CollectiveEstimate`
            when :func:`clusterlab.analytic.plan.fabric_step` priced it (its ``validation`` says
            how far published rows back it, ``nccl_release`` which NCCL's rules priced it);
            None when the caller gave the time.
    """

    compute_s: float
    communication_s: float
    model_flops: float
    n_devices: int
    peak_flops_per_device: float
    all_reduce: costmodel.CollectiveEstimate | None = field(default=None, compare=False)

    @property
    def validated(self) -> bool | None:
        """Whether published rows validate the all-reduce, within the tolerance on their node
        counts (None: no estimate attached)."""
        return None if self.all_reduce is None else self.all_reduce.validated

    @property
    def step_s(self) -> float:
        return self.compute_s + self.communication_s

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization of the whole step, communication included."""
        return flops.mfu(self.model_flops / self.step_s, self.n_devices,
                         self.peak_flops_per_device)


#: The backward pass's share of a step's compute: 4 of the 6 FLOPs per parameter and token
#: (Kaplan et al. 2020, section 2.1), and likewise 8 of attention's 12 L s d. Gradient
#: reduction can only overlap the backward pass, so at most this much of the compute can hide it
#: (with recomputation, the planner derives the share from the policy's FLOPs).
BACKWARD_FRACTION = 2 / 3


def hidden_all_reduce_s(all_reduce_s: float, overlap: float, backward_s: float) -> float:
    """The part of an all-reduce hidden behind the backward pass: ``min(overlap t, backward)``.

    The gradients of a layer exist only once its backward pass has run, so their reduction can
    overlap at most the rest of the backward pass: however large the fraction ``overlap`` a
    framework could hide, a step never hides more communication than ``backward_s``.

    Args:
        all_reduce_s: seconds of the all-reduce.
        overlap: the fraction of it the framework would hide, in [0, 1].
        backward_s: seconds of the backward pass.

    Returns:
        Seconds hidden.
    """
    return min(overlap * all_reduce_s, backward_s)


#: Megatron Core's default gradient bucket, in parameters: ``max(4e7, 1e6 * dp)``
#: (``DistributedDataParallelConfig.bucket_size``, Megatron Core 0.7: "larger DP sizes need
#: larger buckets to ensure collectives do not become latency-bound").
MIN_BUCKET_PARAMS = 40_000_000
BUCKET_PARAMS_PER_DP_RANK = 1_000_000


def megatron_bucket_params(dp: int) -> int:
    """Parameters per gradient bucket by Megatron Core's default, ``max(4e7, 1e6 dp)`` for a
    data-parallel group of ``dp`` GPUs (``DistributedDataParallel.__init__``, Megatron Core
    0.7; ``dp`` without context parallelism, as ``get_data_parallel_world_size()`` counts)."""
    return max(MIN_BUCKET_PARAMS, BUCKET_PARAMS_PER_DP_RANK * count("dp", dp))


def exposed_bucketed_reduce_s(reduce_s: float, window_s: float, n_buckets: int) -> float:
    """Seconds of a bucketed reduction left exposed after the window of compute it overlaps.

    Megatron Core's ``overlap_grad_reduce`` launches a bucket's collective as soon as the
    backward pass has produced its gradients, one bucket after another on one stream. With
    ``n`` buckets ready evenly over the ``window_s`` of backward compute, each taking ``t/n``
    of the reduction's ``t`` seconds, the last finishes ``max(t/n, t - window (1 - 1/n))``
    after the window ends: the last bucket is always exposed (it is ready only when the
    backward pass ends); when the reduction outruns its buckets, all of it but the window from
    the first bucket's readiness on is. Splitting ``t`` evenly also splits the collectives'
    latency, an approximation that holds while buckets are large enough to be bandwidth-bound,
    which is what Megatron sizes them for (:func:`megatron_bucket_params`).

    Args:
        reduce_s: seconds of the whole reduction, unhidden (>= 0).
        window_s: seconds of compute it may overlap (>= 0): a backward pass, or for ZeRO-3's
            parameter gather a forward pass.
        n_buckets: buckets the gradients are reduced in (>= 1).

    Returns:
        Exposed seconds, between ``reduce_s / n_buckets`` and ``reduce_s``.
    """
    n = count("n_buckets", n_buckets)
    if reduce_s < 0 or window_s < 0:
        raise ValueError(f"reduce_s and window_s are durations >= 0; got {reduce_s}, "
                         f"{window_s}.")
    return max(reduce_s / n, reduce_s - window_s * (1 - 1 / n))


def default_shape(n_params: float) -> tuple[int, int]:
    """A plausible ``(n_layers, d_model)`` for a dense transformer of ``n_params`` parameters.

    A transformer layer holds about ``12 d^2`` parameters (4 d^2 in attention, 8 d^2 in an MLP
    of width 4d), so ``N = 12 L d^2``; with GPT-3's aspect ratio ``d = 128 L`` (96 layers of
    width 12288) that gives ``L = (N / (12 * 128^2))^(1/3)``. Used only when a workload gives no
    shape; Llama 2 70B (80 x 8192) comes out as 71 x 9088.

    Args:
        n_params: parameters N (> 0).

    Returns:
        ``(n_layers, d_model)``, ``d_model`` a multiple of 128.

    References:
        Kaplan et al. 2020, section 2.1 (``N = 12 L d^2``), https://arxiv.org/abs/2001.08361;
        Brown et al. 2020, Table 2.1 (GPT-3's shapes), https://arxiv.org/abs/2005.14165.
    """
    n = positive("n_params", n_params)
    n_layers = max(1, round((n / (12 * 128**2)) ** (1 / 3)))
    d_model = max(128, 128 * round(math.sqrt(n / (12 * n_layers)) / 128))
    return n_layers, d_model


def model_shape(n_params: float, n_layers: int | None, d_model: int | None) -> tuple[int, int]:
    """``(n_layers, d_model)`` as given, or :func:`default_shape` when both are None.

    Raises:
        ValueError: if only one of the two is given, or one is not a positive integer.
    """
    if (n_layers is None) != (d_model is None):
        raise ValueError("Give both n_layers and d_model, or neither (then default_shape "
                         "estimates them from n_params).")
    if n_layers is None:
        return default_shape(n_params)
    return count("n_layers", n_layers), count("d_model", d_model)


def data_parallel_step(n_params: float, tokens_per_step: float, n_devices: int, gpu: GPU, *,
                       seq_len: int, compute_efficiency: float, all_reduce_s: float,
                       n_layers: int | None = None, d_model: int | None = None,
                       overlap: float = 0.0,
                       all_reduce: costmodel.CollectiveEstimate | None = None) -> StepTime:
    """A data-parallel step: ``B F / (n peak e)`` of compute plus the exposed all-reduce.

    ``F`` is :func:`clusterlab.analytic.flops.transformer_flops_per_token` of the model's shape (the
    course's one MFU definition). The exposed all-reduce is ``t_AR - min(overlap t_AR, t_bwd)``:
    the backward pass (``BACKWARD_FRACTION`` of the compute) is all a gradient all-reduce can
    hide behind, so a communication-bound step (``t_AR`` above ``t_bwd``) keeps at least
    ``t_AR - t_bwd`` of it exposed whatever the overlap.

    Args:
        n_params: model parameters N.
        tokens_per_step: tokens B in one global batch.
        n_devices: data-parallel devices.
        gpu: the device, for its peak BF16 FLOP/s.
        seq_len: tokens per sequence, for attention's FLOPs.
        compute_efficiency: e, the fraction of peak the matrix multiplications reach.
        all_reduce_s: time of the gradient all-reduce, e.g. from
            :func:`clusterlab.analytic.costmodel.cluster_collective` (the one model across nodes).
        n_layers, d_model: the model's shape; both None: :func:`default_shape` of ``n_params``.
        overlap: the fraction of the all-reduce the framework would hide behind the backward
            pass, in [0, 1], capped at the backward pass's time.
        all_reduce: the estimate ``all_reduce_s`` came from, carried into the result.

    Returns:
        The :class:`StepTime`.

    Raises:
        ValueError: on an efficiency outside (0, 1], an overlap outside [0, 1], a negative
            all-reduce time or a bad shape.
    """
    n_devices = count("n_devices", n_devices)
    efficiency = positive("compute_efficiency", compute_efficiency)
    if efficiency > 1:
        raise ValueError(f"compute_efficiency is a fraction of peak, at most 1; got {efficiency}.")
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap is the hidden fraction of the all-reduce, in [0, 1]; got "
                         f"{overlap}.")
    layers, width = model_shape(n_params, n_layers, d_model)
    model_flops = positive("tokens_per_step", tokens_per_step) * flops.transformer_flops_per_token(
        n_params, layers, seq_len, width)
    compute_s = model_flops / (n_devices * gpu.bf16_flops * efficiency)
    all_reduce_s = positive("all_reduce_s", all_reduce_s, allow_zero=True)
    exposed_s = all_reduce_s - hidden_all_reduce_s(all_reduce_s, overlap,
                                                   BACKWARD_FRACTION * compute_s)
    return StepTime(compute_s, exposed_s, model_flops, n_devices, gpu.bf16_flops, all_reduce)
