"""clusterlab.device.hlo: the collectives XLA compiled into a program, counted from its HLO text."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from clusterlab.device import collectives, devices, hlo
from conftest import sub_mesh


def test_hlo_op_count_ring_and_doubling():
    mesh = sub_mesh(4, "ring")
    x = devices.shard(jnp.arange(4 * 8, dtype=jnp.float32), mesh, P("ring"))
    ring = collectives.make_collective("all_reduce", mesh, "ring", implementation="ring")
    doubling = collectives.make_collective("all_reduce", mesh, "ring",
                                           implementation="recursive_doubling")
    # the ring's two phases are loops: one collective-permute each, executed 4 - 1 times
    assert hlo.hlo_op_count(ring, x) == 2
    assert len(hlo.executed_collectives(ring, x)) == 2 * (4 - 1)
    assert hlo.hlo_op_count(doubling, x) == 2
    assert hlo.hlo_op_count(ring, x, op="all-reduce") == 0


def test_hlo_op_count_finds_the_all_reduce_jit_inserts():
    mesh = sub_mesh(4, "data")
    x = devices.shard(jnp.arange(16.0), mesh, P("data"))
    total = jax.jit(jnp.sum)
    assert hlo.hlo_op_count(total, x, op="all-reduce") == 1
    np.testing.assert_allclose(total(x), 120.0)


def test_hlo_op_count_needs_jit():
    with pytest.raises(TypeError, match="jax.jit"):
        hlo.hlo_op_count(jnp.sum, jnp.ones(4))


# --- a program cannot hide or discount its collectives (issue 37, item 1) -------------------

def _ring_permutes(n_devices: int) -> list[tuple[int, int]]:
    return [(i, (i + 1) % n_devices) for i in range(n_devices)]


def test_a_collective_inside_a_conditional_branch_is_counted():
    # lax.cond hid a built-in all-reduce from executed_collectives (it skipped branches)
    mesh = sub_mesh(4, "x")

    def body(x):
        summed = lambda v: jax.lax.pcast(jax.lax.psum(v, "x"), "x", to="varying")  # noqa: E731
        hidden = jax.lax.cond(x[0] > -1e9, summed, lambda v: v, x)
        return jax.lax.ppermute(hidden, "x", _ring_permutes(4))

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    kinds = [op.kind for op in hlo.executed_collectives(f, jnp.arange(8.0))]
    assert "all-reduce" in kinds and "collective-permute" in kinds
    # control: without the branch there is no all-reduce to find
    g = jax.jit(jax.shard_map(lambda x: jax.lax.ppermute(x, "x", _ring_permutes(4)), mesh=mesh,
                              in_specs=P("x"), out_specs=P("x")))
    assert "all-reduce" not in [op.kind for op in hlo.executed_collectives(g, jnp.arange(8.0))]


def test_a_trip_count_set_by_the_program_does_not_change_the_count():
    from jax.experimental.xla_metadata import set_xla_metadata

    mesh = sub_mesh(4, "x")

    def body(x):
        def step(carry, _):
            return jax.lax.ppermute(carry, "x", _ring_permutes(4)), None
        with set_xla_metadata(spoof='{"known_trip_count":{"n":"1"}}'):
            y, _ = jax.lax.scan(step, x, None, length=3)
        return y

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    x = jnp.arange(8.0)
    loop = next(line for line in hlo.compiled_text(f, x).splitlines() if " while(" in line)
    # the spoof is on the line, before XLA's own count: a first-match parser would read 1
    assert loop.index('"known_trip_count":{"n":"1"}') < loop.index('"known_trip_count":{"n":"3"}')
    permutes = [op for op in hlo.executed_collectives(f, x) if op.kind == "collective-permute"]
    assert len(permutes) == 3


def test_backend_config_is_read_as_json_outside_quoted_strings():
    line = ('%w = (s32[]) while(%t), body=%b, frontend_attributes={a="backend_config={\\"x\\":1}"}'
            ', backend_config={"known_trip_count":{"n":"5"}}')
    assert hlo.backend_config(line) == {"known_trip_count": {"n": "5"}}
    assert hlo.backend_config("%a = f32[] add(%b, %c)") == {}
    assert hlo.backend_config('%w = while(%t), backend_config={"broken"') == {}
