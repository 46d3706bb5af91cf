"""Sharded data parallelism (ZeRO stages 1-3, FSDP) and 2-D data x tensor parallelism.

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
(:func:`clusterlab.memory.training_memory_per_device`), where stage 1 keeps the full gradient
buffer that a framework like PyTorch holds between the backward pass and the optimizer step.

2-D parallelism (:func:`make_2d_train_step`) runs data parallelism over one mesh axis and
Megatron tensor parallelism (:mod:`clusterlab.parallel.tensor`) over the other.

Every step comes with a function that returns the gradient its optimizer receives, computed by
the same code, to check against :func:`clusterlab.models.reference_gradients`: Adam hides a
wrong factor of p in the gradients (a shard's gradient not divided by p), the gradients do not.
``reduce="sum"`` injects exactly that bug on purpose. Replication checking (``check_vma=True``,
shard_map's default) is on wherever JAX 0.10.2 can prove the outputs' layout; the one place it
stays off (the all-gather of updated parameters in stages 1 and 2) says why.

References:
    Rajbhandari, Rasley, Ruwase & He, "ZeRO: Memory Optimizations Toward Training Trillion
    Parameter Models", SC 2020. https://arxiv.org/abs/1910.02054
    Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel", VLDB 2023.
    https://arxiv.org/abs/2304.11277
    Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
    Megatron-LM", SC 2021 (combining data and tensor parallelism).
    https://arxiv.org/abs/2104.04473
"""

from __future__ import annotations

from typing import Callable, Iterable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from clusterlab import collectives, devices, models
from clusterlab.devices import axis_size as _axis_size
from clusterlab.parallel import data, tensor

ZERO_STAGES = (0, 1, 2, 3)
Params = object


# --- Flat parameters: one vector per block, blocks stacked -------------------------------------

def flatten_blocks(params: Sequence[dict]) -> tuple[jax.Array, Callable[[jax.Array], dict]]:
    """Stack the blocks of :func:`clusterlab.models.init_mlp` as flat parameter vectors.

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


def check_divisible(*, flat_size: int, batch_size: int | None, n_devices: int) -> None:
    """Raise a ValueError unless the flat parameters and the batch split over the devices.

    Args:
        flat_size: F, the length of one block's flat parameter vector.
        batch_size: B, the global batch (None to skip the check).
        n_devices: p, the devices on the data-parallel axis.
    """
    if flat_size % n_devices:
        raise ValueError(
            f"Sharded data parallelism splits each block's {flat_size} parameters over "
            f"{n_devices} devices, which does not divide. Choose d_model and d_hidden so that "
            f"2*D*H + H + D is a multiple of {n_devices}, or use a device count that divides "
            f"{flat_size}.")
    if batch_size is not None and batch_size % n_devices:
        raise ValueError(
            f"The global batch of {batch_size} examples does not split into {n_devices} equal "
            f"shards, one per data-parallel device; use a batch that is a multiple of "
            f"{n_devices} (e.g. {(batch_size // n_devices + 1) * n_devices}).")


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


class ShardedDataParallel(NamedTuple):
    """A ZeRO training step and the functions that lay out its inputs.

    Attributes:
        zero_stage: 0 (plain data parallelism), 1, 2 or 3.
        automatic: False for the hand-written ``shard_map`` step, True for ``jax.jit`` with the
            same shardings, the collectives left to the compiler.
        n_devices: p, the devices on the data-parallel axis.
        init: ``init(params) -> (flat, opt_state)``, laid out for ``step``: ``flat`` f32[L, F]
            split along F (stage 3) or replicated, the Adam state split along F (stages >= 1).
        place_batch: ``place_batch(x, y)`` splits a global f32[B, D] batch over the devices.
        step: ``step(flat, opt_state, x, y) -> (flat, opt_state, losses)``, compiled, with
            ``losses`` f32[p], each device's loss on its batch shard (their mean is the loss).
        gather: ``gather(flat) -> list of block dicts`` on the host.
        gradients: ``gradients(flat, x, y) -> list of block dicts`` on the host, with ``flat``
            as ``init`` lays it out and ``x, y`` as ``place_batch`` does: the gradient the
            step's optimizer receives (computed by the same code), assembled from the devices'
            shards (stages 1-3) or their one replicated copy (stage 0).
    """

    zero_stage: int
    automatic: bool
    n_devices: int
    init: Callable
    place_batch: Callable
    step: Callable
    gather: Callable
    gradients: Callable


def _param_spec(zero_stage: int, axis_name: str) -> P:
    return P(None, axis_name) if zero_stage == 3 else P()


def _state_spec(zero_stage: int, axis_name: str) -> P:
    return P(None, axis_name) if zero_stage >= 1 else P()


def make_sharded_data_parallel(params: Sequence[dict], mesh: Mesh, axis_name: str, *,
                               zero_stage: int = 3,
                               optimizer: optax.GradientTransformation | None = None,
                               automatic: bool = False,
                               reduce: str = "mean") -> ShardedDataParallel:
    """Data parallelism with ZeRO stage 0-3 over ``axis_name``, by hand or by the compiler.

    The hand-written step (``automatic=False``) is a ``jax.shard_map`` over the data axis:

    * stage 0: gradients averaged with :func:`clusterlab.collectives.all_reduce_gradients`;
    * stages 1 and 2: :func:`clusterlab.collectives.reduce_scatter_gradients`, Adam on this
      device's slice, :func:`clusterlab.collectives.gather_params` of the updated slices;
    * stage 3: every block gathered with ``gather_params`` in the forward and again in the
      backward loop; its backward is the reduce-scatter of the block's gradient.

    With ``automatic=True`` the single-device step runs under ``jax.jit`` with the same
    ``NamedSharding`` s on parameters, optimizer state and batch; the partitioner inserts the
    communication.

    Args:
        params: the blocks of :func:`clusterlab.models.init_mlp` (unsharded), to read shapes.
        mesh: the mesh; ``axis_name`` is its data-parallel axis (other axes are unused).
        axis_name: the data-parallel axis.
        zero_stage: 0, 1, 2 or 3.
        optimizer: an element-wise ``optax`` optimizer; default
            :func:`clusterlab.models.make_optimizer` (Adam).
        automatic: leave the communication to the compiler.
        reduce: ``"mean"`` divides the gradients summed over the devices by p, right for this
            module's mean loss; ``"sum"`` leaves the sum (for a loss already divided by the
            global batch size). With the mean loss ``"sum"`` is the ZeRO bug of a shard's
            gradient not divided by p; only the hand-written step has the choice.

    Returns:
        A :class:`ShardedDataParallel`.

    References:
        Rajbhandari et al., "ZeRO", SC 2020, Sections 5 and 7.
        https://arxiv.org/abs/1910.02054
    """
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero_stage must be one of {ZERO_STAGES}, got {zero_stage!r}.")
    data.check_reduce(reduce)
    if automatic and reduce != "mean":
        raise ValueError("reduce applies to the hand-written step; with automatic=True the "
                         "compiler derives the reduction from the mean loss. Use "
                         "automatic=False to choose it.")
    mean = reduce == "mean"
    p = _axis_size(mesh, axis_name)
    optimizer = models.make_optimizer() if optimizer is None else optimizer
    flat0, unravel = flatten_blocks(params)
    check_divisible(flat_size=flat0.shape[1], batch_size=None, n_devices=p)
    param_spec, state_spec = _param_spec(zero_stage, axis_name), _state_spec(zero_stage, axis_name)
    state_specs = jax.tree.map(lambda leaf: state_spec if leaf.ndim == 2 else P(),
                               jax.eval_shape(optimizer.init, flat0))
    batch_spec = P(axis_name)
    grad_spec = P() if zero_stage == 0 else P(None, axis_name)  # the gradient the update gets

    def local_gradients(flat, x, y):
        # x, y: f32[B/p, D]; flat: f32[L, F/p] (stage 3) or f32[L, F] replicated. Returns this
        # device's loss and the gradient its optimizer gets: f32[L, F] (stage 0) or f32[L, F/p].
        if zero_stage == 3:
            loss, grads = jax.value_and_grad(_gathered_loss)(flat, x, y, unravel, axis_name)
            # gather_params' backward summed the devices' gradients: f32[L, F/p]
            return loss, grads / p if mean else grads
        # pcast: differentiate this device's own copy, so the gradient stays its batch shard's
        # until the explicit collective (check_vma would otherwise insert a psum itself)
        local = jax.lax.pcast(flat, axis_name, to="varying")
        loss, grads = jax.value_and_grad(_flat_loss)(local, x, y, unravel)  # grads: f32[L, F]
        if zero_stage == 0:
            return loss, collectives.all_reduce_gradients(grads, axis_name, mean=mean)
        return loss, collectives.reduce_scatter_gradients(grads, axis_name, axis=1,
                                                          mean=mean)  # f32[L, F/p]

    def local_step(flat, opt_state, x, y):
        # opt_state: f32[L, F/p] leaves (stages >= 1) or f32[L, F]
        loss, grads = local_gradients(flat, x, y)
        if zero_stage in (0, 3):
            updates, opt_state = optimizer.update(grads, opt_state, flat)
            return optax.apply_updates(flat, updates), opt_state, loss[None]
        width = flat.shape[1] // p
        mine = jax.lax.dynamic_slice_in_dim(flat, jax.lax.axis_index(axis_name) * width, width,
                                            axis=1)  # mine: f32[L, F/p]
        updates, opt_state = optimizer.update(grads, opt_state, mine)
        mine = optax.apply_updates(mine, updates)
        return collectives.gather_params(mine, axis_name, 1), opt_state, loss[None]  # f32[L, F]

    def named(spec_tree):
        return jax.tree.map(lambda s: NamedSharding(mesh, s), spec_tree,
                            is_leaf=lambda v: isinstance(v, P))

    if automatic:
        def global_step(flat, opt_state, x, y):
            loss, grads = jax.value_and_grad(_flat_loss)(flat, x, y, unravel)
            updates, opt_state = optimizer.update(grads, opt_state, flat)
            return optax.apply_updates(flat, updates), opt_state, loss[None]

        step = jax.jit(global_step,
                       in_shardings=(named(param_spec), named(state_specs), named(batch_spec),
                                     named(batch_spec)),
                       out_shardings=(named(param_spec), named(state_specs), named(P())))
        global_gradients = jax.jit(
            lambda flat, x, y: jax.grad(_flat_loss)(flat, x, y, unravel),
            in_shardings=(named(param_spec), named(batch_spec), named(batch_spec)),
            out_shardings=named(param_spec))
    else:
        # check_vma=False only for stages 1 and 2: their updated parameter slices are
        # all-gathered into the whole parameters, returned as replicated (out_specs P()), and
        # jax.lax.all_gather is typed Varying -> Varying; JAX 0.10.2 has no public all-gather
        # whose result is typed replicated, so the check cannot prove that claim. Stages 0 and 3
        # return nothing they cannot prove, and run checked.
        step = jax.jit(jax.shard_map(
            local_step, mesh=mesh, in_specs=(param_spec, state_specs, batch_spec, batch_spec),
            out_specs=(param_spec, state_specs, P(axis_name)),
            check_vma=zero_stage in (0, 3)))
        global_gradients = jax.jit(jax.shard_map(
            lambda flat, x, y: local_gradients(flat, x, y)[1], mesh=mesh,
            in_specs=(param_spec, batch_spec, batch_spec), out_specs=grad_spec))

    def init(unsharded_params):
        flat, _ = flatten_blocks(unsharded_params)
        flat = devices.shard(flat, mesh, param_spec)
        opt_state = optimizer.init(flat)
        opt_state = jax.tree.map(lambda leaf, spec: devices.shard(leaf, mesh, spec), opt_state,
                                 state_specs)
        return flat, opt_state

    def place_batch(x, y):
        check_divisible(flat_size=flat0.shape[1], batch_size=x.shape[0], n_devices=p)
        return devices.shard(x, mesh, batch_spec), devices.shard(y, mesh, batch_spec)

    def gather(flat):
        return unflatten_blocks(np.asarray(jax.device_get(flat)), unravel)

    def gradients(flat, x, y):
        return gather(global_gradients(flat, x, y))

    return ShardedDataParallel(zero_stage, automatic, p, init, place_batch, step, gather,
                               gradients)


def train(sdp: ShardedDataParallel, params: Sequence[dict],
          batches: Iterable[tuple[jax.Array, jax.Array]]) -> tuple[list[dict], np.ndarray]:
    """Run ``sdp.step`` over ``batches``: the counterpart of :func:`models.reference_train`.

    Args:
        sdp: from :func:`make_sharded_data_parallel`.
        params: initial blocks (unsharded).
        batches: ``(x, y)`` global batches, f32[B, D] each, B a multiple of p.

    Returns:
        ``(params, losses)``: the trained blocks on the host, and f32[n_steps] losses (the mean
        of the devices' losses, the loss on the global batch).
    """
    flat, opt_state = sdp.init(params)
    flat, _, losses = models.run_steps(sdp.step, flat, opt_state, batches,
                                       place=sdp.place_batch, loss_value=np.mean)
    return sdp.gather(flat), losses


def sent_bytes_per_device(ops: Sequence[collectives.CollectiveOp], n: int) -> float:
    """Bytes a device sends for the collectives of a compiled program, with ring algorithms.

    Converts each op's result bytes (as :func:`clusterlab.collectives.compiled_collectives`
    reports them) to nccl-tests' size and applies
    :func:`clusterlab.costmodel.collective_steps_and_bytes`: an all-gather's result is the whole
    buffer; a reduce-scatter's result is one p-th of it; an all-reduce's result is the buffer.

    Args:
        ops: collectives of one program, e.g. from :func:`clusterlab.collectives.executed_collectives`.
        n: the devices each collective spans.

    Returns:
        Bytes sent per device, summed over the ops.
    """
    from clusterlab import costmodel

    names = {"all-gather": "all_gather", "reduce-scatter": "reduce_scatter",
             "all-reduce": "all_reduce", "all-to-all": "all_to_all",
             "collective-permute": "send_recv"}
    total = 0.0
    for op in ops:
        if op.kind not in names:
            raise ValueError(f"No byte count for collective {op.kind!r}.")
        size = op.bytes * n if op.kind == "reduce-scatter" else op.bytes
        if size:
            total += costmodel.collective_steps_and_bytes(names[op.kind], size, n)[1]
    return total


# --- 2-D: data parallel over one axis, Megatron tensor parallel over the other ----------------

def _2d_local_gradients(data_axis: str, model_axis: str, reduce: str) -> Callable:
    """Per device: ``(params, x, y) -> (loss, grads)``, the gradients averaged over the data axis."""
    def gradients(params, x, y):
        # params: Megatron shards (w1: f32[D, H/tp], ...), replicated over data_axis; x, y:
        # f32[B/dp, D]. pcast: each data-parallel replica differentiates its own copy, so the
        # gradient stays its batch shard's until the explicit all-reduce over data_axis.
        local = jax.lax.pcast(params, data_axis, to="varying")
        loss, grads = jax.value_and_grad(
            lambda prm: jnp.mean((tensor.mlp_forward(prm, x, model_axis) - y) ** 2))(local)
        grads = collectives.all_reduce_gradients(grads, data_axis, mean=reduce == "mean")
        return loss, grads
    return gradients


def make_2d_train_step(params: Sequence[dict], mesh: Mesh, *, data_axis: str, model_axis: str,
                       optimizer: optax.GradientTransformation | None = None,
                       reduce: str = "mean") -> Callable:
    """A jitted data x tensor parallel training step of the residual MLP (``shard_map``).

    Along ``model_axis`` each block is split the Megatron way (:mod:`clusterlab.parallel.tensor`:
    ``w1`` by columns, ``w2`` by rows, one all-reduce forward and one backward per block); along
    ``data_axis`` the batch is split and the gradients of each device's weight slices are
    averaged over its data-parallel group (:func:`clusterlab.collectives.all_reduce_gradients`).
    Adam acts element by element on each device's slices.

    Args:
        params: the blocks of :func:`clusterlab.models.init_mlp` (unsharded), to read shapes.
        mesh: a 2-D mesh with axes ``data_axis`` and ``model_axis``.
        data_axis: the data-parallel axis (the batch is split over it).
        model_axis: the tensor-parallel axis (the hidden width is split over it).
        optimizer: an element-wise ``optax`` optimizer; default Adam.
        reduce: ``"mean"`` (default) or ``"sum"`` over the data axis, as in
            :func:`make_sharded_data_parallel`; ``"sum"`` is the bug of a missing 1/dp.

    Returns:
        ``step(params, opt_state, x, y) -> (params, opt_state, losses)`` with ``params`` laid out
        by :func:`shard_2d`, ``opt_state`` from ``jax.jit(optimizer.init)`` of them, ``x``, ``y``
        f32[B, D] split over ``data_axis``, ``losses`` f32[dp], the loss of each data shard.
    """
    _axis_size(mesh, data_axis)
    tp = _axis_size(mesh, model_axis)
    data.check_reduce(reduce)
    optimizer = models.make_optimizer() if optimizer is None else optimizer
    tensor.check_divisible(tp=tp, d_hidden=params[0]["w1"].shape[1])
    specs = tensor.param_specs(params, model_axis)  # replicated over data_axis
    state_specs = tensor._opt_state_specs(optimizer, params, specs)
    local_gradients = _2d_local_gradients(data_axis, model_axis, reduce)

    def local_step(params, opt_state, x, y):
        loss, grads = local_gradients(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss[None]

    # check_vma=True: JAX proves that the parameters come out replicated over data_axis (they
    # do only after the all-reduce) and split over model_axis as the specs say.
    return jax.jit(jax.shard_map(
        local_step, mesh=mesh, in_specs=(specs, state_specs, P(data_axis), P(data_axis)),
        out_specs=(specs, state_specs, P(data_axis))))


def make_2d_gradients(params: Sequence[dict], mesh: Mesh, *, data_axis: str, model_axis: str,
                      reduce: str = "mean") -> Callable:
    """The gradient that :func:`make_2d_train_step`'s optimizer receives, by the same code.

    Args:
        params: the blocks of :func:`clusterlab.models.init_mlp` (unsharded), to read shapes.
        mesh, data_axis, model_axis, reduce: as in :func:`make_2d_train_step`.

    Returns:
        ``gradients(params, x, y) -> list of block dicts`` on the host (whole arrays, assembled
        from the Megatron shards), with ``params`` laid out by :func:`shard_2d` and ``x``, ``y``
        f32[B, D] split over ``data_axis``.
    """
    _axis_size(mesh, data_axis)
    tp = _axis_size(mesh, model_axis)
    data.check_reduce(reduce)
    tensor.check_divisible(tp=tp, d_hidden=params[0]["w1"].shape[1])
    specs = tensor.param_specs(params, model_axis)
    local_gradients = _2d_local_gradients(data_axis, model_axis, reduce)
    fn = jax.jit(jax.shard_map(lambda prm, x, y: local_gradients(prm, x, y)[1], mesh=mesh,
                               in_specs=(specs, P(data_axis), P(data_axis)), out_specs=specs))
    return lambda prm, x, y: jax.tree.map(np.asarray, jax.device_get(fn(prm, x, y)))


def shard_2d(params: Sequence[dict], mesh: Mesh, *, model_axis: str) -> list[dict]:
    """Place MLP blocks on a 2-D mesh: Megatron split over ``model_axis``, replicated otherwise."""
    return tensor.shard_params(params, mesh, model_axis)


def train_2d(params: Sequence[dict], batches: Iterable[tuple[jax.Array, jax.Array]],
             mesh: Mesh, *, data_axis: str, model_axis: str,
             optimizer: optax.GradientTransformation | None = None, reduce: str = "mean"
             ) -> tuple[list[dict], np.ndarray]:
    """Train with 2-D data x tensor parallelism; returns host blocks and f32[n_steps] losses.

    ``reduce`` as in :func:`make_2d_train_step`.
    """
    optimizer = models.make_optimizer() if optimizer is None else optimizer
    step = make_2d_train_step(params, mesh, data_axis=data_axis, model_axis=model_axis,
                              optimizer=optimizer, reduce=reduce)
    sharded = shard_2d(params, mesh, model_axis=model_axis)
    opt_state = jax.jit(optimizer.init)(sharded)
    sharded, _, losses = models.run_steps(
        step, sharded, opt_state, batches,
        place=lambda x, y: place_2d_batch(x, y, mesh, data_axis=data_axis), loss_value=np.mean)
    return jax.device_get(sharded), losses


def place_2d_batch(x: jax.Array, y: jax.Array, mesh: Mesh, *,
                   data_axis: str) -> tuple[jax.Array, jax.Array]:
    """Split a global batch, f32[B, D] each, over ``data_axis`` (replicated over the other axis).

    Raises:
        ValueError: when B is not a multiple of the data axis's size.
    """
    dp = _axis_size(mesh, data_axis)
    if x.shape[0] % dp:
        raise ValueError(f"The global batch of {x.shape[0]} examples does not split into "
                         f"{dp} equal shards over {data_axis!r}; use a multiple of {dp}.")
    return tuple(devices.shard(a, mesh, P(data_axis)) for a in (x, y))
