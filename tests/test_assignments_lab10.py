"""The programming assignment of lab 10 (the student's model of a layout, lab10.3: model states per
GPU by ZeRO stage and the 1F1B bubble): the instructor's solution, taken from the lab's solution
cell, passes the key's hidden tests against ``plan.predict``, each bug planted into it fails the
hidden test that names it, and the skeleton is refused with its error.

The function is exported and rebuilt in this process as a submission's kernel and the grader do
(:func:`clusterlab.course.grading.judge`).
"""

from __future__ import annotations

import pytest

from assignment_support import (KEYS, assert_fails_by_name, judge_solution, key_module, lab_sources,
                                solution_functions)
from clusterlab.analytic import costmodel
from clusterlab.course import grading

_SOURCES = lab_sources("10", ["lab10-layout-model"])
_KEY10 = grading.load_key(KEYS / "lab10.py")
_FIRST = "13B parameters, batch 512, dp16 tp4 pp2 ZeRO-0, micro-batch 2"    # the first case
_ZERO2 = "30B parameters, batch 768, dp8 tp4 pp8 ZeRO-2, micro-batch 4"     # the first ZeRO-2
_ZERO3 = "175B parameters, batch 1536, dp64 tp8 pp4 ZeRO-3, micro-batch 2"  # the first ZeRO-3


def _judge(planted: tuple[str, str] | None = None) -> grading.Verdict:
    return judge_solution(_KEY10, "lab10.3", _SOURCES, "layout_model", planted)


def _key_module():
    return key_module("lab10")


def test_lab10_solution_passes_the_hidden_layouts():
    verdict = _judge()
    assert verdict.passed, verdict.line


def test_lab10_hidden_layouts_cover_every_zero_stage_and_the_bubble_is_the_planners():
    key = _key_module()
    cases = key._LAYOUTS
    assert {c.zero_stage for c in cases} == {0, 1, 2, 3}
    assert {c.pp > 1 for c in cases} == {True, False} and {c.tp > 1 for c in cases} == {True, False}
    assert (str(cases[0]), str(cases[2]), str(cases[4])) == (_FIRST, _ZERO2, _ZERO3)
    for case in cases:   # the share the key reads from the Plan is costmodel's (p-1)/(m+p-1)
        m = case.global_batch // (case.dp * case.micro_batch)
        assert key._planned(case)[1] == pytest.approx(
            costmodel.pipeline_bubble_fraction(case.pp, m, "1f1b"), rel=1e-12)


_STATES, _BUBBLE = "its model-state bytes per GPU", "its pipeline bubble"


@pytest.mark.parametrize("planted, failed", [
    (("12 * held", "8 * held"), f"{_FIRST}: {_STATES}"),
    (("n_params / (tp * pp)", "n_params / tp"), f"{_FIRST}: {_STATES}"),
    (("grads / jnp.where(zero_stage >= 2, dp, 1)", "grads / jnp.where(zero_stage >= 3, dp, 1)"),
     f"{_ZERO2}: {_STATES}"),
    (("weights / jnp.where(zero_stage >= 3, dp, 1)", "weights"), f"{_ZERO3}: {_STATES}"),
    (("(pp - 1) / (m + pp - 1)", "(pp - 1) / m"), f"{_FIRST}: {_BUBBLE}"),
    (("global_batch / (dp * micro_batch)", "global_batch / dp"), f"{_FIRST}: {_BUBBLE}"),
], ids=["Adam's state at 8 bytes, not 12", "parameters split over tp only, not tp x pp",
        "ZeRO-2 leaves the gradients whole", "ZeRO-3 leaves the weights whole",
        "bubble (p - 1) / m", "micro-batches counted as sequences"])
def test_lab10_planted_bug_fails_its_hidden_test_by_name(planted, failed):
    verdict = _judge(planted)
    assert_fails_by_name(verdict, failed)


def test_lab10_a_single_array_is_refused_by_its_shapes():
    verdict = grading.judge(_KEY10, "lab10.3", lambda n, *rest: n * 16, {})
    assert not verdict.passed and "its result: shapes [(8,)]" in verdict.line


def test_lab10_skeleton_is_refused_with_its_error():
    skeleton = solution_functions(_SOURCES[:1])["layout_model"]
    verdict = grading.judge(_KEY10, "lab10.3", skeleton, {})
    assert not verdict.passed and "raised NotImplementedError" in verdict.line
