"""The programming assignment of lab 02 (the ring reduce-scatter, lab02.3, and all-gather,
lab02.4, from ``jax.lax.ppermute``): the instructor's solutions, taken from the lab's solution
cells, pass the key's hidden tests on 2, 4 and 8 devices, and each bug planted into them fails
the hidden test that names it.

Programs are exported and rebuilt in this process as a submission's kernel and the grader do
(:func:`clusterlab.course.grading.judge`).
"""

from __future__ import annotations

import pytest

from assignment_support import KEYS, assert_fails_by_name, lab_sources, solution_functions
from clusterlab.course import grading

_RS, _AG = "lab02-reduce-scatter", "lab02-all-gather"
_SOURCES = {_RS: lab_sources("02", [_RS]), _AG: lab_sources("02", [_AG])}
_KEY02 = grading.load_key(KEYS / "lab02.py")
_EXERCISE = {_RS: ("lab02.3", "ring_reduce_scatter"), _AG: ("lab02.4", "ring_all_gather")}
_FIRST = {_RS: "reduce-scatter on 2 devices, 10 values each",     # the first hidden cases
          _AG: "all-gather on 2 devices, 5 values each"}
_FOURTH = {_RS: "reduce-scatter on 4 devices, 36 values each",   # p = 2 cannot tell some bugs
           _AG: "all-gather on 4 devices, 9 values each"}
_TO_NEXT = "to_next = [(i, (i + 1) % p) for i in range(p)]"
_TO_PREVIOUS = "to_next = [(i, (i - 1) % p) for i in range(p)]"


def _judge(label: str, planted: tuple[str, str] | None = None) -> grading.Verdict:
    exercise_id, name = _EXERCISE[label]
    function = solution_functions(_SOURCES[label], planted)[name]
    return grading.judge(_KEY02, exercise_id, function, {})


@pytest.mark.parametrize("label", [_RS, _AG])
def test_lab02_ring_solutions_pass_on_2_4_and_8_devices(label):
    exercise_id, _ = _EXERCISE[label]
    assert sorted(e.n_devices for e in _KEY02[exercise_id].exports) == [2, 4, 8]
    verdict = _judge(label)
    assert verdict.passed, verdict.line


@pytest.mark.parametrize("label, planted, failed", [
    (_RS, ("range(1, p)", "range(1, p - 1)"), f"{_FIRST[_RS]}: its result"),
    (_RS, ("chunks[(me - 1 - step) % p]", "chunks[(me - step) % p]"),
     f"{_FIRST[_RS]}: its result"),
    (_RS, ("chunks = block.reshape(p, -1)", "chunks = jnp.roll(block.reshape(p, -1), -1, 0)"),
     f"{_FIRST[_RS]}: its result"),
    (_RS, ("return partial", "return jax.lax.psum_scatter(block, axis_name, tiled=True)"),
     f"{_FIRST[_RS]}: its messages"),
    (_RS, (_TO_NEXT, _TO_PREVIOUS), f"{_FOURTH[_RS]}: its result"),
    (_AG, ("range(1, p)", "range(1, p - 1)"), f"{_FIRST[_AG]}: its result"),
    (_AG, ("gathered.at[(me - step) % p]", "gathered.at[(me + step) % p]"),
     f"{_FOURTH[_AG]}: its result"),
    (_AG, ("return gathered.reshape(-1)", "return jax.lax.all_gather(chunk, axis_name, "
                                          "tiled=True)"), f"{_FIRST[_AG]}: its messages"),
    (_AG, (_TO_NEXT, _TO_PREVIOUS), f"{_FOURTH[_AG]}: its result"),
], ids=["reduce-scatter a step short (p - 2 steps)", "reduce-scatter adds chunk i - s",
        "reduce-scatter ends with chunk i + 1 (a consistent ring, the wrong owner)",
        "psum_scatter instead of the ring", "reduce-scatter sends left, bookkeeping for right",
        "all-gather a step short (p - 2 steps)", "all-gather stores chunk i - s at i + s",
        "all_gather instead of the ring", "all-gather sends left, bookkeeping for right"])
def test_lab02_planted_bug_fails_its_hidden_test_by_name(label, planted, failed):
    verdict = _judge(label, planted)
    assert_fails_by_name(verdict, failed)


@pytest.mark.parametrize("label", [_RS, _AG])
def test_lab02_skeletons_are_refused_with_their_error(label):
    exercise_id, name = _EXERCISE[label]
    skeleton = solution_functions(_SOURCES[label][:1])[name]
    verdict = grading.judge(_KEY02, exercise_id, skeleton, {})
    assert not verdict.passed and "raised NotImplementedError" in verdict.line
