"""Serving with quantized weights and KV cache: FP8 or INT8 instead of BF16.

A decode step streams every weight and every cached key and value from HBM, so storing them in
one byte instead of two halves those reads and frees memory for more sequences. Two formats:

- ``"fp8"`` weights are W8A8 (FP8 E4M3 weights and activations in the matmuls), so the compute
  roof is the GPU's FP8 peak (Micikevicius et al. 2022).
- ``"int8"`` weights are weight-only (W8A16): read as one byte, multiplied in BF16, so the
  compute roof stays BF16's.

The KV cache takes ``"bf16"`` or ``"fp8"`` (one byte per key or value, as vLLM's
``--kv-cache-dtype fp8``). The activations that tensor parallelism all-reduces stay BF16 whatever
the cache holds (``decode_step``'s ``bytes_per_activation``), where by default it would price
them at the cache's bytes per element.

References:
    Micikevicius et al., "FP8 Formats for Deep Learning", 2022. https://arxiv.org/abs/2209.05433
    vLLM documentation, "Quantized KV Cache" (FP8 E4M3 KV cache).
    https://docs.vllm.ai/en/latest/features/quantization/quantized_kvcache/
"""

from __future__ import annotations

from clusterlab.analytic import serving
from clusterlab.catalog import hardware

__all__ = ["FORMAT_BYTES", "quantized_decode_step"]

#: Bytes per stored number in each format.
FORMAT_BYTES: dict[str, int] = {"bf16": 2, "fp8": 1, "int8": 1}

_ACTIVATION_BYTES = 2  # BF16 activations in the tensor-parallel all-reduces


def _format_bytes(role: str, fmt: str, allowed: tuple[str, ...]) -> int:
    if fmt not in allowed:
        raise ValueError(f"{role}={fmt!r} is not a format this model knows; use one of "
                         f"{', '.join(repr(a) for a in allowed)}.")
    return FORMAT_BYTES[fmt]


def quantized_decode_step(model: serving.Model, batch: int, seq_len: int, *,
                          gpu: hardware.GPU | str, tp: int = 1, weights: str = "bf16",
                          kv_cache: str = "bf16") -> serving.RooflineStep:
    """:func:`~clusterlab.analytic.serving.decode_step` with weights and cache in a given format.

    Weights of ``weights`` bytes are streamed once per step, the cache at ``kv_cache`` bytes per
    number; FP8 weights use the FP8 compute roof, INT8 (weight-only) the BF16 one; the
    ``2 L`` all-reduces move BF16 activations, priced by
    :func:`clusterlab.analytic.costmodel.cluster_collective` on ``tp`` GPUs of one node.

    Args:
        model: the model.
        batch: sequences decoded together (integer >= 1).
        seq_len: tokens in each sequence's cache (integer >= 0).
        gpu: the GPU.
        tp: GPUs per replica (integer >= 1).
        weights: ``"bf16"``, ``"fp8"`` or ``"int8"``.
        kv_cache: ``"bf16"`` or ``"fp8"``.

    Returns:
        A :class:`~clusterlab.analytic.serving.RooflineStep` per GPU; ``time_s`` is the TPOT.

    Raises:
        ValueError: on an unknown format (the message lists the known ones).
    """
    weight_bytes = _format_bytes("weights", weights, ("bf16", "fp8", "int8"))
    kv_bytes = _format_bytes("kv_cache", kv_cache, ("bf16", "fp8"))
    return serving.decode_step(model, batch, seq_len, gpu=gpu, tp=tp,
                               bytes_per_param=weight_bytes, bytes_per_element=kv_bytes,
                               bytes_per_activation=_ACTIVATION_BYTES,
                               precision="fp8" if weights == "fp8" else "bf16")
