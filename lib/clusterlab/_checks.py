"""Input checks shared by the model modules: each names the argument and the constraint."""

from __future__ import annotations

import math


def number(name: str, value: float) -> float:
    """``float(value)``, or a ValueError naming the argument."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}.")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}.") from None


def positive(name: str, value: float, *, allow_zero: bool = False) -> float:
    """``float(value)`` after checking it is finite and > 0 (>= 0 with ``allow_zero``)."""
    v = number(name, value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        bound = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name} must be a {bound} finite number, got {value!r}.")
    return v


def count(name: str, value: int, *, minimum: int = 1) -> int:
    """``int(value)`` after checking it is a whole number >= ``minimum``."""
    v = number(name, value)
    if not math.isfinite(v) or v != int(v) or v < minimum:
        bound = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {bound}, got {value!r}.")
    return int(v)
