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
"""

from __future__ import annotations

from clusterlab import _checks

__all__ = [
    "decode_step_bytes",
    "decode_flops_per_token",
    "decode_arithmetic_intensity",
    "tensor_parallel_all_reduces_per_token",
]


def decode_step_bytes(param_bytes: float, kv_cache_bytes: float) -> float:
    """Bytes one decode step reads from HBM: every weight once, plus the whole KV cache.

    The weights are read once per step and shared by every sequence of the batch; the KV cache
    is per sequence, so pass the cache of the whole batch
    (:func:`clusterlab.memory.kv_cache_bytes` with ``batch`` sequences). Activations are small
    beside both and left out.

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
    of the training term of :func:`clusterlab.flops.transformer_flops_per_token`, which also
    counts the backward pass).

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
    (:func:`clusterlab.hardware.ridge_point`).

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
    tensor-parallel GPUs, one all-reduce each, on the critical path of every token.

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
    return 2 * _checks.count("n_layers", n_layers)
