"""The programming assignment of lab 08 (``lab08.4``, ``gemm_roofline``: each GEMM's roofline
time and whether it is compute-bound): the instructor's solution, taken from the lab's solution
cell, passes the key's hidden tests on every case, and each bug planted into it fails the hidden
test that names it.

The function is exported and rebuilt in this process as a submission's kernel and the grader do
(:func:`clusterlab.course.grading.judge`).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from assignment_support import (KEYS, assert_fails_by_name, judge_solution, lab_sources,
                                solution_functions)
from clusterlab.course import grading

_LABEL, _EXERCISE, _NAME = "lab08-gemm-roofline", "lab08.4", "gemm_roofline"
_SOURCES = lab_sources("08", [_LABEL])
_KEY08 = grading.load_key(KEYS / "lab08.py")
_A100 = "a GPT-3 layer (s 2048, d 12288, 96 heads, t 8) on an A100 in BF16"
_B200 = "a Llama-like layer (s 4096, b 2, d 4096, f 14336, t 4) on a B200 in FP8"


def _judge(planted: tuple[str, str] | None = None) -> grading.Verdict:
    return judge_solution(_KEY08, _EXERCISE, _SOURCES, _NAME, planted)


def test_lab08_gemm_roofline_solution_passes_every_hidden_case():
    assert len(_KEY08[_EXERCISE].exports) == 3
    verdict = _judge()
    assert verdict.passed, verdict.line


def test_lab08_hidden_cases_mix_both_classes_away_from_the_ridge():
    # a float32 function's classes must not hinge on rounding: every GEMM's intensity 5% or
    # more from the ridge, and every case holds compute- and memory-bound GEMMs
    spec = importlib.util.spec_from_file_location("lab08_key", KEYS / "lab08.py")
    key = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(key)
    for case in key._CASES:
        _, compute_bound = case.expected()
        # Gemm.hbm_bytes counts BF16, 2 bytes a value
        intensity = np.array([g.flops / g.hbm_bytes for g in case.gemms]) * 2 / case.bytes_per_value
        assert np.all(np.abs(np.log(intensity / case.roof.ridge_flops_per_byte)) > 0.05)
        assert compute_bound.any() and not compute_bound.all(), case.name


@pytest.mark.parametrize("planted, failed", [
    (("m * k + k * n + m * n", "m * n"), f"{_A100}: its times"),
    (("jnp.maximum(compute_s, memory_s)", "jnp.minimum(compute_s, memory_s)"),
     f"{_A100}: its times"),
    (("2 * m * n * k", "m * n * k"), f"{_A100}: its times"),
    (("bytes_per_value * (", "2 * ("), f"{_B200}: its times"),
    (("compute_s > memory_s", "compute_s < memory_s"), f"{_A100}: its classes"),
], ids=["bytes of C only, not A, B and C", "min instead of max", "m n k FLOPs, not 2 m n k",
        "always 2 bytes a value (BF16)", "the classes swapped"])
def test_lab08_planted_bug_fails_its_hidden_test_by_name(planted, failed):
    verdict = _judge(planted)
    assert_fails_by_name(verdict, failed)


def test_lab08_python_max_is_refused_with_the_jax_numpy_hint():
    verdict = _judge(("jnp.maximum(compute_s, memory_s)", "max(compute_s, memory_s)"))
    assert not verdict.passed and "jnp.maximum, not max" in verdict.line, verdict.line


def test_lab08_skeleton_is_refused_with_its_error():
    skeleton = solution_functions(_SOURCES[:1])[_NAME]
    verdict = grading.judge(_KEY08, _EXERCISE, skeleton, {})
    assert not verdict.passed and "raised NotImplementedError" in verdict.line
