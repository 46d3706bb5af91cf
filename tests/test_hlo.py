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
