"""Counting the floating-point operations of training, and how well a cluster uses its peak.

A dense transformer with ``N`` parameters does about ``2N`` FLOPs per token in the forward pass
(one multiply and one add per weight) and about twice that in the backward pass (gradients with
respect to the activations and with respect to the weights), so training costs about ``6N`` FLOPs
per token and ``6ND`` FLOPs for ``D`` tokens. Attention adds a term that grows with the sequence
length. Model FLOPs utilization (MFU) is the model's FLOPs per second over the peak FLOPs per second
of all devices; it counts only the FLOPs the model needs, not recomputed ones.

**The course's one MFU definition.** The model FLOPs per trained token are
:func:`transformer_flops_per_token`, ``6N + 12 L s d_attn``: PaLM's accounting (Appendix B), the
one most published MFU figures use, and the one every chapter, lab and the planner
(:mod:`clusterlab.analytic.plan`) divide by the peak. It counts attention over the whole ``s x s``
score matrix; a causal model with a FlashAttention-style kernel skips the masked half, so it
*executes* fewer attention FLOPs, :func:`causal_flops_per_token`. That count is for time models (how
long a step or a prefill takes), never for MFU: at long contexts the two differ (see
:func:`mfu_convention_over_causal`), and an MFU must say which it used.

All FLOP counts are plain floating-point operations (a fused multiply-add counts as 2); rates are
in FLOP/s (``_flops_per_s``); times in seconds (``_s``).

References:
    Kaplan et al., "Scaling Laws for Neural Language Models", 2020.
    https://arxiv.org/abs/2001.08361
    Hoffmann et al., "Training Compute-Optimal Large Language Models", 2022.
    https://arxiv.org/abs/2203.15556
    Chowdhery et al., "PaLM: Scaling Language Modeling with Pathways", 2022, Appendix B.
    https://arxiv.org/abs/2204.02311
"""

from __future__ import annotations

import math
from clusterlab._checks import (count as _check_count, number as _as_float,
                                positive as _check_positive)

__all__ = ["training_flops", "transformer_params", "transformer_flops_per_token",
           "moe_flops_per_token",
           "causal_flops_per_token", "mfu_convention_over_causal", "mfu", "time_to_train_s"]


def training_flops(n_params: float, n_tokens: float) -> float:
    """Total training FLOPs of a dense model, the ``6ND`` rule.

    Forward pass ``2N`` FLOPs per token, backward pass ``4N``; attention over the context is left
    out (see :func:`transformer_flops_per_token` for the correction).

    Args:
        n_params: number of parameters ``N`` (> 0).
        n_tokens: number of training tokens ``D`` (> 0).

    Returns:
        ``6 * n_params * n_tokens`` in FLOPs.

    Raises:
        ValueError: if either argument is not positive and finite.

    References:
        Kaplan et al. 2020, Sec. 2.1, https://arxiv.org/abs/2001.08361;
        Hoffmann et al. 2022, https://arxiv.org/abs/2203.15556.
    """
    _check_positive("n_params", n_params)
    _check_positive("n_tokens", n_tokens)
    return 6.0 * float(n_params) * float(n_tokens)


def transformer_params(n_layers: int, d_model: int, *, n_heads: int, n_kv_heads: int,
                       ffn_width: int, vocab_size: int | None = None,
                       untied_embeddings: bool = True) -> float:
    """Parameters of a decoder-only transformer with grouped-query attention and a gated
    (SwiGLU) MLP, as Llama 3 is built, biases and norms left out (under 0.01%).

    Per layer: the query and output projections ``2 d^2``, the key and value projections
    ``2 d g (d / a)`` for ``g`` key/value heads of width ``d / a``, and the MLP's three
    ``d x f`` matrices (gate, up, down); then the input embedding ``V d`` and, untied, the
    output layer ``V d``.

    Llama 3 405B (126 layers, d 16384, 128 heads, 8 KV heads, f 53248, V 128256): 405.8e9,
    the 405B of Dubey et al. 2024, Table 3.

    Args:
        n_layers, d_model: L and d.
        n_heads, n_kv_heads: a and g (g divides a; g = a is multi-head attention).
        ffn_width: f, the gated MLP's hidden width.
        vocab_size: V; None: no embeddings counted.
        untied_embeddings: whether the output layer has its own ``V d`` (Llama 3's do).

    Returns:
        The parameter count.

    Raises:
        ValueError: for a size that is not a positive integer or g not dividing a.
    """
    for name, value in (("n_layers", n_layers), ("d_model", d_model), ("n_heads", n_heads),
                        ("n_kv_heads", n_kv_heads), ("ffn_width", ffn_width)):
        _check_count(name, value)
    if n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads ({n_kv_heads}) must divide n_heads ({n_heads}): each "
                         f"key/value head serves a group of query heads.")
    attention = 2.0 * d_model**2 + 2.0 * d_model * n_kv_heads * (d_model / n_heads)
    per_layer = attention + 3.0 * d_model * ffn_width
    embeddings = 0.0 if vocab_size is None else (
        _check_count("vocab_size", vocab_size) * d_model * (2 if untied_embeddings else 1))
    return n_layers * per_layer + embeddings


def transformer_flops_per_token(n_params: float, n_layers: int, seq_len: int,
                                d_model: int) -> float:
    """Model FLOPs per trained token: the numerator of the course's one MFU definition.

    ``6N`` for the weight matmuls plus ``12 * L * H * Q * T`` = ``12 * L * d_model * T`` for the
    attention scores and the weighted sum of values (``H`` heads of size ``Q``, ``H*Q = d_model``,
    context ``T``), forward and backward, as in the PaLM paper's MFU accounting. Attention is
    counted as if unmasked (every token against all ``T``), by convention; what a causal kernel
    executes is :func:`causal_flops_per_token`.

    Args:
        n_params: number of (non-embedding) parameters ``N`` (> 0).
        n_layers: number of transformer layers ``L`` (integer >= 1).
        seq_len: sequence length ``T`` in tokens (integer >= 1).
        d_model: attention width ``H*Q`` (heads times head size, integer >= 1); it equals the
            model width in most transformers (PaLM 540B is an exception: 48 x 256 = 12288
            against a model width of 18432).

    Returns:
        FLOPs per training token: ``6 * N + 12 * n_layers * seq_len * d_model``.

    Raises:
        ValueError: if ``n_params`` is not positive or a size is not a positive integer.

    References:
        Chowdhery et al. 2022 (PaLM), Appendix B, https://arxiv.org/abs/2204.02311.
    """
    _check_positive("n_params", n_params)
    _check_count("n_layers", n_layers)
    _check_count("seq_len", seq_len)
    _check_count("d_model", d_model)
    return 6.0 * float(n_params) + 12.0 * n_layers * seq_len * d_model


def moe_flops_per_token(n_params: float, n_layers: int, seq_len: int, d_model: int, *,
                        n_moe_layers: int, n_experts: int, top_k: int,
                        params_per_expert: float) -> float:
    """Model FLOPs per trained token of a mixture-of-experts transformer: the course's MFU
    numerator (:func:`transformer_flops_per_token`) of the parameters a token uses.

    A token runs ``top_k`` of the ``n_experts`` expert MLPs of each of the ``n_moe_layers`` MoE
    layers, so ``(n_experts - top_k) * params_per_expert`` parameters of each such layer do no
    work for it. The active parameters are ``N_active = N - n_moe_layers (E - k) P_e`` and the
    FLOPs ``6 N_active + 12 L s d`` (the "active parameters" by which Mixtral 8x7B, 46.7B
    parameters, counts 12.9B, Jiang et al. 2024, section 2; the router's ``d x E`` weights count
    as parameters every token uses).

    Args:
        n_params: every parameter ``N``, the experts' included (> 0).
        n_layers: transformer layers ``L`` (integer >= 1).
        seq_len: sequence length ``T`` (integer >= 1).
        d_model: attention width (integer >= 1), as in :func:`transformer_flops_per_token`.
        n_moe_layers: layers whose MLP is a mixture of experts (integer, 1 to ``n_layers``).
        n_experts: experts ``E`` per MoE layer (integer >= 1).
        top_k: experts per token ``k`` (integer, 1 to ``E``).
        params_per_expert: parameters ``P_e`` of one expert MLP (> 0; ``3 d f`` for a gated
            MLP of width ``f``).

    Returns:
        FLOPs per training token: ``6 N_active + 12 L T d``.

    Raises:
        ValueError: for a bad size, ``top_k`` outside ``[1, E]``, more MoE layers than layers,
            or experts holding every parameter (``N_active <= 0``: ``n_params`` must count all
            parameters).

    References:
        Jiang et al., "Mixtral of Experts", 2024, https://arxiv.org/abs/2401.04088;
        Chowdhery et al. 2022 (PaLM), Appendix B (the ``6N + 12 L T d`` accounting).
    """
    _check_count("n_moe_layers", n_moe_layers)
    _check_count("n_experts", n_experts)
    _check_count("top_k", top_k)
    _check_positive("params_per_expert", params_per_expert)
    if n_moe_layers > _check_count("n_layers", n_layers):
        raise ValueError(f"n_moe_layers ({n_moe_layers}) exceeds the {n_layers} layers; give "
                         f"at most n_layers MoE layers.")
    if top_k > n_experts:
        raise ValueError(f"top_k ({top_k}) exceeds the {n_experts} experts: a token cannot run "
                         f"more experts than there are.")
    active = (_check_positive("n_params", n_params)
              - n_moe_layers * (n_experts - top_k) * float(params_per_expert))
    if active <= 0:
        raise ValueError(f"The {n_moe_layers} x {n_experts} experts of {params_per_expert:.3g} "
                         f"parameters hold more than the {n_params:.3g} parameters given; "
                         f"n_params counts every parameter, the experts' included.")
    return transformer_flops_per_token(active, n_layers, seq_len, d_model)


def causal_flops_per_token(n_params: float, n_layers: int, seq_len: int, d_attn: int, *,
                           backward: bool = True) -> float:
    """FLOPs per token a causal decoder executes: for time models, not for MFU.

    Token ``i`` (1-based) of a sequence of ``T`` attends over ``i`` tokens: ``4 i d_attn`` FLOPs
    per layer forward for the scores and the weighted sum of values. Averaged over the sequence
    that is ``2 d_attn (T + 1)`` per layer, about half of the unmasked count in
    :func:`transformer_flops_per_token`; a FlashAttention-style kernel skips the masked blocks,
    so this is what it executes. The forward pass is ``2N`` plus that; training (``backward``)
    triples both.

    Args:
        n_params: parameters used in a matmul per token ``N`` (> 0).
        n_layers: transformer layers ``L`` (integer >= 1).
        seq_len: sequence (or prompt) length ``T`` in tokens (integer >= 1).
        d_attn: query heads times head size (integer >= 1).
        backward: ``True`` for a training token (forward and backward, 3x the forward),
            ``False`` for the forward pass alone (a prefill).

    Returns:
        ``(2N + 2 L d_attn (T + 1))`` FLOPs per token, times 3 when ``backward``.

    Raises:
        ValueError: if ``n_params`` is not positive or a size is not a positive integer.

    References:
        Dao et al., "FlashAttention", 2022 (causal masking skips blocks).
        https://arxiv.org/abs/2205.14135
    """
    _check_positive("n_params", n_params)
    _check_count("n_layers", n_layers)
    _check_count("seq_len", seq_len)
    _check_count("d_attn", d_attn)
    forward = 2.0 * float(n_params) + 2.0 * n_layers * d_attn * (seq_len + 1)
    return 3.0 * forward if backward else forward


def mfu_convention_over_causal(n_params: float, n_layers: int, seq_len: int,
                               d_attn: int) -> float:
    """How much the MFU convention overstates the FLOPs a causal model executes.

    The ratio :func:`transformer_flops_per_token` / :func:`causal_flops_per_token` (training):
    close to 1 at short contexts, about 1.4 for a 405B model at 131,072 tokens. An MFU computed
    with the convention is this factor above the fraction of the peak the hardware spends on
    the model's executed FLOPs.

    Args:
        n_params, n_layers, seq_len, d_attn: as in :func:`transformer_flops_per_token`.

    Returns:
        The ratio, >= 1 for ``seq_len >= 1``.
    """
    return (transformer_flops_per_token(n_params, n_layers, seq_len, d_attn)
            / causal_flops_per_token(n_params, n_layers, seq_len, d_attn))


def mfu(model_flops_per_s: float, n_devices: int, peak_flops_per_device: float) -> float:
    """Model FLOPs utilization: achieved model FLOP/s over the peak FLOP/s of all devices.

    Only the FLOPs the model needs count (e.g. ``tokens_per_s * 6N``); recomputed activations
    do not, which is what separates MFU from hardware FLOPs utilization (HFU).

    Args:
        model_flops_per_s: model FLOPs per second the whole job achieves (>= 0).
        n_devices: number of devices (integer >= 1).
        peak_flops_per_device: peak FLOP/s of one device in the dtype used (> 0).

    Returns:
        MFU as a fraction (0.462 means 46.2%).

    Raises:
        ValueError: on negative throughput, a non-positive peak or device count, or an MFU
            above 1 (more than the peak: the inputs contradict each other).

    References:
        Chowdhery et al. 2022 (PaLM), Sec. 4.1 and Appendix B, https://arxiv.org/abs/2204.02311.
    """
    achieved = _as_float("model_flops_per_s", model_flops_per_s)
    if not math.isfinite(achieved) or achieved < 0:
        raise ValueError(
            f"model_flops_per_s must be a non-negative finite number, got {model_flops_per_s!r}.")
    _check_count("n_devices", n_devices)
    _check_positive("peak_flops_per_device", peak_flops_per_device)
    value = achieved / (n_devices * float(peak_flops_per_device))
    if value > 1.0:
        raise ValueError(
            f"MFU must be at most 1 (achieved FLOP/s cannot exceed the peak of all devices), got "
            f"{value:.3g} from {model_flops_per_s!r} FLOP/s on {n_devices} x "
            f"{peak_flops_per_device!r} FLOP/s.")
    return value


def time_to_train_s(total_flops: float, n_devices: int, peak_flops_per_device: float,
                    mfu: float) -> float:
    """Wall-clock seconds to do ``total_flops`` on ``n_devices`` running at a given MFU.

    Args:
        total_flops: FLOPs of the whole training run, e.g. from :func:`training_flops` (> 0).
        n_devices: number of devices (integer >= 1).
        peak_flops_per_device: peak FLOP/s of one device in the dtype used (> 0).
        mfu: model FLOPs utilization as a fraction, ``0 < mfu <= 1``.

    Returns:
        ``total_flops / (n_devices * peak_flops_per_device * mfu)`` in seconds.

    Raises:
        ValueError: if an argument is out of range (``mfu`` must lie in (0, 1]).

    References:
        Chowdhery et al. 2022 (PaLM), Sec. 4.1, https://arxiv.org/abs/2204.02311.
    """
    _check_positive("total_flops", total_flops)
    _check_count("n_devices", n_devices)
    _check_positive("peak_flops_per_device", peak_flops_per_device)
    _check_positive("mfu", mfu)
    if mfu > 1:
        raise ValueError(f"mfu must lie in (0, 1] (a fraction of the peak), got {mfu!r}.")
    return float(total_flops) / (n_devices * float(peak_flops_per_device) * float(mfu))
