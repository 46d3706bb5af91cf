"""Collectives: JAX's built-in ones, and the classic algorithms built by hand from ``ppermute``.

Every function whose first argument is a per-device block runs *inside* ``jax.shard_map`` and
takes the mesh axis it communicates over as ``axis_name``. Shapes are per device; ``p`` is the
size of that axis. The hand-built versions return the same values as the built-ins (up to
floating-point summation order) so that labs can check them, time them and compare both with
:mod:`clusterlab.analytic.costmodel`. Reading which collectives a compiled program holds is
:mod:`clusterlab.device.hlo`'s job.

References:
    Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in
    MPICH", IJHPCA 2005 (ring, recursive doubling and halving).
    Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
    JPDC 2009 (the ring all-reduce).
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from clusterlab.analytic.costmodel.alpha_beta import RUNNABLE_OPS



def _shift_by_one(n_devices: int) -> list[tuple[int, int]]:
    return [(i, (i + 1) % n_devices) for i in range(n_devices)]


def _check_splits(x: jax.Array, n_devices: int, what: str) -> None:
    if x.shape[0] % n_devices:
        raise ValueError(f"{what} splits the leading dimension into {n_devices} chunks, one per device, "
                         f"but it has size {x.shape[0]}; make it a multiple of {n_devices}.")


def ring_reduce_scatter(x: jax.Array, axis_name: str) -> jax.Array:
    """Ring reduce-scatter: p-1 steps, each device sends (p-1)/p of its buffer in all.

    Forward: device ``i`` ends with chunk ``i`` of the sum over devices. Its gradient is a
    ring all-gather. The steps run in a ``jax.lax.fori_loop``: one ``collective-permute`` in the
    compiled program, executed p-1 times (:func:`clusterlab.device.hlo.executed_collectives` counts
    them), and one partial-sum buffer of N/p elements reused by every step instead of a new one per
    step.

    Args:
        x: f32[N, ...] per device, N a multiple of p.
        axis_name: the mesh axis to reduce over.

    Returns:
        f32[N/p, ...]: the reduced chunk this device owns, equal to
        ``jax.lax.psum_scatter(x, axis_name, tiled=True)``.
    """
    p = jax.lax.axis_size(axis_name)
    if p == 1:
        return x
    _check_splits(x, p, "ring_reduce_scatter")
    chunks = x.reshape(p, x.shape[0] // p, *x.shape[1:])  # chunks: f32[p, N/p, ...]
    me = jax.lax.axis_index(axis_name)

    def own_chunk(index):  # f32[N/p, ...], this device's chunk number index (mod p)
        return jax.lax.dynamic_index_in_dim(chunks, index % p, axis=0, keepdims=False)

    def step(s, partial):
        # partial: f32[N/p, ...], the sum of chunk i-s over devices i-s+1 .. i-1, sent on to
        # the right; the one received from the left is chunk i-1-s, to which this device adds
        # its own share.
        return jax.lax.ppermute(partial, axis_name, _shift_by_one(p)) + own_chunk(me - 1 - s)

    # Start with chunk i-1; after p-1 steps each device holds the complete sum of chunk i.
    return jax.lax.fori_loop(1, p, step, own_chunk(me - 1))


def ring_all_gather(x: jax.Array, axis_name: str) -> jax.Array:
    """Ring all-gather: p-1 steps, each passing one block to the next device.

    Each received block is written once, in place, at its position in the output
    (``dynamic_update_slice`` in a ``jax.lax.fori_loop``): no per-step copy of the whole buffer
    and no final reordering.

    Args:
        x: f32[B, ...], this device's block.
        axis_name: the mesh axis to gather over.

    Returns:
        f32[p*B, ...] with device j's block at position j, equal to
        ``jax.lax.all_gather(x, axis_name, tiled=True)``.
    """
    p = jax.lax.axis_size(axis_name)
    if p == 1:
        return x
    me = jax.lax.axis_index(axis_name)
    # gathered: f32[p, B, ...]; every slot starts as this device's block, which is right for
    # slot i, and the other p-1 slots are overwritten by the blocks received.
    gathered = jnp.broadcast_to(x, (p, *x.shape))

    def step(s, carry):
        block, gathered = carry
        block = jax.lax.ppermute(block, axis_name, _shift_by_one(p))  # now device i-s's block
        return block, jax.lax.dynamic_update_index_in_dim(gathered, block, (me - s) % p, axis=0)

    _, gathered = jax.lax.fori_loop(1, p, step, (x, gathered))
    return gathered.reshape(p * x.shape[0], *x.shape[1:])


def ring_all_reduce(x: jax.Array, axis_name: str) -> jax.Array:
    """Ring all-reduce: a ring reduce-scatter then a ring all-gather, 2(p-1) steps.

    Each device sends 2(p-1)/p of its buffer, the least any all-reduce can send, so it is
    bandwidth-optimal; its 2(p-1) latency steps make it slow for small messages.

    Args:
        x: f32[N, ...] per device, N a multiple of p.
        axis_name: the mesh axis to reduce over.

    Returns:
        f32[N, ...], the sum over devices, equal to ``jax.lax.psum(x, axis_name)``.
    """
    return ring_all_gather(ring_reduce_scatter(x, axis_name), axis_name)


def ring_permutes_only(x: jax.Array, axis_name: str) -> jax.Array:
    """The 2(p-1) messages of :func:`ring_all_reduce` and nothing else: its communication alone.

    A control for timing the ring: the same ``ppermute`` steps on a chunk of N/p rows, in the
    same loop, without the additions and without assembling the output. Whatever the ring costs
    beyond this is its local work. The result is not an all-reduce.

    Args:
        x: f32[N, ...] per device, N a multiple of p.
        axis_name: the mesh axis.

    Returns:
        f32[N/p, ...]: the first chunk of device ``i - 2(p-1) mod p``, after 2(p-1) steps.
    """
    p = jax.lax.axis_size(axis_name)
    if p == 1:
        return x
    _check_splits(x, p, "ring_permutes_only")
    chunk = x[: x.shape[0] // p]  # chunk: f32[N/p, ...]

    def step(_, chunk):
        return jax.lax.ppermute(chunk, axis_name, _shift_by_one(p))

    return jax.lax.fori_loop(0, 2 * (p - 1), step, chunk)


def recursive_doubling_all_reduce(x: jax.Array, axis_name: str) -> jax.Array:
    """Recursive-doubling all-reduce: log2(p) rounds, each exchanging the whole buffer.

    In round k device i swaps buffers with device ``i XOR 2**k`` and adds. Few steps make it the
    algorithm of choice for small, latency-bound messages; sending log2(p) full buffers makes it
    lose to the ring for large ones.

    Args:
        x: f32[...] per device; p must be a power of two.
        axis_name: the mesh axis to reduce over.

    Returns:
        The sum over devices, equal to ``jax.lax.psum(x, axis_name)``.
    """
    p = jax.lax.axis_size(axis_name)
    if p & (p - 1):
        raise ValueError(f"recursive_doubling_all_reduce needs a power-of-two axis size, got "
                         f"{p}; use ring_all_reduce for other sizes.")
    distance = 1
    while distance < p:
        partner_of = [(i, i ^ distance) for i in range(p)]
        x = x + jax.lax.ppermute(x, axis_name, partner_of)
        distance *= 2
    return x


def tree_broadcast(x: jax.Array, axis_name: str, *, source: int = 0) -> jax.Array:
    """Binomial-tree broadcast from device ``source``: ceil(log2 p) rounds of ``ppermute``.

    In round k every device that already holds the data (ranks below 2**k, counted from the
    source) sends it 2**k ranks further on, so the number of holders doubles each round.

    Args:
        x: f32[...] per device; only the source's value matters.
        axis_name: the mesh axis.
        source: the device index along the axis that holds the data.

    Returns:
        The source's ``x`` on every device.
    """
    p = jax.lax.axis_size(axis_name)
    rank = (jax.lax.axis_index(axis_name) - source) % p  # rank 0 is the source
    distance = 1
    while distance < p:
        pairs = [((r + source) % p, (r + distance + source) % p)
                 for r in range(distance) if r + distance < p]
        received = jax.lax.ppermute(x, axis_name, pairs)
        x = jnp.where((rank >= distance) & (rank < 2 * distance), received, x)
        distance *= 2
    return x


def builtin(op: str, x: jax.Array, axis_name: str) -> jax.Array:
    """JAX's own collective for ``op`` on a per-device block, shaped as nccl-tests counts it.

    Broadcast is the exception: XLA has no broadcast collective on every platform, so it runs
    as :func:`tree_broadcast`.

    Args:
        op: one of :data:`clusterlab.analytic.costmodel.RUNNABLE_OPS`.
        x: the per-device input: the full buffer for all-reduce, reduce-scatter, all-to-all,
            broadcast and send/recv; one p-th of it for all-gather.
        axis_name: the mesh axis.
    """
    if op == "all_reduce":
        return jax.lax.psum(x, axis_name)
    if op == "all_gather":
        return jax.lax.all_gather(x, axis_name, tiled=True)
    if op == "reduce_scatter":
        return jax.lax.psum_scatter(x, axis_name, scatter_dimension=0, tiled=True)
    if op == "all_to_all":
        return jax.lax.all_to_all(x, axis_name, split_axis=0, concat_axis=0, tiled=True)
    if op == "broadcast":  # XLA:CPU lowers no broadcast collective; a binomial tree stands in
        return tree_broadcast(x, axis_name)
    if op == "send_recv":
        return jax.lax.ppermute(x, axis_name, _shift_by_one(jax.lax.axis_size(axis_name)))
    raise ValueError(f"Unknown collective {op!r}. Runnable collectives: {', '.join(RUNNABLE_OPS)}.")


_HAND_BUILT: dict[tuple[str, str], Callable[[jax.Array, str], jax.Array]] = {
    ("all_reduce", "ring"): ring_all_reduce,
    ("all_reduce", "recursive_doubling"): recursive_doubling_all_reduce,
    ("all_gather", "ring"): ring_all_gather,
    ("reduce_scatter", "ring"): ring_reduce_scatter,
}


def per_device_elements(op: str, nbytes: int, n_devices: int, itemsize: int) -> int:
    """Elements of the per-device input that make a collective of ``nbytes`` (nccl-tests' size).

    Raises:
        ValueError: when the size is not a whole number of elements per device.
    """
    if nbytes <= 0:
        raise ValueError(f"Message size must be positive, got {nbytes} bytes.")
    unit = itemsize * n_devices if op in ("all_gather", "reduce_scatter", "all_to_all") else itemsize
    if nbytes % unit:
        raise ValueError(f"{op} of {nbytes} bytes on {n_devices} devices needs a multiple of {unit} "
                         f"bytes ({itemsize}-byte elements, split {n_devices} ways where the op splits).")
    return nbytes // itemsize // n_devices if op == "all_gather" else nbytes // itemsize


def make_collective(op: str, mesh: Mesh, axis_name: str, *,
                    implementation: str = "builtin") -> Callable[[jax.Array], jax.Array]:
    """A jitted function running one collective over ``axis_name`` of ``mesh``.

    The function takes the *global* input, shaped ``[p * per_device_elements]`` and sharded
    over the axis, and returns the global output.

    Args:
        op: one of :data:`clusterlab.analytic.costmodel.RUNNABLE_OPS`.
        mesh: the device mesh.
        axis_name: the axis to communicate over (a 1-D mesh's only axis, usually).
        implementation: ``"builtin"`` (JAX's), ``"ring"`` or ``"recursive_doubling"``.
    """
    if op not in RUNNABLE_OPS:
        raise ValueError(f"Unknown collective {op!r}. Runnable collectives: "
                         f"{', '.join(RUNNABLE_OPS)}.")
    if axis_name not in mesh.shape:
        raise ValueError(f"Mesh axis {axis_name!r} is not in the mesh; its axes are "
                         f"{tuple(mesh.axis_names)}.")
    if implementation == "builtin":
        def body(x):
            return builtin(op, x, axis_name)
    elif (op, implementation) in _HAND_BUILT:
        body = functools.partial(_HAND_BUILT[(op, implementation)], axis_name=axis_name)
    else:
        known = [impl for (o, impl) in _HAND_BUILT if o == op]
        raise ValueError(f"No {implementation!r} implementation of {op}. Available: "
                         f"{', '.join(['builtin', *known])}.")
    # all_reduce, broadcast: every device ends with the same full buffer, but shard_map cannot
    # know that of a hand-built ring, so outputs stay per-device (concatenated) for all ops.
    spec = P(axis_name)
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec,
                                 check_vma=False))


# --- Tensor-parallel pairs (Megatron's f and g) ------------------------------------------------
# Megatron-LM names two conjugate operators, and so do these wrappers. Inside the default
# ``jax.shard_map(..., check_vma=True)`` JAX tracks which values vary over a mesh axis and which
# are replicated, and its own transposes are exactly Megatron's pair: ``pcast(x, to="varying")``
# (a copy: the replicated value becomes a per-device one) transposes to a ``psum`` of the
# cotangents, and ``psum`` (per-device partial sums become one replicated value) transposes to
# that copy. So f and g are those two primitives, with no custom_vjp.
#
# With ``check_vma=False`` JAX does not know what is replicated: ``psum`` then transposes to
# another ``psum`` (gradients ``p`` times too large) and the copy transposes to nothing (the
# gradient of ``x`` stays partial). Steps that must keep the check off (the 2-D step of
# :mod:`clusterlab.device.parallel.sharded`, whose data-axis all-reduce is explicit) still get the
# right pair from these wrappers: they detect the mode and then use the custom_vjp versions below,
# whose backward is written out.


def tracks_replication(axis_name: str) -> bool:
    """Whether JAX tracks replication over ``axis_name`` here (``shard_map``'s ``check_vma``).

    Inside ``jax.shard_map(..., check_vma=True)`` the device index varies over the axis; with
    ``check_vma=False`` every value is typed as replicated, the index too.
    """
    index = jax.lax.axis_index(axis_name)
    return axis_name in jax.typeof(index).manual_axis_type.varying


def _varies_over(x: jax.Array, axis_name: str) -> bool:
    return axis_name in jax.typeof(x).manual_axis_type.varying


def copy_to_model_parallel(x: jax.Array, axis_name: str) -> jax.Array:
    """Megatron's ``f``: identity forward, all-reduce (``psum``) of the gradient backward.

    Put it where a replicated activation enters a column-parallel layer: each device uses the
    whole ``x`` with its own columns of the weight, so the gradient of ``x`` is the sum of the
    devices' partial gradients. With ``check_vma=True`` (shard_map's default) it is
    ``jax.lax.pcast(x, axis_name, to="varying")``, whose transpose JAX defines as that ``psum``
    (JAX would also insert it by itself where ``x`` meets a device-varying weight); with
    ``check_vma=False`` a custom_vjp with the same backward. With an axis of size 1 it does
    nothing.

    Args:
        x: f32[...], the same on every device of the axis.
        axis_name: the tensor-parallel mesh axis.

    Returns:
        ``x`` unchanged, typed as varying over the axis.

    Raises:
        ValueError: when ``x`` already varies over the axis: it is not a replicated activation.

    References:
        Shoeybi et al., "Megatron-LM", 2019, Section 3 and Figure 3 (the operators f and g).
        https://arxiv.org/abs/1909.08053
    """
    if jax.lax.axis_size(axis_name) == 1:
        return x
    if not tracks_replication(axis_name):
        return _copy_unchecked(x, axis_name)
    if _varies_over(x, axis_name):
        raise ValueError(f"copy_to_model_parallel (Megatron's f) takes an activation replicated "
                         f"over {axis_name!r}, but this one already varies over it. Apply f to "
                         f"the block's replicated input, before the column-parallel weight.")
    return jax.lax.pcast(x, axis_name, to="varying")  # backward: psum of the partial gradients


def reduce_from_model_parallel(x: jax.Array, axis_name: str) -> jax.Array:
    """Megatron's ``g``: all-reduce (``psum``) forward, identity backward.

    Put it after a row-parallel layer: each device holds a partial sum of the output (its rows
    of the weight times its slice of the hidden activation); the all-reduce completes it on
    every device. The output is replicated, so its gradient is already whole on every device
    and passes back unchanged: with ``check_vma=True`` that is JAX's own transpose of ``psum``;
    with ``check_vma=False`` a custom_vjp says so. With an axis of size 1 it does nothing (its
    output then keeps a per-device type, so a one-device step runs with ``check_vma=False``).

    Args:
        x: f32[...], this device's partial sum.
        axis_name: the tensor-parallel mesh axis.

    Returns:
        f32[...], the sum over the axis, the same on every device.

    References:
        Shoeybi et al., "Megatron-LM", 2019, Section 3 and Figure 3.
        https://arxiv.org/abs/1909.08053
    """
    if jax.lax.axis_size(axis_name) == 1:
        return x
    if not tracks_replication(axis_name):
        return _reduce_unchecked(x, axis_name)
    return jax.lax.psum(x, axis_name)  # backward: the cotangent, copied to every device


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _copy_unchecked(x: jax.Array, axis_name: str) -> jax.Array:
    return x  # f without replication tracking: identity forward, psum backward (below)


def _copy_fwd(x, axis_name):
    return x, None


def _copy_bwd(axis_name, _, grad):
    return (jax.lax.psum(grad, axis_name),)  # grad: f32[...], partial on each device -> summed


_copy_unchecked.defvjp(_copy_fwd, _copy_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _reduce_unchecked(x: jax.Array, axis_name: str) -> jax.Array:
    return jax.lax.psum(x, axis_name)  # g without replication tracking: identity backward


def _reduce_fwd(x, axis_name):
    return _reduce_unchecked(x, axis_name), None


def _reduce_bwd(axis_name, _, grad):
    return (grad,)


_reduce_unchecked.defvjp(_reduce_fwd, _reduce_bwd)


# --- Gradient all-reduce: the one collective of data parallelism ---------------------------------

def all_reduce_gradients(grads, axis_name: str, *, bucket_bytes: int | None = None,
                         mean: bool = True):
    """Average a gradient pytree over the data-parallel axis: the all-reduce of data parallelism.

    Forward: every device's gradients are replaced by their mean over ``axis_name``
    (``psum / p``), so every replica applies the same update. Backward: none in a training step
    (it acts on gradients, after the backward pass); were it differentiated, JAX transposes the
    mean of device-varying values to a copy, with no communication. With ``bucket_bytes``, the
    leaves are flattened, concatenated and cut into buckets of that many bytes, one all-reduce
    each (the last bucket holds the rest), as PyTorch DDP and Horovod pack small tensors into
    larger messages; XLA's all-reduce combiner merges independent all-reduces on its own unless
    it is turned off (see :data:`clusterlab.device.hlo.SEPARATE_ALL_REDUCES`). Skips all work when
    the axis has size 1.

    Runs inside ``jax.shard_map`` or ``jax.pmap``.

    Args:
        grads: a pytree of arrays, per device (the gradient of this device's batch shard).
        axis_name: the data-parallel axis.
        bucket_bytes: None for one all-reduce per leaf (left to XLA to combine), or the bucket
            size in bytes, a multiple of the gradients' item size; all leaves share one dtype.
        mean: divide the sum by p (``pmean``); False keeps the sum (``psum``), right only for a
            loss already divided by the global batch size, as in :func:`reduce_scatter_gradients`.

    Returns:
        The pytree of means (or sums), the same structure and shapes as ``grads``.

    References:
        Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training",
        VLDB 2020 (gradient bucketing). https://arxiv.org/abs/2006.15704
        Sergeev & Del Balso, "Horovod: fast and easy distributed deep learning in TensorFlow",
        2018 (tensor fusion). https://arxiv.org/abs/1802.05799
    """
    p = jax.lax.axis_size(axis_name)
    if p == 1:
        return grads
    reduce = jax.lax.pmean if mean else jax.lax.psum
    if bucket_bytes is None:
        return jax.tree.map(lambda g: reduce(g, axis_name), grads)
    leaves, treedef = jax.tree.flatten(grads)
    dtypes = {leaf.dtype for leaf in leaves}
    if len(dtypes) != 1:
        raise ValueError(f"Bucketing concatenates the gradients, so they must share one dtype; "
                         f"got {sorted(str(d) for d in dtypes)}. Cast them first.")
    itemsize = leaves[0].dtype.itemsize
    if (isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int)
            or bucket_bytes < itemsize or bucket_bytes % itemsize):
        raise ValueError(f"bucket_bytes must be a positive multiple of the gradients' item size "
                         f"({itemsize} bytes), got {bucket_bytes!r}.")
    flat = jnp.concatenate([leaf.ravel() for leaf in leaves])  # flat: f32[N], every gradient
    per_bucket = bucket_bytes // itemsize
    buckets = [reduce(flat[start:start + per_bucket], axis_name)  # f32[<= bucket]
               for start in range(0, flat.shape[0], per_bucket)]
    flat = jnp.concatenate(buckets)
    out, start = [], 0
    for leaf in leaves:
        out.append(flat[start:start + leaf.size].reshape(leaf.shape))
        start += leaf.size
    return jax.tree.unflatten(treedef, out)


def hierarchical_all_reduce(x: jax.Array, *, intra_axis: str, inter_axis: str) -> jax.Array:
    """Two-level all-reduce: reduce-scatter inside a host, all-reduce across, all-gather inside.

    Only ``1/d`` of the buffer crosses the slow inter-host links (``d`` devices per host), each
    device sending its share over its own network card; the fast links inside the host carry
    the rest. :func:`clusterlab.analytic.costmodel.hierarchical_all_reduce_time` is its cost.
    Forward: the sum over both axes; its gradient is the same all-reduce.

    Args:
        x: f32[N, ...] per device, N a multiple of the size of ``intra_axis``.
        intra_axis: the mesh axis inside a host (devices of one process).
        inter_axis: the mesh axis across hosts (processes).

    Returns:
        f32[N, ...]: the sum over both axes, equal to ``jax.lax.psum(x, (inter_axis, intra_axis))``.

    References:
        Jeaugey, "Massively Scale Your Deep Learning Training with NCCL 2.4", NVIDIA blog, 2019.
    """
    d = jax.lax.axis_size(intra_axis)
    if d == 1:
        return jax.lax.psum(x, inter_axis)
    _check_splits(x, d, "hierarchical_all_reduce")
    share = jax.lax.psum_scatter(x, intra_axis, scatter_dimension=0, tiled=True)  # f32[N/d, ...]
    share = jax.lax.psum(share, inter_axis)  # the same share summed over hosts
    return jax.lax.all_gather(share, intra_axis, tiled=True)  # f32[N, ...]


# --- Sharded data parallelism (ZeRO / FSDP): gather parameters, scatter gradients ---------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def gather_params(shard: jax.Array, axis_name: str, axis: int = 0) -> jax.Array:
    """ZeRO-3/FSDP's parameter gather: all-gather forward, reduce-scatter (a sum) backward.

    Each device stores ``1/p`` of a parameter; just before a layer runs, the shards are gathered
    into the whole parameter. Every device then uses the whole parameter on its own batch slice,
    so the gradient of its shard is the *sum* over devices of the corresponding slice of their
    gradients: a reduce-scatter, the transpose of the all-gather. Divide by ``p`` afterwards for
    the mean over the data-parallel devices. With an axis of size 1 it does nothing. Works with
    ``check_vma`` on or off: the backward is written out, and is the same reduce-scatter that
    JAX derives for ``jax.lax.all_gather`` (Varying -> Varying) when ``check_vma=True``.

    Args:
        shard: f32[..., N/p, ...], this device's shard, split along ``axis``.
        axis_name: the data-parallel mesh axis the parameters are sharded over.
        axis: the array axis the shards are concatenated along.

    Returns:
        f32[..., N, ...], the whole parameter, device ``j``'s shard at position ``j``.

    References:
        Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
        Models", SC 2020, Section 5.3 (partitioning the parameters).
        https://arxiv.org/abs/1910.02054
        Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel", VLDB
        2023. https://arxiv.org/abs/2304.11277
    """
    if jax.lax.axis_size(axis_name) == 1:
        return shard
    return jax.lax.all_gather(shard, axis_name, axis=axis, tiled=True)


def _gather_params_fwd(shard, axis_name, axis):
    return gather_params(shard, axis_name, axis), None


def _gather_params_bwd(axis_name, axis, _, grad):
    # grad: f32[..., N, ...], this device's gradient of the whole parameter -> its shard, summed
    return (reduce_scatter_gradients(grad, axis_name, axis=axis, mean=False),)


gather_params.defvjp(_gather_params_fwd, _gather_params_bwd)


def reduce_scatter_gradients(grads: jax.Array, axis_name: str, *, axis: int = 0,
                             mean: bool = True) -> jax.Array:
    """ZeRO-2's gradient reduction: each device keeps the mean (or sum) of its shard only.

    Forward: a reduce-scatter over ``axis_name``: device ``j`` gets slice ``j`` (along ``axis``)
    of the gradients summed over devices, divided by ``p`` when ``mean``. It sends half the bytes
    of the all-reduce of plain data parallelism, and the other half (an all-gather) moves the
    updated parameters instead. Backward: none in a training step (it acts on gradients); as a
    linear map its transpose would be an all-gather. Skips all work when the axis has size 1.

    Args:
        grads: f32[..., N, ...], this device's gradient, N a multiple of p along ``axis``.
        axis_name: the data-parallel axis.
        axis: the array axis to split.
        mean: divide the sum by p (the data-parallel mean).

    Returns:
        f32[..., N/p, ...]: this device's slice of the reduced gradient.

    References:
        Rajbhandari et al., "ZeRO", SC 2020, Sections 5.2 and 7.2.1.
        https://arxiv.org/abs/1910.02054
    """
    p = jax.lax.axis_size(axis_name)
    if p == 1:
        return grads
    if grads.shape[axis] % p:
        raise ValueError(f"reduce_scatter_gradients splits axis {axis} (size {grads.shape[axis]}) "
                         f"into {p} shards; make it a multiple of {p}.")
    summed = jax.lax.psum_scatter(grads, axis_name, scatter_dimension=axis, tiled=True)
    return summed / p if mean else summed


# --- Overlap: one ring step, and where the compiled schedule puts it ---------------------------


def send_to_next(x: jax.Array, axis_name: str) -> jax.Array:
    """One ring step: device ``i`` sends ``x`` to device ``i+1 (mod p)``, receives ``i-1``'s.

    Forward, one ``collective-permute`` of ``x``'s bytes per device. Backward, JAX transposes it
    into the opposite shift (device ``i`` sends the cotangent to ``i-1``), one more
    ``collective-permute`` of the same bytes. On one device it is the identity and sends nothing.

    Args:
        x: any per-device block.
        axis_name: the ring's mesh axis.

    Returns:
        The block of device ``i-1 (mod p)``, of ``x``'s shape.
    """
    p = jax.lax.axis_size(axis_name)
    if p == 1:
        return x
    return jax.lax.ppermute(x, axis_name, _shift_by_one(p))
