"""The programming assignment lab13.5 (the MoE combine: the experts' buffers back to the tokens,
first-come slots per expert, dropped assignments, the router's weights): the instructor's
solution, taken from the lab's solution cell, passes the key's hidden tests, and each bug
planted into it fails the hidden test that names it.

Programs are exported and rebuilt in this process as a submission's kernel and the grader do
(:func:`clusterlab.course.grading.judge`).
"""

from __future__ import annotations

import importlib.util

import jax
import numpy as np
import pytest

from assignment_support import KEYS, lab_sources, solution_functions
from clusterlab.course import grading
from clusterlab.device.parallel import experts

_KEY13 = grading.load_key(KEYS / "lab13.py")
_SOURCES = lab_sources("13", ["lab13-combine"])
_GATE = "gate = jnp.where(kept, weight, 0.0)"
_POSITION = "jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=1)"


def _key_module():
    spec = importlib.util.spec_from_file_location("lab13_key", KEYS / "lab13.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _judge(planted: tuple[str, str] | None = None) -> grading.Verdict:
    function = solution_functions(_SOURCES, planted)["combine_from_experts"]
    return grading.judge(_KEY13, "lab13.5", function, {})


def test_lab13_combine_hidden_cases_are_unseen_and_drop_tokens():
    key = _key_module()
    assert [e.wrap for e in _KEY13["lab13.5"].exports] == ["jit"] * 3
    assert {(s.n_experts, s.top_k) for s in key._SHAPES}.isdisjoint({(8, 2), (8, 1)})
    assert sorted(s.top_k for s in key._SHAPES) == [1, 2, 3]
    for i, shape in enumerate(key._SHAPES):
        routing = key._hot(shape, 1380 + i)
        assert int(np.sum(~np.asarray(routing.kept))) > 0, shape.name  # the drop test drops
        # the NumPy first-come count is the layer's
        assert np.array_equal(key._first_come(np.asarray(routing.expert)),
                              np.asarray(routing.position))
        expert, _ = key._balanced(shape, 0, weighted=False)
        assert (key._first_come(expert) < shape.capacity).all(), shape.name  # nothing dropped


def test_lab13_combine_reference_is_the_dense_layer():
    # the key's reference (masks + DISPATCH_COMBINE.combine) applied to FFN outputs is moe_dense
    key = _key_module()
    params = experts.init_moe(jax.random.key(0), d_model=6, d_hidden=8, n_experts=4)
    x = jax.random.normal(jax.random.key(1), (20, 6))
    dense = experts.moe_dense(params, x, top_k=2, capacity_factor=1.0)   # C = 10
    assert dense.y.shape == (20, 6)
    r10 = experts.route(params["router"], x, top_k=2, capacity=10)
    m10 = experts.masks(r10, 4, 10)
    out10 = experts.expert_ffn(params["w1"], params["w2"],
                               experts.DISPATCH_COMBINE.dispatch(x, m10))
    np.testing.assert_allclose(key._reference(np.asarray(out10), np.asarray(r10.expert),
                                              np.asarray(r10.weight), np.asarray(r10.position),
                                              10), dense.y, rtol=1e-5, atol=1e-6)


def test_lab13_combine_solution_passes():
    verdict = _judge()
    assert verdict.passed, verdict.line


@pytest.mark.parametrize("planted, failed", [
    ((_GATE, "gate = weight"), "assignments past capacity dropped"),
    ((_GATE, "gate = jnp.where(kept, 1.0, 0.0)"), "weighted by the router"),
    ((_POSITION, "jnp.arange(expert.size)"), "slots first-come per expert"),
    (("expert.reshape(-1), n_experts", "expert.T.reshape(-1), n_experts"),
     "slots first-come per expert"),
], ids=["tokens past capacity kept (read from the last slot)", "combine not weighted by the "
        "router", "slots counted per assignment instead of per expert",
        "slots counted in rank order instead of token order"])
def test_lab13_combine_planted_bug_fails_its_hidden_test_by_name(planted, failed):
    verdict = _judge(planted)
    assert not verdict.passed
    assert f"combine: {failed}: " in verdict.line, verdict.line
    assert "Count each expert's assignments" in verdict.line, verdict.line   # the hint


def test_lab13_combine_skeleton_is_refused_with_its_error():
    skeleton = solution_functions(_SOURCES[:1])["combine_from_experts"]
    verdict = grading.judge(_KEY13, "lab13.5", skeleton, {})
    assert not verdict.passed and "raised NotImplementedError" in verdict.line
