"""Checking exercise answers, with feedback a student can act on.

Each function prints one line, a tick or a hint, and returns whether the answer passed, so a
notebook cell shows the verdict and a test can assert it.

Grading: with the environment variable ``CLUSTERLAB_CHECK_STRICT=1`` a failed check also raises
an ``AssertionError`` carrying the same line, so an instructor can run a submitted notebook with
``CLUSTERLAB_CHECK_STRICT=1 pytest --nbval-lax submitted.ipynb`` and see every wrong or missing
answer as a failing cell.
"""

from __future__ import annotations

import os

import numpy as np

STRICT_ENV = "CLUSTERLAB_CHECK_STRICT"


def _fail(line: str) -> bool:
    """Print a failed verdict; raise it instead of returning when grading strictly."""
    print(line)
    if os.environ.get(STRICT_ENV, "") not in ("", "0"):
        raise AssertionError(line)
    return False


def close(answer, expected, *, rtol: float = 1e-3, atol: float = 0.0, hint: str = "",
          name: str = "answer") -> bool:
    """Check a number (or array) against the expected value within a relative tolerance.

    Args:
        answer: the student's value.
        expected: the reference value.
        rtol: relative tolerance (1e-3 = within 0.1%).
        atol: absolute tolerance.
        hint: what to look at again when the answer is wrong.
        name: what the answer is, for the message.

    Returns:
        True when ``answer`` is within tolerance of ``expected``.
    """
    if answer is None or answer is Ellipsis:
        return _fail(f"✗ {name}: no answer yet; replace the ... with your value.")
    try:
        passed = bool(np.allclose(np.asarray(answer, dtype=float),
                                  np.asarray(expected, dtype=float), rtol=rtol, atol=atol))
    except (TypeError, ValueError):
        return _fail(f"✗ {name}: expected a number, got {answer!r}.")
    if passed:
        print(f"✓ {name} is correct.")
        return True
    return _fail(f"✗ {name} is off: {np.asarray(answer)} vs the expected value (within {rtol:.0e} "
                 f"relative). {hint}".rstrip())


def equal(answer, expected, *, hint: str = "", name: str = "answer") -> bool:
    """Check an exact answer: a string, an integer, a tuple of names."""
    if answer is None or answer is Ellipsis:
        return _fail(f"✗ {name}: no answer yet; replace the ... with your value.")
    if answer == expected:
        print(f"✓ {name} is correct.")
        return True
    return _fail(f"✗ {name} is not right. {hint}".rstrip())
