"""The ZeRO-1 mixed-precision assignment of lab 06 (lab06.5): the instructor's solution, taken
from the lab's solution cell, passes the key's hidden tests on 3, 4 and 6 devices, and each bug
planted into it fails the hidden test that names it.

Programs are exported and rebuilt in this process as a submission's kernel and the grader do
(:func:`clusterlab.course.grading.judge`).
"""

from __future__ import annotations

import pytest

from assignment_support import (KEYS, assert_fails_by_name, assert_solution_passes, judge_solution,
                                lab_sources, solution_functions)
from clusterlab.course import grading

# lab06.4's skeleton gives unflatten_block, which zero1_step uses
_LAB06 = lab_sources("06", ["lab06-fsdp-step", "lab06-zero1-mixed"])
_KEY06 = grading.load_key(KEYS / "lab06.py")
_FIRST = "ZeRO-1 Adam step on 3 devices, 2 block(s) of D = 6, H = 12, batch 12"   # first case

_SCATTER = "jax.lax.psum_scatter(grads, axis_name, scatter_dimension=1, tiled=True) / p"
_UPDATE = "adam_update(master[0], m[0], v[0], mine.astype(jnp.float32))"


def test_solution_passes_on_3_4_and_6_devices():
    assert sorted(e.n_devices for e in _KEY06["lab06.5"].exports) == [3, 4, 6]
    assert_solution_passes(_KEY06, "lab06.5", _LAB06, "zero1_step")


@pytest.mark.parametrize("planted, failed", [
    (("new_master[None], new_m[None]",
      "new_master.astype(jnp.bfloat16).astype(jnp.float32)[None], new_m[None]"),
     f"{_FIRST}: the updated fp32 master weights"),
    ((_UPDATE, "adam_update(params[0][:, :master.shape[2]].astype(jnp.float32), m[0], v[0], "
               "mine.astype(jnp.float32))"),
     f"{_FIRST}: the updated fp32 master weights"),
    ((_SCATTER, "jax.lax.psum_scatter(grads, axis_name, scatter_dimension=1, tiled=True)"),
     f"{_FIRST}: the updated fp32 master weights"),
    ((_UPDATE,
      "[jax.lax.dynamic_slice_in_dim(full, jax.lax.axis_index(axis_name) * master.shape[2], "
      "master.shape[2], axis=1) for full in adam_update(*(jax.lax.all_gather(s[0], axis_name, "
      "axis=1, tiled=True) for s in (master, m, v)), jax.lax.all_gather(mine, axis_name, axis=1, "
      "tiled=True).astype(jnp.float32))]"),
     f"{_FIRST}: its memory"),
    ((_SCATTER,
      "jax.lax.dynamic_slice_in_dim(jax.lax.psum(grads, axis_name), jax.lax.axis_index("
      "axis_name) * master.shape[2], master.shape[2], axis=1) / p"),
     f"{_FIRST}: its collectives"),
    (("psum_scatter(grads,", "psum_scatter(grads.astype(jnp.float32),"),
     f"{_FIRST}: its collectives"),
], ids=["master weights rounded to bf16", "the update applied to the bf16 parameters",
        "the sum of gradients, not the mean", "the whole fp32 state gathered on every device",
        "an all-reduce where a reduce-scatter belongs", "the gradient reduced in fp32"])
def test_planted_bug_fails_its_hidden_test_by_name(planted, failed):
    verdict = judge_solution(_KEY06, "lab06.5", _LAB06, "zero1_step", planted)
    assert_fails_by_name(verdict, failed)


def test_skeleton_is_refused_with_its_error():
    skeleton = solution_functions(_LAB06[:1] + _LAB06[2:3])["zero1_step"]
    verdict = grading.judge(_KEY06, "lab06.5", skeleton, {})
    assert not verdict.passed and "raised NotImplementedError" in verdict.line
