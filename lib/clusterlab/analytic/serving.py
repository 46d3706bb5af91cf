"""Serving a language model: prefill and decode, the KV cache, batching, tensor parallelism.

Generating text has two phases. **Prefill** runs the whole prompt through the model at once: a
matrix-matrix product per weight matrix, thousands of tokens per weight read, so it is
compute-bound. **Decode** then makes one token per step per sequence: every step reads every
weight (and the key-value cache of every sequence) from HBM to do ``2 N`` FLOPs per token, so
it is memory-bound unless many sequences share the weight reads in one batch.

Units: bytes (1 GB = 1e9 bytes), FLOPs (a multiply-add is 2), seconds, FLOP/byte.

References:
    Pope et al., "Efficiently Scaling Transformer Inference", MLSys 2023.
    https://arxiv.org/abs/2211.05102
    Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
    Parallelism", 2019, Section 3. https://arxiv.org/abs/1909.08053
    Leviathan, Kalman and Matias, "Fast Inference from Transformers via Speculative Decoding",
    ICML 2023 (speculative decoding). https://arxiv.org/abs/2211.17192
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from clusterlab import _checks
from clusterlab.analytic import costmodel, flops as _flops, memory
from clusterlab.catalog import hardware

__all__ = [
    "decode_step_bytes",
    "decode_flops_per_token",
    "decode_arithmetic_intensity",
    "tensor_parallel_all_reduces_per_token",
    "Model",
    "LLAMA_3_70B",
    "RooflineStep",
    "roofline_step",
    "tensor_parallel_all_reduce_bytes",
    "prefill_flops",
    "prefill_step",
    "decode_step",
    "decode_tokens_per_s",
    "crossover_batch",
    "max_batch",
    "kv_transfer_time_s",
    "ServingPlan",
    "serving_options",
    "size_serving",
    "speculative_tokens_per_step",
    "speculative_speedup",
    "simulate_speculative_tokens_per_step",
]


def decode_step_bytes(param_bytes: float, kv_cache_bytes: float) -> float:
    """Bytes one decode step reads from HBM: every weight once, plus the whole KV cache.

    The weights are read once per step and shared by every sequence of the batch; the KV cache
    is per sequence, so pass the cache of the whole batch
    (:func:`clusterlab.analytic.memory.kv_cache_bytes` with ``batch`` sequences). Activations are
    small beside both and left out.

    Args:
        param_bytes: bytes of the model's weights (parameters times bytes per parameter, > 0).
        kv_cache_bytes: bytes of the KV cache of every sequence in the batch (>= 0).

    Returns:
        ``param_bytes + kv_cache_bytes`` in bytes.

    Raises:
        ValueError: if ``param_bytes`` is not positive or ``kv_cache_bytes`` is negative.

    References:
        Pope et al. 2023, Section 2 (memory time of a decode step).
        https://arxiv.org/abs/2211.05102
    """
    weights = _checks.positive("param_bytes", param_bytes)
    cache = _checks.positive("kv_cache_bytes", kv_cache_bytes, allow_zero=True)
    return weights + cache


def decode_flops_per_token(n_params: float, *, n_layers: int = 0, seq_len: int = 0,
                           d_attn: int = 0) -> float:
    """FLOPs to generate one token: ``2 N`` for the weights, plus attention over the cache.

    Each weight does one multiply-add per token (``2 N``). Attending over ``seq_len`` cached
    tokens costs ``2 * seq_len * d_attn`` for the query-key scores and as much for the weighted
    sum of values, in each of ``n_layers`` layers: ``4 * n_layers * seq_len * d_attn`` (a third
    of the training term of :func:`clusterlab.analytic.flops.transformer_flops_per_token`, which
    also counts the backward pass).

    Args:
        n_params: parameters ``N`` (> 0).
        n_layers: layers; 0 (the default) leaves attention out.
        seq_len: tokens in the cache (>= 0).
        d_attn: query heads times head size (the model width for most models; with grouped-query
            attention still the query heads, not the key-value heads).

    Returns:
        FLOPs per generated token, ``2 N + 4 * n_layers * seq_len * d_attn``.

    Raises:
        ValueError: if ``n_params`` is not positive, a size is negative or not whole, or the
            attention term is half given (``n_layers`` and ``d_attn`` go together, and
            ``seq_len > 0`` needs both).

    References:
        Chowdhery et al. 2022 (PaLM), Appendix B: ``6N + 12 L H Q T`` per training token, of
        which the forward pass is a third. https://arxiv.org/abs/2204.02311
    """
    weights = 2.0 * _checks.positive("n_params", n_params)
    layers = _checks.count("n_layers", n_layers, minimum=0)
    tokens = _checks.count("seq_len", seq_len, minimum=0)
    width = _checks.count("d_attn", d_attn, minimum=0)
    if (layers == 0) != (width == 0) or (tokens > 0 and layers == 0):
        raise ValueError(
            f"Give n_layers and d_attn together (and both with seq_len > 0) to count attention, "
            f"or none of them to leave it out; got n_layers={n_layers!r}, seq_len={seq_len!r}, "
            f"d_attn={d_attn!r}.")
    return weights + 4.0 * layers * tokens * width


def decode_arithmetic_intensity(batch: int, param_bytes: float,
                                kv_cache_bytes_per_sequence: float, n_params: float, *,
                                n_layers: int = 0, seq_len: int = 0, d_attn: int = 0) -> float:
    """FLOPs per byte read of one decode step for a batch of sequences.

    A step makes one token for each of ``batch`` sequences
    (``batch * decode_flops_per_token``) and reads the weights once plus each sequence's cache
    (:func:`decode_step_bytes`). The weights are shared, so the intensity rises with the batch,
    towards ``2 N / kv_cache_bytes_per_sequence`` when the cache dominates; at ``batch = 1`` in
    BF16 it is about 1 FLOP/byte, far below any GPU's ridge point
    (:func:`clusterlab.catalog.hardware.ridge_point`).

    Args:
        batch: sequences decoded together (integer >= 1).
        param_bytes: bytes of the weights (> 0).
        kv_cache_bytes_per_sequence: bytes of one sequence's KV cache (>= 0).
        n_params: parameters ``N`` (> 0).
        n_layers, seq_len, d_attn: optional attention term, as in
            :func:`decode_flops_per_token`.

    Returns:
        FLOP/byte.

    Raises:
        ValueError: on a batch below 1 or an invalid size (see the functions it composes).

    References:
        Pope et al. 2023, Section 2. https://arxiv.org/abs/2211.05102
        Williams, Waterman & Patterson, "Roofline", CACM 2009.
    """
    sequences = _checks.count("batch", batch)
    cache = _checks.positive("kv_cache_bytes_per_sequence", kv_cache_bytes_per_sequence,
                             allow_zero=True)
    flops = sequences * decode_flops_per_token(n_params, n_layers=n_layers, seq_len=seq_len,
                                               d_attn=d_attn)
    return flops / decode_step_bytes(param_bytes, sequences * cache)


def tensor_parallel_all_reduces_per_token(n_layers: int) -> int:
    """All-reduces per generated token with Megatron-style tensor parallelism: 2 per layer.

    Each layer splits attention by heads and the MLP by its hidden units; the partial outputs
    of attention's output projection and of the MLP's second matmul are summed across the
    tensor-parallel GPUs, one all-reduce each, on the critical path of every token: the
    forward pass of :func:`clusterlab.analytic.costmodel.megatron_all_reduces_per_layer`.

    Args:
        n_layers: transformer layers (integer >= 1).

    Returns:
        ``2 * n_layers``.

    Raises:
        ValueError: if ``n_layers`` is not a positive integer.

    References:
        Shoeybi et al. 2019 (Megatron-LM), Section 3 and Figure 3 (``g`` operators).
        https://arxiv.org/abs/1909.08053
    """
    return _checks.count("n_layers", n_layers) * costmodel.megatron_all_reduces_per_layer(
        backward=False)


@dataclass(frozen=True)
class Model:
    """The shape of a decoder-only transformer, as far as serving it is concerned.

    Attention has ``n_heads`` query heads and ``n_kv_heads`` key-value heads of ``head_dim``
    numbers (grouped-query attention when ``n_kv_heads < n_heads``); the MLP is gated (SwiGLU:
    three ``d_model x d_ff`` matrices); input embedding and output projection are separate
    ``vocab x d_model`` matrices. Norm weights (``2 d_model`` per layer) are left out.
    """

    name: str
    n_layers: int      # transformer layers
    d_model: int       # hidden size: the activations tensor parallelism all-reduces are this wide
    n_heads: int       # query heads
    n_kv_heads: int    # key-value heads (GQA); divides n_heads
    head_dim: int      # numbers per head
    d_ff: int          # MLP hidden size
    vocab: int         # vocabulary size
    source: str        # where the shape comes from, key in references.bib

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff",
                     "vocab"):
            _checks.count(name, getattr(self, name))
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads ({self.n_kv_heads}) must divide n_heads "
                             f"({self.n_heads}): each key-value head serves a whole group.")

    @property
    def d_attn(self) -> int:
        """Query heads times head size: the width attention's scores are computed over."""
        return self.n_heads * self.head_dim

    @property
    def n_params(self) -> int:
        """Parameters: embeddings, then per layer Q, K, V, O and the gated MLP."""
        kv_width = self.n_kv_heads * self.head_dim
        per_layer = (2 * self.d_model * self.d_attn + 2 * self.d_model * kv_width
                     + 3 * self.d_model * self.d_ff)
        return 2 * self.vocab * self.d_model + self.n_layers * per_layer

    @property
    def matmul_params(self) -> int:
        """Parameters used in a matmul per token: all but the input embedding (a lookup)."""
        return self.n_params - self.vocab * self.d_model

    def param_bytes(self, bytes_per_param: float = 2) -> float:
        """Bytes of the weights at ``bytes_per_param`` (2 for BF16, 1 for FP8)."""
        return self.n_params * _checks.positive("bytes_per_param", bytes_per_param)

    def streamed_param_bytes(self, bytes_per_param: float = 2) -> float:
        """Bytes of weights a forward pass reads: the matmul parameters' (a lookup in the input
        embedding reads only its tokens' rows)."""
        return self.matmul_params * _checks.positive("bytes_per_param", bytes_per_param)

    def kv_cache_bytes(self, seq_len: int, batch: int = 1, bytes_per_element: float = 2) -> int:
        """:func:`clusterlab.analytic.memory.kv_cache_bytes` for this model's layers and heads."""
        return memory.kv_cache_bytes(self.n_layers, self.n_kv_heads, self.head_dim, seq_len,
                                     batch, bytes_per_element)


#: Llama 3 70B: 80 layers, width 8192, 64 query heads and 8 key-value heads of 128, MLP 28672,
#: vocabulary 128256 (Dubey et al. 2024, Table 3, which rounds the vocabulary to 128,000; the
#: exact size is Meta's config.json). Its parameter count, 70.55e9, follows from the shape.
LLAMA_3_70B = Model("Llama-3-70B", n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8,
                    head_dim=128, d_ff=28672, vocab=128256,
                    source="Dubey et al. 2024, Table 3 [dubey2024]; Meta-Llama-3-70B "
                           "config.json [meta_llama3_70b_config]")


@dataclass(frozen=True)
class RooflineStep:
    """One step of a model on one GPU of a tensor-parallel group, on the roofline.

    Attributes:
        flops: FLOPs each GPU does in the step.
        hbm_bytes: bytes each GPU reads from (or writes to) HBM.
        compute_s: ``flops`` at the GPU's (derated) peak.
        memory_s: ``hbm_bytes`` at its (derated) HBM bandwidth.
        communication_s: tensor-parallel all-reduces, on the critical path (0 without).
    """

    flops: float
    hbm_bytes: float
    compute_s: float
    memory_s: float
    communication_s: float

    @property
    def time_s(self) -> float:
        """The slower of the two roofs, plus communication: ``max(compute, memory) + comm``."""
        return max(self.compute_s, self.memory_s) + self.communication_s

    @property
    def bound(self) -> str:
        """``"compute"`` or ``"memory"``: which roof sets the step's compute part."""
        return "compute" if self.compute_s >= self.memory_s else "memory"


def _gpu(gpu: hardware.GPU | str) -> hardware.GPU:
    return gpu if isinstance(gpu, hardware.GPU) else hardware.gpu(gpu)


def _fraction(name: str, value: float) -> float:
    v = _checks.positive(name, value)
    if v > 1:
        raise ValueError(f"{name} must lie in (0, 1] (a fraction of the peak), got {value!r}.")
    return v


def _roofs(spec: hardware.GPU, precision: hardware.Precision, flops_efficiency: float,
           bandwidth_efficiency: float) -> tuple[float, float]:
    # (derated peak FLOP/s, derated HBM bytes/s): the two roofs every step is held against
    return (hardware.peak_flops(spec, precision=precision)
            * _fraction("flops_efficiency", flops_efficiency),
            spec.hbm_bytes_per_s * _fraction("bandwidth_efficiency", bandwidth_efficiency))


def roofline_step(flops: float, hbm_bytes: float, *, gpu: hardware.GPU | str, tp: int = 1,
                  communication_s: float = 0.0, precision: hardware.Precision = "bf16",
                  flops_efficiency: float = 1.0,
                  bandwidth_efficiency: float = 1.0) -> RooflineStep:
    """Time of a step that does ``flops`` and moves ``hbm_bytes``, split evenly over ``tp`` GPUs.

    Compute and memory traffic overlap, so the slower of the two sets the time (the roofline);
    communication that sits between the matmuls (tensor parallelism's all-reduces) adds to it.

    Args:
        flops: FLOPs of the whole step (>= 0).
        hbm_bytes: bytes of the whole step (>= 0).
        gpu: a name in :data:`clusterlab.catalog.hardware.GPUS` or a
        :class:`~clusterlab.catalog.hardware.GPU`;
            its dense peak and HBM bandwidth are the two roofs.
        tp: GPUs sharing the step (integer >= 1).
        communication_s: seconds of communication on the critical path (>= 0).
        precision: the matmuls' precision, ``"bf16"`` or ``"fp8"``
            (:func:`clusterlab.catalog.hardware.peak_flops`); it sets the compute roof only.
        flops_efficiency: fraction of the peak FLOP/s reached, in (0, 1]; 1 gives the bound.
        bandwidth_efficiency: fraction of the HBM bandwidth reached, in (0, 1].

    Returns:
        A :class:`RooflineStep` per GPU.

    Raises:
        ValueError: on negative work, a ``tp`` below 1 or an efficiency outside (0, 1].

    References:
        Williams, Waterman & Patterson, "Roofline", CACM 2009.
        https://doi.org/10.1145/1498765.1498785
    """
    spec = _gpu(gpu)
    flops = _checks.positive("flops", flops, allow_zero=True)
    hbm_bytes = _checks.positive("hbm_bytes", hbm_bytes, allow_zero=True)
    tp = _checks.count("tp", tp)
    communication_s = _checks.positive("communication_s", communication_s, allow_zero=True)
    peak, bandwidth = _roofs(spec, precision, flops_efficiency, bandwidth_efficiency)
    return RooflineStep(flops=flops / tp, hbm_bytes=hbm_bytes / tp, compute_s=flops / tp / peak,
                        memory_s=hbm_bytes / tp / bandwidth, communication_s=communication_s)


def tensor_parallel_all_reduce_bytes(model: Model, tokens: int, *,
                                     bytes_per_element: float = 2) -> float:
    """Buffer of one tensor-parallel all-reduce: the ``[tokens, d_model]`` activations.

    A row-parallel matmul (attention's output projection, the MLP's second matmul) leaves each
    GPU a partial sum of the whole output; the all-reduce adds them. In decode ``tokens`` is the
    batch (one new token per sequence), in prefill the batch's prompt tokens.

    Args:
        model: the model (its ``d_model``).
        tokens: tokens in the step (integer >= 1).
        bytes_per_element: bytes per activation (2 for BF16).

    Returns:
        ``tokens * d_model * bytes_per_element`` in bytes, the size nccl-tests would report.

    References:
        Shoeybi et al. 2019 (Megatron-LM), Section 3. https://arxiv.org/abs/1909.08053
    """
    tokens = _checks.count("tokens", tokens)
    return tokens * model.d_model * _checks.positive("bytes_per_element", bytes_per_element)


def _tp_all_reduces_s(model: Model, tokens: int, tp: int, gpu: hardware.GPU,
                      bytes_per_activation: float, all_reduce_s: float | None = None) -> float:
    # 2 L all-reduces per step, each priced by the cost model unless all_reduce_s is given
    if tp == 1:
        return 0.0
    count = tensor_parallel_all_reduces_per_token(model.n_layers)
    if all_reduce_s is not None:
        return count * _checks.positive("all_reduce_s", all_reduce_s, allow_zero=True)
    nbytes = tensor_parallel_all_reduce_bytes(model, tokens, bytes_per_element=bytes_per_activation)
    # The tensor-parallel group: tp GPUs of one node, over the GPU's NVLink.
    group = hardware.ClusterSpec(gpu=gpu, n_nodes=1, gpus_per_node=tp)
    return count * costmodel.cluster_collective("all_reduce", nbytes, group).time_s


def prefill_flops(model: Model, prompt_tokens: int, *, batch: int = 1) -> float:
    """FLOPs a causal prefill of ``batch`` prompts of ``prompt_tokens`` tokens executes.

    Token ``i`` (1-based) attends over ``i`` tokens, so the prompt costs the sum of
    :func:`decode_flops_per_token` over ``seq_len = 1 .. T``:
    ``2 N T + 2 L d_attn T (T + 1)`` per prompt, with ``N`` the matmul parameters, which is
    ``T`` times :func:`clusterlab.analytic.flops.causal_flops_per_token` of the forward pass. This
    is a count of executed FLOPs for the time model, not the MFU convention
    (:func:`clusterlab.analytic.flops.transformer_flops_per_token`), which counts attention
    unmasked.

    Args:
        model: the model.
        prompt_tokens: ``T``, tokens per prompt (integer >= 1).
        batch: prompts (integer >= 1).

    Returns:
        FLOPs.
    """
    tokens = _checks.count("prompt_tokens", prompt_tokens)
    prompts = _checks.count("batch", batch)
    per_token = _flops.causal_flops_per_token(model.matmul_params, model.n_layers, tokens,
                                              model.d_attn, backward=False)
    return prompts * tokens * per_token


def prefill_step(model: Model, prompt_tokens: int, *, gpu: hardware.GPU | str, batch: int = 1,
                 tp: int = 1, bytes_per_param: float = 2, bytes_per_element: float = 2,
                 precision: hardware.Precision = "bf16",
                 flops_efficiency: float = 1.0, bandwidth_efficiency: float = 1.0,
                 all_reduce_s: float | None = None) -> RooflineStep:
    """The prefill of ``batch`` prompts: usually compute-bound.

    FLOPs from :func:`prefill_flops`; HBM traffic is the weights read once
    (:meth:`Model.streamed_param_bytes`) plus the KV cache written once; with ``tp > 1`` each
    of the ``2 L`` all-reduces carries the whole prompt's activations
    (``batch * prompt_tokens * d_model`` values), priced by
    :func:`clusterlab.analytic.costmodel.cluster_collective` on one node. ``time_s`` is the time to
    first token (TTFT) when the request does not wait in a queue.

    Args:
        model: the model.
        prompt_tokens: tokens per prompt (integer >= 1).
        gpu: the GPU (name or :class:`~clusterlab.catalog.hardware.GPU`).
        batch: prompts run together (integer >= 1).
        tp: tensor-parallel GPUs inside one NVLink domain (integer >= 1).
        bytes_per_param: bytes per weight (2 for BF16).
        bytes_per_element: bytes per cached key/value and per all-reduced activation.
        precision, flops_efficiency, bandwidth_efficiency: as in :func:`roofline_step`.
        all_reduce_s: seconds per tensor-parallel all-reduce, replacing the cost model's
            estimate (e.g. an assumed or measured latency of a CUDA-graphed one-shot kernel);
            ``None`` (the default) prices each with
            :func:`clusterlab.analytic.costmodel.cluster_collective`, whose small-message latency is
            fitted to an eager PyTorch benchmark.

    Returns:
        A :class:`RooflineStep` per GPU.

    References:
        Pope et al. 2023, Sections 2-3. https://arxiv.org/abs/2211.05102
    """
    spec = _gpu(gpu)
    tp = _checks.count("tp", tp)
    flops = prefill_flops(model, prompt_tokens, batch=batch)
    nbytes = model.streamed_param_bytes(bytes_per_param) + model.kv_cache_bytes(
        prompt_tokens, batch, bytes_per_element)
    comm = _tp_all_reduces_s(model, prompt_tokens * batch, tp, spec, bytes_per_element,
                             all_reduce_s)
    return roofline_step(flops, nbytes, gpu=spec, tp=tp, communication_s=comm,
                         precision=precision, flops_efficiency=flops_efficiency,
                         bandwidth_efficiency=bandwidth_efficiency)


def decode_step(model: Model, batch: int, seq_len: int, *, gpu: hardware.GPU | str,
                tp: int = 1, bytes_per_param: float = 2, bytes_per_element: float = 2,
                precision: hardware.Precision = "bf16",
                flops_efficiency: float = 1.0, bandwidth_efficiency: float = 1.0,
                all_reduce_s: float | None = None,
                bytes_per_activation: float | None = None) -> RooflineStep:
    """One decode step: one new token for each of ``batch`` sequences of ``seq_len`` tokens.

    FLOPs: ``batch`` times :func:`decode_flops_per_token` (matmul parameters, attention over
    ``seq_len`` cached tokens); bytes: :func:`decode_step_bytes` (the weights once,
    :meth:`Model.streamed_param_bytes`, and the whole batch's cache); with ``tp > 1``,
    :func:`tensor_parallel_all_reduces_per_token` all-reduces of ``batch * d_model``
    activations each, priced by
    :func:`clusterlab.analytic.costmodel.cluster_collective`. ``time_s`` is the time per output
    token (TPOT) every sequence of the batch sees.

    Args:
        model: the model.
        batch: sequences decoded together (integer >= 1).
        seq_len: tokens already in each sequence's cache (integer >= 0).
        gpu, tp, bytes_per_param, bytes_per_element, precision, flops_efficiency,
            bandwidth_efficiency, all_reduce_s: as in :func:`prefill_step`.
        bytes_per_activation: bytes per all-reduced activation where they differ from the
            cache's (an FP8 cache with BF16 activations: 2); None: ``bytes_per_element``.

    Returns:
        A :class:`RooflineStep` per GPU.

    References:
        Pope et al. 2023, Section 2. https://arxiv.org/abs/2211.05102
    """
    spec = _gpu(gpu)
    batch = _checks.count("batch", batch)
    tp = _checks.count("tp", tp)
    flops = batch * decode_flops_per_token(model.matmul_params, n_layers=model.n_layers,
                                           seq_len=seq_len, d_attn=model.d_attn)
    nbytes = decode_step_bytes(model.streamed_param_bytes(bytes_per_param),
                               model.kv_cache_bytes(seq_len, batch, bytes_per_element))
    comm = _tp_all_reduces_s(model, batch, tp, spec,
                             bytes_per_element if bytes_per_activation is None
                             else bytes_per_activation, all_reduce_s)
    return roofline_step(flops, nbytes, gpu=spec, tp=tp, communication_s=comm,
                         precision=precision, flops_efficiency=flops_efficiency,
                         bandwidth_efficiency=bandwidth_efficiency)


def decode_tokens_per_s(model: Model, batch: int, seq_len: int, *, gpu: hardware.GPU | str,
                        **options) -> float:
    """Tokens per second one model replica generates: ``batch / decode_step(...).time_s``.

    Args:
        model, batch, seq_len, gpu: as in :func:`decode_step`.
        **options: keyword options of :func:`decode_step` (``tp``, bytes, efficiencies).

    Returns:
        Tokens/s of the whole replica (all its ``tp`` GPUs together).
    """
    return _checks.count("batch", batch) / decode_step(model, batch, seq_len, gpu=gpu,
                                                       **options).time_s


def crossover_batch(model: Model, seq_len: int, *, gpu: hardware.GPU | str,
                    bytes_per_param: float = 2, bytes_per_element: float = 2,
                    precision: hardware.Precision = "bf16",
                    flops_efficiency: float = 1.0, bandwidth_efficiency: float = 1.0) -> float:
    """The batch at which a decode step turns from memory-bound to compute-bound.

    Per sequence a step adds ``F`` FLOPs and ``C`` cache bytes to the weights' ``W`` bytes;
    compute time ``b F / peak`` reaches memory time ``(W + b C) / bw`` at
    ``b* = (W / bw) / (F / peak - C / bw)``. Without a cache that is the GPU's ridge point at
    that precision (:func:`clusterlab.catalog.hardware.ridge_point`) times ``bytes_per_param / 2``;
    a long cache
    raises it, and when one sequence's cache takes longer to read than its FLOPs take to
    compute (``C / bw >= F / peak``) decode stays memory-bound at every batch (``inf``).
    Tensor parallelism divides both sides alike and leaves ``b*`` unchanged.

    Args:
        model: the model.
        seq_len: tokens in each sequence's cache (integer >= 0).
        gpu, bytes_per_param, bytes_per_element, precision, flops_efficiency,
            bandwidth_efficiency: as in :func:`decode_step`.

    Returns:
        ``b*`` as a real number (``math.inf`` when decode never becomes compute-bound); batches
        ``>= b*`` are compute-bound.

    References:
        Pope et al. 2023, Section 2 and Figure 1. https://arxiv.org/abs/2211.05102
    """
    spec = _gpu(gpu)
    peak, bandwidth = _roofs(spec, precision, flops_efficiency, bandwidth_efficiency)
    flops = decode_flops_per_token(model.matmul_params, n_layers=model.n_layers,
                                   seq_len=seq_len, d_attn=model.d_attn)
    cache_s = model.kv_cache_bytes(seq_len, 1, bytes_per_element) / bandwidth
    margin_s = flops / peak - cache_s
    if margin_s <= 0:
        return math.inf
    return model.streamed_param_bytes(bytes_per_param) / bandwidth / margin_s


def _usable_bytes(spec: hardware.GPU, tp: int, usable_fraction: float) -> float:
    return _fraction("usable_fraction", usable_fraction) * _checks.count("tp", tp) \
        * spec.memory_bytes


def max_batch(model: Model, seq_len: int, *, gpu: hardware.GPU | str, tp: int = 1,
              bytes_per_param: float = 2, bytes_per_element: float = 2,
              usable_fraction: float = 0.9) -> int:
    """How many sequences of ``seq_len`` tokens fit in HBM beside the weights.

    ``floor((usable_fraction * tp * memory - weights) / cache per sequence)``: the weights are
    split over the ``tp`` GPUs and so is every sequence's cache (by key-value heads).

    Args:
        model: the model.
        seq_len: tokens each sequence may reach (integer >= 1).
        gpu: the GPU; its ``memory_bytes`` is the capacity.
        tp: GPUs holding one replica (integer >= 1).
        bytes_per_param, bytes_per_element: as in :func:`decode_step`.
        usable_fraction: share of HBM the server may fill, in (0, 1]; the rest is workspace for
            activations and the runtime. 0.9 is vLLM's default ``gpu_memory_utilization``.

    Returns:
        Sequences (>= 0).

    Raises:
        ValueError: if the weights alone do not fit; the message names the fix (more GPUs per
            replica, or fewer bytes per weight).

    References:
        Kwon et al., "Efficient Memory Management for Large Language Model Serving with
        PagedAttention", SOSP 2023. https://arxiv.org/abs/2309.06180
        vLLM engine arguments (``--gpu-memory-utilization``, default 0.9).
    """
    spec = _gpu(gpu)
    _checks.count("seq_len", seq_len)
    usable = _usable_bytes(spec, tp, usable_fraction)
    weights = model.param_bytes(bytes_per_param)
    if weights > usable:
        raise ValueError(
            f"{model.name}'s weights ({weights / 1e9:.1f} GB) do not fit in {usable / 1e9:.1f} "
            f"GB ({usable_fraction:g} of {tp} x {spec.name}); raise tp or lower "
            f"bytes_per_param (FP8: 1).")
    return int((usable - weights) // model.kv_cache_bytes(seq_len, 1, bytes_per_element))


def kv_transfer_time_s(model: Model, prompt_tokens: int, *, link: hardware.Link | str,
                       batch: int = 1, n_links: int = 1, bytes_per_element: float = 2) -> float:
    """Seconds to move prefilled KV caches from prefill GPUs to decode GPUs.

    With prefill and decode on different GPUs (disaggregation), each prompt's cache crosses a
    link once: ``kv_cache_bytes / (n_links * link bandwidth)`` at line rate (per direction).

    Args:
        model: the model.
        prompt_tokens: tokens per prompt (integer >= 1).
        link: a name in :data:`clusterlab.catalog.hardware.LINKS` (``"NVLink4"``, ``"IB-NDR"``) or a
            :class:`~clusterlab.catalog.hardware.Link`.
        batch: prompts moved (integer >= 1).
        n_links: links used in parallel (integer >= 1; e.g. one NIC per GPU of a tp group).
        bytes_per_element: bytes per cached number.

    Returns:
        Seconds.

    References:
        Zhong et al., "DistServe", OSDI 2024, Section 4.3. https://arxiv.org/abs/2401.09670
        Patel et al., "Splitwise", ISCA 2024, Section 4. https://arxiv.org/abs/2311.18677
    """
    spec = link if isinstance(link, hardware.Link) else hardware.link(link)
    _checks.count("prompt_tokens", prompt_tokens)
    n_links = _checks.count("n_links", n_links)
    nbytes = model.kv_cache_bytes(prompt_tokens, _checks.count("batch", batch), bytes_per_element)
    return nbytes / (n_links * spec.bytes_per_s)


@dataclass(frozen=True)
class ServingPlan:
    """One way to serve a model at a target rate (:func:`serving_options`).

    Attributes:
        tp: GPUs per replica (tensor parallelism).
        batch: sequences each replica decodes together (the largest that meets the latency
            target and fits in memory).
        tpot_s: time per output token at that batch.
        replica_tokens_per_s: tokens/s of one replica, ``batch / tpot_s``.
        replicas: replicas needed for the target rate.
        gpus: ``replicas * tp``.
        bound: ``"compute"`` or ``"memory"`` at that batch.
    """

    tp: int
    batch: int
    tpot_s: float
    replica_tokens_per_s: float
    replicas: int
    gpus: int
    bound: str


def serving_options(model: Model, *, target_tokens_per_s: float, max_tpot_s: float,
                    seq_len: int, gpu: hardware.GPU | str,
                    tp_options: Sequence[int] = (1, 2, 4, 8), usable_fraction: float = 0.9,
                    **options) -> list[ServingPlan]:
    """Every tensor-parallel width that can serve the target, with the GPUs each needs.

    For each ``tp``: skip it when the weights do not fit (:func:`max_batch`) or one sequence
    alone misses ``max_tpot_s``; otherwise take the largest batch that fits in memory and keeps
    :func:`decode_step`'s time at or below ``max_tpot_s`` (the step time grows with the batch),
    and as many replicas as the target rate needs. Decode only: prompts are assumed prefilled
    elsewhere (disaggregated) and every sequence is at ``seq_len`` tokens.

    Args:
        model: the model.
        target_tokens_per_s: generated tokens per second over all users (> 0).
        max_tpot_s: the latency target, seconds per output token (> 0).
        seq_len: tokens per sequence (integer >= 1).
        gpu: the GPU.
        tp_options: tensor-parallel widths to try (inside one NVLink domain).
        usable_fraction: as in :func:`max_batch`.
        **options: ``bytes_per_param``, ``bytes_per_element``, ``precision`` and the
            efficiencies of :func:`decode_step`.

    Returns:
        One :class:`ServingPlan` per feasible ``tp``, in the order of ``tp_options`` (empty when
        none is feasible).
    """
    target = _checks.positive("target_tokens_per_s", target_tokens_per_s)
    max_tpot = _checks.positive("max_tpot_s", max_tpot_s)
    memory_options = {k: v for k, v in options.items()
                      if k in ("bytes_per_param", "bytes_per_element")}
    plans = []
    spec = _gpu(gpu)
    for tp in tp_options:
        if model.param_bytes(options.get("bytes_per_param", 2)) > _usable_bytes(
                spec, tp, usable_fraction):
            continue  # the weights alone do not fit this many GPUs
        fits = max_batch(model, seq_len, gpu=spec, tp=tp, usable_fraction=usable_fraction,
                         **memory_options)

        def step(b: int, tp: int = tp) -> RooflineStep:
            return decode_step(model, b, seq_len, gpu=spec, tp=tp, **options)

        if fits < 1 or step(1).time_s > max_tpot:
            continue
        low, high = 1, fits  # step(low) meets the target; find the largest batch that does
        while low < high:
            mid = (low + high + 1) // 2
            if step(mid).time_s <= max_tpot:
                low = mid
            else:
                high = mid - 1
        best = step(low)
        rate = low / best.time_s
        replicas = math.ceil(target / rate)
        plans.append(ServingPlan(tp, low, best.time_s, rate, replicas, replicas * tp,
                                 best.bound))
    return plans


def size_serving(model: Model, **kwargs) -> ServingPlan:
    """The plan of :func:`serving_options` that needs the fewest GPUs (ties: lower latency).

    Args:
        model: the model.
        **kwargs: the keyword arguments of :func:`serving_options`.

    Returns:
        A :class:`ServingPlan`.

    Raises:
        ValueError: if no ``tp`` in ``tp_options`` can meet the latency target with the weights
            in memory; the message names what to relax.
    """
    plans = serving_options(model, **kwargs)
    if not plans:
        raise ValueError(
            f"No tensor-parallel width in {kwargs.get('tp_options', (1, 2, 4, 8))} serves "
            f"{model.name} within max_tpot_s={kwargs.get('max_tpot_s')!r}: allow a longer time "
            f"per token, wider tp_options, or fewer bytes per weight.")
    return min(plans, key=lambda plan: (plan.gpus, plan.tpot_s))


def _acceptance(alpha: float) -> float:
    a = _checks.number("alpha", alpha)
    if not 0 <= a <= 1:
        raise ValueError(f"alpha must lie in [0, 1] (the chance a draft token is accepted), "
                         f"got {alpha!r}.")
    return a


def speculative_tokens_per_step(alpha: float, k: int) -> float:
    """Expected tokens one target step emits with speculative decoding.

    A small draft model proposes ``k`` tokens; the target model scores all of them in one
    forward pass, keeps the longest accepted prefix and adds one token of its own (the
    correction at the first rejection, or a bonus token when all ``k`` are accepted). If each
    draft token is accepted with probability ``alpha``, independently, the expected number of
    tokens per target step is ``(1 - alpha**(k + 1)) / (1 - alpha)`` (``k + 1`` at
    ``alpha = 1``, 1 at ``alpha = 0``).

    Args:
        alpha: acceptance rate of a draft token, in [0, 1].
        k: draft tokens proposed per target step (integer >= 0; 0 is plain decoding).

    Returns:
        Expected tokens per target forward pass, in [1, k + 1].

    Raises:
        ValueError: if ``alpha`` is outside [0, 1] or ``k`` is not an integer >= 0.

    References:
        Leviathan et al., ICML 2023, Section 3.1, Equation (1).
        https://arxiv.org/abs/2211.17192
    """
    a = _acceptance(alpha)
    draft = _checks.count("k", k, minimum=0)
    if a == 1:
        return float(draft + 1)
    return (1 - a ** (draft + 1)) / (1 - a)


def speculative_speedup(alpha: float, k: int, cost_ratio: float) -> float:
    """Modelled wall-clock speed-up of speculative decoding over plain decoding.

    One speculative step costs ``k`` draft steps of ``cost_ratio`` (``c``, a draft step's time
    over a target step's) plus one target step, ``k c + 1`` target steps, and emits
    :func:`speculative_tokens_per_step` tokens, so the speed-up is
    ``(1 - alpha**(k + 1)) / ((1 - alpha) (k c + 1))``. It assumes the target scores ``k + 1``
    tokens in the time of one (decode is memory-bound: true while the batch stays below the
    compute-bound crossover, see :func:`crossover_batch`).

    Args:
        alpha: acceptance rate of a draft token, in [0, 1].
        k: draft tokens per target step (integer >= 0).
        cost_ratio: a draft step's time over a target step's, ``c >= 0``.

    Returns:
        Expected tokens per unit of target-step time, relative to plain decoding (1 at k = 0).

    Raises:
        ValueError: for ``alpha`` outside [0, 1], ``k`` not an integer >= 0, or a negative or
            non-finite ``cost_ratio``.

    References:
        Leviathan et al., ICML 2023, Section 3.4, Theorem 3.8.
        https://arxiv.org/abs/2211.17192
    """
    c = _checks.number("cost_ratio", cost_ratio)
    if not math.isfinite(c) or c < 0:
        raise ValueError(f"cost_ratio must be a finite number >= 0 (draft step time / target "
                         f"step time), got {cost_ratio!r}.")
    draft = _checks.count("k", k, minimum=0)
    return speculative_tokens_per_step(alpha, draft) / (draft * c + 1)


def simulate_speculative_tokens_per_step(alpha: float, k: int, steps: int, *,
                                         seed: int = 0) -> float:
    """Tokens per target step, counted by drawing ``steps`` speculative steps at random.

    Each step draws up to ``k`` independent acceptances with probability ``alpha``, stops at
    the first rejection, and emits the accepted tokens plus the target's one: the brute-force
    check of :func:`speculative_tokens_per_step`.

    Args:
        alpha: acceptance rate, in [0, 1].
        k: draft tokens per step (integer >= 0).
        steps: target steps simulated (integer >= 1).
        seed: NumPy generator seed.

    Returns:
        Mean tokens per step over the simulation.

    Raises:
        ValueError: for ``alpha`` outside [0, 1] or a count out of range.
    """
    import numpy as np

    a = _acceptance(alpha)
    draft = _checks.count("k", k, minimum=0)
    n = _checks.count("steps", steps)
    accepted = np.random.default_rng(seed).random((n, draft)) < a   # (steps, k)
    prefix = np.cumprod(accepted, axis=1).sum(axis=1)                # accepted before 1st reject
    return float(np.mean(prefix + 1))
