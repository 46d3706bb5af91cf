"""Checking exercise answers, with feedback a student can act on.

Each function prints one line, a tick or a hint, and returns whether the answer passed, so a
notebook cell shows the verdict and a test can assert it.
"""

from __future__ import annotations

import numpy as np


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
        print(f"✗ {name}: no answer yet; replace the ... with your value.")
        return False
    try:
        passed = bool(np.allclose(np.asarray(answer, dtype=float),
                                  np.asarray(expected, dtype=float), rtol=rtol, atol=atol))
    except (TypeError, ValueError):
        print(f"✗ {name}: expected a number, got {answer!r}.")
        return False
    if passed:
        print(f"✓ {name} is correct.")
    else:
        print(f"✗ {name} is off: {np.asarray(answer)} vs the expected value (within {rtol:.0e} "
              f"relative). {hint}".rstrip())
    return passed


def equal(answer, expected, *, hint: str = "", name: str = "answer") -> bool:
    """Check an exact answer: a string, an integer, a tuple of names."""
    if answer is None or answer is Ellipsis:
        print(f"✗ {name}: no answer yet; replace the ... with your value.")
        return False
    if answer == expected:
        print(f"✓ {name} is correct.")
        return True
    print(f"✗ {name} is not right. {hint}".rstrip())
    return False
