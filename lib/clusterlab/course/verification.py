"""Verifications: claims a lab makes about its own run, and the float32 tolerances they use.

Exercise checks (:mod:`clusterlab.course.answers`) grade a student's answer and return a verdict.
The functions here verify the lab itself (a parallel step equals one device, a count from the
compiled program equals its formula, a resume is bit-identical): they print a ✓ line when the
claim holds and raise :class:`VerificationFailed`, naming what differed and by how much, when it
does not, so a lab stops at the first broken claim in Jupyter, under nbval and on GPUs alike.
:mod:`clusterlab.course.check` re-exports every public name (labs call ``check.verify_close(...)``).

JAX is imported inside the functions that use it, not at the top: :mod:`clusterlab.course.check`
re-exports this module, and chapters import ``check`` (for :func:`clusterlab.course.answers.close`)
without JAX.
"""

from __future__ import annotations

import numpy as np

from clusterlab.course.answers import _as_comparable, is_array

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
    if is_array(actual) or is_array(expected):
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
    import jax  # see the module docstring: check imports this module without JAX

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
    import jax  # see the module docstring: check imports this module without JAX

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
    import jax  # see the module docstring: check imports this module without JAX

    return jax.default_matmul_precision("highest")
