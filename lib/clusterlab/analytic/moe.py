"""A mixture-of-experts layer's counts, without running it: capacity, drops, all-to-all bytes.

An MoE layer routes each of a group's ``T`` tokens to ``k`` of ``E`` experts; each expert takes at
most ``C = ceil(capacity_factor * T * k / E)`` of the group's assignments (Switch's "expert
capacity" times k, Fedus et al. 2021), and expert parallelism moves them in a dispatch and a
combine all-to-all whose buffers hold ``E * C`` slots of ``D`` values per device (GShard,
Lepikhin et al. 2021). These are NumPy-only, so the planner (:mod:`clusterlab.analytic.plan`) prices
expert parallelism with the same functions that :mod:`clusterlab.device.parallel.experts` checks
against a layer run on devices.

References:
    Lepikhin et al., "GShard: Scaling Giant Models with Conditional Computation and Automatic
    Sharding", 2021. https://arxiv.org/abs/2006.16668
    Fedus, Zoph and Shazeer, "Switch Transformers: Scaling to Trillion Parameter Models with
    Simple and Efficient Sparsity", 2021 (JMLR 2022). https://arxiv.org/abs/2101.03961
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["all_to_all_bytes", "check_routing", "expert_capacity", "predicted_dropped"]


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
