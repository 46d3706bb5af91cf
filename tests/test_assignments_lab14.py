"""The programming assignment of lab 14 (ring attention's backward, lab14.4): the instructor's
solution, taken from the lab's solution cell, passes the key's hidden tests, and each wrong
implementation fails the hidden test that names it: keys and values not passed on, the gradients
of keys and values not sent home, and autodiff through the forward (right gradients, the memory
of every ring step's scores).

Programs are exported and rebuilt in this process as a submission's kernel and the grader do
(:func:`clusterlab.course.grading.judge`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import nbformat
import numpy as np
import pytest

from assignment_support import (KEYS, assert_fails_by_name, code_after, judge_solution,
                                key_module, lab_sources, solution_functions)
from clusterlab.course import grading
from clusterlab.device.parallel import context
from conftest import ROOT

_LABEL = "lab14-ring-backward"
# the cell that gives the forward, block_mask and the custom_vjp wiring, then skeleton, solution
_LAB14 = [code_after(nbformat.read(next((ROOT / "labs").glob("14-*.ipynb")), as_version=4),
                     "`with_backward(backward, axis)`"), *lab_sources("14", [_LABEL])]
_KEY14 = grading.load_key(KEYS / "lab14.py")
_FIRST = "gradients S = 12, 3 head(s) of 5 on 3 devices: dq, dk, dv against full causal attention's"
_MEMORY_8 = "the temporary memory S = 256, 2 head(s) of 16 on 8 devices"


def _judge(planted: tuple[str, str] | None = None) -> grading.Verdict:
    return judge_solution(_KEY14, "lab14.4", _LAB14, "ring_attention_backward", planted)


def test_lab14_reference_gradients_equal_jax_grad_of_the_library_reference():
    # the key's float64 formula against autodiff of context.reference_attention (float32)
    rng = np.random.default_rng(0)
    q, k, v, d_out = (rng.standard_normal((10, 2, 4)) for _ in range(4))
    out, lse, *gradients = key_module("lab14").reference_gradients(q, k, v, d_out)

    def attention(q, k, v):
        return context.reference_attention(q[None], k[None], v[None], causal=True)[0]

    with jax.default_matmul_precision("highest"):
        expected_out, vjp = jax.vjp(attention, *(jnp.float32(x) for x in (q, k, v)))
        expected = vjp(jnp.float32(d_out))
    np.testing.assert_allclose(out, expected_out, rtol=1e-5, atol=1e-5)
    for actual, wanted in zip(gradients, expected):
        np.testing.assert_allclose(actual, wanted, rtol=1e-4, atol=1e-5)
    scores = np.einsum("qhe,khe->hqk", q, k) / 2 + np.triu(np.full((10, 10), -np.inf), 1)
    np.testing.assert_allclose(lse, np.log(np.exp(scores).sum(-1)).T, rtol=1e-12)


def test_lab14_solution_passes_the_hidden_tests():
    assert len(_KEY14["lab14.4"].exports) == 8
    verdict = _judge()
    assert verdict.passed, verdict.line


@pytest.mark.parametrize("planted, failed", [
    (("kv, dkv = jax.lax.ppermute((kv, dkv), axis_name, ring)",
      "dkv = jax.lax.ppermute(dkv, axis_name, ring)"), _FIRST),
    (("    dkv = jax.lax.ppermute(dkv, axis_name, ring)   # the last hop",
      "    # the last hop"), _FIRST),
    ((" * scale\n        dk = ", "\n        dk = "), _FIRST),
], ids=["keys and values not passed on (local blocks only)",
        "dk and dv not sent home (the last hop dropped)",
        "the score gradient not scaled by 1/sqrt(Dh)"])
def test_lab14_planted_bug_fails_its_hidden_test_by_name(planted, failed):
    assert_fails_by_name(_judge(planted), failed)


def test_lab14_autodiff_through_the_forward_fails_the_memory_test():
    forward = solution_functions(_LAB14)["ring_attention_forward"]

    def ring_attention_backward(q, k, v, out, lse, d_out, axis_name):
        return jax.vjp(lambda q, k, v: forward(q, k, v, axis_name)[0], q, k, v)[1](d_out)

    verdict = grading.judge(_KEY14, "lab14.4", ring_attention_backward, {})
    assert_fails_by_name(verdict, _MEMORY_8)


def test_lab14_an_all_gather_of_keys_and_values_fails_the_collectives_test():
    # right gradients and small enough temporaries, but the whole sequence's keys gathered
    namespace = solution_functions(_LAB14)
    solution = namespace["ring_attention_backward"]

    def ring_attention_backward(q, k, v, out, lse, d_out, axis_name):
        gathered = jax.lax.all_gather(k, axis_name)
        return solution(q, k + 0 * gathered.sum(0), v, out, lse, d_out, axis_name)

    verdict = grading.judge(_KEY14, "lab14.4", ring_attention_backward, {})
    assert_fails_by_name(verdict, "the collectives S = 12, 3 head(s) of 5 on 3 devices")


def test_lab14_skeleton_is_refused_with_its_error():
    skeleton = solution_functions(_LAB14[:2])["ring_attention_backward"]
    verdict = grading.judge(_KEY14, "lab14.4", skeleton, {})
    assert not verdict.passed and "raised NotImplementedError" in verdict.line
