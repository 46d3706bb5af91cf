"""clusterlab.course.check.verify*: lab verifications print a verdict when they hold and raise when not."""

from __future__ import annotations

import re

import numpy as np
import pytest

from clusterlab.course import check
from clusterlab.course.check import VerificationFailed


def test_verify_prints_when_it_holds(capsys):
    check.verify("the kill landed", True, detail="3 kills")
    assert capsys.readouterr().out == "✓ the kill landed (3 kills)\n"


def test_verify_raises_when_it_does_not():
    with pytest.raises(VerificationFailed, match=r"✗ the kill landed: does not hold \(0 kills\)"):
        check.verify("the kill landed", False, detail="0 kills")


@pytest.mark.parametrize("actual, expected", [(3, 3), ([4, 6], (4, 6)), ("ring", "ring"),
                                              ({"a": [1, 2]}, {"a": (1, 2)})])
def test_verify_equal_holds(actual, expected, capsys):
    check.verify_equal("count", actual, expected)
    assert capsys.readouterr().out.startswith("✓ count (")


@pytest.mark.parametrize("actual, expected", [(3, 4), ([4, 6], (4, 7)), ("ring", "tree")])
def test_verify_equal_names_both_values(actual, expected):
    with pytest.raises(VerificationFailed, match=re.escape(f"got {actual!r}, expected {expected!r}")):
        check.verify_equal("count", actual, expected)


def test_verify_equal_on_arrays_counts_the_differing_elements():
    check.verify_equal("digest", np.arange(4), np.arange(4))
    with pytest.raises(VerificationFailed, match="1 of 4 elements differ"):
        check.verify_equal("digest", np.arange(4), np.array([0, 1, 2, 4]))
    with pytest.raises(VerificationFailed, match=r"shape \(4,\) vs expected \(5,\)"):
        check.verify_equal("digest", np.arange(4), np.arange(5))


def test_verify_close_on_pytrees_reports_the_worst_leaf(capsys):
    expected = {"w": np.ones((2, 3)), "b": np.full(3, 0.5)}
    actual = {"w": np.ones((2, 3)) * (1 + 1e-7), "b": np.full(3, 0.5)}
    rel = check.verify_close("grads equal", actual, expected, rtol=1e-5)
    assert rel == pytest.approx(1e-7, rel=1e-3)
    assert "max relative difference 1.0e-07 <= 1e-05" in capsys.readouterr().out
    with pytest.raises(VerificationFailed, match=r"7\.0e\+00 > 1e-05 \(at \['b'\]\)"):
        check.verify_close("grads equal", {"w": expected["w"], "b": expected["b"] * 8},
                           expected, rtol=1e-5)


def test_verify_close_catches_a_factor_of_p_that_adam_would_hide():
    grads = np.linspace(-1, 1, 16)
    with pytest.raises(VerificationFailed, match="max relative difference 7.0e"):
        check.verify_close("sum for mean", grads * 8, grads, rtol=1e-5)


def test_verify_close_rejects_nan_shape_and_structure():
    with pytest.raises(VerificationFailed, match="NaN or inf"):
        check.verify_close("x", np.array([np.nan]), np.array([1.0]), rtol=1e-3)
    with pytest.raises(VerificationFailed, match="shape"):
        check.verify_close("x", np.zeros(3), np.zeros(4), rtol=1e-3)
    with pytest.raises(VerificationFailed, match="different structures"):
        check.verify_close("x", {"a": np.zeros(3)}, {"b": np.zeros(3)}, rtol=1e-3)


def test_verify_close_all_zero_leaf_uses_atol():
    check.verify_close("zeros", np.full(3, 1e-9), np.zeros(3), rtol=1e-5, atol=1e-8)
    with pytest.raises(VerificationFailed, match="inf"):
        check.verify_close("zeros", np.full(3, 1e-3), np.zeros(3), rtol=1e-5, atol=1e-8)


def test_verify_catches_reports_a_caught_bug(capsys):
    def buggy_check():
        check.verify_equal("all-reduce count", 0, 1)

    caught = check.verify_catches("no gradient sync", buggy_check)
    assert isinstance(caught, VerificationFailed)
    assert capsys.readouterr().out == ("✓ negative control, no gradient sync: caught: "
                                       "all-reduce count: got 0, expected 1\n")


def test_verify_catches_raises_when_the_check_is_blind(capsys):
    with pytest.raises(VerificationFailed, match="cannot see this bug"):
        check.verify_catches("no gradient sync", lambda: check.verify("fine", True))
