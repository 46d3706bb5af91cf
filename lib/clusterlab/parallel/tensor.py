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
points are the named operators of :mod:`clusterlab.collectives`:
:func:`~clusterlab.collectives.copy_to_model_parallel` (Megatron's ``f``) and
:func:`~clusterlab.collectives.reduce_from_model_parallel` (``g``).

Collectives per training step, for L column-then-row pairs (an MLP block is one pair, a
transformer layer two) on a batch of T tokens of width D, dtype size ``b``: L all-reduces
forward and L backward, each of a ``T * D * b``-byte buffer; none backward for the first pair
when its input is the data, whose gradient nobody needs
(:func:`clusterlab.costmodel.tensor_parallel_bytes_per_step`).

References:
    Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
    Parallelism", 2019. https://arxiv.org/abs/1909.08053
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from clusterlab import collectives, devices, models

Params = object
MODELS = ("mlp", "transformer")


class MegatronOps(NamedTuple):
    """Megatron's two communication points, each a function ``(x, axis_name) -> x``.

    The library always uses :data:`MEGATRON`; a lab swaps one operator for another (an identity,
    a bare ``jax.lax.psum``) to show what the check against one device catches.
    """

    copy: Callable[[jax.Array, str], jax.Array]  # f: enters a column-parallel layer
    reduce: Callable[[jax.Array, str], jax.Array]  # g: completes a row-parallel layer's sum


MEGATRON = MegatronOps(collectives.copy_to_model_parallel, collectives.reduce_from_model_parallel)


def check_divisible(*, tp: int, d_hidden: int | None = None, n_heads: int | None = None) -> None:
    """Raise a ValueError unless the hidden width and the heads split evenly over ``tp`` devices.

    Args:
        tp: devices on the tensor-parallel axis.
        d_hidden: H, the MLP's hidden width (w1's columns, w2's rows).
        n_heads: the number of attention heads.
    """
    if d_hidden is not None and d_hidden % tp:
        raise ValueError(
            f"Tensor parallelism splits the MLP's hidden width over the devices: d_hidden = "
            f"{d_hidden} does not divide by {tp} devices. Use a d_hidden that is a multiple of "
            f"{tp} (e.g. {(d_hidden // tp + 1) * tp}) or a device count that divides {d_hidden}.")
    if n_heads is not None and n_heads % tp:
        raise ValueError(
            f"Tensor parallelism gives each device whole attention heads: n_heads = {n_heads} "
            f"does not divide by {tp} devices. Use a number of heads that is a multiple of {tp}, "
            f"or a device count that divides {n_heads}.")


def _model_of(params: Params) -> str:
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
        params: from :func:`clusterlab.models.init_mlp` or
            :func:`clusterlab.models.init_transformer_block`.
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


def _check_params(params: Params, tp: int) -> str:
    kind = _model_of(params)
    blocks = [params] if kind == "transformer" else list(params)
    for block in blocks:
        check_divisible(tp=tp, d_hidden=block["w1"].shape[1])
    if kind == "transformer":
        check_divisible(tp=tp, n_heads=params["wq"].shape[1])
    return kind


def shard_params(params: Params, mesh: Mesh, axis_name: str) -> Params:
    """Place ``params`` on ``mesh`` split as :func:`param_specs` says, after checking sizes."""
    _check_params(params, mesh.shape[axis_name])
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
        f32[B, D], replicated: equal to :func:`clusterlab.models.mlp_block` on the whole block.
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
    """:func:`clusterlab.models.transformer_block`, heads and MLP split (inside shard_map).

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


def _local_loss_and_grad(kind: str, axis_name: str, ops: MegatronOps) -> Callable:
    """``(params, x, y) -> (loss, grads)`` on this device's shards (inside shard_map)."""
    model = transformer_block if kind == "transformer" else mlp_forward

    def loss(params, x, y):  # x, y: f32[B, ...], the whole batch on every device
        return jnp.mean((model(params, x, axis_name, ops=ops) - y) ** 2)

    return jax.value_and_grad(loss)


def make_grad_fn(params: Params, mesh: Mesh, axis_name: str, *, ops: MegatronOps = MEGATRON,
                 check_vma: bool = True) -> Callable:
    """The loss and gradients of one tensor-parallel step, to check against one device.

    A wrong factor in a gradient (a ``psum`` transposed into another ``psum``: ``t`` times too
    large) hides behind Adam, which divides it out; compared here, before any optimizer, it
    shows as a relative difference of order one.

    Args:
        params: the (unsharded or sharded) parameters, to read the model and its shapes.
        mesh: the mesh; ``axis_name`` is the tensor-parallel axis.
        axis_name: the tensor-parallel axis.
        ops: Megatron's ``f`` and ``g``; swap one out to see the check catch it.
        check_vma: shard_map's replication checking; on by default, off only to show what a
            bare ``psum`` does without it.

    Returns:
        ``grads(params, x, y) -> (loss, grads)``: ``params`` sharded (:func:`shard_params`),
        ``x``, ``y`` f32[B, ...] replicated, ``loss`` f32[], ``grads`` shaped and sharded like
        ``params`` (``jax.device_get`` them to compare with ``jax.grad`` of the reference).
    """
    kind = _check_params(params, mesh.shape[axis_name])
    specs = param_specs(params, axis_name)
    return jax.jit(jax.shard_map(_local_loss_and_grad(kind, axis_name, ops), mesh=mesh,
                                 in_specs=(specs, P(), P()), out_specs=(P(), specs),
                                 check_vma=_check_vma(check_vma, mesh, axis_name)))


def _check_vma(requested: bool, mesh: Mesh, axis_name: str) -> bool:
    # On one device f and g skip their (empty) communication, so g's output keeps the type of a
    # per-device value; nothing is replicated across one device, so there is nothing to check.
    return requested and mesh.shape[axis_name] > 1


def _opt_state_specs(optimizer: optax.GradientTransformation, params: Params,
                     specs: Params) -> object:
    state_shapes = jax.eval_shape(optimizer.init, params)
    return optax.tree_map_params(optimizer, lambda _, spec: spec, state_shapes, specs,
                                 transform_non_params=lambda _: P(),
                                 is_leaf=lambda v: isinstance(v, P))


def make_train_step(params: Params, mesh: Mesh, axis_name: str, *,
                    optimizer: optax.GradientTransformation, ops: MegatronOps = MEGATRON,
                    check_vma: bool = True) -> Callable:
    """A jitted tensor-parallel training step written with ``jax.shard_map``.

    Each device holds its shards of the parameters and of Adam's moments, and the whole batch.
    It runs the forward and backward pass with the Megatron all-reduces, then updates its own
    shards (Adam acts element by element, so no further communication). The loss is the mean
    squared error of :func:`clusterlab.models.mse_loss`.

    Args:
        params: the (unsharded or sharded) parameters, to read the model and its shapes.
        mesh: the mesh; ``axis_name`` is the tensor-parallel axis.
        axis_name: the tensor-parallel axis.
        optimizer: an ``optax`` optimizer that acts element by element (Adam, SGD).
        ops: Megatron's ``f`` and ``g`` (default :data:`MEGATRON`).
        check_vma: shard_map's replication checking (see :func:`make_grad_fn`).

    Returns:
        ``step(params, opt_state, x, y) -> (params, opt_state, loss)`` with ``params`` and
        ``opt_state`` sharded (see :func:`shard_params` and :func:`init_opt_state`), ``x``, ``y``
        f32[B, ...] replicated, ``loss`` f32[].
    """
    kind = _check_params(params, mesh.shape[axis_name])
    specs = param_specs(params, axis_name)
    state_specs = _opt_state_specs(optimizer, params, specs)
    loss_and_grad = _local_loss_and_grad(kind, axis_name, ops)

    def local_step(params, opt_state, x, y):
        # params, opt_state: this device's shards; x, y: f32[B, ...] whole batch on every device
        loss, grads = loss_and_grad(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    # check_vma=True: JAX checks that the loss and the replicated parameters (b2, LayerNorm) are
    # the same on every device, as out_specs P() claims, and transposes f and g correctly.
    return jax.jit(jax.shard_map(
        local_step, mesh=mesh, in_specs=(specs, state_specs, P(), P()),
        out_specs=(specs, state_specs, P()), check_vma=_check_vma(check_vma, mesh, axis_name)))


def init_opt_state(optimizer: optax.GradientTransformation, sharded_params: Params) -> object:
    """The optimizer state of sharded parameters, sharded like them (Adam's moments split)."""
    return jax.jit(optimizer.init)(sharded_params)


def make_auto_train_step(params: Params, mesh: Mesh, axis_name: str, *,
                         optimizer: optax.GradientTransformation) -> Callable:
    """The same step left to the compiler: the single-device step under ``jax.jit``.

    The parameters come in split as :func:`param_specs` says (``NamedSharding``), the batch
    replicated; XLA's sharding propagation decides where to communicate.

    Returns:
        ``step(params, opt_state, x, y) -> (params, opt_state, loss)``, like
        :func:`make_train_step`.
    """
    kind = _check_params(params, mesh.shape[axis_name])
    forward = models.transformer_block if kind == "transformer" else models.mlp_forward
    specs = param_specs(params, axis_name)
    param_shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                                   is_leaf=lambda v: isinstance(v, P))
    state_shardings = jax.tree.map(lambda s: NamedSharding(mesh, s),
                                   _opt_state_specs(optimizer, params, specs),
                                   is_leaf=lambda v: isinstance(v, P))
    replicated = NamedSharding(mesh, P())

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(models.mse_loss)(params, x, y, forward=forward)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, in_shardings=(param_shardings, state_shardings, replicated, replicated),
                   out_shardings=(param_shardings, state_shardings, replicated))


def train(params: Params, batches: Sequence[tuple[jax.Array, jax.Array]], mesh: Mesh,
          axis_name: str, *, optimizer: optax.GradientTransformation | None = None,
          automatic: bool = False) -> tuple[Params, jax.Array]:
    """Train with tensor parallelism: the counterpart of :func:`clusterlab.models.reference_train`.

    Args:
        params: initial parameters (unsharded).
        batches: ``(x, y)`` pairs, each the whole batch.
        mesh: the mesh; ``axis_name`` is the tensor-parallel axis.
        axis_name: the tensor-parallel axis.
        optimizer: default :func:`clusterlab.models.make_optimizer` (Adam, 1e-3).
        automatic: use :func:`make_auto_train_step` instead of the shard_map step.

    Returns:
        ``(params, losses)``: the trained parameters, still sharded (``jax.device_get`` them to
        compare with the reference's), and the losses, a NumPy f32[n_steps] on the host.
    """
    optimizer = models.make_optimizer() if optimizer is None else optimizer
    maker = make_auto_train_step if automatic else make_train_step
    step = maker(params, mesh, axis_name, optimizer=optimizer)
    params = shard_params(params, mesh, axis_name)
    opt_state = init_opt_state(optimizer, params)
    params, _, losses = models.run_steps(step, params, opt_state, batches)
    return params, losses
