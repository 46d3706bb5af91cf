"""Checking exercise answers, with feedback a student can act on.

A lab's exercise cell records the student's answer and carries no expected value::

    answer = ...  # bytes
    check.answer("lab01.1", answer)

:func:`answer` records the value under the exercise's id and, where the instructor's key
(``keys/labNN.py``, see :mod:`clusterlab.grading`) is found, judges it and prints one ✓/✗ line
with the key's hint; in a student copy, which has no key, it prints one line saying the answer
was recorded and how it is graded. ``python -m clusterlab grade`` runs a submitted notebook and
judges every exercise of the key from the recorded answers, so a deleted ``check.answer`` call
scores zero for its exercise.

:func:`close` and :func:`equal` are the comparisons the keys use; chapters call them directly
where the expected value is part of the text. Each function prints one line and returns nothing,
so a notebook cell shows that verdict line and nothing else.
"""

from __future__ import annotations

import re
import sys

import numpy as np

EXERCISE_ID = re.compile(r"^lab(\d\d)\.(\d+)$")
_NO_ANSWER = "no answer yet; replace the ... with your value."

# The answers recorded in this process (a notebook's kernel), by exercise id; the grader reads
# them after the submitted notebook has run.
_RECORDED: dict[str, object] = {}


def is_unanswered(value) -> bool:
    """Whether ``value`` is the blank a student cell starts with (``...``) or nothing."""
    return value is None or value is Ellipsis


def close_verdict(answer, expected, *, rtol: float = 1e-3, atol: float = 0.0, hint: str = "",
                  name: str = "answer") -> tuple[bool, str]:
    """Judge a number (or array) against the expected value within a relative tolerance.

    Args:
        answer: the student's value.
        expected: the reference value; an array's shape must match exactly (one value may come
            in any shape of size 1), nothing is broadcast.
        rtol: relative tolerance (1e-3 = within 0.1%).
        atol: absolute tolerance.
        hint: what to look at again when the answer is wrong.
        name: what the answer is, for the message.

    Returns:
        ``(passed, line)``: the verdict and its one-line message (✓ or ✗ with the hint).
    """
    if is_unanswered(answer):
        return False, f"✗ {name}: {_NO_ANSWER}"
    try:
        answer_array = np.asarray(answer, dtype=float)
        expected_array = np.asarray(expected, dtype=float)
    except (TypeError, ValueError):
        return False, f"✗ {name}: expected a number, got {answer!r}."
    # one value is one value, whatever its shape; anything larger must match (no broadcasting)
    one_value = answer_array.size == expected_array.size == 1
    if answer_array.shape != expected_array.shape and not one_value:
        return False, (f"✗ {name} has shape {answer_array.shape}; expected shape "
                       f"{expected_array.shape}.")
    if np.allclose(answer_array, expected_array, rtol=rtol, atol=atol):
        return True, f"✓ {name} is correct."
    return False, (f"✗ {name} is off: {np.asarray(answer)} vs the expected value (within "
                   f"{rtol:.0e} relative). {hint}").rstrip()


def equal_verdict(answer, expected, *, hint: str = "", name: str = "answer") -> tuple[bool, str]:
    """Judge an exact answer: a string, an integer, a tuple of names, an array.

    Sequences compare element-wise, so ``[4, 6]`` equals ``(4, 6)``; arrays must have the
    expected shape and every element equal.

    Returns:
        ``(passed, line)``: the verdict and its one-line message (✓ or ✗ with the hint).
    """
    if is_unanswered(answer):
        return False, f"✗ {name}: {_NO_ANSWER}"
    if _exactly_equal(answer, expected):
        return True, f"✓ {name} is correct."
    return False, f"✗ {name} is not right. {hint}".rstrip()


def close(answer, expected, *, rtol: float = 1e-3, atol: float = 0.0, hint: str = "",
          name: str = "answer") -> None:
    """Print :func:`close_verdict`'s line: ``✓ <name> is correct.`` or ✗ with the hint."""
    print(close_verdict(answer, expected, rtol=rtol, atol=atol, hint=hint, name=name)[1])


def equal(answer, expected, *, hint: str = "", name: str = "answer") -> None:
    """Print :func:`equal_verdict`'s line: ``✓ <name> is correct.`` or ✗ with the hint."""
    print(equal_verdict(answer, expected, hint=hint, name=name)[1])


def answer(exercise_id: str, value) -> None:
    """Record a lab exercise's answer and, where the instructor's key is found, judge it.

    Args:
        exercise_id: ``"labNN.K"``, the K-th exercise of lab NN (as the key names it).
        value: the answer: a number, a tuple, an array, or for a code exercise the function
            the student wrote.

    Prints one line: the key's ✓/✗ verdict with its hint; without a key (a student copy),
    that the answer was recorded and is graded with ``python -m clusterlab grade``; for a blank
    (``...``), that there is no answer yet.

    Raises:
        ValueError: when ``exercise_id`` is not of the form ``labNN.K``, or the key has no such
            exercise.
    """
    if not isinstance(exercise_id, str) or not EXERCISE_ID.match(exercise_id):
        raise ValueError(f"Exercise ids look like 'lab01.2' (lab 01, exercise 2); got "
                         f"{exercise_id!r}.")
    from clusterlab import grading  # grading imports this module

    _RECORDED[exercise_id] = value
    key = grading.find_key(exercise_id)
    if key is None:
        print(f"✗ {exercise_id}: {_NO_ANSWER}" if is_unanswered(value) else
              f"• {exercise_id}: answer recorded; your instructor grades it with the course's "
              "key (python -m clusterlab grade).")
        return
    # expected values the key takes from the lab come from the calling notebook's namespace
    namespace = sys._getframe(1).f_globals
    print(grading.judge(key, exercise_id, value, namespace).line)


def recorded_answers() -> dict[str, object]:
    """The answers :func:`answer` recorded in this process, by exercise id (a copy)."""
    return dict(_RECORDED)


# --- Verifications: claims a lab makes about its own run -------------------------------------
#
# Exercise checks above grade a student's answer and return a verdict. The functions below
# verify the lab itself (a parallel step equals one device, a count from the compiled program
# equals its formula, a resume is bit-identical): they print a ✓ line when the claim holds and
# raise VerificationFailed, naming what differed and by how much, when it does not, so a lab
# stops at the first broken claim in Jupyter, under nbval and on GPUs alike.


class VerificationFailed(AssertionError):
    """A lab's claim did not hold; the message names what differed and by how much."""


def verify(claim: str, holds: bool, *, detail: str = "") -> None:
    """Verify a claim computed by the caller.

    Args:
        claim: what is verified, as a sentence fragment ("the kill landed mid-write").
        holds: whether it holds.
        detail: the evidence, shown in both verdicts ("8 of 8 resumes bit-identical").

    Raises:
        VerificationFailed: when ``holds`` is false.
    """
    suffix = f" ({detail})" if detail else ""
    if not holds:
        raise VerificationFailed(f"✗ {claim}: does not hold{suffix}")
    print(f"✓ {claim}{suffix}")


def verify_equal(claim: str, actual, expected) -> None:
    """Verify an exact result: a count, a byte total, a schedule, an array bit for bit.

    Sequences compare element-wise, so ``[4, 6]`` equals ``(4, 6)``; arrays compare exactly.

    Raises:
        VerificationFailed: naming both values (or, for arrays, how many elements differ).
    """
    if _is_array(actual) or _is_array(expected):
        a, e = np.asarray(actual), np.asarray(expected)
        if a.shape != e.shape:
            raise VerificationFailed(f"✗ {claim}: shape {a.shape} vs expected {e.shape}")
        n_diff = int(np.sum(a != e))
        if n_diff:
            raise VerificationFailed(f"✗ {claim}: {n_diff} of {a.size} elements differ")
        print(f"✓ {claim} ({a.size} elements equal)")
        return
    if _as_comparable(actual) != _as_comparable(expected):
        raise VerificationFailed(f"✗ {claim}: got {actual!r}, expected {expected!r}")
    print(f"✓ {claim} ({actual!r})")


def verify_close(claim: str, actual, expected, *, rtol: float, atol: float = 0.0) -> float:
    """Verify that two arrays or pytrees of arrays agree within a relative tolerance.

    Each leaf's largest absolute difference is taken relative to that leaf's largest expected
    magnitude (its scale), so a wrong factor anywhere (a sum for a mean, a missing 1/p) shows
    as a relative difference of order one, while rounding stays near fp32's 1e-7.

    Args:
        claim: what is verified ("shard_map gradients equal one device's").
        actual: the array or pytree under test.
        expected: the reference, of the same structure and shapes.
        rtol: the largest relative difference accepted, per leaf.
        atol: an absolute floor, for leaves whose expected values are all near zero.

    Returns:
        The worst leaf's relative difference.

    Raises:
        VerificationFailed: naming the worst leaf, its difference and the tolerance; also when
            the structures or shapes differ.
    """
    import jax  # the exercise checks above must not need JAX

    actual_leaves = jax.tree_util.tree_leaves_with_path(actual)
    expected_leaves = jax.tree_util.tree_leaves_with_path(expected)
    if [p for p, _ in actual_leaves] != [p for p, _ in expected_leaves]:
        raise VerificationFailed(f"✗ {claim}: the two trees have different structures")
    worst_rel, worst_where = 0.0, ""
    for (path, a), (_, e) in zip(actual_leaves, expected_leaves):
        a, e = np.asarray(a, dtype=np.float64), np.asarray(e, dtype=np.float64)
        where = jax.tree_util.keystr(path) or "the array"
        if a.shape != e.shape:
            raise VerificationFailed(f"✗ {claim}: {where} has shape {a.shape}, "
                                     f"expected {e.shape}")
        if not np.all(np.isfinite(a)):
            raise VerificationFailed(f"✗ {claim}: {where} holds NaN or inf")
        abs_diff = float(np.max(np.abs(a - e), initial=0.0))
        if abs_diff <= atol:
            continue
        scale = float(np.max(np.abs(e), initial=0.0))
        rel = abs_diff / scale if scale > 0 else float("inf")
        if rel > worst_rel:
            worst_rel, worst_where = rel, where
    if worst_rel > rtol:
        raise VerificationFailed(f"✗ {claim}: max relative difference {worst_rel:.1e} > "
                                 f"{rtol:.0e} (at {worst_where})")
    print(f"✓ {claim} (max relative difference {worst_rel:.1e} <= {rtol:.0e})")
    return worst_rel


def verify_catches(bug: str, run_check) -> VerificationFailed:
    """A negative control: inject a bug on purpose and show that the lab's check catches it.

    Args:
        bug: the bug injected ("gradients summed instead of averaged").
        run_check: a function that runs the check on the buggy result and must raise
            VerificationFailed.

    Returns:
        The caught failure, for the lab to inspect further.

    Raises:
        VerificationFailed: when the check does not raise: it is blind to this bug.
    """
    try:
        run_check()
    except VerificationFailed as caught:
        print(f"✓ negative control, {bug}: caught: {str(caught).removeprefix('✗ ')}")
        return caught
    raise VerificationFailed(f"✗ negative control, {bug}: the check passed; it cannot see this "
                             "bug")


def _is_array(value) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def _as_comparable(value):
    """Lists and tuples alike, recursively, so ``[4, 6]`` and ``(4, 6)`` compare equal."""
    if isinstance(value, (list, tuple)):
        return tuple(_as_comparable(v) for v in value)
    if isinstance(value, dict):
        return {k: _as_comparable(v) for k, v in value.items()}
    return value


def _exactly_equal(answer, expected) -> bool:
    """Equality that accepts arrays (same shape, every element) and lists for tuples."""
    if _is_array(answer) or _is_array(expected):
        a, e = np.asarray(answer), np.asarray(expected)
        return a.shape == e.shape and bool(np.all(a == e))
    return _as_comparable(answer) == _as_comparable(expected)
