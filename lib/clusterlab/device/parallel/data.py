"""Data parallelism three ways: ``jax.pmap``, ``jax.shard_map`` and ``jax.jit`` with shardings.

Every device holds the whole model and a slice of the global batch. Each computes the gradient
of the loss on its slice; one all-reduce averages the gradients, so every device applies the
same optimizer update and the replicas stay identical. With a loss that is a mean over the batch
and equal slices, the averaged gradient *is* the gradient of the global batch, so a data-parallel
run equals the single-device run of :func:`clusterlab.device.models.reference_train` up to
floating-point summation order.

The three forms build the same step and differ in who writes the communication:

* ``form="pmap"``: the classic form: the function runs once per device over a leading device
  axis, and calls the gradient mean itself
  (:func:`clusterlab.device.collectives.all_reduce_gradients`).
* ``form="shard_map"`` (the default): the same per-device code over named mesh axes; the
  all-reduce is explicit, may be bucketed, or left out to time the step without communication.
* ``automatic=True``: single-device code with the batch sharded (``NamedSharding``); the compiler
  (GSPMD/Shardy) finds that the gradients of replicated parameters need an all-reduce and
  inserts it. Lab 03 runs the three side by side, which is why ``form`` stays beside
  ``automatic`` here: the two hand-written forms differ in the code a reader writes.

:func:`make_data_parallel` returns the :class:`~clusterlab.device.parallel.Strategy` every
strategy module returns; :func:`train` (the one of :mod:`clusterlab.device.parallel`) runs N steps
like ``reference_train``. Its ``grads`` returns the gradient each device hands its optimizer,
one row per device (to check against :func:`clusterlab.device.models.reference_gradients`, where a
wrong factor of p shows). The axis may be a tuple (``("hosts", "devices")``): one reduction over
every device of a multi-process mesh (:mod:`clusterlab.course.examples.multihost`).

Replication checking: the ``shard_map`` step runs with ``check_vma=True`` (shard_map's
default), so JAX proves that the parameters it returns as replicated (``out_specs=P()``) are the
same on every device, which they are only after the gradient all-reduce.

References:
    Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training",
    VLDB 2020. https://arxiv.org/abs/2006.15704
    Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", 2017.
    https://arxiv.org/abs/1706.02677
    Xu et al., "GSPMD: General and Scalable Parallelization for ML Computation Graphs", 2021.
    https://arxiv.org/abs/2105.04663
"""

from __future__ import annotations

from typing import Callable, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from clusterlab.device import collectives, hlo, models
from clusterlab.device.parallel._common import (AxisNames, LossFn, Params, Reduction, Strategy,
                                                as_axis_names, automatic_programs, axes_size,
                                                check_batch, check_reduce, optimizer_or_adam,
                                                spec_axes, to_host, update)

__all__ = ["Form", "gradient_bytes", "make_data_parallel", "make_gradient_all_reduce"]

Form = Literal["pmap", "shard_map"]

def _local_gradients(loss_fn: LossFn, axes: tuple[str, ...], *, bucket_bytes: int | None,
                     sync_gradients: bool, reduce: Reduction) -> Callable:
    """The per-device gradient of the hand-written forms: ``(params, x, y) -> (loss, grads)``.

    The step and the strategy's ``grads`` both call it, so checking the gradients checks the
    step's own reduction.
    """
    axis = spec_axes(axes)

    def gradients(params, x, y):
        # params: replicated; x: f32[B/p, ...], y: f32[B/p, ...] this device's slice.
        # pcast: each device differentiates its own copy, so the gradient stays its local
        # batch's (varying over the axes) until the explicit all-reduce below. Without it,
        # check_vma's transpose of the implicit copy of a replicated parameter would insert a
        # psum by itself: a sum over devices, p times the gradient of the mean loss.
        local = jax.lax.pcast(params, axis, to="varying")
        loss, grads = jax.value_and_grad(loss_fn)(local, x, y)  # grads of the local mean
        if sync_gradients:
            grads = collectives.all_reduce_gradients(grads, axis, bucket_bytes=bucket_bytes,
                                                     mean=reduce == "mean")
        return jax.lax.pmean(loss, axis), grads  # the global batch's loss, for reporting
    return gradients


def _local_step(optimizer: optax.GradientTransformation, gradients: Callable) -> Callable:
    """The per-device step of the hand-written forms, around :func:`_local_gradients`."""
    def step(params, opt_state, x, y):
        loss, grads = gradients(params, x, y)
        params, opt_state = update(optimizer, params, opt_state, grads)
        return params, opt_state, loss
    return step


def _rows(tree: Params) -> Params:
    """Leaves split one row per device over the data axes (f32[p, ...]), read on the host.

    Reads the addressable shards, in device order, so that it also works when other processes
    hold the other rows (:mod:`clusterlab.course.examples.multihost`): then the rows are this
    process's devices'.
    """
    def rows(leaf):
        shards = sorted(leaf.addressable_shards, key=lambda s: s.index[0].start or 0)
        return np.concatenate([np.asarray(s.data) for s in shards])
    return jax.tree.map(rows, tree)


def _replica_rows(tree: Params) -> Params:
    """Each device's copy of replicated arrays, read from their shards: leaves f32[p, ...]."""
    return jax.tree.map(
        lambda leaf: np.stack([np.asarray(s.data) for s in leaf.addressable_shards]), tree)


def _pmap(loss_fn: LossFn, optimizer: optax.GradientTransformation, mesh: Mesh,
          axes: tuple[str, ...], gradient_options: dict) -> Strategy:
    """The ``pmap`` form: parameters, optimizer state and batch carry a leading device axis."""
    if len(axes) != 1 or mesh.devices.ndim != 1:
        raise ValueError(f"The pmap form runs over one axis; got axes {axes} of a mesh of shape "
                         f"{dict(mesh.shape)}. Use a 1-D mesh, or form='shard_map'.")
    p, (axis,) = axes_size(mesh, axes), axes
    devices = list(mesh.devices.flat)
    stacked = NamedSharding(mesh, P(axis))  # a leading axis of p, one slice per device
    gradients = _local_gradients(loss_fn, axes, **gradient_options)
    step = jax.pmap(_local_step(optimizer, gradients), axis_name=axis, devices=devices)
    per_device_gradients = jax.pmap(lambda params, x, y: gradients(params, x, y)[1],
                                    axis_name=axis, devices=devices)

    def shard(params):
        # each leaf: [p, ...], one copy per device
        return jax.tree.map(lambda a: jax.device_put(jnp.broadcast_to(a, (p, *jnp.shape(a))),
                                                     stacked), params)

    def place_batch(x, y):
        check_batch(x.shape[0], p)
        # x: f32[B, ...] -> f32[p, B/p, ...]
        return tuple(jax.device_put(a.reshape(p, a.shape[0] // p, *a.shape[1:]), stacked)
                     for a in (x, y))

    return Strategy(
        "data/pmap", mesh, axes, False, shard,
        unshard=lambda params: to_host(jax.tree.map(lambda a: a[0], params)),
        init_opt_state=jax.pmap(optimizer.init, axis_name=axis, devices=devices),
        place_batch=place_batch,
        step=step, grads=lambda params, x, y: to_host(per_device_gradients(params, x, y)),
        loss_value=lambda loss: np.asarray(loss[0]))


def _replicated_layout(mesh: Mesh, axes: tuple[str, ...],
                       optimizer: optax.GradientTransformation) -> dict:
    """``shard``, ``unshard``, ``init_opt_state`` and ``place_batch`` of the shard_map and jit
    forms: parameters and optimizer state replicated, the batch split over ``axes``."""
    p = axes_size(mesh, axes)
    replicated = NamedSharding(mesh, P())
    batch_sharding = NamedSharding(mesh, P(spec_axes(axes)))

    def place_batch(x, y):
        check_batch(x.shape[0], p)
        return jax.device_put((x, y), batch_sharding)  # each device: f32[B/p, ...]

    return dict(shard=lambda params: jax.device_put(params, replicated), unshard=to_host,
                init_opt_state=jax.jit(optimizer.init, out_shardings=replicated),
                place_batch=place_batch, loss_value=np.asarray)


def _shard_map(loss_fn: LossFn, optimizer: optax.GradientTransformation, mesh: Mesh,
               axes: tuple[str, ...], gradient_options: dict,
               compiler_options: dict | None) -> Strategy:
    """The ``shard_map`` form: the gradient all-reduce written out."""
    axis = spec_axes(axes)
    gradients = _local_gradients(loss_fn, axes, **gradient_options)
    # check_vma=True proves that the parameters returned as replicated (out_specs P()) are the
    # same on every device. Without the all-reduce they are not, and JAX would reject the step
    # at trace time; the sync_gradients=False variant exists to time the step without its
    # communication (and to show a check catching the drift), so only it runs unchecked.
    step = jax.jit(jax.shard_map(
        _local_step(optimizer, gradients), mesh=mesh,
        in_specs=(P(), P(), P(axis), P(axis)), out_specs=(P(), P(), P()),
        check_vma=gradient_options["sync_gradients"]), compiler_options=compiler_options)
    # one row per device (out_specs P(axis)): replicated or not, every device's copy comes back
    per_device_gradients = jax.jit(jax.shard_map(
        lambda params, x, y: jax.tree.map(lambda g: g[None], gradients(params, x, y)[1]),
        mesh=mesh, in_specs=(P(), P(axis), P(axis)), out_specs=P(axis)),
        compiler_options=compiler_options)
    return Strategy("data/shard_map", mesh, axes, False, step=step,
                    grads=lambda params, x, y: _rows(per_device_gradients(params, x, y)),
                    **_replicated_layout(mesh, axes, optimizer))


def _automatic(loss_fn: LossFn, optimizer: optax.GradientTransformation, mesh: Mesh,
               axes: tuple[str, ...], compiler_options: dict | None) -> Strategy:
    """The form left to the compiler: ``jax.jit`` of the single-device step, batch sharded.

    XLA's SPMD partitioner sees that the gradient of a replicated parameter sums over the
    sharded batch and inserts the all-reduce.
    """
    # the gradient is the one the step computes, laid out as the step lays it out (replicated)
    step, global_gradients = automatic_programs(loss_fn, optimizer, mesh, params=P(),
                                                opt_state=P(), batch=P(spec_axes(axes)),
                                                compiler_options=compiler_options)
    return Strategy("data/jit", mesh, axes, True, step=step,
                    grads=lambda params, x, y: _replica_rows(global_gradients(params, x, y)),
                    **_replicated_layout(mesh, axes, optimizer))


def make_data_parallel(loss_fn: LossFn, mesh: Mesh,
                       optimizer: optax.GradientTransformation | None = None, *,
                       axis_name: AxisNames, automatic: bool = False,
                       form: Form = "shard_map", bucket_bytes: int | None = None,
                       combine_all_reduces: bool = True, sync_gradients: bool = True,
                       reduce: Reduction = "mean") -> Strategy:
    """Data parallelism over ``axis_name``: written out (pmap, shard_map) or by the compiler.

    Args:
        loss_fn: ``loss_fn(params, x, y) -> f32[]``, a mean over the batch (any model: data
            parallelism splits only the batch), e.g. :func:`clusterlab.device.models.mse_loss`.
        mesh: the device mesh; parameters are replicated over all of it.
        optimizer: an ``optax`` gradient transformation; default
            :func:`clusterlab.device.models.make_optimizer` (Adam).
        axis_name: the data-parallel axis, or a tuple of axes reduced over together (e.g.
            ``("hosts", "devices")``: one all-reduce over every device of several processes).
        automatic: ``jax.jit`` of the single-device step with the batch sharded; the compiler
            inserts the all-reduce. Takes no ``form``, buckets, ``sync_gradients`` or
            ``reduce``: it derives the reduction from the mean loss.
        form: for the hand-written step, ``"shard_map"`` (per-device code over a named mesh
            axis) or ``"pmap"`` (the classic form, over a leading device axis; one 1-D axis).
        bucket_bytes: None for one all-reduce per gradient leaf, or the bucket size in bytes
            (see :func:`clusterlab.device.collectives.all_reduce_gradients`).
        combine_all_reduces: let XLA merge independent all-reduces (its default). False
            compiles with :data:`clusterlab.device.hlo.SEPARATE_ALL_REDUCES`, so the program
            keeps one all-reduce per bucket (or per leaf). Not for ``form="pmap"``.
        sync_gradients: False leaves the gradient all-reduce out (shard_map only): each device
            then updates with its own gradients and the replicas drift apart. Only for timing
            the step without its communication, and as the negative control of a check.
        reduce: ``"mean"`` averages the devices' gradients (``pmean``), right for a ``loss_fn``
            that is a mean over its batch slice; ``"sum"`` adds them (``psum``), right only for a
            loss already divided by the global batch size: with a mean loss it applies ``p``
            times the gradient (the bug a check of the gradients catches).

    Returns:
        The :class:`~clusterlab.device.parallel.Strategy`, named ``"data/pmap"``,
        ``"data/shard_map"`` or ``"data/jit"``; its ``grads`` has one row per device.

    Raises:
        ValueError: for an axis not in the mesh, an unknown ``form`` or ``reduce``, or an
            option the chosen form does not have.
    """
    axes = as_axis_names(axis_name)
    axes_size(mesh, axes)
    optimizer = optimizer_or_adam(optimizer)
    check_reduce(reduce)
    compiler_options = None if combine_all_reduces else hlo.SEPARATE_ALL_REDUCES
    if automatic:
        if bucket_bytes is not None or not sync_gradients or reduce != "mean":
            raise ValueError("automatic=True leaves the all-reduce to the compiler: it takes no "
                             "bucket_bytes, sync_gradients or reduce. Use automatic=False to "
                             "write the reduction out.")
        return _automatic(loss_fn, optimizer, mesh, axes, compiler_options)
    options = dict(bucket_bytes=bucket_bytes, sync_gradients=sync_gradients, reduce=reduce)
    if form == "shard_map":
        return _shard_map(loss_fn, optimizer, mesh, axes, options, compiler_options)
    if form != "pmap":
        raise ValueError(f"Unknown data-parallel form {form!r}; choose 'shard_map' or 'pmap' "
                         f"(automatic=True for the compiler's).")
    if not (combine_all_reduces and sync_gradients):
        raise ValueError("The pmap form takes no combine_all_reduces or sync_gradients; use "
                         "form='shard_map' for them.")
    return _pmap(loss_fn, optimizer, mesh, axes, options)


def make_gradient_all_reduce(mesh: Mesh, *, axis_name: AxisNames,
                             bucket_bytes: int | None = None,
                             combine_all_reduces: bool = True) -> Callable:
    """The gradient all-reduce of a data-parallel step on its own, to time it apart from compute.

    Args:
        mesh: the device mesh.
        axis_name: the data-parallel axis (or axes).
        bucket_bytes: as in :func:`clusterlab.device.collectives.all_reduce_gradients`.
        combine_all_reduces: as in :func:`make_data_parallel`.

    Returns:
        A jitted ``fn(grads) -> grads``: every device holds a whole gradient pytree (replicated
        placement, ``P()``) and gets the mean over ``axis_name``, in one all-reduce per bucket
        (or per leaf, or combined by XLA).
    """
    axis = spec_axes(as_axis_names(axis_name))
    axes_size(mesh, axis_name)

    def mean_of_copies(grads):
        # the replicated input stands for p different per-device gradients: pcast types it so
        grads = jax.lax.pcast(grads, axis, to="varying")
        return collectives.all_reduce_gradients(grads, axis, bucket_bytes=bucket_bytes)

    fn = jax.shard_map(mean_of_copies, mesh=mesh, in_specs=P(), out_specs=P())
    return jax.jit(fn, compiler_options=None if combine_all_reduces
                   else hlo.SEPARATE_ALL_REDUCES)


def gradient_bytes(params: Params) -> int:
    """Bytes of one full gradient of ``params``: what data parallelism all-reduces per step."""
    return models.param_bytes(params)
