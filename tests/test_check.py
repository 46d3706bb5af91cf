"""clusterlab.course.check: verdicts for exercise answers, one printed line each."""

from __future__ import annotations

import numpy as np
import pytest

from clusterlab.course import check


def _verdict(capsys) -> str:
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out  # one line per check
    return out.strip()


@pytest.mark.parametrize("answer, expected", [
    (1.0, 1.0), (1.0005, 1.0), (0.9995, 1.0), (2 * 7 / 8, 1.75), (np.float32(1.75), 1.75),
    ([1.0, 2.0, 3.0], [1.0, 2.0, 3.001]), (np.arange(4), np.arange(4)), (3, 3.0),
])
def test_close_passes_within_tolerance(answer, expected, capsys):
    check.close(answer, expected)
    assert _verdict(capsys) == "✓ answer is correct."


@pytest.mark.parametrize("answer, expected", [
    (1.01, 1.0), (0.99, 1.0), (7 / 8, 1.75), ([1.0, 2.0], [1.0, 2.1]), (-1.0, 1.0),
])
def test_close_fails_outside_tolerance(answer, expected, capsys):
    check.close(answer, expected, hint="Count the steps again.", name="busbw")
    line = _verdict(capsys)
    assert line.startswith("✗ busbw is off: ")
    assert "(within 1e-03 relative)" in line
    assert line.endswith("Count the steps again.")


def test_close_message_without_a_hint(capsys):
    check.close(2.0, 1.0)
    assert _verdict(capsys) == ("✗ answer is off: 2.0 vs the expected value "
                                "(within 1e-03 relative).")


@pytest.mark.parametrize("answer, expected, tolerances, mark", [
    (1.04, 1.0, {"rtol": 0.05}, "✓"), (1.06, 1.0, {"rtol": 0.05}, "✗"),
    (1e-9, 0.0, {}, "✗"),                            # nothing is relatively close to zero
    (1e-9, 0.0, {"atol": 1e-8}, "✓"),
])
def test_close_tolerances(answer, expected, tolerances, mark, capsys):
    check.close(answer, expected, **tolerances)
    assert _verdict(capsys).startswith(mark)


@pytest.mark.parametrize("answer", [..., None])
def test_close_without_an_answer(answer, capsys):
    check.close(answer, 1.0, name="time_s")
    assert _verdict(capsys) == "✗ time_s: no answer yet; replace the ... with your value."


@pytest.mark.parametrize("answer", ["fast", "1,5", {"a": 1}])
def test_close_with_something_that_is_not_a_number(answer, capsys):
    check.close(answer, [1.0, 2.0])
    assert _verdict(capsys) == f"✗ answer: expected a number, got {answer!r}."


@pytest.mark.parametrize("answer, expected", [
    ("ring", "ring"), (3, 3), (("data", "model"), ("data", "model")), (np.int64(8), 8),
])
def test_equal_passes(answer, expected, capsys):
    check.equal(answer, expected, name="choice")
    assert _verdict(capsys) == "✓ choice is correct."


@pytest.mark.parametrize("answer, expected", [
    ("tree", "ring"), (4, 3), (("model", "data"), ("data", "model")), ("3", 3),
])
def test_equal_fails(answer, expected, capsys):
    check.equal(answer, expected, hint="Which one sends less?")
    assert _verdict(capsys) == "✗ answer is not right. Which one sends less?"


def test_equal_fails_without_a_hint(capsys):
    check.equal(1, 2)
    assert _verdict(capsys) == "✗ answer is not right."


@pytest.mark.parametrize("answer", [..., None])
def test_equal_without_an_answer(answer, capsys):
    check.equal(answer, "ring")
    assert _verdict(capsys) == "✗ answer: no answer yet; replace the ... with your value."


def test_close_requires_the_expected_shape(capsys):
    check.close(np.ones((1, 8)), np.ones(8), name="row")
    assert _verdict(capsys) == "✗ row has shape (1, 8); expected shape (8,)."


@pytest.mark.parametrize("answer, expected", [([4, 6], (4, 6)), (np.arange(3), np.arange(3)),
                                              ((1, [2, 3]), [1, (2, 3)])])
def test_equal_accepts_lists_for_tuples_and_arrays(answer, expected, capsys):
    check.equal(answer, expected)
    assert _verdict(capsys) == "✓ answer is correct."


@pytest.mark.parametrize("answer, expected", [([4, 7], (4, 6)), (np.arange(3), np.arange(4)),
                                              (np.array([0, 1, 3]), np.arange(3))])
def test_equal_rejects_other_values_and_shapes(answer, expected, capsys):
    check.equal(answer, expected)
    assert _verdict(capsys).startswith("✗ answer is not right.")


def test_close_takes_one_value_in_any_shape(capsys):
    check.close(np.array([2.0]), 2.0)
    assert _verdict(capsys) == "✓ answer is correct."


def test_a_check_cell_shows_its_verdict_line_and_nothing_else(capsys):
    assert check.close(1.0, 1.0) is None             # no True/False after the verdict in a cell
    assert check.equal(1, 2) is None
    assert capsys.readouterr().out.count("\n") == 2
