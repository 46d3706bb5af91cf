"""Collectives: JAX's built-in ones, and the classic algorithms built by hand from ``ppermute``.

Every function whose first argument is a per-device block runs *inside* ``jax.shard_map`` and
takes the mesh axis it communicates over as ``axis_name``. Shapes are per device; ``p`` is the
size of that axis. The hand-built versions return the same values as the built-ins (up to
floating-point summation order) so that labs can check them, time them and compare both with
:mod:`clusterlab.costmodel`.

References:
    Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in
    MPICH", IJHPCA 2005 (ring, recursive doubling and halving).
    Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
    JPDC 2009 (the ring all-reduce).
"""

from __future__ import annotations

import functools
import re
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

# The ops that can be run on devices: the cost model's list less "reduce", since XLA has no
# reduce-to-one-device collective (its all-reduce does that work and more).
RUNNABLE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                "send_recv")
IMPLEMENTATIONS = ("builtin", "ring", "recursive_doubling")


def _shift_by_one(p: int) -> list[tuple[int, int]]:
    return [(i, (i + 1) % p) for i in range(p)]


def _check_splits(x: jax.Array, p: int, what: str) -> None:
    if x.shape[0] % p:
        raise ValueError(f"{what} splits the leading dimension into {p} chunks, one per device, "
                         f"but it has size {x.shape[0]}; make it a multiple of {p}.")


def ring_reduce_scatter(x: jax.Array, axis_name: str) -> jax.Array:
    """Ring reduce-scatter: p-1 steps, each device sends (p-1)/p of its buffer in all.

    Forward: device ``i`` ends with chunk ``i`` of the sum over devices. Its gradient is a
    ring all-gather.

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

    def own_chunk(index):
        return jax.lax.dynamic_index_in_dim(chunks, index % p, axis=0, keepdims=False)

    # Start with chunk i-1; after step s the partial sum in hand is for chunk i-1-s, so after
    # p-1 steps each device holds the complete sum of its own chunk i.
    partial = own_chunk(me - 1)
    for step in range(1, p):
        partial = jax.lax.ppermute(partial, axis_name, _shift_by_one(p))
        partial = partial + own_chunk(me - 1 - step)
    return partial


def ring_all_gather(x: jax.Array, axis_name: str) -> jax.Array:
    """Ring all-gather: p-1 steps, each passing one block to the next device.

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
    received = [x]  # after step s the block in hand came from device i-s
    for _ in range(1, p):
        received.append(jax.lax.ppermute(received[-1], axis_name, _shift_by_one(p)))
    stacked = jnp.stack(received)  # stacked: f32[p, B, ...], stacked[s] = block of device i-s
    me = jax.lax.axis_index(axis_name)
    # One gather puts block j at position j, instead of p updates of the whole buffer.
    in_device_order = jnp.take(stacked, (me - jnp.arange(p)) % p, axis=0)
    return in_device_order.reshape(p * x.shape[0], *x.shape[1:])


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
        op: one of :data:`RUNNABLE_OPS`.
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


def per_device_elements(op: str, nbytes: int, n: int, itemsize: int) -> int:
    """Elements of the per-device input that make a collective of ``nbytes`` (nccl-tests' size).

    Raises:
        ValueError: when the size is not a whole number of elements per device.
    """
    if nbytes <= 0:
        raise ValueError(f"Message size must be positive, got {nbytes} bytes.")
    unit = itemsize * n if op in ("all_gather", "reduce_scatter", "all_to_all") else itemsize
    if nbytes % unit:
        raise ValueError(f"{op} of {nbytes} bytes on {n} devices needs a multiple of {unit} "
                         f"bytes ({itemsize}-byte elements, split {n} ways where the op splits).")
    return nbytes // itemsize // n if op == "all_gather" else nbytes // itemsize


def make_collective(op: str, mesh: Mesh, axis_name: str, *,
                    implementation: str = "builtin") -> Callable[[jax.Array], jax.Array]:
    """A jitted function running one collective over ``axis_name`` of ``mesh``.

    The function takes the *global* input, shaped ``[p * per_device_elements]`` and sharded
    over the axis, and returns the global output.

    Args:
        op: one of :data:`RUNNABLE_OPS`.
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


_HLO_OPCODE = re.compile(r"(?:^|\s)([a-z][a-z0-9-]*)\(")


def hlo_op_count(jitted: Callable[..., object], *args, op: str = "collective-permute") -> int:
    """How many ``op`` instructions XLA compiled into the program of ``jitted(*args)``.

    Counting the collectives in the compiled program shows what runs, not what the Python code
    suggests: a ring all-reduce over p devices compiles to 2(p-1) ``collective-permute``
    instructions, and ``jit`` over sharded inputs inserts the ``all-reduce`` a sum needs.
    Asynchronous pairs (``op-start``/``op-done``, as on GPUs) count once.

    Args:
        jitted: a ``jax.jit``-wrapped function.
        *args: example arguments (arrays with their shardings) to compile it for.
        op: an XLA opcode, e.g. ``"collective-permute"``, ``"all-reduce"``, ``"all-gather"``.

    Returns:
        The number of instructions with that opcode, across all computations of the program.
    """
    if not hasattr(jitted, "lower"):
        raise TypeError("hlo_op_count needs a jax.jit-wrapped function (it calls .lower); "
                        "wrap yours with jax.jit first.")
    text = jitted.lower(*args).compile().as_text()
    count = 0
    for line in text.splitlines():
        _, equals, right = line.partition(" = ")
        match = _HLO_OPCODE.search(right) if equals else None
        if match and match.group(1) in (op, f"{op}-start"):
            count += 1
    return count
