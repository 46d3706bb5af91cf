"""Data parallelism three ways: ``jax.pmap``, ``jax.shard_map`` and ``jax.jit`` with shardings.

Every device holds the whole model and a slice of the global batch. Each computes the gradient
of the loss on its slice; one all-reduce averages the gradients, so every device applies the
same optimizer update and the replicas stay identical. With a loss that is a mean over the batch
and equal slices, the averaged gradient *is* the gradient of the global batch, so a data-parallel
run equals the single-device run of :func:`clusterlab.models.reference_train` up to
floating-point summation order.

The three forms build the same step and differ in who writes the communication:

* ``"pmap"``: the classic form: the function runs once per device over a leading device axis,
  and calls the gradient mean itself (:func:`clusterlab.collectives.all_reduce_gradients`).
* ``"shard_map"``: the same per-device code over a named mesh axis; the all-reduce is explicit,
  may be bucketed, or left out to time the step without communication.
* ``"jit"``: single-device code with the batch sharded (``NamedSharding``); the compiler
  (GSPMD/Shardy) finds that the gradients of replicated parameters need an all-reduce and
  inserts it.

Each maker returns a :class:`DataParallel`: ``init`` lays out parameters and optimizer state,
``place_batch`` splits a global batch, ``step(params, opt_state, x, y) -> (params, opt_state,
loss)`` trains one step, ``gradients`` returns the gradient each device hands its optimizer (to
check against :func:`clusterlab.models.reference_gradients`, where a wrong factor of p shows),
``gather`` returns one copy of the parameters. :func:`train` runs N steps like
``reference_train``.

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

from typing import Callable, Iterable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from clusterlab import collectives, models
from clusterlab.devices import axis_size as _axis_size

FORMS = ("pmap", "shard_map", "jit")
REDUCTIONS = ("mean", "sum")

LossFn = Callable[..., jax.Array]


class DataParallel(NamedTuple):
    """A data-parallel training step and the functions that lay out its inputs.

    Attributes:
        form: ``"pmap"``, ``"shard_map"`` or ``"jit"``.
        n_devices: p, the devices along the data-parallel axis.
        init: ``init(params) -> (params, opt_state)``, both laid out for ``step``.
        place_batch: ``place_batch(x, y)``: global f32[B, ...] arrays split over the devices;
            B must be a multiple of p.
        step: ``step(params, opt_state, x, y) -> (params, opt_state, loss)``, compiled; its
            ``.lower`` works, so :func:`clusterlab.collectives.compiled_collectives` can read it.
        gather: ``gather(params) -> params``: one copy of the parameters.
        loss_value: ``loss_value(loss) -> f32[]``: the step's loss as one scalar.
        gradients: ``gradients(params, x, y) -> grads``, with ``params`` as ``init`` lays them
            out and ``x, y`` as ``place_batch`` does: the gradient each device hands its
            optimizer in ``step`` (after the all-reduce, computed by the same code), as NumPy
            arrays with one row per device, each leaf f32[p, ...].
    """

    form: str
    n_devices: int
    init: Callable
    place_batch: Callable
    step: Callable
    gather: Callable
    loss_value: Callable
    gradients: Callable


def check_batch(batch_size: int, n_devices: int) -> None:
    """Raise a ValueError unless a global batch splits evenly over the data-parallel devices.

    Args:
        batch_size: B, examples in the global batch.
        n_devices: p, devices along the data-parallel axis.
    """
    if batch_size % n_devices:
        fits = [d for d in range(1, n_devices + 1) if batch_size % d == 0]
        raise ValueError(
            f"The global batch of {batch_size} examples does not split evenly over {n_devices} "
            f"data-parallel devices: each device needs batch/devices whole examples. Use a batch "
            f"that is a multiple of {n_devices} (e.g. {(batch_size // n_devices + 1) * n_devices})"
            f", or a device count that divides {batch_size} (e.g. {fits[-1]}).")


def check_reduce(reduce: str) -> None:
    """Raise a ValueError unless ``reduce`` names a gradient reduction, "mean" or "sum"."""
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be 'mean' (the gradient of the global batch's mean loss, "
                         f"for a loss_fn that is a mean over its batch) or 'sum' (for a loss_fn "
                         f"already divided by the global batch size); got {reduce!r}.")


def _update(optimizer: optax.GradientTransformation, params, opt_state, grads):
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def _local_gradients(loss_fn: LossFn, axis_name: str, *, bucket_bytes: int | None = None,
                     sync_gradients: bool = True, reduce: str = "mean") -> Callable:
    """The per-device gradient of the pmap and shard_map forms: ``(params, x, y) -> (loss, grads)``.

    The step and :attr:`DataParallel.gradients` both call it, so checking the gradients checks
    the step's own reduction.
    """
    def gradients(params, x, y):
        # params: replicated; x: f32[B/p, ...], y: f32[B/p, ...] this device's slice.
        # pcast: each device differentiates its own copy, so the gradient stays its local
        # batch's (varying over axis_name) until the explicit all-reduce below. Without it,
        # check_vma's transpose of the implicit copy of a replicated parameter would insert a
        # psum by itself: a sum over devices, p times the gradient of the mean loss.
        local = jax.lax.pcast(params, axis_name, to="varying")
        loss, grads = jax.value_and_grad(loss_fn)(local, x, y)  # grads of the local mean
        if sync_gradients:
            grads = collectives.all_reduce_gradients(grads, axis_name, bucket_bytes=bucket_bytes,
                                                     mean=reduce == "mean")
        return jax.lax.pmean(loss, axis_name), grads  # the global batch's loss, for reporting
    return gradients


def _local_step(loss_fn: LossFn, optimizer: optax.GradientTransformation, axis_name: str,
                **gradient_options) -> Callable:
    """The per-device step of the pmap and shard_map forms."""
    gradients = _local_gradients(loss_fn, axis_name, **gradient_options)

    def step(params, opt_state, x, y):
        loss, grads = gradients(params, x, y)
        params, opt_state = _update(optimizer, params, opt_state, grads)
        return params, opt_state, loss
    return step


def _device_rows(tree) -> object:
    """Each device's copy of replicated arrays, read from their shards: leaves f32[p, ...]."""
    return jax.tree.map(
        lambda leaf: np.stack([np.asarray(s.data) for s in leaf.addressable_shards]), tree)


def pmap_data_parallel(loss_fn: LossFn, optimizer: optax.GradientTransformation, mesh: Mesh, *,
                       axis_name: str, bucket_bytes: int | None = None,
                       reduce: str = "mean") -> DataParallel:
    """Data parallelism with ``jax.pmap``: per-device code, ``pmean`` of the gradients.

    Parameters and optimizer state carry a leading device axis (one copy per device), the batch
    is reshaped to f32[p, B/p, ...].

    Args:
        loss_fn: ``loss_fn(params, x, y) -> f32[]``, a mean over the batch.
        optimizer: an ``optax`` gradient transformation.
        mesh: a 1-D mesh whose devices ``pmap`` runs on.
        axis_name: the mesh's axis, the name ``pmean`` reduces over.
        bucket_bytes: bucket the gradient all-reduce (see
            :func:`clusterlab.collectives.all_reduce_gradients`).
        reduce: as in :func:`shard_map_data_parallel`.

    Returns:
        The :class:`DataParallel` of the pmap form.
    """
    p = _axis_size(mesh, axis_name)
    check_reduce(reduce)
    if mesh.devices.ndim != 1:
        raise ValueError(f"The pmap form runs over one axis; got a mesh of shape "
                         f"{dict(mesh.shape)}. Use a 1-D mesh, or the shard_map or jit form.")
    devices = list(mesh.devices.flat)
    stacked = NamedSharding(mesh, P(axis_name))  # a leading axis of p, one slice per device
    options = dict(bucket_bytes=bucket_bytes, reduce=reduce)
    step = jax.pmap(_local_step(loss_fn, optimizer, axis_name, **options),
                    axis_name=axis_name, devices=devices)
    local_gradients = _local_gradients(loss_fn, axis_name, **options)
    per_device_gradients = jax.pmap(lambda params, x, y: local_gradients(params, x, y)[1],
                                    axis_name=axis_name, devices=devices)

    def put_stacked(a: jax.Array) -> jax.Array:
        return jax.device_put(a, stacked)

    def init(params):
        opt_state = optimizer.init(params)
        copies = jax.tree.map(lambda a: jnp.broadcast_to(a, (p, *jnp.shape(a))),
                              (params, opt_state))  # each leaf: [p, ...], one copy per device
        return jax.tree.map(put_stacked, copies)

    def place_batch(x, y):
        check_batch(x.shape[0], p)
        # x: f32[B, ...] -> f32[p, B/p, ...]
        return tuple(put_stacked(a.reshape(p, a.shape[0] // p, *a.shape[1:])) for a in (x, y))

    return DataParallel("pmap", p, init, place_batch, step,
                        gather=lambda params: jax.tree.map(lambda a: a[0], params),
                        loss_value=lambda loss: loss[0],
                        gradients=lambda params, x, y: jax.tree.map(
                            np.asarray, per_device_gradients(params, x, y)))


def shard_map_data_parallel(loss_fn: LossFn, optimizer: optax.GradientTransformation,
                            mesh: Mesh, *, axis_name: str, bucket_bytes: int | None = None,
                            combine_all_reduces: bool = True,
                            sync_gradients: bool = True, reduce: str = "mean") -> DataParallel:
    """Data parallelism with ``jax.shard_map``: the gradient all-reduce written out.

    Args:
        loss_fn: ``loss_fn(params, x, y) -> f32[]``, a mean over the batch.
        optimizer: an ``optax`` gradient transformation.
        mesh: the device mesh; parameters are replicated over all of it.
        axis_name: the data-parallel axis; the batch is split over it.
        bucket_bytes: None for one all-reduce per gradient leaf, or the bucket size in bytes
            (see :func:`clusterlab.collectives.all_reduce_gradients`).
        combine_all_reduces: let XLA merge independent all-reduces (its default). False
            compiles with :data:`clusterlab.collectives.SEPARATE_ALL_REDUCES`, so the program
            keeps one all-reduce per bucket (or per leaf).
        sync_gradients: False leaves the gradient all-reduce out: each device then updates
            with its own gradients and the replicas drift apart. Only for timing the step
            without its communication, and as the negative control of a check against one
            device.
        reduce: ``"mean"`` averages the devices' gradients (``pmean``), right for a ``loss_fn``
            that is a mean over its batch slice; ``"sum"`` adds them (``psum``), right only for a
            loss already divided by the global batch size: with a mean loss it applies ``p``
            times the gradient (the bug that a check of the gradients catches and a check of
            Adam's parameters barely sees).

    Returns:
        The :class:`DataParallel` of the shard_map form.
    """
    p = _axis_size(mesh, axis_name)
    check_reduce(reduce)
    replicated = NamedSharding(mesh, P())
    batch_sharding = NamedSharding(mesh, P(axis_name))
    options = dict(bucket_bytes=bucket_bytes, sync_gradients=sync_gradients, reduce=reduce)
    # check_vma=True proves that the parameters returned as replicated (out_specs P()) are the
    # same on every device. Without the all-reduce they are not, and JAX would reject the step
    # at trace time; the sync_gradients=False variant exists to time the step without its
    # communication (and to show a check catching the drift), so only it runs unchecked.
    per_device = jax.shard_map(
        _local_step(loss_fn, optimizer, axis_name, **options),
        mesh=mesh, in_specs=(P(), P(), P(axis_name), P(axis_name)), out_specs=(P(), P(), P()),
        check_vma=sync_gradients)
    compiler_options = None if combine_all_reduces else collectives.SEPARATE_ALL_REDUCES
    step = jax.jit(per_device, compiler_options=compiler_options)
    local_gradients = _local_gradients(loss_fn, axis_name, **options)
    # one row per device (out_specs P(axis)): replicated or not, every device's copy comes back
    per_device_gradients = jax.jit(jax.shard_map(
        lambda params, x, y: jax.tree.map(lambda g: g[None], local_gradients(params, x, y)[1]),
        mesh=mesh, in_specs=(P(), P(axis_name), P(axis_name)), out_specs=P(axis_name)),
        compiler_options=compiler_options)

    def init(params):
        return jax.device_put((params, optimizer.init(params)), replicated)

    def place_batch(x, y):
        check_batch(x.shape[0], p)
        return jax.device_put((x, y), batch_sharding)  # each device: f32[B/p, ...]

    return DataParallel("shard_map", p, init, place_batch, step, gather=lambda params: params,
                        loss_value=lambda loss: loss,
                        gradients=lambda params, x, y: jax.tree.map(
                            np.asarray, per_device_gradients(params, x, y)))


def jit_data_parallel(loss_fn: LossFn, optimizer: optax.GradientTransformation, mesh: Mesh, *,
                      axis_name: str, combine_all_reduces: bool = True) -> DataParallel:
    """Data parallelism left to the compiler: ``jax.jit`` of the single-device step.

    The batch is sharded over ``axis_name`` and the parameters replicated; XLA's SPMD
    partitioner sees that the gradient of a replicated parameter sums over the sharded batch
    and inserts the all-reduce.

    Args:
        loss_fn: ``loss_fn(params, x, y) -> f32[]``, a mean over the batch.
        optimizer: an ``optax`` gradient transformation.
        mesh: the device mesh.
        axis_name: the data-parallel axis; the batch is split over it.
        combine_all_reduces: as in :func:`shard_map_data_parallel`.

    Returns:
        The :class:`DataParallel` of the jit form.
    """
    p = _axis_size(mesh, axis_name)
    replicated = NamedSharding(mesh, P())
    batch_sharding = NamedSharding(mesh, P(axis_name))

    def global_step(params, opt_state, x, y):
        # x: f32[B, ...], sharded over axis_name; the code is the single-device step
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        params, opt_state = _update(optimizer, params, opt_state, grads)
        return params, opt_state, loss

    options = None if combine_all_reduces else collectives.SEPARATE_ALL_REDUCES
    step = jax.jit(global_step, in_shardings=(replicated, replicated, batch_sharding,
                                              batch_sharding),
                   out_shardings=(replicated, replicated, replicated), compiler_options=options)
    # the same gradient the step computes, laid out as the step lays it out (replicated)
    global_gradients = jax.jit(jax.grad(loss_fn), in_shardings=(replicated, batch_sharding,
                                                                batch_sharding),
                               out_shardings=replicated, compiler_options=options)

    def init(params):
        return jax.device_put((params, optimizer.init(params)), replicated)

    def place_batch(x, y):
        check_batch(x.shape[0], p)
        return jax.device_put((x, y), batch_sharding)

    return DataParallel("jit", p, init, place_batch, step, gather=lambda params: params,
                        loss_value=lambda loss: loss,
                        gradients=lambda params, x, y: _device_rows(
                            global_gradients(params, x, y)))


def make_data_parallel(form: str, loss_fn: LossFn, optimizer: optax.GradientTransformation,
                       mesh: Mesh, *, axis_name: str, **options) -> DataParallel:
    """One of the three forms by name; ``options`` go to its maker.

    Args:
        form: ``"pmap"``, ``"shard_map"`` or ``"jit"``.
        loss_fn, optimizer, mesh, axis_name: as in the makers.
        **options: e.g. ``bucket_bytes``, ``combine_all_reduces`` or ``reduce``.
    """
    makers = {"pmap": pmap_data_parallel, "shard_map": shard_map_data_parallel,
              "jit": jit_data_parallel}
    if form not in makers:
        raise ValueError(f"Unknown data-parallel form {form!r}; choose one of {', '.join(FORMS)}.")
    return makers[form](loss_fn, optimizer, mesh, axis_name=axis_name, **options)


def make_gradient_all_reduce(mesh: Mesh, *, axis_name: str, bucket_bytes: int | None = None,
                             combine_all_reduces: bool = True) -> Callable:
    """The gradient all-reduce of a data-parallel step on its own, to time it apart from compute.

    Args:
        mesh: the device mesh.
        axis_name: the data-parallel axis.
        bucket_bytes: as in :func:`clusterlab.collectives.all_reduce_gradients`.
        combine_all_reduces: as in :func:`shard_map_data_parallel`.

    Returns:
        A jitted ``fn(grads) -> grads``: every device holds a whole gradient pytree (replicated
        placement, ``P()``) and gets the mean over ``axis_name``, in one all-reduce per bucket
        (or per leaf, or combined by XLA).
    """
    _axis_size(mesh, axis_name)

    def mean_of_copies(grads):
        # the replicated input stands for p different per-device gradients: pcast types it so
        grads = jax.lax.pcast(grads, axis_name, to="varying")
        return collectives.all_reduce_gradients(grads, axis_name, bucket_bytes=bucket_bytes)

    fn = jax.shard_map(mean_of_copies, mesh=mesh, in_specs=P(), out_specs=P())
    return jax.jit(fn, compiler_options=None if combine_all_reduces
                   else collectives.SEPARATE_ALL_REDUCES)


def train(dp: DataParallel, params, batches: Iterable[tuple[jax.Array, jax.Array]]):
    """Train with a data-parallel step, as :func:`clusterlab.models.reference_train` does.

    Args:
        dp: from one of the makers.
        params: initial parameters (one copy).
        batches: ``(x, y)`` global batches, one per step; each batch size a multiple of p.

    Returns:
        ``(params, losses)``: one copy of the trained parameters and the global batch's loss
        before each update, a NumPy f32[n_steps] on the host.
    """
    params, opt_state = dp.init(params)
    params, _, losses = models.run_steps(dp.step, params, opt_state, batches,
                                         place=dp.place_batch, loss_value=dp.loss_value)
    return dp.gather(params), losses


def gradient_bytes(params) -> int:
    """Bytes of one full gradient of ``params``: what data parallelism all-reduces per step."""
    return models.param_bytes(params)
