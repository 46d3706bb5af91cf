"""The programming assignments of labs 05 (GPipe) and 06 (FSDP): the instructor's solutions,
taken from the labs' solution cells, pass the keys' hidden tests on every device count, and each
bug planted into them fails the hidden test that names it.

Programs are exported and rebuilt in this process as a submission's kernel and the grader do
(:func:`clusterlab.course.grading.judge`: :func:`clusterlab.course.submission.export_answer` for each
``grading.Export`` of the key, then :func:`clusterlab.course.grading.rehydrate`).
"""

from __future__ import annotations

import functools

import jax
import pytest

from assignment_support import KEYS, assert_fails_by_name, lab_sources, solution_functions
from clusterlab.course import grading


# --- lab 05: GPipe forward (lab05.3) and gradients (lab05.4) -----------------------------------

_LAB05 = lab_sources("05", ["lab05-gpipe-forward", "lab05-gpipe-grads"])
_KEY05 = grading.load_key(KEYS / "lab05.py")
_FIRST05 = "2 stages of 2 block(s), 3 micro-batches of 4"   # the first hidden case


@pytest.mark.parametrize("exercise, function", [("lab05.3", "gpipe_forward"),
                                                ("lab05.4", "gpipe_grads")])
def test_lab05_solution_passes_on_2_4_and_8_stages(exercise, function):
    assert sorted(e.n_devices for e in _KEY05[exercise].exports) == [2, 4, 8]
    verdict = grading.judge(_KEY05, exercise, solution_functions(_LAB05)[function], {})
    assert verdict.passed, verdict.line


@pytest.mark.parametrize("exercise, function, planted, failed", [
    ("lab05.3", "gpipe_forward",
     ("to_next = [(s, s + 1) for s in range(p - 1)]",
      "to_next = [(s, (s + 2) % p) for s in range(p)]"),
     f"forward on {_FIRST05}: the last stage's outputs"),
    ("lab05.3", "gpipe_forward",
     ("xs[jnp.minimum(t, m - 1)]", "xs[jnp.maximum(m - 1 - t, 0)]"),
     f"forward on {_FIRST05}: the last stage's outputs"),
    ("lab05.3", "gpipe_forward",
     ("jax.lax.ppermute(out, axis_name, to_next)",
      "jax.lax.all_gather(out, axis_name)[jnp.maximum(stage - 1, 0)]"),
     f"forward on {_FIRST05}: its messages"),
    ("lab05.4", "gpipe_grads",
     ("jax.lax.ppermute(d_h, axis_name, to_previous)", "d_h"),
     f"gradients on {_FIRST05}"),
    ("lab05.4", "gpipe_grads",
     ("/ (m * out.size)", "/ out.size"),
     f"gradients on {_FIRST05}"),
], ids=["send to the wrong stage", "micro-batches in the wrong order",
        "activations all-gathered, not sent", "a missing backward send",
        "micro-batch losses summed, not averaged"])
def test_lab05_planted_bug_fails_its_hidden_test_by_name(exercise, function, planted, failed):
    verdict = grading.judge(_KEY05, exercise, solution_functions(_LAB05, planted)[function], {})
    assert_fails_by_name(verdict, failed)


def test_lab05_skeleton_is_refused_with_its_error():
    verdict = grading.judge(_KEY05, "lab05.3", solution_functions(_LAB05[:1])["gpipe_forward"], {})
    assert not verdict.passed and "raised NotImplementedError" in verdict.line


# --- lab 06: one FSDP / ZeRO-3 SGD step (lab06.4) ----------------------------------------------

_LAB06 = lab_sources("06", ["lab06-fsdp-step"])
_KEY06 = grading.load_key(KEYS / "lab06.py")
_FIRST06 = "SGD step on 2 devices, 2 block(s) of D = 8, H = 16, batch 12"   # the first case


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _gather_reducing_with_all_reduce(row_slice, axis_name):
    """An all-gather whose backward all-reduces the whole gradient and keeps this device's
    slice: the right numbers with plain data parallelism's all-reduce (a planted bug)."""
    return jax.lax.all_gather(row_slice, axis_name, tiled=True)


def _gather_forward(row_slice, axis_name):
    return _gather_reducing_with_all_reduce(row_slice, axis_name), None


def _gather_backward(axis_name, _residual, grad):
    total = jax.lax.psum(grad, axis_name)                              # f32[F], an all-reduce
    width = grad.shape[0] // jax.lax.axis_size(axis_name)
    return (jax.lax.dynamic_slice_in_dim(total, jax.lax.axis_index(axis_name) * width, width),)


_gather_reducing_with_all_reduce.defvjp(_gather_forward, _gather_backward)


def test_lab06_solution_passes_on_2_4_and_8_devices():
    assert sorted(e.n_devices for e in _KEY06["lab06.4"].exports) == [2, 4, 8]
    verdict = grading.judge(_KEY06, "lab06.4", solution_functions(_LAB06)["fsdp_step"], {})
    assert verdict.passed, verdict.line


@pytest.mark.parametrize("planted, failed", [
    (("jax.lax.all_gather(row_slice, axis_name, tiled=True)",
      "_gather_reducing_with_all_reduce(row_slice, axis_name)"),
     f"{_FIRST06}: its collectives"),
    (("jax.grad(loss)(flat_shard[0]) / p", "jax.grad(loss)(flat_shard[0])"),
     f"{_FIRST06}: the updated slices"),
    (("return (flat_shard[0] - LEARNING_RATE * grads)[None]",
      "return jax.lax.all_gather(flat_shard[0] - LEARNING_RATE * grads, axis_name, axis=1, "
      "tiled=True)[None]"),
     f"{_FIRST06}: the updated slices"),
    (("jax.lax.scan(jax.checkpoint(block), x, slices)", "jax.lax.scan(block, x, slices)"),
     f"{_FIRST06}: its collectives"),
], ids=["an all-reduce where a reduce-scatter belongs", "the sum of gradients, not the mean",
        "the full parameters updated and returned, not the slice",
        "parameters kept for the backward pass, not gathered again"])
def test_lab06_planted_bug_fails_its_hidden_test_by_name(planted, failed):
    step = solution_functions(_LAB06, planted,
                      _gather_reducing_with_all_reduce=_gather_reducing_with_all_reduce)
    verdict = grading.judge(_KEY06, "lab06.4", step["fsdp_step"], {})
    assert_fails_by_name(verdict, failed)


def test_lab06_skeleton_is_refused_with_its_error():
    verdict = grading.judge(_KEY06, "lab06.4", solution_functions(_LAB06[:1])["fsdp_step"], {})
    assert not verdict.passed and "raised NotImplementedError" in verdict.line
