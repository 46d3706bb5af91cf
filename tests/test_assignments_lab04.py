"""The programming assignments of lab 04 (the Megatron MLP block's forward, lab04.3, and its
hand-written backward, lab04.4): the instructor's solutions, taken from the lab's solution cells,
pass the key's hidden tests on 2, 4 and 8 devices, and each bug planted into them fails the
hidden test that names it. A backward by autodiff (the review's W2) has the right gradients and
the one all-reduce; it fails the "written by hand" test, the last of each hidden case.

Programs are exported and rebuilt in this process as a submission's kernel and the grader do
(:func:`clusterlab.course.grading.judge`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from assignment_support import (KEYS, assert_fails_by_name, judge_solution, lab_sources,
                                solution_functions)
from clusterlab.course import grading

_LAB04 = lab_sources("04", ["lab04-megatron-forward", "lab04-megatron-backward"])
_KEY04 = grading.load_key(KEYS / "lab04.py")
_FIRST04 = "2 devices, D = 6, H = 10, batch 5"   # the first hidden case
_G = "jax.lax.psum(partial, axis_name)"
_F = "jax.lax.psum(d_pre @ w1.T, axis_name)"


def _judge(key_id: str, function_name: str, planted=None) -> grading.Verdict:
    return grading.judge(_KEY04, key_id, solution_functions(_LAB04, planted)[function_name], {})


@pytest.mark.parametrize("key_id, function_name", [("lab04.3", "megatron_mlp_forward"),
                                                   ("lab04.4", "megatron_mlp_grads")])
def test_lab04_solutions_pass_on_2_4_and_8_devices(key_id, function_name):
    assert sorted(e.n_devices for e in _KEY04[key_id].exports) == [2, 4, 8]
    verdict = _judge(key_id, function_name)
    assert verdict.passed, verdict.line


@pytest.mark.parametrize("key_id, function_name, planted, failed", [
    ("lab04.3", "megatron_mlp_forward", (_G, "partial"), f"output on {_FIRST04}"),
    ("lab04.3", "megatron_mlp_forward",
     ("x[0] + " + _G + " + b2[0]", "x[0] + jax.lax.psum(partial + b2[0], axis_name)"),
     f"output on {_FIRST04}"),
    ("lab04.4", "megatron_mlp_grads", (_F, "d_pre @ w1.T"), f"gradients on {_FIRST04}"),
    ("lab04.4", "megatron_mlp_grads", ("dy.sum(0))", "jax.lax.psum(dy.sum(0), axis_name))"),
     f"gradients on {_FIRST04}"),
    ("lab04.4", "megatron_mlp_grads",
     ("dx = dy + " + _F, "dx = jax.lax.psum(dy + d_pre @ w1.T, axis_name) / 1"),
     f"gradients on {_FIRST04}"),
], ids=["g left out (no psum in the forward)", "b2 added on every device before the psum",
        "f left out (dx not all-reduced)", "db2 t times too large (psum of db2)",
        "dy all-reduced with dx (t x dy in dx)"])
def test_lab04_planted_bug_fails_its_hidden_test_by_name(key_id, function_name, planted, failed):
    verdict = _judge(key_id, function_name, planted)
    assert_fails_by_name(verdict, failed)


@pytest.mark.parametrize("key_id, function_name, cell", [
    ("lab04.3", "megatron_mlp_forward", 0), ("lab04.4", "megatron_mlp_grads", 2)])
def test_lab04_skeletons_are_refused_with_their_error(key_id, function_name, cell):
    skeleton = solution_functions(_LAB04[cell:cell + 1])[function_name]
    verdict = grading.judge(_KEY04, key_id, skeleton, {})
    assert not verdict.passed and "raised NotImplementedError" in verdict.line


def _megatron_grads_by_vjp(x, w1, b1, w2, dy, axis_name):
    """The backward with jax.vjp of the local block, then f's psum: right numbers, one
    all-reduce, and the autodiff the exercise forbids (the review's bypass, W2)."""
    def local_block(x, w1, b1, w2):
        return jax.nn.relu(x @ w1 + b1) @ w2                    # this device's partial output

    _, vjp = jax.vjp(local_block, x[0], w1[0], b1[0], w2[0])
    d_partial_x, dw1, db1, dw2 = vjp(dy[0])
    dx = dy[0] + jax.lax.psum(d_partial_x, axis_name)
    return tuple(g[None] for g in (dx, dw1, db1, dw2, dy[0].sum(0)))


def _megatron_grads_by_grad(x, w1, b1, w2, dy, axis_name):
    """jax.grad of sum(dy * block) for the weights, the hand-written dx: autodiff of a piece."""
    def weighted(w1, b1, w2):
        return jnp.sum(dy[0] * (jax.nn.relu(x[0] @ w1 + b1) @ w2))

    dw1, db1, dw2 = jax.grad(weighted, argnums=(0, 1, 2))(w1[0], b1[0], w2[0])
    pre = x[0] @ w1[0] + b1[0]
    dx = dy[0] + jax.lax.psum(((dy[0] @ w2[0].T) * (pre > 0)) @ w1[0].T, axis_name)
    return tuple(g[None] for g in (dx, dw1, db1, dw2, dy[0].sum(0)))


@pytest.mark.parametrize("submission", [_megatron_grads_by_vjp, _megatron_grads_by_grad],
                         ids=["jax.vjp of the local block, then psum", "jax.grad of the weights"])
def test_lab04_backward_by_autodiff_fails_by_name(submission):
    verdict = grading.judge(_KEY04, "lab04.4", submission, {})
    assert_fails_by_name(verdict, f"{_FIRST04}: written by hand")


# --- lab04.6: the block under sequence parallelism ---------------------------------------------

_LAB04_SEQUENCE = lab_sources("04", ["lab04-sequence-parallel"])
_FIRST_SEQUENCE = "2 devices, T = 6 tokens, D = 6, H = 10"   # the first hidden case
_GATHER = "jax.lax.all_gather(x, axis_name, tiled=True)"
_SCATTER = "jax.lax.psum_scatter(partial, axis_name, scatter_dimension=0, tiled=True)"


def test_lab04_sequence_parallel_solution_passes_on_2_4_and_8_devices():
    assert sorted(e.n_devices for e in _KEY04["lab04.6"].exports) == [2, 4, 8]
    verdict = judge_solution(_KEY04, "lab04.6", _LAB04_SEQUENCE, "sequence_parallel_mlp")
    assert verdict.passed, verdict.line


@pytest.mark.parametrize("planted, failed", [
    ((_SCATTER, "jax.lax.dynamic_slice_in_dim(jax.lax.psum(partial, axis_name), "
                "jax.lax.axis_index(axis_name) * x.shape[0], x.shape[0])"),
     f"{_FIRST_SEQUENCE}: its collectives"),
    ((_SCATTER, "jax.lax.psum_scatter(partial, axis_name, scatter_dimension=1, "
                "tiled=True).reshape(x.shape)"),
     f"output on {_FIRST_SEQUENCE}"),
    ((_GATHER, "jnp.tile(x, (jax.lax.axis_size(axis_name), 1))"),
     f"output on {_FIRST_SEQUENCE}"),
    (("return x + mine + b2[0]", "return jax.lax.all_gather(x + mine + b2[0], axis_name, "
                                 "tiled=True)[:x.shape[0]]"),
     f"output on {_FIRST_SEQUENCE}"),
    (("@ w2[0]", "@ w2[0] + b2[0]"), f"output on {_FIRST_SEQUENCE}"),
], ids=["the all-reduce kept (then this device's rows)",
        "reduce-scatter along the wrong axis (features, reshaped)",
        "the gather missing (this device's tokens repeated)",
        "every device returns the first device's rows", "b2 added before the reduce-scatter"])
def test_lab04_sequence_parallel_planted_bug_fails_its_hidden_test_by_name(planted, failed):
    verdict = judge_solution(_KEY04, "lab04.6", _LAB04_SEQUENCE, "sequence_parallel_mlp", planted)
    assert_fails_by_name(verdict, failed)


def test_lab04_sequence_parallel_skeleton_is_refused_with_its_error():
    skeleton = solution_functions(_LAB04_SEQUENCE[:1])["sequence_parallel_mlp"]
    verdict = grading.judge(_KEY04, "lab04.6", skeleton, {})
    assert not verdict.passed and "raised NotImplementedError" in verdict.line
