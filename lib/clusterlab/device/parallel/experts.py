"""Mixture of experts and expert parallelism: a top-k router, capacity, and two all-to-alls.

A mixture-of-experts (MoE) layer replaces one MLP with ``E`` expert MLPs and a router that sends
each token to ``k`` of them (Shazeer et al. 2017; GShard, Lepikhin et al. 2021; Switch, Fedus et
al. 2021). This module holds one such layer three ways:

* the router (:func:`route`): a softmax over the experts, the top ``k`` kept. Their weights are
  *renormalised* to sum to one when ``renormalize=True`` (Mixtral: a softmax over the top-k
  logits, which is the same thing, Jiang et al. 2024, Section 2.1; DeepSeek-V3 normalises its
  selected affinities the same way, DeepSeek-AI 2024, Section 2.1.2) and left as the softmax's
  probabilities when ``False`` (Switch, top-1: the output is scaled by the gate value p_i(x),
  Fedus et al. 2021, Eq. 2; with k = 1 a renormalised weight would always be 1).
* capacity and dropping: each expert takes at most ``C = ceil(capacity_factor * T * k / E)``
  assignments from a group of ``T`` tokens (:func:`clusterlab.analytic.moe.expert_capacity`;
  Switch's "expert capacity" times k). Assignments are served first-come in token order (token 0's k
  choices in rank order, then token 1's, ...); those beyond an expert's ``C`` are *dropped*: that
  choice adds nothing to the token's output (the layer around it keeps the residual).
  :func:`clusterlab.analytic.moe.predicted_dropped` counts them from the assignments alone: ``sum_e
  max(0, n_e - C)`` per group. These counts, and the all-to-all's bytes, are NumPy-only and live in
  :mod:`clusterlab.analytic.moe` , so the planner prices expert parallelism with the same functions.
* the auxiliary load-balancing loss of Switch (Fedus et al. 2021, Eq. 4 to 6):
  ``E * sum_e f_e * P_e``, with ``f_e`` the fraction of the k * T assignments routed to expert
  e (before dropping) and ``P_e`` the mean router probability of e over the T tokens; it is 1
  when the load is uniform and grows to E when one expert takes everything.

:func:`moe_dense` is the single-device reference: every expert applied to every token, the
outputs picked and weighted per token, no buffers. :func:`moe_expert_parallel` is expert
parallelism inside ``jax.shard_map``: the tokens split over the mesh axis (each device's tokens
are one routing group), the experts split over the same axis (E / p per device), and two
all-to-alls per layer forward: the *dispatch* sends each expert's buffer of ``C`` token slots to
the device that holds the expert, the *combine* sends the outputs back. Each carries
``E * C * D`` values per device (:func:`clusterlab.analytic.moe.all_to_all_bytes`), proportional to
k through C. Backward, each all-to-all's transpose is another all-to-all (JAX 0.10's rule for
``jax.lax.all_to_all``), so a training step runs four.

Parameters are a dict: ``router`` f32[D, E], ``w1`` f32[E, D, H], ``w2`` f32[E, H, D]; an
expert is ``relu(x @ w1[e]) @ w2[e]``. The communication is
:func:`clusterlab.device.collectives.builtin`'s all-to-all and all-reduce; axis names are arguments.

References:
    Shazeer et al., "Outrageously Large Neural Networks: The Sparsely-Gated Mixture-of-Experts
    Layer", 2017. https://arxiv.org/abs/1701.06538
    Lepikhin et al., "GShard: Scaling Giant Models with Conditional Computation and Automatic
    Sharding", 2021. https://arxiv.org/abs/2006.16668
    Fedus, Zoph and Shazeer, "Switch Transformers: Scaling to Trillion Parameter Models with
    Simple and Efficient Sparsity", 2021 (JMLR 2022). https://arxiv.org/abs/2101.03961
    Jiang et al., "Mixtral of Experts", 2024. https://arxiv.org/abs/2401.04088
    DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024. https://arxiv.org/abs/2412.19437
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from clusterlab.analytic.moe import check_routing, expert_capacity
from clusterlab.device import collectives
from clusterlab.device.parallel._common import check_divisible

__all__ = ["DISPATCH_COMBINE", "Masks", "MoEOps", "MoEOutput", "Routing", "check_moe",
           "expert_ffn", "init_moe", "load_balancing_loss", "masks", "moe_dense",
           "moe_expert_parallel", "route", "steered_tokens", "straggler_factor"]

Params = dict  # {"router": f32[D, E], "w1": f32[E, D, H], "w2": f32[E, H, D]}


class Routing(NamedTuple):
    """Where one group's tokens go: T tokens, k choices each, E experts, capacity C."""

    probs: jax.Array  # f32[T, E] the router's softmax
    expert: jax.Array  # i32[T, k] the experts chosen, best first
    weight: jax.Array  # f32[T, k] their combine weights (renormalised or not)
    position: jax.Array  # i32[T, k] the slot in the expert's buffer, first-come in token order
    kept: jax.Array  # bool[T, k] position < C: the assignment is served, else dropped


class Masks(NamedTuple):
    """GShard's dispatch and combine tensors for one group (Lepikhin et al. 2021, Algorithm 2)."""

    dispatch: jax.Array  # f32[T, E, C] 1 where token t sits in slot c of expert e
    combine: jax.Array  # f32[T, E, C] the same, times the token's weight for that expert


class MoEOps(NamedTuple):
    """How tokens enter and leave the experts' buffers, each a function of (array, masks).

    The library uses :data:`DISPATCH_COMBINE`; a lab swaps one for a buggy version (a buffer
    sent to the wrong expert, a combine that ignores the router's weights) to show what the
    check against :func:`moe_dense` catches.
    """

    dispatch: Callable[[jax.Array, Masks], jax.Array]  # (f32[T, D], masks) -> f32[E, C, D]
    combine: Callable[[jax.Array, Masks], jax.Array]  # (f32[E, C, D], masks) -> f32[T, D]


def _dispatch(x: jax.Array, m: Masks) -> jax.Array:
    return jnp.einsum("tec,td->ecd", m.dispatch, x)  # f32[E, C, D]


def _combine(out: jax.Array, m: Masks) -> jax.Array:
    return jnp.einsum("tec,ecd->td", m.combine, out)  # f32[T, D]


DISPATCH_COMBINE = MoEOps(_dispatch, _combine)


class MoEOutput(NamedTuple):
    """What an MoE layer returns."""

    y: jax.Array  # f32[T, D] the layer's output (without the residual)
    aux_loss: jax.Array  # f32[] Switch's load-balancing loss over all T tokens
    dropped: jax.Array  # i32[] assignments dropped by capacity, all groups together
    expert_load: jax.Array  # i32[E] assignments routed to each expert, before dropping


# --- the straggler (capacity, drops and bytes are clusterlab.analytic.moe's)
# -----------------------

def straggler_factor(expert_load: np.ndarray, n_devices: int) -> float:
    """Modelled: the step's expert compute over the balanced case, ``max_device / mean_device``.

    Without a capacity limit every device processes the assignments of its own experts (E / p
    contiguous experts each), and the layer waits for the busiest device. This is a model of
    compute time proportional to tokens processed, not a measurement.

    Args:
        expert_load: i32[E], assignments routed to each expert.
        n_devices: p, expert-parallel devices (E must divide by p).
    """
    load = np.asarray(expert_load, dtype=np.float64)
    check_divisible(load.size, n_devices, _EXPERTS_MESSAGE)
    per_device = load.reshape(n_devices, -1).sum(axis=1)
    return float(per_device.max() / per_device.mean())


def steered_tokens(key: jax.Array, expert: np.ndarray, *, d_model: int,
                   n_experts: int) -> tuple[jax.Array, jax.Array]:
    """A router and tokens whose top-1 choice is known: token t goes to ``expert[t]``.

    The router is ``4 * I`` (expert e reads feature e) and token t is ``3`` on feature
    ``expert[t]`` plus noise of 0.1, so its top logit is that expert's by a margin of about 12
    against noise of about 0.6. For labs and tests that need a given load (one hot expert).

    Args:
        key: for the noise.
        expert: i32[T], the expert each token should pick.
        d_model: D (at least E).
        n_experts: E.

    Returns:
        ``(router f32[D, E], x f32[T, D])``.
    """
    expert = np.asarray(expert)
    if d_model < n_experts:
        raise ValueError(f"Steering needs a feature per expert: d_model = {d_model} < "
                         f"{n_experts} experts; use d_model >= n_experts.")
    if expert.ndim != 1 or expert.min() < 0 or expert.max() >= n_experts:
        raise ValueError(f"expert must be a 1-D array of experts in [0, {n_experts}).")
    router = 4.0 * jnp.eye(d_model, n_experts)
    x = 3.0 * jax.nn.one_hot(expert, d_model) + 0.1 * jax.random.normal(
        key, (expert.size, d_model))
    return router, x


# --- the router -----------------------------------------------------------------------------

_EXPERTS_MESSAGE = (
    "Expert parallelism gives each device whole experts: {size} experts do not divide by {parts} "
    "devices. Use a number of experts that is a multiple of {parts} (e.g. {multiple}) or a "
    "device count that divides {size} (e.g. {divisor}).")
_TOKENS_MESSAGE = (
    "Expert parallelism splits the tokens over the devices: {size} tokens do not divide by "
    "{parts} devices. Use a token count that is a multiple of {parts} (e.g. {multiple}).")


def check_moe(params: Params, x: jax.typing.ArrayLike, *, top_k: int,
              capacity_factor: float) -> None:
    """Raise a ValueError naming the fix for a bad MoE layer or call.

    Args:
        params: from :func:`init_moe`.
        x: f32[T, D] tokens.
        top_k: k.
        capacity_factor: > 0.
    """
    if not {"router", "w1", "w2"} <= set(params):
        raise ValueError("MoE parameters are a dict with 'router' [D, E], 'w1' [E, D, H] and "
                         "'w2' [E, H, D] (see experts.init_moe).")
    d_model, n_experts = params["router"].shape
    if params["w1"].shape[:2] != (n_experts, d_model) or params["w2"].shape[0] != n_experts:
        raise ValueError(f"w1 must be [E={n_experts}, D={d_model}, H] and w2 [E, H, D]; got "
                         f"{params['w1'].shape} and {params['w2'].shape}.")
    if np.ndim(x) != 2 or np.shape(x)[1] != d_model:
        raise ValueError(f"x must be tokens [T, D={d_model}], got shape {np.shape(x)}; "
                         "flatten batch and sequence into T first.")
    check_routing(n_experts, top_k, capacity_factor)


def init_moe(key: jax.Array, *, d_model: int, d_hidden: int, n_experts: int) -> Params:
    """An MoE layer's parameters, scaled 1/sqrt(fan-in).

    Returns:
        ``{"router": f32[D, E], "w1": f32[E, D, H], "w2": f32[E, H, D]}``.
    """
    k_router, k1, k2 = jax.random.split(key, 3)
    return {
        "router": jax.random.normal(k_router, (d_model, n_experts)) / math.sqrt(d_model),
        "w1": jax.random.normal(k1, (n_experts, d_model, d_hidden)) / math.sqrt(d_model),
        "w2": jax.random.normal(k2, (n_experts, d_hidden, d_model)) / math.sqrt(d_hidden),
    }


def route(router: jax.Array, x: jax.Array, *, top_k: int, capacity: int,
          renormalize: bool = True) -> Routing:
    """Route one group of tokens: softmax, top-k, slots first-come in token order.

    Args:
        router: f32[D, E] the router's weights.
        x: f32[T, D] the group's tokens.
        top_k: k.
        capacity: C, slots per expert.
        renormalize: divide the k weights by their sum (Mixtral, DeepSeek-V3); False keeps the
            softmax probabilities (Switch).
    """
    n_experts = router.shape[1]
    probs = jax.nn.softmax(x @ router, axis=-1)  # f32[T, E]
    weight, expert = jax.lax.top_k(probs, top_k)  # f32[T, k], i32[T, k]
    if renormalize:
        weight = weight / jnp.sum(weight, axis=-1, keepdims=True)
    # the T*k assignments in token order; an expert's n-th assignment takes slot n
    onehot = jax.nn.one_hot(expert.reshape(-1), n_experts, dtype=jnp.int32)  # i32[T*k, E]
    position = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=1)  # i32[T*k]
    position = position.reshape(expert.shape)  # i32[T, k]
    return Routing(probs, expert, weight, position, position < capacity)


def masks(routing: Routing, n_experts: int, capacity: int,
          dtype: jax.typing.DTypeLike = jnp.float32) -> Masks:
    """The dispatch and combine tensors [T, E, C] of one group's routing, in ``dtype``.

    Pass the tokens' dtype: a float32 mask would promote bf16 tokens to float32 in the dispatch
    einsum, and the all-to-alls would then move twice the bytes of
    :func:`clusterlab.analytic.moe.all_to_all_bytes` at two bytes per value. The masks are built
    in float32 and cast once: dispatch holds 0 and 1 (exact in bf16), combine the router's
    weights rounded to ``dtype``.
    """
    kept = routing.kept.astype(jnp.float32)  # f32[T, k]
    to_expert = jax.nn.one_hot(routing.expert, n_experts)  # f32[T, k, E]
    to_slot = jax.nn.one_hot(routing.position, capacity)  # f32[T, k, C]; zero where >= C
    dispatch = jnp.einsum("tk,tke,tkc->tec", kept, to_expert, to_slot)
    combine = jnp.einsum("tk,tke,tkc->tec", kept * routing.weight, to_expert, to_slot)
    return Masks(dispatch.astype(dtype), combine.astype(dtype))


def _load_sums(routing: Routing, n_experts: int) -> tuple[jax.Array, jax.Array]:
    """A group's assignment counts i32[E] (before dropping) and router probabilities summed
    over its tokens f32[E]."""
    counts = jnp.sum(jax.nn.one_hot(routing.expert, n_experts, dtype=jnp.int32), axis=(0, 1))
    return counts, jnp.sum(routing.probs, axis=0)


def load_balancing_loss(counts: jax.Array, prob_sums: jax.Array, tokens: int,
                        top_k: int) -> jax.Array:
    """Switch's auxiliary loss ``E * sum_e f_e * P_e`` (Fedus et al. 2021, Eq. 4).

    Args:
        counts: i32[E] assignments to each expert over ``tokens`` tokens (f_e = counts / (k T)).
        prob_sums: f32[E] router probabilities summed over the tokens (P_e = prob_sums / T).
        tokens: T.
        top_k: k.

    Returns:
        f32[] 1.0 for a uniform load; E when every token goes to one expert with certainty.
        Only P carries a gradient (f counts argmaxes).
    """
    n_experts = counts.shape[0]
    f = counts.astype(jnp.float32) / (top_k * tokens)
    return n_experts * jnp.sum(f * prob_sums / tokens)


def expert_ffn(w1: jax.Array, w2: jax.Array, h: jax.Array) -> jax.Array:
    """Each expert's MLP on its own rows: ``relu(h[e] @ w1[e]) @ w2[e]``.

    Args:
        w1: f32[E', D, H]. w2: f32[E', H, D]. h: f32[E', N, D], N tokens per expert.
    """
    return jnp.einsum("enh,ehd->end", jax.nn.relu(jnp.einsum("end,edh->enh", h, w1)), w2)


# --- the layer, on one device and expert-parallel -------------------------------------------

def moe_dense(params: Params, x: jax.typing.ArrayLike, *, top_k: int, capacity_factor: float,
              n_groups: int = 1, renormalize: bool = True) -> MoEOutput:
    """The single-device reference: every expert on every token, outputs picked per token.

    No buffers and no dispatch: ``y_t = sum_j kept_tj * w_tj * FFN_{e_tj}(x_t)``. With
    ``n_groups = p`` the tokens are routed in p consecutive groups with their own capacity, as
    :func:`moe_expert_parallel` on p devices routes them, so the two agree even when tokens are
    dropped.

    Args:
        params: from :func:`init_moe`.
        x: f32[T, D] tokens.
        top_k: k.
        capacity_factor: > 0.
        n_groups: routing groups (T must divide by it).
        renormalize: as in :func:`route`.
    """
    check_moe(params, x, top_k=top_k, capacity_factor=capacity_factor)
    x = jnp.asarray(x)
    tokens, _ = x.shape
    n_experts = params["router"].shape[1]
    check_divisible(tokens, n_groups, _TOKENS_MESSAGE)
    capacity = expert_capacity(tokens // n_groups, n_experts=n_experts, top_k=top_k,
                               capacity_factor=capacity_factor)
    groups = x.reshape(n_groups, tokens // n_groups, -1)  # f32[G, T/G, D]
    routing = jax.vmap(lambda g: route(params["router"], g, top_k=top_k, capacity=capacity,
                                       renormalize=renormalize))(groups)
    routing = Routing(*(a.reshape(tokens, *a.shape[2:]) for a in routing))  # groups -> tokens
    every = expert_ffn(params["w1"], params["w2"], jnp.broadcast_to(x, (n_experts, *x.shape)))
    # every: f32[E, T, D]; pick expert e_tj's output for token t
    picked = every[routing.expert, jnp.arange(tokens)[:, None]]  # f32[T, k, D]
    scale = (routing.weight * routing.kept).astype(x.dtype)  # [T, k] in the tokens' dtype
    y = jnp.einsum("tk,tkd->td", scale, picked)
    counts, prob_sums = _load_sums(routing, n_experts)
    aux = load_balancing_loss(counts, prob_sums, tokens, top_k)
    return MoEOutput(y, aux, jnp.sum(~routing.kept).astype(jnp.int32), counts)


def _local_moe(params: Params, x: jax.Array, *, axis_name: str, top_k: int, capacity: int,
               tokens: int, renormalize: bool, ops: MoEOps) -> MoEOutput:
    """One device's part of the layer (inside shard_map over ``axis_name``, p devices)."""
    # params["router"]: f32[D, E] (every device); w1: f32[E/p, D, H], w2: f32[E/p, H, D]
    # x: f32[T/p, D], this device's tokens, one routing group
    p = jax.lax.axis_size(axis_name)
    n_experts = params["router"].shape[1]
    routing = route(params["router"], x, top_k=top_k, capacity=capacity,
                    renormalize=renormalize)
    m = masks(routing, n_experts, capacity, x.dtype)
    buffers = ops.dispatch(x, m)  # f32[E, C, D]: every expert's slots, experts in order
    # dispatch all-to-all: chunk j (experts j*E/p ...) goes to device j; what arrives is
    # f32[E, C, D] ordered (source device, local expert)
    received = collectives.builtin("all_to_all", buffers, axis_name)
    d_model = x.shape[1]
    local = received.reshape(p, n_experts // p, capacity, d_model).transpose(1, 0, 2, 3)
    local = local.reshape(n_experts // p, p * capacity, d_model)  # f32[E/p, p*C, D]
    out = expert_ffn(params["w1"], params["w2"], local)  # f32[E/p, p*C, D]
    out = out.reshape(n_experts // p, p, capacity, d_model).transpose(1, 0, 2, 3)
    out = out.reshape(n_experts, capacity, d_model)  # f32[E, C, D] (source, local expert)
    # combine all-to-all: chunk j goes back to source device j, which gets f32[E, C, D] in
    # global expert order
    returned = collectives.builtin("all_to_all", out, axis_name)
    y = ops.combine(returned, m)  # f32[T/p, D]
    counts, prob_sums = _load_sums(routing, n_experts)
    counts = collectives.builtin("all_reduce", counts, axis_name)  # i32[E], all tokens
    prob_sums = collectives.builtin("all_reduce", prob_sums, axis_name)  # f32[E]
    aux = load_balancing_loss(counts, prob_sums, tokens, top_k)
    dropped = collectives.builtin("all_reduce", jnp.sum(~routing.kept).astype(jnp.int32),
                                  axis_name)
    return MoEOutput(y, aux, dropped, counts)


def moe_expert_parallel(params: Params, x: jax.typing.ArrayLike, mesh: Mesh, *, axis_name: str,
                        top_k: int, capacity_factor: float, renormalize: bool = True,
                        ops: MoEOps = DISPATCH_COMBINE) -> MoEOutput:
    """The MoE layer with its experts and tokens split over ``axis_name`` (p devices).

    Each device routes its own T/p tokens (one group, capacity from T/p), sends every expert's
    buffer to the device holding it (all-to-all), runs its E/p experts on the p * C slots it
    received, and sends the outputs back (all-to-all); the router's weights are replicated.
    Equal to ``moe_dense(..., n_groups=p)``, and to ``moe_dense`` with one group where no token
    is dropped. Differentiable (``jax.grad`` through it runs the two all-to-alls' transposes).

    Args:
        params: from :func:`init_moe` (E must divide by p).
        x: f32[T, D] tokens (T must divide by p).
        mesh: a mesh with ``axis_name``.
        axis_name: the expert-parallel axis, e.g. ``"expert"``.
        top_k: k.
        capacity_factor: > 0.
        renormalize: as in :func:`route`.
        ops: dispatch and combine (:data:`DISPATCH_COMBINE`; a lab swaps in a bug).
    """
    check_moe(params, x, top_k=top_k, capacity_factor=capacity_factor)
    if axis_name not in mesh.shape:
        raise ValueError(f"The mesh has axes {tuple(mesh.shape)}, not {axis_name!r}; pass the "
                         "expert-parallel axis's name as axis_name.")
    p = mesh.shape[axis_name]
    tokens, _ = np.shape(x)
    n_experts = params["router"].shape[1]
    check_divisible(n_experts, p, _EXPERTS_MESSAGE)
    check_divisible(tokens, p, _TOKENS_MESSAGE)
    capacity = expert_capacity(tokens // p, n_experts=n_experts, top_k=top_k,
                               capacity_factor=capacity_factor)
    specs = {"router": P(), "w1": P(axis_name), "w2": P(axis_name)}
    local = jax.shard_map(
        lambda prm, xs: _local_moe(prm, xs, axis_name=axis_name, top_k=top_k,
                                   capacity=capacity, tokens=tokens, renormalize=renormalize,
                                   ops=ops),
        mesh=mesh, in_specs=(specs, P(axis_name)),
        out_specs=MoEOutput(P(axis_name), P(), P(), P()))
    return local({k: params[k] for k in specs}, x)
