"""Keys of labs 00-02, 08 and 09 refuse the shortcuts the review of issue 20 found they let pass."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from clusterlab.course import grading
from conftest import ROOT, sub_mesh

KEYS = ROOT / "keys"


def test_lab00_global_max_refuses_jnp_max_under_a_sharding_constraint():
    # one sharding constraint makes jnp.max compile to an all-reduce with no shard_map written
    key = grading.load_key(KEYS / "lab00.py")
    mesh = sub_mesh(8, "data")
    constrained = jax.jit(lambda d: jnp.max(
        jax.lax.with_sharding_constraint(d, NamedSharding(mesh, P("data"))), keepdims=True))
    verdict = grading.judge(key, "lab00.3", constrained, {})
    assert not verdict.passed
    assert "without a shard_map" in verdict.line
