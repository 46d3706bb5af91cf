"""A mixture-of-experts layer's counts, without running it: capacity, drops, all-to-all bytes.

An MoE layer routes each of a group's ``T`` tokens to ``k`` of ``E`` experts; each expert takes at
most ``C = ceil(capacity_factor * T * k / E)`` of the group's assignments (Switch's "expert
capacity" times k, Fedus et al. 2021), and expert parallelism moves them in a dispatch and a
combine all-to-all whose buffers hold ``E * C`` slots of ``D`` values per device (GShard,
Lepikhin et al. 2021). These are NumPy-only, so the planner (:mod:`clusterlab.analytic.plan`) prices
expert parallelism with the same functions that :mod:`clusterlab.device.parallel.experts` checks
against a layer run on devices.

A model's parameters are counted from its shapes (:func:`moe_transformer_parameters`): the total,
the *active* ones a token uses, and the routed experts' share, which expert parallelism divides
(:func:`expert_parallel_state_bytes`).

References:
    Lepikhin et al., "GShard: Scaling Giant Models with Conditional Computation and Automatic
    Sharding", 2021. https://arxiv.org/abs/2006.16668
    Fedus, Zoph and Shazeer, "Switch Transformers: Scaling to Trillion Parameter Models with
    Simple and Efficient Sparsity", 2021 (JMLR 2022). https://arxiv.org/abs/2101.03961
    Jiang et al., "Mixtral of Experts", 2024, Table 1. https://arxiv.org/abs/2401.04088
    DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, section 4.2; the shapes of its
    released config.json. https://arxiv.org/abs/2412.19437
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["MoeParameterCount", "all_to_all_bytes", "check_routing", "expert_capacity",
           "expert_parallel_state_bytes", "gated_mlp_parameters",
           "grouped_query_attention_parameters", "latent_attention_parameters",
           "moe_transformer_parameters", "predicted_dropped"]


def check_routing(n_experts: int, top_k: int, capacity_factor: float) -> None:
    """Raise a ValueError naming the fix unless 1 <= top_k <= n_experts and capacity_factor > 0."""
    if not 1 <= top_k <= n_experts:
        raise ValueError(f"top_k must be between 1 and the number of experts ({n_experts}), "
                         f"got {top_k}: a token cannot pick more experts than there are.")
    if not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be > 0, got {capacity_factor}: it scales each "
                         "expert's share of the tokens (1.0 is exactly the even share).")


def expert_capacity(tokens: int, *, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert for one group: ``ceil(capacity_factor * tokens * top_k / n_experts)``.

    Args:
        tokens: tokens routed together (one device's tokens under expert parallelism).
        n_experts: E.
        top_k: k, experts per token.
        capacity_factor: 1.0 gives exactly the even share; above 1 leaves headroom.

    Raises:
        ValueError: for a capacity factor <= 0, k > E or k < 1, or no tokens.
    """
    check_routing(n_experts, top_k, capacity_factor)
    if tokens < 1:
        raise ValueError(f"An MoE layer needs at least one token per group, got {tokens}.")
    return math.ceil(capacity_factor * tokens * top_k / n_experts)


def predicted_dropped(expert: np.ndarray, capacity: int, n_experts: int) -> int:
    """Assignments a capacity of ``capacity`` drops, counted from the router's choices alone.

    Args:
        expert: i32[G, T, k] (or [T, k] for one group): the experts chosen per token.
        capacity: C, slots per expert per group.
        n_experts: E.

    Returns:
        ``sum over groups and experts of max(0, n_ge - C)``, n_ge the assignments of group g to
        expert e. The order of service decides *which* are dropped, not how many.
    """
    expert = np.asarray(expert)
    if expert.ndim == 2:
        expert = expert[None]
    if expert.ndim != 3:
        raise ValueError(f"expert must be [groups, tokens, k] or [tokens, k], got shape "
                         f"{expert.shape}.")
    counts = np.stack([np.bincount(g.ravel(), minlength=n_experts) for g in expert])  # [G, E]
    return int(np.maximum(counts - capacity, 0).sum())


def all_to_all_bytes(tokens_per_device: int, *, d_model: int, n_experts: int, top_k: int,
                     capacity_factor: float, bytes_per_element: int = 4) -> int:
    """Bytes of one dispatch (or combine) all-to-all per device: ``E * C * D * b``.

    That is the all-to-all's buffer (the size nccl-tests reports and the compiled program's
    result shape): ``E`` experts of ``C`` slots of ``D`` values, so about
    ``capacity_factor * k * T * D * b``. A device keeps ``1/p`` of it and sends ``(p-1)/p``
    (:func:`clusterlab.analytic.costmodel.collective_steps_and_bytes`).

    Args:
        tokens_per_device: T, tokens each device routes.
        d_model: D.
        n_experts: E.
        top_k: k.
        capacity_factor: as in :func:`expert_capacity`.
        bytes_per_element: 4 for float32, 2 for bf16.
    """
    capacity = expert_capacity(tokens_per_device, n_experts=n_experts, top_k=top_k,
                               capacity_factor=capacity_factor)
    return n_experts * capacity * d_model * bytes_per_element


# --- parameters, active parameters and model-state bytes -------------------------------------

class MoeParameterCount(NamedTuple):
    """A mixture-of-experts transformer's parameters, counted from its shapes.

    Attributes:
        total: every parameter (embeddings, attention, norms, routers, every expert).
        active: the parameters one token uses: all but the ``E - k`` routed experts it skips in
            each MoE layer (the "active" or "activated" parameters papers report).
        routed_expert: the routed experts' parameters over every MoE layer: the part that
            expert parallelism divides among devices.
    """

    total: int
    active: int
    routed_expert: int


def gated_mlp_parameters(d_model: int, width: int) -> int:
    """A gated (SwiGLU) MLP's weights: gate, up and down, ``3 d f``, no biases."""
    return 3 * _positive_int("d_model", d_model) * _positive_int("width", width)


def grouped_query_attention_parameters(d_model: int, *, n_heads: int, n_kv_heads: int,
                                       head_dim: int) -> int:
    """Grouped-query attention's projections, no biases: ``d (2 a + 2 g) d_head``.

    The query and output projections map ``d`` to and from ``a`` heads of ``d_head``; the key
    and value projections map ``d`` to ``g`` heads (Mixtral 8x7B: d 4096, a 32, g 8, d_head
    128, Jiang et al. 2024, Table 1).
    """
    for name, value in (("d_model", d_model), ("n_heads", n_heads), ("n_kv_heads", n_kv_heads),
                        ("head_dim", head_dim)):
        _positive_int(name, value)
    if n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads ({n_kv_heads}) must divide n_heads ({n_heads}): each "
                         f"key/value head serves a group of query heads.")
    return d_model * (2 * n_heads + 2 * n_kv_heads) * head_dim


def latent_attention_parameters(d_model: int, *, n_heads: int, q_rank: int, kv_rank: int,
                                nope_head_dim: int, rope_head_dim: int, v_head_dim: int) -> int:
    """Multi-head latent attention's weights (DeepSeek-V2/V3), its two RMSNorms included.

    Queries: ``d -> q_rank`` (normed) ``-> a (nope + rope)``. Keys and values: ``d -> kv_rank +
    rope`` (the compressed latent, normed, plus one shared rotary key), then ``kv_rank -> a
    (nope + v)``. Output: ``a v -> d``. These are the matrices of DeepSeek-V3's released
    ``modeling_deepseek.py`` (q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa,
    kv_a_layernorm, kv_b_proj, o_proj).

    Args:
        d_model: d (7168 for DeepSeek-V3).
        n_heads: a (128).
        q_rank, kv_rank: the query and key-value compression widths (1536, 512).
        nope_head_dim, rope_head_dim, v_head_dim: per-head widths of the keys' non-rotary and
            rotary parts and of the values (128, 64, 128).
    """
    for name, value in (("d_model", d_model), ("n_heads", n_heads), ("q_rank", q_rank),
                        ("kv_rank", kv_rank), ("nope_head_dim", nope_head_dim),
                        ("rope_head_dim", rope_head_dim), ("v_head_dim", v_head_dim)):
        _positive_int(name, value)
    queries = d_model * q_rank + q_rank + q_rank * n_heads * (nope_head_dim + rope_head_dim)
    keys_values = (d_model * (kv_rank + rope_head_dim) + kv_rank
                   + kv_rank * n_heads * (nope_head_dim + v_head_dim))
    return queries + keys_values + n_heads * v_head_dim * d_model


def moe_transformer_parameters(*, n_layers: int, n_dense_layers: int, d_model: int,
                               attention_per_layer: int, dense_mlp_width: int | None,
                               expert_mlp_width: int, n_experts: int, top_k: int,
                               n_shared_experts: int, vocab_size: int,
                               untied_embeddings: bool = True) -> MoeParameterCount:
    """Total, active and routed-expert parameters of a decoder with gated-MLP experts.

    Each of the ``n_layers`` layers has attention (``attention_per_layer``, as
    :func:`grouped_query_attention_parameters` or :func:`latent_attention_parameters` count
    it) and two RMSNorms of ``d``. The first ``n_dense_layers`` have a dense gated MLP of
    ``dense_mlp_width``; the rest have a router (``E d``), ``n_shared_experts`` experts every
    token uses and ``E`` routed experts of ``expert_mlp_width``, ``k`` of them per token. Then
    the input embedding ``V d``, the output layer ``V d`` if untied, and the final norm ``d``.
    A token uses everything but ``E - k`` routed experts per MoE layer. Biases (none in these
    models) and the router's score bias (DeepSeek-V3: ``E`` values) are left out.

    Mixtral 8x7B (Jiang et al. 2024, Table 1): 46.70e9 total, 12.88e9 active, against the 46.7B
    and 12.9B Mistral AI reports. DeepSeek-V3 (DeepSeek-AI 2024, section 4.2, and its released
    config.json): 671.0e9 and 37.6e9, against 671B and 37B.

    Args:
        n_layers: L, every layer.
        n_dense_layers: layers with a dense MLP (0 for Mixtral, 3 for DeepSeek-V3), the first.
        d_model: d.
        attention_per_layer: one layer's attention parameters.
        dense_mlp_width: the dense layers' MLP width (None when there are none).
        expert_mlp_width: one expert's MLP width.
        n_experts: E, routed experts per MoE layer.
        top_k: k, routed experts per token.
        n_shared_experts: experts every token uses, beside the routed ones (0 or more).
        vocab_size: V.
        untied_embeddings: whether the output layer has its own ``V d`` (both models' do).

    Raises:
        ValueError: for a size that is not a positive integer, ``top_k`` outside ``[1, E]``,
            dense layers outside ``[0, L)``, or dense layers without a width.
    """
    for name, value in (("n_layers", n_layers), ("d_model", d_model),
                        ("attention_per_layer", attention_per_layer),
                        ("vocab_size", vocab_size)):
        _positive_int(name, value)
    check_routing(n_experts, top_k, 1.0)
    if not 0 <= n_dense_layers < n_layers:
        raise ValueError(f"n_dense_layers must be in [0, n_layers = {n_layers}), got "
                         f"{n_dense_layers}: an MoE model needs at least one MoE layer.")
    if n_shared_experts < 0:
        raise ValueError(f"n_shared_experts must be 0 or more, got {n_shared_experts}.")
    if n_dense_layers and dense_mlp_width is None:
        raise ValueError(f"{n_dense_layers} dense layers need dense_mlp_width; give their MLP "
                         "width.")
    expert = gated_mlp_parameters(d_model, expert_mlp_width)
    dense_mlp = gated_mlp_parameters(d_model, dense_mlp_width) if n_dense_layers else 0
    n_moe_layers = n_layers - n_dense_layers
    every_layer = attention_per_layer + 2 * d_model
    moe_layer_always = n_experts * d_model + n_shared_experts * expert   # router, shared
    routed = n_moe_layers * n_experts * expert
    embeddings = vocab_size * d_model * (2 if untied_embeddings else 1) + d_model
    total = (n_layers * every_layer + n_dense_layers * dense_mlp
             + n_moe_layers * moe_layer_always + routed + embeddings)
    active = total - n_moe_layers * (n_experts - top_k) * expert
    return MoeParameterCount(total=total, active=active, routed_expert=routed)


def expert_parallel_state_bytes(counts: MoeParameterCount, *, ep: int, pp: int = 1,
                                bytes_per_parameter: float = 16.0) -> float:
    """Model-state bytes per GPU when ``ep`` GPUs share the routed experts.

    Each GPU of an expert-parallel group holds ``1/ep`` of the routed experts and all of the
    rest (attention, embeddings, shared experts, routers); a pipeline of ``pp`` stages divides
    both by ``pp`` (layers assumed even across stages). Every parameter costs
    ``bytes_per_parameter`` whatever the expert: 16 for mixed-precision Adam (16-bit weight and
    gradient, FP32 master weight and two moments; Rajbhandari et al. 2020, as
    :func:`clusterlab.analytic.memory.training_memory_per_device` counts at ZeRO stage 0).
    Activations and buffers are not included.

    Returns:
        ``bytes_per_parameter * ((total - routed) + routed / ep) / pp``.

    Raises:
        ValueError: for ``ep`` or ``pp`` not a positive integer or bytes per parameter <= 0.
    """
    _positive_int("ep", ep)
    _positive_int("pp", pp)
    if not bytes_per_parameter > 0:
        raise ValueError(f"bytes_per_parameter must be > 0, got {bytes_per_parameter}: 16 for "
                         "mixed-precision Adam.")
    per_gpu = (counts.total - counts.routed_expert) + counts.routed_expert / ep
    return float(bytes_per_parameter * per_gpu / pp)


def _positive_int(name: str, value: int) -> int:
    """``value`` if it is a positive integer, else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return int(value)
