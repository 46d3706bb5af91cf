"""The programming assignment of lab 03 (the data-parallel gradient, lab03.4): the instructor's
solution, taken from the lab's solution cell, passes the key's hidden tests on 2, 4 and 8
devices, and each bug planted into it fails the hidden test that names it.

Programs are exported and rebuilt in this process as a submission's kernel and the grader do
(:func:`clusterlab.course.grading.judge`: :func:`clusterlab.course.submission.export_answer` for each
``grading.Export`` of the key, then :func:`clusterlab.course.grading.rehydrate`).
"""

from __future__ import annotations

import pytest

from assignment_support import KEYS, assert_fails_by_name, lab_sources, solution_functions
from clusterlab.course import grading

_LAB03 = lab_sources("03", ["lab03-data-parallel-grads"])
_KEY03 = grading.load_key(KEYS / "lab03.py")
_FIRST03 = "2 devices, 2 block(s) of D = 8, H = 12, batch 12"   # the first hidden case
_PMEAN = "jax.lax.pmean(local, axis_name)"


def test_lab03_solution_passes_on_2_4_and_8_devices():
    assert sorted(e.n_devices for e in _KEY03["lab03.4"].exports) == [2, 4, 8]
    verdict = grading.judge(_KEY03, "lab03.4", solution_functions(_LAB03)["data_parallel_grads"],
                            {})
    assert verdict.passed, verdict.line


@pytest.mark.parametrize("planted, failed", [
    ((_PMEAN, "jax.lax.psum(local, axis_name)"), f"gradients on {_FIRST03}"),
    ((_PMEAN, "local"), f"gradients on {_FIRST03}"),
    ((_PMEAN, f"jax.tree.map(lambda g: g / jax.lax.axis_size(axis_name), {_PMEAN})"),
     f"gradients on {_FIRST03}"),
    (("grads = " + _PMEAN,
      "x, y = (jax.lax.all_gather(a, axis_name, tiled=True) for a in (x, y))\n"
      "    grads = jax.grad(local_loss, argnums=(0, 1, 2, 3))(w1[0], b1[0], w2[0], b2[0])"),
     f"{_FIRST03}: its collectives"),
], ids=["psum of the devices' means (sum for mean)", "no all-reduce (each device's own slice)",
        "divided by p twice", "the batch all-gathered, the whole batch on every device"])
def test_lab03_planted_bug_fails_its_hidden_test_by_name(planted, failed):
    grads = solution_functions(_LAB03, planted)["data_parallel_grads"]
    verdict = grading.judge(_KEY03, "lab03.4", grads, {})
    assert_fails_by_name(verdict, failed)


def test_lab03_skeleton_is_refused_with_its_error():
    skeleton = solution_functions(_LAB03[:1])["data_parallel_grads"]
    verdict = grading.judge(_KEY03, "lab03.4", skeleton, {})
    assert not verdict.passed and "raised NotImplementedError" in verdict.line
