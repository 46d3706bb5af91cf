"""Exercise answers: recorded by id, and judged against an expected value in one line.

A lab's exercise cell hands its answer to :func:`clusterlab.course.check.answer`, which records it
here (:func:`record`) and has :mod:`clusterlab.course.grading` judge it with the comparisons below.
:func:`close` and :func:`equal` print their verdict; the keys and chapters use them and their
``*_verdict`` forms, which return it. NumPy only: a chapter that checks a number imports no JAX.
:mod:`clusterlab.course.check` re-exports every public name.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import numpy as np

# a lab's exercises are labNN.K; a chapter's chNN.K (ch04b.K for chapter 04b)
EXERCISE_ID = re.compile(r"^(lab\d\d|ch\d\d[a-z]?)\.(\d+)$")
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


def record(exercise_id: str, value) -> None:
    """Record ``value`` as the answer to ``exercise_id`` in this process.

    Raises:
        ValueError: when ``exercise_id`` is neither ``labNN.K`` nor ``chNN.K``.
    """
    if not isinstance(exercise_id, str) or not EXERCISE_ID.match(exercise_id):
        raise ValueError(f"Exercise ids look like 'lab01.2' (lab 01, exercise 2) or 'ch04b.1' "
                         f"(chapter 04b, exercise 1); got {exercise_id!r}.")
    _RECORDED[exercise_id] = value


SKELETON_MESSAGE = "write "  # a skeleton raises NotImplementedError("write <its name>.")


@contextlib.contextmanager
def public_tests(exercise_id: str) -> Iterator[None]:
    """Run a code exercise's public tests; a function not written yet is "not attempted".

    A student copy wraps each exercise's public-tests cell in this, so that "Run All" on a fresh
    copy reaches the end: the skeleton's ``NotImplementedError("write ...")`` becomes one line,
    and the cell stops there. Any other error (a bug in the student's function, a failed check)
    is raised as usual.
    """
    try:
        yield
    except NotImplementedError as error:
        if not str(error).startswith(SKELETON_MESSAGE):
            raise
        print(f"○ {exercise_id}: not attempted yet ({error}). Write the function in the cell "
              "above, run it, then run this cell again.")


def recorded_answers() -> dict[str, object]:
    """The answers :func:`record` recorded in this process, by exercise id (a copy)."""
    return dict(_RECORDED)


def is_array(value) -> bool:
    """Whether ``value`` is an array (NumPy, JAX or anything with a shape and a dtype)."""
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
    if is_array(answer) or is_array(expected):
        a, e = np.asarray(answer), np.asarray(expected)
        return a.shape == e.shape and bool(np.all(a == e))
    return _as_comparable(answer) == _as_comparable(expected)
