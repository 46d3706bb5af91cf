"""The traffic of the parallel strategies, and the pipeline's bubble.

Bytes each device sends per training step under data parallelism (plain and ZeRO-sharded), the
buckets a gradient is all-reduced in, Megatron tensor parallelism's all-reduces, and a
pipeline's idle fraction and in-flight micro-batches; each is counted with the ring collectives
of :mod:`clusterlab.analytic.costmodel.alpha_beta`.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from clusterlab import _checks
from clusterlab.analytic.costmodel.alpha_beta import collective_steps_and_bytes


def sharded_data_parallel_bytes_per_step(n_params: float, bytes_per_param: float, dp: int,
                                         zero_stage: int) -> float:
    """Bytes each device sends per training step under data parallelism with ZeRO stage 0-3.

    With ``Psi = n_params * bytes_per_param`` (the bytes of all parameters, or of all gradients)
    and ring collectives (:func:`collective_steps_and_bytes`):

    * stage 0 (plain data parallelism): one all-reduce of the gradients, ``2 (dp-1)/dp Psi``;
    * stages 1 and 2: a reduce-scatter of the gradients (each device keeps the sum of its shard)
      and, after the update, an all-gather of the parameters: also ``2 (dp-1)/dp Psi``;
    * stage 3: parameters are all-gathered before the forward pass and again before the
      backward pass (they are freed in between), and the gradients reduce-scattered:
      ``3 (dp-1)/dp Psi``, 1.5 times plain data parallelism.

    Args:
        n_params: number of parameters.
        bytes_per_param: bytes per parameter and per gradient element as communicated (2 for
            BF16, 4 for FP32).
        dp: data-parallel degree, the devices the states are sharded across.
        zero_stage: 0, 1, 2 or 3.

    Returns:
        Bytes sent per device per step (equal to the bytes received).

    References:
        Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
        Models", SC 2020, Section 7 (communication analysis of ZeRO-DP).
        https://arxiv.org/abs/1910.02054
    """
    _checks.positive("n_params", n_params)
    _checks.positive("bytes_per_param", bytes_per_param)
    dp = _checks.count("dp", dp)
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be one of (0, 1, 2, 3), got {zero_stage!r}.")
    psi_bytes = float(n_params) * float(bytes_per_param)
    if dp == 1:
        return 0.0
    if zero_stage == 0:
        return collective_steps_and_bytes("all_reduce", psi_bytes, dp)[1]
    gather_bytes = collective_steps_and_bytes("all_gather", psi_bytes, dp)[1]
    scatter_bytes = collective_steps_and_bytes("reduce_scatter", psi_bytes, dp)[1]
    return (2 if zero_stage == 3 else 1) * gather_bytes + scatter_bytes


def data_parallel_bytes_per_step(n_params: float, bytes_per_grad: float, dp: int) -> float:
    """Bytes each device sends per step of plain data parallelism: ``2 (dp-1)/dp`` of a gradient.

    One ring all-reduce of the gradient (``n_params * bytes_per_grad`` bytes) per step; the
    compiled program shows the buffer reduced (the gradient), the ring sends ``2 (dp-1)/dp`` of
    it and receives as much. Bucketing the gradient does not change the bytes, only how many
    all-reduces carry them.

    Args:
        n_params: number of parameters (= gradient elements).
        bytes_per_grad: bytes per gradient element as communicated (4 for FP32, 2 for BF16).
        dp: data-parallel devices.

    Returns:
        Bytes sent per device per step; 0 for one device.

    References:
        Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
        workstations", JPDC 69(2), 2009. https://doi.org/10.1016/j.jpdc.2008.09.002
    """
    _checks.positive("n_params", n_params)
    _checks.positive("bytes_per_grad", bytes_per_grad)
    dp = _checks.count("dp", dp)
    if dp == 1:
        return 0.0
    return collective_steps_and_bytes("all_reduce", float(n_params) * float(bytes_per_grad), dp)[1]


def gradient_buckets(total_bytes: int, bucket_bytes: int) -> list[int]:
    """Sizes in bytes of the buckets a gradient of ``total_bytes`` is cut into.

    ``ceil(total / bucket)`` buckets, all full but the last (as
    :func:`clusterlab.device.collectives.all_reduce_gradients` cuts them). Each is one all-reduce,
    so under a fitted per-call line ``t = alpha + beta * bytes`` the gradient costs
    ``len(buckets) * alpha + beta * total_bytes``: small buckets pay the latency many times.

    Args:
        total_bytes: bytes of the whole gradient.
        bucket_bytes: bytes per bucket.

    Returns:
        The bucket sizes, summing to ``total_bytes``.
    """
    _checks.positive("total_bytes", total_bytes)
    _checks.positive("bucket_bytes", bucket_bytes)
    total, bucket = int(total_bytes), int(bucket_bytes)
    full, rest = divmod(total, bucket)
    return [bucket] * full + ([rest] if rest else [])


#: Column-then-row parallel pairs in one transformer layer: attention (QKV columns, output
#: projection rows) and the MLP (first matmul's columns, second's rows).
MEGATRON_PAIRS_PER_LAYER = 2


def megatron_all_reduces_per_layer(*, backward: bool, recompute: bool = False) -> int:
    """Tensor-parallel all-reduces of one transformer layer per micro-batch (Megatron-LM).

    Each column-then-row parallel pair all-reduces its output in the forward pass (``g``) and
    the gradient of its input in the backward pass (``f``); a layer has two pairs (attention
    and the MLP). A full recomputation of the forward pass before the backward pass runs the
    forward all-reduces again. Serving a token runs the forward pass only.

    Args:
        backward: whether the backward pass runs (training) or not (inference, one token).
        recompute: whether the forward pass is recomputed in the backward pass (full
            activation recomputation); needs ``backward=True``.

    Returns:
        2 (forward only), 4 (forward and backward) or 6 (with recomputation).

    Raises:
        ValueError: ``recompute=True`` without a backward pass.

    References:
        Shoeybi et al., "Megatron-LM", 2019, Section 3 and Figure 3.
        https://arxiv.org/abs/1909.08053
        Narayanan et al., SC 2021, Section 3.2 (recomputation). https://arxiv.org/abs/2104.04473
    """
    if recompute and not backward:
        raise ValueError("recompute=True recomputes the forward pass for a backward pass; "
                         "give backward=True, or recompute=False for inference.")
    passes = 1 + bool(backward) + bool(recompute)
    return MEGATRON_PAIRS_PER_LAYER * passes


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
    buffer_bytes = float(tokens * d_model * bytes_per_element)
    if tp == 1:
        return TensorParallelTraffic(forward_all_reduces=0, backward_all_reduces=0,
                                     all_reduce_bytes=buffer_bytes, tp=1)
    backward = n_pairs if first_input_needs_grad else n_pairs - 1
    return TensorParallelTraffic(forward_all_reduces=n_pairs, backward_all_reduces=backward,
                                 all_reduce_bytes=buffer_bytes, tp=tp)


PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved")
Schedule = Literal["gpipe", "1f1b", "interleaved"]


def check_pipeline(stages: int, microbatches: int, schedule: Schedule, *,
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


def pipeline_bubble_fraction(stages: int, microbatches: int, schedule: Schedule = "gpipe", *,
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


def pipeline_activation_microbatches(stages: int, microbatches: int,
                                     schedule: Schedule = "gpipe", *, stage: int = 0,
                                     virtual_stages: int | None = None) -> float:
    """The most micro-batches whose activations one stage holds at once.

    GPipe runs all m forwards before any backward, so every stage holds all m. 1F1B starts the
    backward of a micro-batch as soon as it can and lets stage ``s`` run at most ``p - s``
    forwards ahead of its backwards: stage 0 holds ``min(p, m)``, the last stage 1.

    Interleaved 1F1B (v model chunks per device, each ``1/v`` of the stage's layers) warms up
    with ``(p - s - 1) 2 + (v - 1) p`` chunk forwards before its first backward (Megatron-LM's
    ``num_warmup_microbatches``), so stage ``s`` holds ``(v + 1) p - 1 - 2 s`` chunks, at most
    the step's ``m v``; counted in whole micro-batches (v chunks each) stage 0 holds
    ``p + (p - 1) / v = p (1 + (p-1)/(p v))``: 1F1B's ``p`` times Korthikanti et al.'s factor
    ``1 + (p-1)/(p v)``.

    Args:
        stages: p.
        microbatches: m (a multiple of p when interleaved with v > 1).
        schedule: ``"gpipe"``, ``"1f1b"`` or ``"interleaved"``.
        stage: which stage, 0 (the first, which holds the most) to p-1.
        virtual_stages: v, model chunks per device; required for ``"interleaved"`` (its count
            depends on it), None otherwise.

    Returns:
        A number of micro-batches (a fraction when interleaved: chunks over v); times the bytes
        of one micro-batch's stashed activations of the stage's layers it is the stage's
        activation memory.

    Raises:
        ValueError: for a bad shape, a stage out of range, or ``"interleaved"`` without
            ``virtual_stages``.

    References:
        Narayanan et al., SC 2021, Section 2.2.1 (1F1B limits in-flight micro-batches to p) and
        2.2.2 (the interleaved schedule). https://arxiv.org/abs/2104.04473
        Korthikanti et al., MLSys 2023, Section 4.2.3 (interleaving multiplies the first
        stage's activations by ``1 + (p-1)/(p v)``). https://arxiv.org/abs/2205.05198
        Megatron-LM, ``megatron/core/pipeline_parallel/schedules.py``,
        ``forward_backward_pipelining_with_interleaving`` (the warm-up count).
    """
    if schedule == "interleaved" and virtual_stages is None:
        raise ValueError("Activation counts are modelled for 'gpipe' and '1f1b', and for "
                         "'interleaved' given its virtual_stages (pass virtual_stages=v); "
                         "clusterlab.analytic.schedule.make_schedule(...).held_microbatches() counts "
                         "any schedule slot by slot.")
    p, m, v = check_pipeline(stages, microbatches, schedule,
                             virtual_stages=1 if virtual_stages is None else virtual_stages)
    if not 0 <= stage < p:
        raise ValueError(f"stage must be in [0, {p - 1}] for {p} stages, got {stage!r}.")
    if schedule == "interleaved":
        return min((v + 1) * p - 1 - 2 * stage, m * v) / v
    return m if schedule == "gpipe" else min(p - stage, m)
