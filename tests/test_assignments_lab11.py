"""The programming assignments of lab 11 (one decode step's attention against the KV cache,
lab11.4; speculative sampling's verification, lab11.5): the instructor's solution, taken from the
lab's solution cell, passes the key's hidden tests, and each bug planted into it fails the hidden
test that names it.

Programs are exported and rebuilt in this process as a submission's kernel and the grader do
(:func:`clusterlab.course.grading.judge`).
"""

from __future__ import annotations

import pytest

import numpy as np

from assignment_support import (KEYS, assert_fails_by_name, judge_solution, key_module,
                                lab_sources, solution_functions)
from clusterlab.course import grading

_LAB11 = lab_sources("11", ["lab11-decode-attention"])
_KEY11 = grading.load_key(KEYS / "lab11.py")
_CASE = "2 sequence(s), 3 heads of 4, a cache of 10"      # the first hidden case
_DECODING = f"decoding {_CASE}: every step's logits against decode.forward"
_REUSED = f"one step at position 6 of a reused cache ({_CASE})"
_MASK = "jnp.where(seen, scores, -jnp.inf)"
_WRITE_K = "k_cache.at[:, :, t].set(k)"


def _judge(planted: tuple[str, str] | None = None) -> grading.Verdict:
    return judge_solution(_KEY11, "lab11.4", _LAB11, "decode_attention", planted)


def test_lab11_solution_passes_the_hidden_tests():
    assert len(_KEY11["lab11.4"].exports) == 2
    verdict = _judge()
    assert verdict.passed, verdict.line


@pytest.mark.parametrize("planted, failed", [
    ((_WRITE_K, "k_cache.at[:, :, t + 1].set(k)"), _DECODING),
    ((_MASK, "scores"), _DECODING),
    (("shape[2]) <= t", "shape[2]) < t"), _DECODING),
    ((" / jnp.sqrt(jnp.float32(q.shape[-1]))", ""), _DECODING),
    (("jnp.arange(k_cache.shape[2]) <= t", "jnp.any(k_cache != 0, axis=-1)"),
     f"{_REUSED}: its output"),
    ((_WRITE_K, "jnp.where((jnp.arange(k_cache.shape[2]) >= t)[:, None], k[:, :, None], "
                "k_cache)"), f"{_REUSED}: the caches it returns"),
], ids=["the new key written at t + 1", "the whole cache attended, unwritten positions too",
        "the token's own position masked out", "scores not scaled by 1/sqrt(Dh)",
        "unwritten positions told by their zeros, not their position",
        "the new key written over every position from t on (>= for ==)"])
def test_lab11_planted_bug_fails_its_hidden_test_by_name(planted, failed):
    verdict = _judge(planted)
    assert_fails_by_name(verdict, failed)


def test_lab11_skeleton_is_refused_with_its_error():
    skeleton = solution_functions(_LAB11[:1])["decode_attention"]
    verdict = grading.judge(_KEY11, "lab11.4", skeleton, {})
    assert not verdict.passed and "raised NotImplementedError" in verdict.line


_SPEC = lab_sources("11", ["lab11-verify-draft"])


def _judge_verification(planted: tuple[str, str] | None = None) -> grading.Verdict:
    return judge_solution(_KEY11, "lab11.5", _SPEC, "verify_draft", planted)


def test_lab11_verification_solution_passes_the_hidden_tests():
    assert len(_KEY11["lab11.5"].exports) == 3
    verdict = _judge_verification()
    assert verdict.passed, verdict.line


def test_lab11_reference_verification_keeps_the_target_distribution():
    # the key's rule, by itself: over many draws the first emitted token follows p_0, not q_0
    key = key_module("lab11")
    rng = np.random.default_rng(5)
    draft = rng.dirichlet(np.ones(4), 2).astype(np.float32)
    target = rng.dirichlet(np.ones(4), 3).astype(np.float32)
    counts = np.zeros(4)
    for _ in range(20000):
        tokens = np.array([rng.choice(4, p=row / row.sum()) for row in draft], np.int32)
        n, token, _ = key.reference_verification(tokens, draft, target, rng.uniform(size=2),
                                                 rng.uniform())
        counts[tokens[0] if n > 0 else token] += 1
    np.testing.assert_allclose(counts / counts.sum(), target[0], atol=0.015)


@pytest.mark.parametrize("planted, failed", [
    (("accepted = accept_u * q < p", "accepted = accept_u * q < jnp.inf"), "the accepted count"),
    (("p, q = target_probs[rows, draft_tokens], draft_probs",
      "p, q = draft_probs[rows, draft_tokens], draft_probs"), "the accepted count"),
    (("target_probs[n] - draft_row", "target_probs[jnp.minimum(n, k - 1)] - draft_row"),
     "the next token"),
    (("jnp.maximum(target_probs[n] - draft_row, 0.0)", "target_probs[n]"), "the next token"),
], ids=["every draft token accepted", "the draft's probabilities compared with themselves",
        "the bonus token drawn from the last draft position's target row (off by one)",
        "the correction drawn from the target, not from max(p - q, 0)"])
def test_lab11_verification_planted_bug_fails_its_hidden_test_by_name(planted, failed):
    assert_fails_by_name(_judge_verification(planted), failed)


def test_lab11_verification_skeleton_is_refused_with_its_error():
    skeleton = solution_functions(_SPEC[:1])["verify_draft"]
    verdict = grading.judge(_KEY11, "lab11.5", skeleton, {})
    assert not verdict.passed and "raised NotImplementedError" in verdict.line
