"""2-D parallelism: data parallelism over one mesh axis, Megatron tensor parallelism over the other.

Along ``model_axis`` each block of the residual MLP is split the Megatron way
(:mod:`clusterlab.device.parallel.tensor`: ``w1`` by columns, ``w2`` by rows, one all-reduce forward
and one backward per block, of the activations); along ``data_axis`` the batch is split and the
gradients of each device's weight slices are averaged over its data-parallel group
(:func:`clusterlab.device.collectives.all_reduce_gradients`). Adam acts element by element on each
device's slices. The two kinds of all-reduce run on different groups of devices: the
activations' within a tensor-parallel group (one row of the mesh), the weight slices' gradients
within a data-parallel group (one column).

References:
    Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
    Megatron-LM", SC 2021 (combining data and tensor parallelism).
    https://arxiv.org/abs/2104.04473
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, PartitionSpec as P

from clusterlab.device import collectives, devices, models
from clusterlab.device.parallel import tensor
from clusterlab.device.parallel._common import (Params, Reduction, Strategy, automatic_programs,
                                                axes_size, check_batch, check_reduce,
                                                opt_state_initializer, opt_state_specs,
                                                optimizer_or_adam, to_host, update)

__all__ = ["make_2d_parallel"]


def _local_gradients(data_axis: str, model_axis: str, reduce: Reduction) -> Callable:
    """Per device: ``(params, x, y) -> (loss, grads)``, gradients averaged over the data axis."""
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


def _manual_programs(mesh: Mesh, data_axis: str, model_axis: str,
                     optimizer: optax.GradientTransformation, specs: Params, state_specs: Params,
                     reduce: Reduction) -> tuple[Callable, Callable]:
    """The ``shard_map`` step and the gradients its optimizer receives, by the same code."""
    local_gradients = _local_gradients(data_axis, model_axis, reduce)

    def local_step(params, opt_state, x, y):
        loss, grads = local_gradients(params, x, y)
        params, opt_state = update(optimizer, params, opt_state, grads)
        return params, opt_state, loss[None]

    # check_vma=True: JAX proves that the parameters come out replicated over data_axis (they
    # do only after the all-reduce) and split over model_axis as the specs say.
    step = jax.jit(jax.shard_map(
        local_step, mesh=mesh, in_specs=(specs, state_specs, P(data_axis), P(data_axis)),
        out_specs=(specs, state_specs, P(data_axis))))
    grads = jax.jit(jax.shard_map(lambda prm, x, y: local_gradients(prm, x, y)[1], mesh=mesh,
                                  in_specs=(specs, P(data_axis), P(data_axis)), out_specs=specs))
    return step, grads


def make_2d_parallel(params: Sequence[dict], mesh: Mesh,
                     optimizer: optax.GradientTransformation | None = None, *, data_axis: str,
                     model_axis: str, automatic: bool = False,
                     reduce: Reduction = "mean") -> Strategy:
    """Data x tensor parallelism of the residual MLP on a 2-D mesh.

    Args:
        params: the blocks of :func:`clusterlab.device.models.init_mlp` (unsharded), to read shapes.
        mesh: a 2-D mesh with axes ``data_axis`` and ``model_axis``.
        optimizer: an element-wise ``optax`` optimizer; default
            :func:`clusterlab.device.models.make_optimizer` (Adam).
        data_axis: the data-parallel axis (the batch is split over it).
        model_axis: the tensor-parallel axis (the hidden width is split over it).
        automatic: the single-device step under ``jax.jit`` with the same shardings.
        reduce: ``"mean"`` (default) or ``"sum"`` over the data axis; ``"sum"`` is the bug of a
            missing 1/dp, for a negative control. Hand-written step only.

    Returns:
        A :class:`~clusterlab.device.parallel.Strategy` named ``"2d"`` (or ``"2d/jit"``),
        ``axis_names`` ``(data_axis, model_axis)``: ``shard`` splits the weights over
        ``model_axis`` (replicated over ``data_axis``), ``place_batch`` splits f32[B, D] over
        ``data_axis``; the hand-written step's loss is f32[dp], each data shard's.

    Raises:
        ValueError: when an axis is not in the mesh, the hidden width does not split over the
            model axis, or ``reduce`` is combined with ``automatic``.
    """
    dp = axes_size(mesh, data_axis)
    tensor.check_params(params, axes_size(mesh, model_axis))
    check_reduce(reduce)
    if automatic and reduce != "mean":
        raise ValueError("reduce applies to the hand-written step; use automatic=False.")
    optimizer = optimizer_or_adam(optimizer)
    specs = tensor.param_specs(params, model_axis)  # replicated over data_axis
    state_specs = opt_state_specs(optimizer, params, specs)
    if automatic:
        step, grads = automatic_programs(models.mse_loss, optimizer, mesh, params=specs,
                                         opt_state=state_specs, batch=P(data_axis))
    else:
        step, grads = _manual_programs(mesh, data_axis, model_axis, optimizer, specs,
                                       state_specs, reduce)

    def place_batch(x, y):
        check_batch(x.shape[0], dp)
        return tuple(devices.shard(a, mesh, P(data_axis)) for a in (x, y))  # f32[B/dp, D] each

    return Strategy("2d/jit" if automatic else "2d", mesh, (data_axis, model_axis), automatic,
                    shard=lambda prm: tensor.shard_params(prm, mesh, model_axis),
                    unshard=to_host,
                    init_opt_state=opt_state_initializer(optimizer, mesh, state_specs),
                    place_batch=place_batch, step=step,
                    grads=lambda prm, x, y: to_host(grads(prm, x, y)), loss_value=np.mean)
