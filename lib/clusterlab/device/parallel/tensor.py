"""Tensor parallelism, Megatron style: weight matrices split across the devices of one axis.

In each MLP block the first weight ``w1`` is split by columns and the second ``w2`` by rows
(Shoeybi et al. 2019, Section 3). Every device then computes ``relu(x @ w1[:, cols])`` for its
own slice of the hidden units with no communication at all, multiplies it by its rows of ``w2``
and holds a *partial* sum of the block's output; one all-reduce completes it. Backward, the
mirror image: one all-reduce of the gradient of the block's input. Attention splits the same
way by heads: the query, key and value projections by heads (columns), the output projection by
rows, and one all-reduce after it.

The data is *replicated* along the tensor-parallel axis (every device sees the whole batch);
only the weights, their gradients and the optimizer state are split. The two communication
points are the named operators of :mod:`clusterlab.device.collectives`:
:func:`~clusterlab.device.collectives.copy_to_model_parallel` (Megatron's ``f``) and
:func:`~clusterlab.device.collectives.reduce_from_model_parallel` (``g``).

Collectives per training step, for L column-then-row pairs (an MLP block is one pair, a
transformer layer two) on a batch of T tokens of width D, dtype size ``b``: L all-reduces
forward and L backward, each of a ``T * D * b``-byte buffer; none backward for the first pair
when its input is the data, whose gradient nobody needs
(:func:`clusterlab.analytic.costmodel.tensor_parallel_bytes_per_step`).

With the activations split by tokens between blocks (sequence parallelism), a column-parallel
matmul needs an all-gather first and a row-parallel one a reduce-scatter after;
:func:`collective_matmul` and :func:`collective_matmul_reduce_scatter` split either into p-1 ring
steps beside partial matmuls that a GPU can overlap with them (Wang et al. 2023).

References:
    Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
    Parallelism", 2019. https://arxiv.org/abs/1909.08053
    Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022.
    https://arxiv.org/abs/2205.05198
    Wang et al., "Overlap Communication with Dependent Computation via Decomposition in Large
    Deep Learning Models", ASPLOS 2023. https://doi.org/10.1145/3567955.3567959
"""

from __future__ import annotations

import functools
from typing import Callable, Literal, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, PartitionSpec as P

from clusterlab.device import collectives, devices, models
from clusterlab.device.parallel._common import (LossFn, Params, Strategy, automatic_programs,
                                                axes_size, check_divisible, named,
                                                opt_state_initializer, opt_state_specs,
                                                optimizer_or_adam, to_host)

__all__ = ["MEGATRON", "MegatronOps", "all_gather_matmul", "attention", "check_params",
           "collective_matmul", "collective_matmul_reduce_scatter", "make_column_matmul",
           "make_row_matmul", "make_tensor_parallel", "matmul_reduce_scatter", "mlp_block",
           "mlp_forward", "param_specs", "shard_params", "transformer_block"]

Model = Literal["mlp", "transformer"]
_HIDDEN_MESSAGE = (
    "Tensor parallelism splits the MLP's hidden width over the devices: d_hidden = {size} does "
    "not divide by {parts} devices. Use a d_hidden that is a multiple of {parts} (e.g. "
    "{multiple}) or a device count that divides {size}.")
_HEADS_MESSAGE = (
    "Tensor parallelism gives each device whole attention heads: n_heads = {size} does not "
    "divide by {parts} devices. Use a number of heads that is a multiple of {parts}, or a device "
    "count that divides {size}.")


class MegatronOps(NamedTuple):
    """Megatron's two communication points, each a function ``(x, axis_name) -> x``.

    The library always uses :data:`MEGATRON`; a lab swaps one operator for another (an identity,
    a bare ``jax.lax.psum``) to show what the check against one device catches.
    """

    copy: Callable[[jax.Array, str], jax.Array]  # f: enters a column-parallel layer
    reduce: Callable[[jax.Array, str], jax.Array]  # g: completes a row-parallel layer's sum


MEGATRON = MegatronOps(collectives.copy_to_model_parallel, collectives.reduce_from_model_parallel)


def _model_of(params: Params) -> Model:
    if isinstance(params, dict) and "wq" in params:
        return "transformer"
    if isinstance(params, (list, tuple)) and params and "w1" in params[0]:
        return "mlp"
    raise ValueError("Expected the parameters of models.init_mlp (a list of blocks) or of "
                     "models.init_transformer_block (a dict with 'wq').")


def param_specs(params: Params, axis_name: str) -> Params:
    """The PartitionSpec of every parameter under Megatron's split, as a pytree like ``params``.

    MLP: ``w1`` f32[D, H] by columns ``P(None, axis)``, ``b1`` f32[H] ``P(axis)``, ``w2`` f32[H, D]
    by rows ``P(axis, None)``, ``b2`` replicated. Attention: ``wq``, ``wk``, ``wv`` f32[D, NH, Dh]
    by heads ``P(None, axis, None)``, ``wo`` f32[NH, Dh, D] by heads ``P(axis, None, None)``;
    LayerNorm parameters replicated.

    Args:
        params: from :func:`clusterlab.device.models.init_mlp` or
            :func:`clusterlab.device.models.init_transformer_block`.
        axis_name: the tensor-parallel mesh axis.
    """
    split = {"w1": P(None, axis_name), "b1": P(axis_name), "w2": P(axis_name, None),
             "wq": P(None, axis_name, None), "wk": P(None, axis_name, None),
             "wv": P(None, axis_name, None), "wo": P(axis_name, None, None)}

    def spec_of(block: dict) -> dict:
        return {name: split.get(name, P()) for name in block}

    if _model_of(params) == "transformer":
        return spec_of(params)
    return [spec_of(block) for block in params]


def check_params(params: Params, tp: int) -> Model:
    """Raise a ValueError unless every hidden width and the heads split over ``tp`` devices.

    Args:
        params: from :func:`clusterlab.device.models.init_mlp` or
            :func:`clusterlab.device.models.init_transformer_block` (or one decoder layer of the
            same keys).
        tp: devices on the tensor-parallel axis.

    Returns:
        The model: ``"mlp"`` or ``"transformer"``.
    """
    kind = _model_of(params)
    blocks = [params] if kind == "transformer" else list(params)
    for block in blocks:
        check_divisible(block["w1"].shape[1], tp, _HIDDEN_MESSAGE)
    if kind == "transformer":
        check_divisible(params["wq"].shape[1], tp, _HEADS_MESSAGE)
    return kind


def shard_params(params: Params, mesh: Mesh, axis_name: str) -> Params:
    """Place ``params`` on ``mesh`` split as :func:`param_specs` says, after checking sizes."""
    check_params(params, axes_size(mesh, axis_name))
    return jax.tree.map(lambda leaf, spec: devices.shard(leaf, mesh, spec), params,
                        param_specs(params, axis_name))


def mlp_block(block: dict, x: jax.Array, axis_name: str, *,
              ops: MegatronOps = MEGATRON) -> jax.Array:
    """One residual MLP block on this device's slice of the hidden units (inside shard_map).

    Args:
        block: this device's shards ``{"w1": f32[D, H/tp], "b1": f32[H/tp], "w2": f32[H/tp, D],
            "b2": f32[D]}``.
        x: f32[B, D], replicated.
        axis_name: the tensor-parallel axis.
        ops: Megatron's ``f`` and ``g`` (default :data:`MEGATRON`).

    Returns:
        f32[B, D], replicated: equal to :func:`clusterlab.device.models.mlp_block` on the whole
        block.
    """
    return _mlp_residual(block, x, x, axis_name, ops)


def _mlp_residual(block: dict, x: jax.Array, residual: jax.Array, axis_name: str,
                  ops: MegatronOps = MEGATRON) -> jax.Array:
    # residual + relu(x @ w1 + b1) @ w2 + b2, summed in the reference's order.
    x_in = ops.copy(x, axis_name)  # f: backward all-reduce of dx
    hidden = jax.nn.relu(x_in @ block["w1"] + block["b1"])  # hidden: f32[..., H/tp], no comm.
    partial = hidden @ block["w2"]  # partial: f32[..., D], this device's share of the sum
    return residual + ops.reduce(partial, axis_name) + block["b2"]  # g: forward all-reduce


def mlp_forward(params: Sequence[dict], x: jax.Array, axis_name: str, *,
                ops: MegatronOps = MEGATRON) -> jax.Array:
    """The residual MLP stack with every block tensor-parallel (inside shard_map).

    Args:
        params: a list of per-device block shards (see :func:`mlp_block`).
        x: f32[B, D], replicated.
        axis_name: the tensor-parallel axis.
        ops: Megatron's ``f`` and ``g`` (default :data:`MEGATRON`).

    Returns:
        f32[B, D], replicated.
    """
    for block in params:
        x = mlp_block(block, x, axis_name, ops=ops)
    return x


def attention(params: dict, x: jax.Array, axis_name: str, *,
              ops: MegatronOps = MEGATRON) -> jax.Array:
    """Causal self-attention with this device's heads, all-reduced (inside shard_map).

    Args:
        params: this device's shards: ``"wq", "wk", "wv": f32[D, NH/tp, Dh]``,
            ``"wo": f32[NH/tp, Dh, D]``.
        x: f32[B, S, D], normalised, replicated.
        axis_name: the tensor-parallel axis.
        ops: Megatron's ``f`` and ``g`` (default :data:`MEGATRON`).

    Returns:
        f32[B, S, D], replicated: the attention output of all heads.
    """
    x_in = ops.copy(x, axis_name)  # f
    partial = models.causal_attention(params, x_in)  # partial: f32[B, S, D], this device's heads
    return ops.reduce(partial, axis_name)  # g


def transformer_block(params: dict, x: jax.Array, axis_name: str, *,
                      ops: MegatronOps = MEGATRON) -> jax.Array:
    """:func:`clusterlab.device.models.transformer_block`, heads and MLP split (inside shard_map).

    Two all-reduces forward (after attention, after the MLP) and two backward.

    Args:
        params: this device's shards (see :func:`param_specs`).
        x: f32[B, S, D], replicated.
        axis_name: the tensor-parallel axis.
        ops: Megatron's ``f`` and ``g`` (default :data:`MEGATRON`).

    Returns:
        f32[B, S, D], replicated.
    """
    normed = models.layer_norm(x, params["ln1_scale"], params["ln1_bias"])
    h = x + attention(params, normed, axis_name, ops=ops)  # h: f32[B, S, D]
    normed = models.layer_norm(h, params["ln2_scale"], params["ln2_bias"])
    return _mlp_residual(params, normed, h, axis_name, ops)



def _local_loss_and_grad(kind: Model, axis_name: str, ops: MegatronOps) -> Callable:
    """``(params, x, y) -> (loss, grads)`` on this device's shards (inside shard_map)."""
    model = transformer_block if kind == "transformer" else mlp_forward

    def loss(params, x, y):  # x, y: f32[B, ...], the whole batch on every device
        return jnp.mean((model(params, x, axis_name, ops=ops) - y) ** 2)

    return jax.value_and_grad(loss)


def _check_vma(requested: bool, mesh: Mesh, axis_name: str) -> bool:
    # On one device f and g skip their (empty) communication, so g's output keeps the type of a
    # per-device value; nothing is replicated across one device, so there is nothing to check.
    return requested and mesh.shape[axis_name] > 1


def _manual_programs(kind: Model, mesh: Mesh, axis_name: str,
                     optimizer: optax.GradientTransformation, specs: Params, state_specs: Params,
                     ops: MegatronOps, check_vma: bool) -> tuple[Callable, Callable]:
    """The ``shard_map`` step and the gradients it computes, with Megatron's ``f`` and ``g``.

    Each device holds its shards of the parameters and of Adam's moments, and the whole batch.
    It runs the forward and backward pass with the all-reduces, then updates its own shards
    (Adam acts element by element, so no further communication).
    """
    loss_and_grad = _local_loss_and_grad(kind, axis_name, ops)
    vma = _check_vma(check_vma, mesh, axis_name)

    def local_step(params, opt_state, x, y):
        # params, opt_state: this device's shards; x, y: f32[B, ...] whole batch on every device
        loss, grads = loss_and_grad(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    # check_vma=True: JAX checks that the loss and the replicated parameters (b2, LayerNorm) are
    # the same on every device, as out_specs P() claims, and transposes f and g correctly.
    step = jax.jit(jax.shard_map(
        local_step, mesh=mesh, in_specs=(specs, state_specs, P(), P()),
        out_specs=(specs, state_specs, P()), check_vma=vma))
    # the loss stays an output, so that a missing g is refused where the partial loss is
    # declared replicated, as in the step
    loss_and_grads = jax.jit(jax.shard_map(loss_and_grad, mesh=mesh, in_specs=(specs, P(), P()),
                                           out_specs=(P(), specs), check_vma=vma))
    return step, lambda params, x, y: loss_and_grads(params, x, y)[1]


def _loss_fn(kind: Model) -> LossFn:
    """The single-device loss of ``kind``, for the compiler's form."""
    forward = models.transformer_block if kind == "transformer" else models.mlp_forward
    return lambda params, x, y: models.mse_loss(params, x, y, forward=forward)


def make_tensor_parallel(params: Params, mesh: Mesh,
                         optimizer: optax.GradientTransformation | None = None, *,
                         axis_name: str, automatic: bool = False, ops: MegatronOps = MEGATRON,
                         check_vma: bool = True) -> Strategy:
    """Megatron tensor parallelism of the residual MLP or a transformer block over ``axis_name``.

    The loss is the mean squared error of :func:`clusterlab.device.models.mse_loss`. The data is
    replicated along the axis (every device sees the whole batch); the weights, their gradients
    and the optimizer state are split as :func:`param_specs` says.

    Args:
        params: the unsharded parameters of :func:`clusterlab.device.models.init_mlp` or
            :func:`clusterlab.device.models.init_transformer_block`, to read the model and its
            shapes.
        mesh: the mesh.
        optimizer: an ``optax`` optimizer that acts element by element (Adam, SGD); default
            :func:`clusterlab.device.models.make_optimizer`.
        axis_name: the tensor-parallel axis.
        automatic: the single-device step under ``jax.jit`` with the same shardings; the
            compiler places the communication.
        ops: Megatron's ``f`` and ``g`` (default :data:`MEGATRON`); swap one out to see the
            check against one device catch it. Hand-written step only.
        check_vma: shard_map's replication checking; on by default, off only to show what a
            bare ``psum`` does without it. Hand-written step only.

    Returns:
        A :class:`~clusterlab.device.parallel.Strategy` named ``"tensor"`` (or
        ``"tensor/jit"``); its batch is replicated and its loss is f32[].

    Raises:
        ValueError: when the hidden width or the heads do not split over the axis, or
            ``automatic`` is combined with ``ops`` or ``check_vma``.
    """
    kind = check_params(params, axes_size(mesh, axis_name))
    optimizer = optimizer_or_adam(optimizer)
    specs = param_specs(params, axis_name)
    state_specs = opt_state_specs(optimizer, params, specs)
    if automatic:
        if ops is not MEGATRON or not check_vma:
            raise ValueError("ops and check_vma belong to the hand-written step; with "
                             "automatic=True the compiler places the communication.")
        step, grads = automatic_programs(_loss_fn(kind), optimizer, mesh, params=specs,
                                         opt_state=state_specs, batch=P())
    else:
        step, grads = _manual_programs(kind, mesh, axis_name, optimizer, specs, state_specs,
                                       ops, check_vma)
    replicated = named(mesh, P())
    return Strategy("tensor/jit" if automatic else "tensor", mesh, (axis_name,), automatic,
                    shard=lambda prm: shard_params(prm, mesh, axis_name), unshard=to_host,
                    init_opt_state=opt_state_initializer(optimizer, mesh, state_specs),
                    place_batch=lambda x, y: jax.device_put((x, y), replicated), step=step,
                    grads=lambda prm, x, y: to_host(grads(prm, x, y)), loss_value=np.asarray)


# --- Collective matmul: the all-gather (or reduce-scatter) split into ring steps ---------------
# With sequence parallelism (Korthikanti et al. 2022) the activations between tensor-parallel
# blocks are split by tokens, so a column-parallel matmul must first all-gather them, and a
# row-parallel one reduce-scatters its output. Wang et al. (2023) decompose the collective into
# p-1 ring steps and the matmul into p partial matmuls, so that each device multiplies the block
# it holds while the next one is in flight; JAX's shard_map notes show the same idea. The code
# here is the course's own, on :func:`clusterlab.device.collectives.send_to_next`.

_TOKENS_MESSAGE = (
    "The reduce-scatter splits the tokens over the devices: T = {size} tokens do not divide by "
    "{parts} devices. Use a number of tokens that is a multiple of {parts} (e.g. {multiple}).")


def all_gather_matmul(x_block: jax.Array, w_block: jax.Array, axis_name: str) -> jax.Array:
    """The plain column-parallel matmul of sequence-split activations (inside shard_map).

    One all-gather of the activations, then one matmul: nothing to overlap, the matmul needs
    the whole gathered input.

    Args:
        x_block: f32[T/p, D], this device's tokens.
        w_block: f32[D, H/p], this device's columns.
        axis_name: the tensor-parallel axis (p devices).

    Returns:
        f32[T, H/p]: all tokens times this device's columns.
    """
    x = collectives.builtin("all_gather", x_block, axis_name)  # x: f32[T, D]
    return x @ w_block


def collective_matmul(x_block: jax.Array, w_block: jax.Array, axis_name: str, *,
                      misplace_by: int = 0) -> jax.Array:
    """:func:`all_gather_matmul` as p-1 ring steps interleaved with p partial matmuls.

    Step s (s = 0 .. p-1): device i holds device (i - s)'s token block; it sends that block on
    to device i+1 (:func:`clusterlab.device.collectives.send_to_next`, except at the last step) and,
    independently of that transfer, multiplies it by its columns, writing rows (i - s) mod p of
    the output. The permute and the matmul of one step share an input and nothing else, so a
    compiler with asynchronous collectives may run them at once (Wang et al. 2023). p-1
    ``collective-permute`` of T/p x D values each and no all-gather in the compiled program;
    backward, JAX transposes each permute into one in the opposite direction.

    Args:
        x_block: f32[T/p, D], this device's tokens.
        w_block: f32[D, H/p], this device's columns.
        axis_name: the tensor-parallel axis (p devices).
        misplace_by: a deliberate bug for negative controls: write each partial product this
            many blocks away from its rows (an off-by-one rotation is 1). Default 0, correct.

    Returns:
        f32[T, H/p], equal to :func:`all_gather_matmul` up to float rounding.

    References:
        Wang et al., "Overlap Communication with Dependent Computation via Decomposition in
        Large Deep Learning Models", ASPLOS 2023. https://doi.org/10.1145/3567955.3567959
    """
    p = jax.lax.axis_size(axis_name)
    me = jax.lax.axis_index(axis_name)
    rows, width = x_block.shape[0], w_block.shape[1]
    out = jnp.zeros((p, rows, width), jnp.result_type(x_block, w_block))  # f32[p, T/p, H/p]
    block = x_block  # block: f32[T/p, D], device (me - s)'s tokens at step s
    for s in range(p):
        incoming = collectives.send_to_next(block, axis_name) if s < p - 1 else None
        partial = block @ w_block  # partial: f32[T/p, H/p], rows of block (me - s) mod p
        out = jax.lax.dynamic_update_index_in_dim(out, partial, (me - s + misplace_by) % p, 0)
        block = incoming
    return out.reshape(p * rows, width)


def matmul_reduce_scatter(h: jax.Array, w_block: jax.Array, axis_name: str) -> jax.Array:
    """The plain row-parallel matmul whose output is reduce-scattered by tokens (inside shard_map).

    Args:
        h: f32[T, H/p], all tokens, this device's hidden units.
        w_block: f32[H/p, D], this device's rows.
        axis_name: the tensor-parallel axis (p devices).

    Returns:
        f32[T/p, D]: this device's tokens of the sum over devices of ``h @ w_block``.
    """
    check_divisible(h.shape[0], jax.lax.axis_size(axis_name), _TOKENS_MESSAGE)
    partial = h @ w_block  # partial: f32[T, D], this device's share of every token's sum
    return collectives.builtin("reduce_scatter", partial, axis_name)


def collective_matmul_reduce_scatter(h: jax.Array, w_block: jax.Array, axis_name: str, *,
                                     misplace_by: int = 0) -> jax.Array:
    """:func:`matmul_reduce_scatter` as p partial matmuls interleaved with p-1 ring steps.

    A running sum travels the ring. Device i starts with its share of token block i-1; at step
    s (s = 1 .. p-1) it receives the sum for block i-1-s from device i-1 and adds its share of
    that block, a matmul that does not depend on the transfer, so both may run at once. After
    p-1 steps device i holds the complete sum of its own block i. p-1 ``collective-permute`` of
    T/p x D values each and no reduce-scatter in the compiled program.

    Args:
        h: f32[T, H/p], all tokens, this device's hidden units; T a multiple of p.
        w_block: f32[H/p, D], this device's rows.
        axis_name: the tensor-parallel axis (p devices).
        misplace_by: a deliberate bug for negative controls: multiply the token block this many
            blocks away from the right one. Default 0, correct.

    Returns:
        f32[T/p, D], equal to :func:`matmul_reduce_scatter` up to float rounding.

    References:
        Wang et al., "Overlap Communication with Dependent Computation via Decomposition in
        Large Deep Learning Models", ASPLOS 2023. https://doi.org/10.1145/3567955.3567959
    """
    p = jax.lax.axis_size(axis_name)
    check_divisible(h.shape[0], p, _TOKENS_MESSAGE)
    me = jax.lax.axis_index(axis_name)
    blocks = h.reshape(p, h.shape[0] // p, h.shape[1])  # blocks: f32[p, T/p, H/p]

    def share(index):  # f32[T/p, D]: this device's term of token block index (mod p)
        block = jax.lax.dynamic_index_in_dim(blocks, (index + misplace_by) % p, 0, keepdims=False)
        return block @ w_block

    running = share(me - 1)  # running: f32[T/p, D], the sum for block me-1-s after step s
    for s in range(1, p):
        running = collectives.send_to_next(running, axis_name) + share(me - 1 - s)
    return running


def make_column_matmul(mesh: Mesh, axis_name: str, *, overlap: bool,
                       misplace_by: int = 0) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """The jitted column-parallel matmul of sequence-split activations on ``mesh``.

    Args:
        mesh: the mesh.
        axis_name: the tensor-parallel axis.
        overlap: :func:`collective_matmul` (ring steps and partial matmuls) if true, else
            :func:`all_gather_matmul` (all-gather, then one matmul).
        misplace_by: passed to :func:`collective_matmul` (negative controls only).

    Returns:
        ``f(x, w) -> y``: ``x`` f32[T, D] split by tokens ``P(axis)``, ``w`` f32[D, H] split by
        columns ``P(None, axis)``, ``y = x @ w`` f32[T, H] split by columns.
    """
    axes_size(mesh, axis_name)  # raises for an axis the mesh lacks
    if misplace_by and not overlap:
        raise ValueError("misplace_by is a bug planted in the collective matmul; the plain "
                         "all-gather-then-matmul has no block index to misplace.")
    if overlap:
        body = functools.partial(collective_matmul, axis_name=axis_name, misplace_by=misplace_by)
    else:
        body = functools.partial(all_gather_matmul, axis_name=axis_name)
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(axis_name), P(None, axis_name)),
                                 out_specs=P(None, axis_name)))


def make_row_matmul(mesh: Mesh, axis_name: str, *, overlap: bool,
                    misplace_by: int = 0) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """The jitted row-parallel matmul whose output is reduce-scattered by tokens on ``mesh``.

    Args:
        mesh: the mesh.
        axis_name: the tensor-parallel axis.
        overlap: :func:`collective_matmul_reduce_scatter` if true, else
            :func:`matmul_reduce_scatter`.
        misplace_by: passed to :func:`collective_matmul_reduce_scatter` (negative controls).

    Returns:
        ``f(h, w) -> y``: ``h`` f32[T, H] split by columns ``P(None, axis)``, ``w`` f32[H, D]
        split by rows ``P(axis, None)``, ``y = h @ w`` f32[T, D] split by tokens ``P(axis)``.
    """
    axes_size(mesh, axis_name)
    if misplace_by and not overlap:
        raise ValueError("misplace_by is a bug planted in the collective matmul; the plain "
                         "matmul-then-reduce-scatter has no block index to misplace.")
    if overlap:
        body = functools.partial(collective_matmul_reduce_scatter, axis_name=axis_name,
                                 misplace_by=misplace_by)
    else:
        body = functools.partial(matmul_reduce_scatter, axis_name=axis_name)
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(None, axis_name), P(axis_name)),
                                 out_specs=P(axis_name)))
