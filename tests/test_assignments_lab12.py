"""The programming assignment of lab 12 (the student's max-min fair rates, lab12.2: progressive
filling on a dense incidence matrix): the instructor's solution, taken from the lab's solution
cell, passes the key's hidden flow sets against ``fabric.max_min_rates``, each bug planted into
it fails the hidden test that names it, and the skeleton is refused with its error.

The function is exported and rebuilt in this process as a submission's kernel and the grader do
(:func:`clusterlab.course.grading.judge`).
"""

from __future__ import annotations


import numpy as np
import pytest

from assignment_support import (KEYS, assert_fails_by_name, judge_solution, key_module, lab_sources,
                                solution_functions)
from clusterlab.course import grading

_SOURCES = lab_sources("12", ["lab12-max-min"])
_KEY12 = grading.load_key(KEYS / "lab12.py")
_FIRST = "flow set 1 (16 flows on 12 links): its rates"
_SPRAYED = "flow set 4 (16 flows on 12 links, some sprayed): its rates"   # the first sprayed


def _judge(planted: tuple[str, str] | None = None) -> grading.Verdict:
    return judge_solution(_KEY12, "lab12.2", _SOURCES, "max_min_rates", planted)


def _key_module():
    return key_module("lab12")


def test_lab12_solution_passes_the_hidden_flow_sets():
    verdict = _judge()
    assert verdict.passed, verdict.line


def test_lab12_hidden_flow_sets_route_every_flow_and_spray_only_the_last():
    key = _key_module()
    for i, (incidence, capacity) in enumerate(key._CASES):
        assert incidence.shape == (12, 16) and capacity.shape == (12,)
        assert (incidence.sum(axis=0) > 0).all() and (capacity > 0).all()
        assert ((incidence == 0.5).any()) == (i >= key._FIRST_SPRAYED)
    assert f"{key._case_name(0)}: its rates" == _FIRST
    assert f"{key._case_name(key._FIRST_SPRAYED)}: its rates" == _SPRAYED


@pytest.mark.parametrize("planted, failed", [
    (("jnp.where(active, delta, 0.0)", "delta"), _FIRST),
    (("active = active & ~(full.astype(incidence.dtype) @ incidence > 0)", "active = active"),
     _FIRST),
    (("incidence @ active.astype(incidence.dtype)", "incidence @ jnp.ones(n_flows)"), _FIRST),
    (("load = incidence @", "load = jnp.ceil(incidence) @"), _SPRAYED),
], ids=["frozen flows keep growing", "no flow freezes: all held to the tightest link's share",
        "frozen flows still counted in a link's load",
        "a sprayed flow loads each link with its whole rate"])
def test_lab12_planted_bug_fails_its_hidden_test_by_name(planted, failed):
    verdict = _judge(planted)
    assert_fails_by_name(verdict, failed)


def test_lab12_equal_shares_are_refused():
    # each flow gets its tightest link's capacity over the flows on it: not max-min fair
    def equal_shares(incidence, capacity):
        import jax.numpy as jnp
        share = capacity / incidence.sum(axis=1)
        return jnp.min(jnp.where(incidence > 0, share[:, None], jnp.inf), axis=0)

    verdict = grading.judge(_KEY12, "lab12.2", equal_shares, {})
    assert not verdict.passed and f": {_FIRST}: " in verdict.line, verdict.line


def test_lab12_a_result_of_the_wrong_shape_is_refused():
    verdict = grading.judge(_KEY12, "lab12.2", lambda incidence, capacity: capacity, {})
    assert not verdict.passed and "its result: shape (12,)" in verdict.line


def test_lab12_skeleton_is_refused_with_its_error():
    skeleton = solution_functions(_SOURCES[:1])["max_min_rates"]
    verdict = grading.judge(_KEY12, "lab12.2", skeleton, {})
    assert not verdict.passed and "raised NotImplementedError" in verdict.line


def test_lab12_public_textbook_case_is_not_equal_shares():
    rates = solution_functions(_SOURCES)["max_min_rates"](
        np.array([[1, 1, 0], [0, 1, 1]], dtype=np.float32), np.array([1, 2], dtype=np.float32))
    np.testing.assert_allclose(np.asarray(rates), [0.5, 0.5, 1.5], rtol=1e-6)
