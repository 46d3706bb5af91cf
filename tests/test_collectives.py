"""Hand-built collectives against JAX's built-ins (and against NumPy), on sub-meshes of the
eight simulated devices, for 1-D and 2-D per-device blocks, float32 and int32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from clusterlab.analytic import costmodel
from clusterlab.device import collectives, hlo
from conftest import sub_mesh

AXIS = "x"
BLOCK_ROWS = 24  # divisible by every device count used here (1, 2, 3, 4, 6, 8)


def _global_input(n: int, block_shape: tuple[int, ...], dtype, seed: int = 0) -> np.ndarray:
    """x: dtype[n * block_shape[0], *block_shape[1:]], device i's block is x[i*B:(i+1)*B]."""
    rng = np.random.default_rng(seed + 97 * n)
    shape = (n * block_shape[0], *block_shape[1:])
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-1000, 1000, size=shape).astype(dtype)


def _blocks(x: np.ndarray, n: int) -> np.ndarray:
    """blocks: [n, B, ...], the per-device blocks of a global input."""
    return x.reshape(n, x.shape[0] // n, *x.shape[1:])


def _expected(op: str, x: np.ndarray, n: int, source: int = 0) -> np.ndarray:
    """The global output of make_collective(op) computed with NumPy (per-device outputs
    concatenated along the leading axis)."""
    blocks = _blocks(x, n)
    if op == "all_reduce":
        return np.concatenate([blocks.sum(axis=0)] * n)
    if op == "reduce_scatter":  # device i keeps chunk i of the sum: together, the sum
        return blocks.sum(axis=0)
    if op == "all_gather":  # every device holds the whole input
        return np.concatenate([x] * n)
    if op == "broadcast":
        return np.concatenate([blocks[source]] * n)
    if op == "send_recv":  # device i+1 receives device i's block
        return np.concatenate([blocks[(i - 1) % n] for i in range(n)])
    if op == "all_to_all":  # device i receives chunk i of every device's block, in order
        chunks = blocks.reshape(n, n, blocks.shape[1] // n, *blocks.shape[2:])
        return np.concatenate([np.concatenate(list(chunks[:, i])) for i in range(n)])
    raise AssertionError(op)


def _assert_same(actual, expected, dtype):
    actual = np.asarray(actual)
    assert actual.shape == expected.shape
    assert actual.dtype == np.dtype(dtype)
    if np.dtype(dtype).kind == "f":
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(actual, expected)


# (op, implementation, device counts)
HAND_BUILT = [
    ("reduce_scatter", "ring", (2, 3, 4, 6, 8)),
    ("all_gather", "ring", (2, 3, 4, 6, 8)),
    ("all_reduce", "ring", (2, 3, 4, 6, 8)),
    ("all_reduce", "recursive_doubling", (2, 4, 8)),
]
# Per-device block shapes and dtypes; each (op, n) meets every shape and dtype across the two
# ways of calling (make_collective and a direct shard_map).
VARIANTS_MAKE = [((BLOCK_ROWS,), np.float32), ((BLOCK_ROWS, 3), np.int32)]
VARIANTS_DIRECT = [((BLOCK_ROWS, 3), np.float32), ((BLOCK_ROWS,), np.int32)]


def _cases(variants):
    return [pytest.param(op, impl, n, shape, dtype,
                         id=f"{op}-{impl}-n{n}-{'x'.join(map(str, shape))}-{np.dtype(dtype)}")
            for op, impl, counts in HAND_BUILT for n in counts for shape, dtype in variants]


@pytest.mark.parametrize("op, implementation, n, block_shape, dtype", _cases(VARIANTS_MAKE))
def test_make_collective_hand_built_equals_builtin(op, implementation, n, block_shape, dtype):
    mesh = sub_mesh(n)
    x = _global_input(n, block_shape, dtype)
    hand = collectives.make_collective(op, mesh, AXIS, implementation=implementation)(x)
    builtin = collectives.make_collective(op, mesh, AXIS)(x)
    expected = _expected(op, x, n)
    _assert_same(builtin, expected, dtype)
    _assert_same(hand, expected, dtype)
    if np.dtype(dtype).kind != "f":
        np.testing.assert_array_equal(np.asarray(hand), np.asarray(builtin))


_HAND_FUNCTIONS = {
    ("reduce_scatter", "ring"): collectives.ring_reduce_scatter,
    ("all_gather", "ring"): collectives.ring_all_gather,
    ("all_reduce", "ring"): collectives.ring_all_reduce,
    ("all_reduce", "recursive_doubling"): collectives.recursive_doubling_all_reduce,
}
_BUILTIN_FUNCTIONS = {
    "reduce_scatter": lambda x: jax.lax.psum_scatter(x, AXIS, scatter_dimension=0, tiled=True),
    "all_gather": lambda x: jax.lax.all_gather(x, AXIS, tiled=True),
    "all_reduce": lambda x: jax.lax.psum(x, AXIS),
}


@pytest.mark.parametrize("op, implementation, n, block_shape, dtype", _cases(VARIANTS_DIRECT))
def test_shard_map_hand_built_equals_builtin(op, implementation, n, block_shape, dtype):
    mesh = sub_mesh(n)
    hand_fn, builtin_fn = _HAND_FUNCTIONS[(op, implementation)], _BUILTIN_FUNCTIONS[op]

    def both(x_block):  # x_block: dtype[B, ...]
        return hand_fn(x_block, AXIS), builtin_fn(x_block)

    run = jax.jit(jax.shard_map(both, mesh=mesh, in_specs=P(AXIS),
                                out_specs=(P(AXIS), P(AXIS)), check_vma=False))
    x = _global_input(n, block_shape, dtype, seed=1)
    hand, builtin = run(x)
    expected = _expected(op, x, n)
    _assert_same(builtin, expected, dtype)
    _assert_same(hand, expected, dtype)


@pytest.mark.parametrize("n", [2, 3, 4, 6, 8])
def test_ring_all_gather_needs_no_divisible_block(n):
    x = _global_input(n, (5, 2), np.int32, seed=2)  # 5 rows per device, not a multiple of n
    mesh = sub_mesh(n)
    hand = collectives.make_collective("all_gather", mesh, AXIS, implementation="ring")(x)
    _assert_same(hand, _expected("all_gather", x, n), np.int32)


# --- tree broadcast ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("block_shape, dtype", VARIANTS_MAKE)
def test_make_collective_broadcast_is_tree_from_device_0(n, block_shape, dtype):
    x = _global_input(n, block_shape, dtype, seed=3)
    out = collectives.make_collective("broadcast", sub_mesh(n), AXIS)(x)
    _assert_same(out, _expected("broadcast", x, n, source=0), dtype)


@pytest.mark.parametrize("n, sources", [(2, (0, 1)), (3, (0, 2)), (4, (1, 3)), (6, (0, 5)),
                                        (8, (0, 3, 7))])
@pytest.mark.parametrize("block_shape, dtype", VARIANTS_DIRECT)
def test_tree_broadcast_equals_gathered_source_block(n, sources, block_shape, dtype):
    mesh = sub_mesh(n)

    def body(x_block):  # x_block: dtype[B, ...]
        gathered = jax.lax.all_gather(x_block, AXIS)  # gathered: dtype[p, B, ...]
        trees = tuple(collectives.tree_broadcast(x_block, AXIS, source=s) for s in sources)
        builtins = tuple(gathered[s] for s in sources)
        return trees, builtins

    specs = tuple(P(AXIS) for _ in sources)
    run = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(AXIS), out_specs=(specs, specs),
                                check_vma=False))
    x = _global_input(n, block_shape, dtype, seed=4)
    trees, builtins = run(x)
    for source, tree, builtin in zip(sources, trees, builtins):
        expected = _expected("broadcast", x, n, source=source)
        _assert_same(builtin, expected, dtype)
        _assert_same(tree, expected, dtype)


# --- the remaining built-ins, and one device ------------------------------------------------

@pytest.mark.parametrize("op", costmodel.RUNNABLE_OPS)
def test_make_collective_builtins_match_numpy(op):
    n = 4
    x = _global_input(n, (BLOCK_ROWS, 2), np.int32, seed=5)
    out = collectives.make_collective(op, sub_mesh(n), AXIS)(x)
    _assert_same(out, _expected(op, x, n), np.int32)


@pytest.mark.parametrize("op, implementation", [(op, impl) for op, impl, _ in HAND_BUILT]
                         + [("broadcast", "builtin")])
def test_one_device_is_the_identity(op, implementation):
    x = _global_input(1, (6, 2), np.float32, seed=6)
    out = collectives.make_collective(op, sub_mesh(1), AXIS, implementation=implementation)(x)
    _assert_same(out, x, np.float32)


# --- per_device_elements ----------------------------------------------------------------------

@pytest.mark.parametrize("op, expected", [
    ("all_reduce", 4096 // 4),           # the full buffer on every device
    ("all_gather", 4096 // 4 // 8),      # nccl-tests' size is the gathered output
    ("reduce_scatter", 4096 // 4),       # the input that is scattered
    ("all_to_all", 4096 // 4),
    ("broadcast", 4096 // 4),
    ("send_recv", 4096 // 4),
])
def test_per_device_elements(op, expected):
    assert collectives.per_device_elements(op, 4096, 8, 4) == expected


@pytest.mark.parametrize("nbytes", [0, -4, -4096])
def test_per_device_elements_rejects_non_positive_sizes(nbytes):
    with pytest.raises(ValueError, match=f"Message size must be positive, got {nbytes} bytes"):
        collectives.per_device_elements("all_reduce", nbytes, 8, 4)


@pytest.mark.parametrize("op, nbytes, n, unit", [
    ("all_reduce", 6, 8, 4),             # not a whole number of 4-byte elements
    ("all_gather", 4100, 8, 32),         # not a whole number of elements per device
    ("reduce_scatter", 100, 6, 24),  # 100 bytes = 25 elements, not 6 equal parts
    ("all_to_all", 4096, 3, 12),
])
def test_per_device_elements_rejects_sizes_that_do_not_divide(op, nbytes, n, unit):
    with pytest.raises(ValueError, match=rf"{op} of {nbytes} bytes on {n} devices needs a "
                                         rf"multiple of {unit} bytes"):
        collectives.per_device_elements(op, nbytes, n, 4)


# --- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["all_reduse", "reduce", "gather"])
def test_make_collective_unknown_op(op):
    with pytest.raises(ValueError, match=rf"Unknown collective '{op}'. Runnable collectives: "
                                         r"all_reduce, all_gather"):
        collectives.make_collective(op, sub_mesh(2), AXIS)


def test_builtin_unknown_op():
    with pytest.raises(ValueError, match=r"Unknown collective 'scan'"):
        collectives.builtin("scan", jnp.zeros(4), AXIS)


@pytest.mark.parametrize("op, implementation, available", [
    ("broadcast", "ring", "builtin"),
    ("all_reduce", "tree", "builtin, ring, recursive_doubling"),
    ("all_to_all", "ring", "builtin"),
    ("all_gather", "recursive_doubling", "builtin, ring"),
])
def test_make_collective_unknown_implementation(op, implementation, available):
    with pytest.raises(ValueError, match=rf"No '{implementation}' implementation of {op}. "
                                         rf"Available: {available}\."):
        collectives.make_collective(op, sub_mesh(2), AXIS, implementation=implementation)


def test_make_collective_unknown_axis():
    with pytest.raises(ValueError, match=r"Mesh axis 'y' is not in the mesh; its axes are "
                                         r"\('x',\)"):
        collectives.make_collective("all_reduce", sub_mesh(2), "y")


@pytest.mark.parametrize("op", ["reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("n, rows", [(4, 6), (3, 4), (8, 12)])
def test_ring_rejects_blocks_that_do_not_split(op, n, rows):
    x = np.zeros((n * rows,), np.float32)  # rows per device, not a multiple of n
    fn = collectives.make_collective(op, sub_mesh(n), AXIS, implementation="ring")
    with pytest.raises(ValueError, match=rf"ring_reduce_scatter splits the leading dimension "
                                         rf"into {n} chunks.*size {rows}; make it a multiple "
                                         rf"of {n}"):
        fn(x)


def test_ring_reduce_scatter_in_shard_map_rejects_blocks_that_do_not_split():
    run = jax.jit(jax.shard_map(lambda b: collectives.ring_reduce_scatter(b, AXIS),
                                mesh=sub_mesh(4), in_specs=P(AXIS), out_specs=P(AXIS),
                                check_vma=False))
    with pytest.raises(ValueError, match="into 4 chunks, one per device, but it has size 5"):
        run(np.zeros((20, 3), np.float32))


@pytest.mark.parametrize("n", [3, 6])
def test_recursive_doubling_needs_a_power_of_two(n):
    fn = collectives.make_collective("all_reduce", sub_mesh(n), AXIS,
                                     implementation="recursive_doubling")
    with pytest.raises(ValueError, match=rf"needs a power-of-two axis size, got {n}; use "
                                         r"ring_all_reduce"):
        fn(np.zeros((n * BLOCK_ROWS,), np.float32))


# --- the ring's messages in the compiled program ----------------------------------------------

def test_program_inspection_has_one_path_hlo():
    # One name, one import path: reading a compiled program is hlo's, and collectives does not
    # offer it under a second name (it once re-exported 18 of hlo's names).
    for name in ("compiled_collectives", "summarize", "collectives_in_text", "CollectiveOp",
                 "hlo_op_count", "permute_schedule"):
        assert getattr(hlo, name).__module__ == "clusterlab.device.hlo"
        assert not hasattr(collectives, name), name


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_all_reduce_executes_2p_minus_2_messages_of_one_chunk(n):
    from clusterlab.analytic import costmodel

    x = _global_input(n, (BLOCK_ROWS,), np.float32)
    ring = collectives.make_collective("all_reduce", sub_mesh(n), AXIS, implementation="ring")
    executed = hlo.executed_collectives(ring, x)
    steps, sent_bytes = costmodel.collective_steps_and_bytes("all_reduce", 4 * BLOCK_ROWS, n)
    assert [op.kind for op in executed] == ["collective-permute"] * steps
    assert sum(op.bytes for op in executed) == sent_bytes  # 2(p-1)/p of the 96-byte buffer
    # Each phase is one loop: one collective-permute in the program, run p-1 times.
    assert hlo.hlo_op_count(ring, x) == 2


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_permutes_only_sends_what_the_ring_sends(n):
    mesh = sub_mesh(n)
    x = _global_input(n, (BLOCK_ROWS,), np.int32)
    run = jax.jit(jax.shard_map(lambda b: collectives.ring_permutes_only(b, AXIS), mesh=mesh,
                                in_specs=P(AXIS), out_specs=P(AXIS)))
    ring = collectives.make_collective("all_reduce", mesh, AXIS, implementation="ring")
    assert (hlo.executed_collectives(run, x)
            == hlo.executed_collectives(ring, x))
    blocks = _blocks(x, n)
    chunk = BLOCK_ROWS // n
    # After 2(n-1) steps to the right, device i holds the first chunk of device i - 2(n-1).
    expected = np.concatenate([blocks[(i - 2 * (n - 1)) % n, :chunk] for i in range(n)])
    np.testing.assert_array_equal(run(x), expected)


@pytest.mark.parametrize("check_vma", [True, False])
def test_ring_all_reduce_values_and_gradients_equal_psum(check_vma):
    n = 8
    mesh = sub_mesh(n)

    def sharded(fn):
        return jax.jit(jax.shard_map(lambda b: fn(b, AXIS), mesh=mesh, in_specs=P(AXIS),
                                     out_specs=P(AXIS), check_vma=check_vma))

    ring, psum = sharded(collectives.ring_all_reduce), sharded(jax.lax.psum)
    x = _global_input(n, (BLOCK_ROWS, 3), np.float32)
    weights = np.arange(x.size, dtype=np.float32).reshape(x.shape)  # a different weight each

    def loss(fn):
        return lambda x: jnp.sum(fn(x) * weights)

    np.testing.assert_allclose(ring(x), psum(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.grad(loss(ring))(x), jax.grad(loss(psum))(x), rtol=1e-6)


# --- Claims lab 02 states and these tests hold -------------------------------------------------

@pytest.mark.parametrize("buffer_bytes", [4 * 2**10, 16 * 2**20])
@pytest.mark.parametrize("implementation", ["ring", "recursive_doubling"])
def test_executed_messages_and_bytes_equal_the_models_at_lab02s_sizes(implementation,
                                                                      buffer_bytes):
    # Lab 02 times 4 KiB and 16 MiB a device on 8 devices; what runs is what the model counts.
    n = 8
    x = jnp.ones((n * buffer_bytes // 4,), jnp.float32)
    fn = collectives.make_collective("all_reduce", sub_mesh(n), AXIS,
                                     implementation=implementation)
    executed = hlo.executed_collectives(fn, x)
    assert {op.kind for op in executed} == {"collective-permute"}
    assert (len(executed), sum(op.bytes for op in executed)) == \
        costmodel.collective_steps_and_bytes("all_reduce", buffer_bytes, n, implementation)


def test_psum_compiles_to_one_all_reduce():
    n = 8
    x = _global_input(n, (BLOCK_ROWS,), np.float32)
    builtin = collectives.make_collective("all_reduce", sub_mesh(n), AXIS)
    assert [op.kind for op in hlo.executed_collectives(builtin, x)] == ["all-reduce"]
