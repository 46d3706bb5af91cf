"""Sharded data parallelism: ZeRO stages 1-3 and FSDP.

Plain data parallelism keeps a whole copy of the parameters, the gradients and the optimizer
state on every device. ZeRO splits them over the ``p`` data-parallel devices instead
(Rajbhandari et al. 2020):

* stage 1 shards the optimizer state (Adam's two moments): each device updates only its slice
  of the parameters, then an all-gather gives every device the whole updated parameters;
* stage 2 shards the gradients as well: a reduce-scatter leaves each device the mean gradient of
  its slice only, half of the all-reduce of plain data parallelism (the all-gather of updated
  parameters is the other half);
* stage 3 (FSDP's "full shard") shards the parameters too: each layer's parameters are
  all-gathered just before the forward pass uses them, freed, gathered again for the backward
  pass, and their gradients reduce-scattered: ``3 (p-1)/p`` of the parameter bytes per step
  instead of ``2 (p-1)/p``.

Like PyTorch FSDP, each block's parameters are flattened into one vector (a "flat parameter",
``f32[F]`` with ``F = 2 D H + H + D`` for an MLP block) and the blocks stacked into
``f32[L, F]``, split along F. Every block then costs one all-gather forward, one backward and one
reduce-scatter. The blocks run in a ``jax.lax.scan`` under ``jax.checkpoint``: the forward loop
gathers each block's parameters and drops them, the backward loop gathers them again (only the
matrix products' outputs are kept), which is what makes stage 3 hold just ``1/p`` of the
parameters outside one layer.

Within one compiled step gradients live only until they are reduced, and XLA frees the full
gradient as soon as its reduce-scatter has run; stages 1 and 2 therefore compile to the same
program here (reduce-scatter, update of the shard, all-gather). They differ in the memory model
(:func:`clusterlab.analytic.memory.training_memory_per_device`), where stage 1 keeps the full
gradient buffer that a framework like PyTorch holds between the backward pass and the optimizer
step.

2-D parallelism (data x tensor) is :mod:`clusterlab.device.parallel.two_d`.

Every strategy's ``grads`` returns the gradient its optimizer receives, computed by
the same code, to check against :func:`clusterlab.device.models.reference_gradients`: Adam hides a
wrong factor of p in the gradients (a shard's gradient not divided by p), the gradients do not.
``reduce="sum"`` injects exactly that bug on purpose. Replication checking (``check_vma=True``,
shard_map's default) is on wherever JAX 0.10.2 can prove the outputs' layout; the one place it
stays off (the all-gather of updated parameters in stages 1 and 2) says why.

References:
    Rajbhandari, Rasley, Ruwase & He, "ZeRO: Memory Optimizations Toward Training Trillion
    Parameter Models", SC 2020. https://arxiv.org/abs/1910.02054
    Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel", VLDB 2023.
    https://arxiv.org/abs/2304.11277
"""

from __future__ import annotations

from typing import Any, Callable, Literal, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, PartitionSpec as P

from clusterlab.analytic import costmodel
from clusterlab.analytic.memory import ZERO_STAGES
from clusterlab.device import collectives, devices, hlo, models
from clusterlab.device.parallel._common import (Reduction, Strategy, automatic_programs, axes_size,
                                                check_batch, check_divisible, check_reduce,
                                                opt_state_initializer, opt_state_specs,
                                                optimizer_or_adam, to_host, update)

__all__ = ["ZERO_STAGES", "flatten_blocks", "make_sharded_data_parallel", "sent_bytes_per_device",
           "unflatten_blocks"]

ZeroStage = Literal[0, 1, 2, 3]
_FLAT_MESSAGE = (
    "Sharded data parallelism splits each block's {size} parameters over {parts} devices, "
    "which does not divide. Choose d_model and d_hidden so that 2*D*H + H + D is a multiple of "
    "{parts}, or use a device count that divides {size}.")
# --- Flat parameters: one vector per block, blocks stacked -------------------------------------

def flatten_blocks(params: Sequence[dict]) -> tuple[jax.Array, Callable[[jax.Array], dict]]:
    """Stack the blocks of :func:`clusterlab.device.models.init_mlp` as flat parameter vectors.

    Args:
        params: a list of L blocks, each ``{"w1": f32[D, H], "b1": f32[H], "w2": f32[H, D],
            "b2": f32[D]}``.

    Returns:
        ``(flat, unravel)``: ``flat`` f32[L, F] with ``F = 2 D H + H + D`` (row l is block l's
        parameters, in ``ravel_pytree`` order), and ``unravel(f32[F]) -> block dict``.
    """
    if not isinstance(params, (list, tuple)) or not params or "w1" not in params[0]:
        raise ValueError("flatten_blocks expects the list of blocks of models.init_mlp.")
    rows, unravel = [], None
    for block in params:
        row, unravel = ravel_pytree(block)
        rows.append(row)
    if len({row.shape for row in rows}) != 1:
        raise ValueError("All blocks must have the same shapes to be stacked.")
    return jnp.stack(rows), unravel  # flat: f32[L, F]


def unflatten_blocks(flat: jax.typing.ArrayLike, unravel: Callable[[jax.Array], dict]
                     ) -> list[dict]:
    """The inverse of :func:`flatten_blocks`: f32[L, F] back to a list of L block dicts."""
    flat = jnp.asarray(flat)
    return [unravel(flat[i]) for i in range(flat.shape[0])]


def _flat_loss(flat: jax.Array, x: jax.Array, y: jax.Array, unravel) -> jax.Array:
    # flat: f32[L, F] whole parameters; x, y: f32[B, D]. The blocks of models.mlp_forward.
    def body(h, row):
        return models.mlp_block(unravel(row), h), None

    h, _ = jax.lax.scan(body, x, flat)
    return jnp.mean((h - y) ** 2)


def _gathered_loss(flat_shard: jax.Array, x: jax.Array, y: jax.Array, unravel,
                   axis_name: str) -> jax.Array:
    # flat_shard: f32[L, F/p]; x, y: f32[B/p, D]. ZeRO-3: gather each block just before use.
    def body(h, row_shard):  # row_shard: f32[F/p]
        row = collectives.gather_params(row_shard, axis_name)  # row: f32[F], freed after use
        return models.mlp_block(unravel(row), h), None

    # Keep only the matrix products' outputs for the backward pass: the gathered parameters are
    # not saved, so the backward loop gathers them again, as ZeRO-3 and FSDP do.
    body = jax.checkpoint(body, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    h, _ = jax.lax.scan(body, x, flat_shard)
    return jnp.mean((h - y) ** 2)


def _param_spec(zero_stage: ZeroStage, axis_name: str) -> P:
    return P(None, axis_name) if zero_stage == 3 else P()


def _state_spec(zero_stage: ZeroStage, axis_name: str) -> P:
    return P(None, axis_name) if zero_stage >= 1 else P()


def _zero_local_gradients(zero_stage: ZeroStage, unravel: Callable, axis_name: str, n_devices: int,
                          mean: bool) -> Callable:
    """Per device: ``(flat, x, y) -> (loss, grads)``, the gradient this device's optimizer gets.

    ``x, y``: f32[B/p, D]; ``flat``: f32[L, F/p] (stage 3) or f32[L, F] replicated. ``grads``:
    f32[L, F] (stage 0, all-reduced) or f32[L, F/p] (reduce-scattered, stages 1-3).
    """
    def local_gradients(flat, x, y):
        if zero_stage == 3:
            loss, grads = jax.value_and_grad(_gathered_loss)(flat, x, y, unravel, axis_name)
            # gather_params' backward summed the devices' gradients: f32[L, F/p]
            return loss, grads / n_devices if mean else grads
        # pcast: differentiate this device's own copy, so the gradient stays its batch shard's
        # until the explicit collective (check_vma would otherwise insert a psum itself)
        local = jax.lax.pcast(flat, axis_name, to="varying")
        loss, grads = jax.value_and_grad(_flat_loss)(local, x, y, unravel)  # grads: f32[L, F]
        if zero_stage == 0:
            return loss, collectives.all_reduce_gradients(grads, axis_name, mean=mean)
        return loss, collectives.reduce_scatter_gradients(grads, axis_name, axis=1,
                                                          mean=mean)  # f32[L, F/p]
    return local_gradients


def _zero_local_step(zero_stage: ZeroStage, local_gradients: Callable,
                     optimizer: optax.GradientTransformation, axis_name: str, p: int) -> Callable:
    """Per device: one ZeRO step around :func:`_zero_local_gradients`.

    Stages 0 and 3 update what they hold; stages 1 and 2 update this device's slice of the
    whole parameters and all-gather the updated slices.
    """
    def local_step(flat, opt_state, x, y):
        # opt_state: f32[L, F/p] leaves (stages >= 1) or f32[L, F]
        loss, grads = local_gradients(flat, x, y)
        if zero_stage in (0, 3):
            flat, opt_state = update(optimizer, flat, opt_state, grads)
            return flat, opt_state, loss[None]
        width = flat.shape[1] // p
        mine = jax.lax.dynamic_slice_in_dim(flat, jax.lax.axis_index(axis_name) * width, width,
                                            axis=1)  # mine: f32[L, F/p]
        mine, opt_state = update(optimizer, mine, opt_state, grads)
        return collectives.gather_params(mine, axis_name, 1), opt_state, loss[None]  # f32[L, F]
    return local_step


def _manual_programs(zero_stage: ZeroStage, mesh: Mesh, axis_name: str, unravel: Callable,
                     optimizer: optax.GradientTransformation, state_specs: Any,
                     mean: bool) -> tuple[Callable, Callable]:
    """The hand-written ``shard_map`` step and the gradients its optimizer receives."""
    p = axes_size(mesh, axis_name)
    param_spec, batch_spec = _param_spec(zero_stage, axis_name), P(axis_name)
    grad_spec = P() if zero_stage == 0 else P(None, axis_name)  # the gradient the update gets
    local_gradients = _zero_local_gradients(zero_stage, unravel, axis_name, p, mean)
    # check_vma=False only for stages 1 and 2: their updated parameter slices are all-gathered
    # into the whole parameters, returned as replicated (out_specs P()), and
    # jax.lax.all_gather is typed Varying -> Varying; JAX 0.10.2 has no public all-gather whose
    # result is typed replicated, so the check cannot prove that claim. Stages 0 and 3 return
    # nothing they cannot prove, and run checked.
    step = jax.jit(jax.shard_map(
        _zero_local_step(zero_stage, local_gradients, optimizer, axis_name, p), mesh=mesh,
        in_specs=(param_spec, state_specs, batch_spec, batch_spec),
        out_specs=(param_spec, state_specs, P(axis_name)), check_vma=zero_stage in (0, 3)))
    grads = jax.jit(jax.shard_map(
        lambda flat, x, y: local_gradients(flat, x, y)[1], mesh=mesh,
        in_specs=(param_spec, batch_spec, batch_spec), out_specs=grad_spec))
    return step, grads


def make_sharded_data_parallel(params: Sequence[dict], mesh: Mesh,
                               optimizer: optax.GradientTransformation | None = None, *,
                               axis_name: str, automatic: bool = False,
                               zero_stage: ZeroStage = 3,
                               reduce: Reduction = "mean") -> Strategy:
    """Data parallelism with ZeRO stage 0-3 over ``axis_name``, by hand or by the compiler.

    The hand-written step (``automatic=False``) is a ``jax.shard_map`` over the data axis:

    * stage 0: gradients averaged with :func:`clusterlab.device.collectives.all_reduce_gradients`;
    * stages 1 and 2: :func:`clusterlab.device.collectives.reduce_scatter_gradients`, Adam on this
      device's slice, :func:`clusterlab.device.collectives.gather_params` of the updated slices;
    * stage 3: every block gathered with ``gather_params`` in the forward and again in the
      backward loop; its backward is the reduce-scatter of the block's gradient.

    With ``automatic=True`` the single-device step runs under ``jax.jit`` with the same
    ``NamedSharding`` s on parameters, optimizer state and batch; the partitioner inserts the
    communication.

    Args:
        params: the blocks of :func:`clusterlab.device.models.init_mlp` (unsharded), to read shapes.
        mesh: the mesh; ``axis_name`` is its data-parallel axis (other axes are unused).
        optimizer: an element-wise ``optax`` optimizer; default
            :func:`clusterlab.device.models.make_optimizer` (Adam).
        axis_name: the data-parallel axis.
        automatic: leave the communication to the compiler.
        zero_stage: 0, 1, 2 or 3.
        reduce: ``"mean"`` divides the gradients summed over the devices by p, right for this
            module's mean loss; ``"sum"`` leaves the sum (for a loss already divided by the
            global batch size). With the mean loss ``"sum"`` is the ZeRO bug of a shard's
            gradient not divided by p; only the hand-written step has the choice.

    Returns:
        A :class:`~clusterlab.device.parallel.Strategy` named ``"zero<stage>"`` (or
        ``"zero<stage>/jit"``): ``shard`` flattens the blocks to f32[L, F] split along F
        (stage 3) or replicated, ``init_opt_state`` splits Adam's state along F (stages >= 1),
        the step's loss is f32[p] (each device's on its batch shard; ``loss_value`` averages).

    Raises:
        ValueError: for an unknown stage or reduction, ``reduce`` with ``automatic``, or
            blocks whose flat size does not split over the devices.

    References:
        Rajbhandari et al., "ZeRO", SC 2020, Sections 5 and 7.
        https://arxiv.org/abs/1910.02054
    """
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero_stage must be one of {ZERO_STAGES}, got {zero_stage!r}.")
    check_reduce(reduce)
    if automatic and reduce != "mean":
        raise ValueError("reduce applies to the hand-written step; with automatic=True the "
                         "compiler derives the reduction from the mean loss. Use "
                         "automatic=False to choose it.")
    p = axes_size(mesh, axis_name)
    optimizer = optimizer_or_adam(optimizer)
    flat0, unravel = flatten_blocks(params)
    check_divisible(flat0.shape[1], p, _FLAT_MESSAGE)
    state_specs = opt_state_specs(optimizer, flat0, _state_spec(zero_stage, axis_name))
    if automatic:
        # the single-device step with ZeRO's shardings; the partitioner inserts the communication
        step, grads = automatic_programs(
            lambda flat, x, y: _flat_loss(flat, x, y, unravel), optimizer, mesh,
            params=_param_spec(zero_stage, axis_name), opt_state=state_specs,
            batch=P(axis_name))
    else:
        step, grads = _manual_programs(zero_stage, mesh, axis_name, unravel, optimizer,
                                       state_specs, reduce == "mean")
    return Strategy(
        f"zero{zero_stage}" + ("/jit" if automatic else ""), mesh, (axis_name,), automatic,
        shard=lambda blocks: devices.shard(flatten_blocks(blocks)[0], mesh,
                                           _param_spec(zero_stage, axis_name)),
        unshard=lambda flat: to_host(unflatten_blocks(jax.device_get(flat), unravel)),
        init_opt_state=opt_state_initializer(optimizer, mesh, state_specs),
        place_batch=_batch_placer(mesh, axis_name), step=step,
        grads=lambda flat, x, y: to_host(unflatten_blocks(jax.device_get(grads(flat, x, y)),
                                                          unravel)),
        loss_value=np.mean)


def _batch_placer(mesh: Mesh, axis_name: str) -> Callable:
    p = axes_size(mesh, axis_name)

    def place_batch(x, y):
        # x, y: f32[B, D] -> f32[B/p, D] per device
        check_batch(x.shape[0], p)
        return devices.shard(x, mesh, P(axis_name)), devices.shard(y, mesh, P(axis_name))
    return place_batch


def sent_bytes_per_device(ops: Sequence[hlo.CollectiveOp], n_devices: int) -> float:
    """Bytes a device sends for the collectives of a compiled program, with ring algorithms.

    Converts each op's result bytes (as :func:`clusterlab.device.hlo.compiled_collectives`
    reports them) to nccl-tests' size and applies
    :func:`clusterlab.analytic.costmodel.collective_steps_and_bytes`: an all-gather's result is the
    whole buffer; a reduce-scatter's result is one p-th of it; an all-reduce's result is the buffer.

    Args:
        ops: collectives of one program, e.g. from
            :func:`clusterlab.device.hlo.executed_collectives`.
        n_devices: the devices each collective spans.

    Returns:
        Bytes sent per device, summed over the ops.
    """
    names = {"all-gather": "all_gather", "reduce-scatter": "reduce_scatter",
             "all-reduce": "all_reduce", "all-to-all": "all_to_all",
             "collective-permute": "send_recv"}
    total = 0.0
    for op in ops:
        if op.kind not in names:
            raise ValueError(f"No byte count for collective {op.kind!r}.")
        size = op.bytes * n_devices if op.kind == "reduce-scatter" else op.bytes
        if size:
            total += costmodel.collective_steps_and_bytes(names[op.kind], size, n_devices)[1]
    return total
