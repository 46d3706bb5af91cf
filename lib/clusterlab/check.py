"""Checking exercise answers, with feedback a student can act on.

Each function prints one line, a tick or a hint, and returns nothing, so a notebook cell shows
that verdict line and nothing else.

Grading: with the environment variable ``CLUSTERLAB_CHECK_STRICT=1`` a failed check also raises
an ``AssertionError`` carrying the same line, so an instructor can run a submitted notebook with
``CLUSTERLAB_CHECK_STRICT=1 pytest --nbval-lax submitted.ipynb`` and see every wrong or missing
answer as a failing cell.
"""

from __future__ import annotations

import os

import numpy as np

STRICT_ENV = "CLUSTERLAB_CHECK_STRICT"


def _fail(line: str) -> None:
    """Print a failed verdict; raise it instead of returning when grading strictly."""
    print(line)
    if os.environ.get(STRICT_ENV, "") not in ("", "0"):
        raise AssertionError(line)


def close(answer, expected, *, rtol: float = 1e-3, atol: float = 0.0, hint: str = "",
          name: str = "answer") -> None:
    """Check a number (or array) against the expected value within a relative tolerance.

    Args:
        answer: the student's value.
        expected: the reference value.
        rtol: relative tolerance (1e-3 = within 0.1%).
        atol: absolute tolerance.
        hint: what to look at again when the answer is wrong.
        name: what the answer is, for the message.

    Prints ``✓ <name> is correct.`` when ``answer`` is within tolerance of ``expected``, otherwise
    one ``✗`` line with the hint (raised as an AssertionError when grading strictly).
    """
    if answer is None or answer is Ellipsis:
        return _fail(f"✗ {name}: no answer yet; replace the ... with your value.")
    try:
        answer_array = np.asarray(answer, dtype=float)
        expected_array = np.asarray(expected, dtype=float)
    except (TypeError, ValueError):
        return _fail(f"✗ {name}: expected a number, got {answer!r}.")
    # one value is one value, whatever its shape; anything larger must match (no broadcasting)
    one_value = answer_array.size == expected_array.size == 1
    if answer_array.shape != expected_array.shape and not one_value:
        return _fail(f"✗ {name} has shape {answer_array.shape}; expected shape "
                     f"{expected_array.shape}.")
    passed = bool(np.allclose(answer_array, expected_array, rtol=rtol, atol=atol))
    if passed:
        print(f"✓ {name} is correct.")
        return
    return _fail(f"✗ {name} is off: {np.asarray(answer)} vs the expected value (within {rtol:.0e} "
                 f"relative). {hint}".rstrip())


def equal(answer, expected, *, hint: str = "", name: str = "answer") -> None:
    """Check an exact answer: a string, an integer, a tuple of names."""
    if answer is None or answer is Ellipsis:
        return _fail(f"✗ {name}: no answer yet; replace the ... with your value.")
    if _exactly_equal(answer, expected):
        print(f"✓ {name} is correct.")
        return
    return _fail(f"✗ {name} is not right. {hint}".rstrip())


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
