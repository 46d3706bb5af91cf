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


# --- Tolerances for float32 comparisons, per backend -----------------------------------------
#
# A lab compares a sharded computation with one device's. In float32 the two differ by rounding
# only, because a sum split into partial sums is added in another order; how large that
# rounding is depends on how the backend computes a float32 matmul. JAX leans toward speed:
# by default a float32 dot runs in float32 on CPUs, in TensorFloat32 (inputs rounded to a 10-bit
# mantissa, unit roundoff 2**-11 = 4.9e-4) on NVIDIA GPUs from Ampere on, and in one bfloat16
# pass (8-bit mantissa, 2**-8 = 3.9e-3) on TPUs (JAX's "Matmul precision" docs; jax issue
# #18934). A tolerance that holds on a CPU (1e-5) then fails on an H100 although nothing is
# wrong, and one loose enough for TF32 everywhere may let a bug through.
#
# So the labs do both things in one place: `fp32_matmuls()` pins float32 matmuls to full
# float32 ("highest") around a check, and `fp32_rtol()` derives the tolerance from the
# precision the backend will actually use, which inside the pin is float32 everywhere. The
# injected bugs of the labs' negative controls (a sum for a mean, a missing all-reduce, a
# reordered schedule, a dropped cache update) differ by 0.2 to 7 relative, above even the
# loosest tolerance below; tests/test_fp32_tolerance.py holds them to it.

# Relative tolerance of one pass (gradients, logits, losses) compared across summation orders,
# by how float32 matmuls are computed: about 10-100 unit roundoffs of the matmul inputs, and
# for float32 ten times the largest difference the labs measure (1.1e-6).
FP32_RTOL: dict[str, float] = {
    "float32": 1e-5,          # true float32 (24-bit mantissa): CPUs, or pinned to "highest"
    "bfloat16_3x": 1e-4,      # TPU "high": three bfloat16 passes, about 16 mantissa bits
    "tensorfloat32": 5e-3,    # NVIDIA tensor cores, 10-bit mantissa: ten unit roundoffs
    "bfloat16": 5e-2,         # one bfloat16 pass, 8-bit mantissa: ten unit roundoffs
}
# Parameters after Adam steps: Adam divides each gradient by its running size, so an element
# whose gradient is near zero moves by up to the learning rate on a rounding-level change
# (lab 03 measures 4.2e-5 after 6 steps in float32). Only full float32 keeps that small; under
# TF32 or bfloat16 a wrong gradient scale would hide in it, so there is no such tolerance.
FP32_TRAINED_RTOL = 1e-3

# jax_default_matmul_precision's values for float32 inputs, as each platform computes them.
_PRECISION_BY_SETTING = {
    "gpu": {None: "tensorfloat32", "default": "tensorfloat32", "high": "tensorfloat32",
            "tensorfloat32": "tensorfloat32", "TF32_TF32_F32": "tensorfloat32",
            "bfloat16": "bfloat16", "BF16_BF16_F32": "bfloat16",
            "BF16_BF16_F32_X3": "bfloat16_3x"},
    "tpu": {None: "bfloat16", "default": "bfloat16", "bfloat16": "bfloat16",
            "BF16_BF16_F32": "bfloat16", "high": "bfloat16_3x", "tensorfloat32": "bfloat16_3x",
            "BF16_BF16_F32_X3": "bfloat16_3x"},
}
_FULL_FP32_SETTINGS = ("highest", "float32", "F32_F32_F32", "BF16_BF16_F32_X6",
                       "BF16_BF16_F32_X9", "TF32_TF32_F32_X3")


def matmul_precision(*, platform: str | None = None, setting: str | None = ...) -> str:
    """How a float32 matmul is computed: ``"float32"``, ``"tensorfloat32"``, ``"bfloat16_3x"``
    or ``"bfloat16"``.

    Args:
        platform: ``"cpu"``, ``"gpu"`` (``"cuda"``, ``"rocm"``) or ``"tpu"``; default JAX's
            default backend.
        setting: a value of ``jax_default_matmul_precision`` (``None`` is JAX's default);
            default the current one, as :func:`fp32_matmuls` or ``jax.default_matmul_precision``
            set it.

    XLA:CPU computes float32 dots in float32 whatever the setting. On GPUs the default and
    ``"high"`` mean TF32 (on Ampere and later; a V100 has no TF32 and computes float32, so this
    errs on the safe side there); on TPUs the default is one bfloat16 pass.

    Raises:
        ValueError: for a platform or a setting this table does not know (a float8 or float16
            algorithm is not a float32 precision).
    """
    import jax  # the exercise checks above must not need JAX

    if setting is ...:
        setting = jax.config.jax_default_matmul_precision
    platform = (platform or jax.default_backend()).lower()
    platform = {"cuda": "gpu", "rocm": "gpu"}.get(platform, platform)
    if platform not in ("cpu", "gpu", "tpu"):
        raise ValueError(f"matmul_precision knows the platforms cpu, gpu and tpu; got "
                         f"{platform!r}.")
    if platform == "cpu" or setting in _FULL_FP32_SETTINGS:
        return "float32"
    try:
        return _PRECISION_BY_SETTING[platform][setting]
    except KeyError:
        raise ValueError(f"jax_default_matmul_precision={setting!r} is not a float32 matmul "
                         f"precision this course compares at; use check.fp32_matmuls() to pin "
                         f"'highest'.") from None


def fp32_rtol(*, trained: bool = False, platform: str | None = None,
              setting: str | None = ...) -> float:
    """The relative tolerance for comparing a sharded float32 result with one device's.

    Args:
        trained: the values compared are parameters after optimizer (Adam) steps, which
            amplify rounding (see ``FP32_TRAINED_RTOL``); else one pass: gradients, logits,
            losses.
        platform, setting: as in :func:`matmul_precision`; default the current backend and
            ``jax_default_matmul_precision``.

    Returns:
        ``FP32_RTOL`` of the matmul precision in force: 1e-5 in float32 (any CPU; any backend
        inside :func:`fp32_matmuls`), 5e-3 in TF32 (a GPU at JAX's default), 5e-2 in bfloat16
        (a TPU at JAX's default); with ``trained``, ``FP32_TRAINED_RTOL`` (1e-3).

    Raises:
        ValueError: with ``trained`` where matmuls are not full float32: pin them with
            :func:`fp32_matmuls` first.
    """
    precision = matmul_precision(platform=platform, setting=setting)
    if not trained:
        return FP32_RTOL[precision]
    if precision != "float32":
        raise ValueError(f"Parameters after Adam steps can only be compared in full float32, "
                         f"and float32 matmuls here run in {precision}: run the comparison "
                         "inside `with check.fp32_matmuls():`.")
    return FP32_TRAINED_RTOL


def fp32_matmuls():
    """A context manager that computes float32 matmuls in full float32 on every backend.

    ``with check.fp32_matmuls(): ...`` is ``jax.default_matmul_precision("highest")``: programs
    traced inside it (the setting is part of jit's cache key, so a jitted function called
    inside it is traced anew) round no matmul input to TF32 or bfloat16. Labs run a check's
    reference *and* the computation under test inside it, so the check holds at
    :func:`fp32_rtol`'s float32 tolerance on GPUs as on CPUs; timings run outside it, at JAX's
    default speed.
    """
    import jax

    return jax.default_matmul_precision("highest")
