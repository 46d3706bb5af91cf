"""Expert parallelism (clusterlab.device.parallel.experts) against the dense single-device MoE: output
and gradients on 2, 4 and 8 devices, dropped tokens against the capacity formula, the
all-to-alls of the compiled program against the byte formula, negative controls, input checks;
and lab 13's programming assignment (the dispatch all-to-all) judged by its key."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from assignment_support import KEYS, lab_sources, solution_functions
from clusterlab.analytic import moe
from clusterlab.course import check, grading
from clusterlab.device import hlo
from clusterlab.device.parallel import experts
from conftest import sub_mesh

AXIS = "expert"
D, H, E, T = 8, 16, 8, 64  # width, expert hidden width, experts, tokens (all devices)
NO_DROP = E / 2  # capacity_factor with C = T/p * k * (E/k) / E = T/p: every slot fits (k <= 2)


@functools.lru_cache(maxsize=None)
def _case(seed: int = 0):
    params = experts.init_moe(jax.random.key(seed), d_model=D, d_hidden=H, n_experts=E)
    x = jax.random.normal(jax.random.key(seed + 1), (T, D))  # f32[T, D]
    return params, x


def _loss(layer):
    """A scalar of the layer's output and its auxiliary loss, weighted so no term cancels."""
    def loss(params, x):
        out = layer(params, x)
        weights = jnp.sin(jnp.arange(out.y.size, dtype=jnp.float32)).reshape(out.y.shape)
        return jnp.sum(weights * out.y) + 0.1 * out.aux_loss
    return loss


def _ep(mesh, **kw):
    return lambda params, x: experts.moe_expert_parallel(params, x, mesh, axis_name=AXIS, **kw)


@functools.lru_cache(maxsize=None)
def _dense(**kw):
    """The dense layer, jitted once per set of options: one compile of the reference, shared by
    the tests, not one per primitive (run op by op, it took 15 s of the first test)."""
    return jax.jit(lambda params, x: experts.moe_dense(params, x, **kw))


@pytest.mark.parametrize("p", [2, 4, 8])
def test_output_and_gradients_equal_dense_when_nothing_is_dropped(p):
    params, x = _case()
    kw = dict(top_k=2, capacity_factor=NO_DROP)
    with check.fp32_matmuls():
        rtol = check.fp32_rtol()
        ep = jax.jit(_ep(sub_mesh(p, AXIS), **kw))(params, x)
        dense = _dense(**kw)(params, x)
        assert int(ep.dropped) == int(dense.dropped) == 0
        check.verify_close(f"EP output on {p} devices", ep.y, dense.y, rtol=rtol)
        check.verify_close("auxiliary loss", ep.aux_loss, dense.aux_loss, rtol=rtol)
        np.testing.assert_array_equal(ep.expert_load, dense.expert_load)
        grads = jax.jit(jax.grad(_loss(_ep(sub_mesh(p, AXIS), **kw)), argnums=(0, 1)))(params, x)
        reference = jax.jit(jax.grad(_loss(_dense(**kw)), argnums=(0, 1)))(params, x)
        check.verify_close(f"EP gradients (router, w1, w2, x) on {p} devices", grads, reference,
                           rtol=rtol)
    # every gradient is exercised: none is identically zero
    assert all(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(reference))


def test_switch_top1_without_renormalising_equals_dense():
    params, x = _case(3)
    kw = dict(top_k=1, capacity_factor=float(E), renormalize=False)
    with check.fp32_matmuls():
        grads = jax.jit(jax.grad(_loss(_ep(sub_mesh(4, AXIS), **kw))))(params, x)
        reference = jax.jit(jax.grad(_loss(_dense(**kw))))(params, x)
        check.verify_close("top-1 gradients", grads, reference, rtol=check.fp32_rtol())
    # without renormalising, the router learns through the output, not only the aux loss
    no_aux = jax.jit(jax.grad(lambda prm: jnp.sum(_dense(**kw)(prm, x).y)))(params)
    assert float(jnp.max(jnp.abs(no_aux["router"]))) > 0


def test_equal_with_drops_when_dense_routes_the_same_groups():
    params, x = _case()
    kw = dict(top_k=2, capacity_factor=1.0)
    with check.fp32_matmuls():
        ep = jax.jit(_ep(sub_mesh(4, AXIS), **kw))(params, x)
        grouped = _dense(n_groups=4, **kw)(params, x)
        check.verify_close("EP output with drops", ep.y, grouped.y, rtol=check.fp32_rtol())
    assert int(ep.dropped) == int(grouped.dropped) > 0


def _skewed(p: int, hot_per_group: int):
    """Tokens that each pick one known expert: hot_per_group per group pick expert 0, the rest
    experts 1..E-1 in turn. Returns (params, x f32[T, D], target i32[T])."""
    params = experts.init_moe(jax.random.key(7), d_model=D, d_hidden=H, n_experts=E)
    per_group = T // p
    target = np.concatenate([
        np.r_[np.zeros(hot_per_group, int), 1 + np.arange(per_group - hot_per_group) % (E - 1)]
        for _ in range(p)])
    router, x = experts.steered_tokens(jax.random.key(8), target, d_model=D, n_experts=E)
    params = {**params, "router": router}
    return params, x, target


@pytest.mark.parametrize("p, hot", [(2, 20), (4, 12)])
def test_dropped_tokens_equal_capacity_formula_for_a_skewed_router(p, hot):
    capacity_factor = 1.25
    params, x, target = _skewed(p, hot)
    capacity = moe.expert_capacity(T // p, n_experts=E, top_k=1,
                                       capacity_factor=capacity_factor)
    out = jax.jit(_ep(sub_mesh(p, AXIS), top_k=1, capacity_factor=capacity_factor,
                      renormalize=False))(params, x)
    routing = jax.vmap(lambda g: experts.route(params["router"], g, top_k=1,
                                               capacity=capacity))(x.reshape(p, T // p, D))
    np.testing.assert_array_equal(np.asarray(routing.expert).reshape(-1), target)
    formula = p * max(0, hot - capacity)  # the other experts get at most ceil(rest/(E-1)) <= C
    assert formula > 0
    assert moe.predicted_dropped(np.asarray(routing.expert), capacity, E) == formula
    assert int(out.dropped) == formula
    # measured independently of the counter: a dropped top-1 token's output is exactly zero
    assert int(np.sum(np.all(np.asarray(out.y) == 0, axis=1))) == formula
    assert np.asarray(out.expert_load)[0] == p * hot


@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_two_all_to_alls_forward_whose_bytes_scale_with_k(top_k):
    params, x = _case()
    p, cf = 4, 1.0
    forward = jax.jit(_ep(sub_mesh(p, AXIS), top_k=top_k, capacity_factor=cf))
    ops = [op for op in hlo.compiled_collectives(forward, params, x) if op.kind == "all-to-all"]
    expected = moe.all_to_all_bytes(T // p, d_model=D, n_experts=E, top_k=top_k,
                                        capacity_factor=cf)
    assert [op.bytes for op in ops] == [expected, expected]
    assert expected == top_k * (T // p) * D * 4  # cf = 1 and k T/p divisible by E: C = k T/(pE)
    loss = _loss(_ep(sub_mesh(p, AXIS), top_k=top_k, capacity_factor=cf))
    for argnums, n_all_to_all in (((0, 1), 4), (0, 3)):
        backward = jax.jit(jax.grad(loss, argnums=argnums))
        kinds = [op.kind for op in hlo.compiled_collectives(backward, params, x)]
        # each all-to-all's transpose is one more; without x's gradient the dispatch's is dead
        # code (the router's gradient does not flow through the routing's one-hot slots)
        assert kinds.count("all-to-all") == n_all_to_all


def test_bf16_layer_stays_bf16_and_its_all_to_alls_move_two_bytes_a_value():
    # The outside review's B1: masks built at float32 promoted bf16 tokens, so the output came out
    # float32 and each all-to-all moved twice moe.all_to_all_bytes(..., bytes_per_element=2).
    params, x = _case()
    params = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
    x = x.astype(jnp.bfloat16)
    p, top_k, cf = 4, 2, 1.0
    layer = jax.jit(_ep(sub_mesh(p, AXIS), top_k=top_k, capacity_factor=cf))
    out = layer(params, x)
    assert out.y.dtype == jnp.bfloat16
    # The program as traced (before XLA's passes): XLA:CPU widens bf16 collectives to f32 when it
    # compiles (jaxlib 0.10.2), a GPU keeps them bf16; the layer's own dtype is what is judged.
    traced = layer.lower(params, x).as_text(dialect="hlo")
    ops = [op for op in hlo.collectives_in_text(traced) if op.kind == "all-to-all"]
    expected = moe.all_to_all_bytes(T // p, d_model=D, n_experts=E, top_k=top_k,
                                    capacity_factor=cf, bytes_per_element=2)
    assert [op.bytes for op in ops] == [expected, expected]
    # and expert parallelism still equals the dense layer routed in the same groups, in bf16
    dense = _dense(top_k=top_k, capacity_factor=cf, n_groups=p)(params, x).y
    assert dense.dtype == jnp.bfloat16
    error = np.abs(np.asarray(out.y, np.float32) - np.asarray(dense, np.float32)).max()
    assert error <= 0.02 * np.abs(np.asarray(dense, np.float32)).max()


def _wrong_expert(x, m):
    return jnp.roll(experts.DISPATCH_COMBINE.dispatch(x, m), 1, axis=0)  # expert e's slots to e+1


def _unweighted(out, m):
    return experts.DISPATCH_COMBINE.combine(out, m._replace(combine=m.dispatch))


@pytest.mark.parametrize("ops, bug", [
    (experts.MoEOps(_wrong_expert, experts.DISPATCH_COMBINE.combine), "wrong expert"),
    (experts.MoEOps(experts.DISPATCH_COMBINE.dispatch, _unweighted), "unweighted combine")])
def test_negative_controls_are_caught(ops, bug):
    params, x = _case()
    kw = dict(top_k=2, capacity_factor=NO_DROP)
    buggy = jax.jit(_ep(sub_mesh(4, AXIS), ops=ops, **kw))(params, x)
    dense = _dense(**kw)(params, x)
    with pytest.raises(check.VerificationFailed):
        check.verify_close("EP output", buggy.y, dense.y, rtol=check.fp32_rtol())


def test_bad_input_is_refused_with_the_fix():
    params, x = _case()
    with pytest.raises(ValueError, match="6 experts do not divide by 4 devices"):
        six = experts.init_moe(jax.random.key(0), d_model=D, d_hidden=H, n_experts=6)
        experts.moe_expert_parallel(six, x, sub_mesh(4, AXIS), axis_name=AXIS, top_k=1,
                                    capacity_factor=1.0)
    with pytest.raises(ValueError, match="top_k must be between 1 and the number of experts"):
        experts.moe_dense(params, x, top_k=E + 1, capacity_factor=1.0)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="capacity_factor must be > 0"):
            experts.moe_expert_parallel(params, x, sub_mesh(2, AXIS), axis_name=AXIS, top_k=2,
                                        capacity_factor=bad)
    with pytest.raises(ValueError, match="not 'model'"):
        experts.moe_expert_parallel(params, x, sub_mesh(2, AXIS), axis_name="model", top_k=2,
                                    capacity_factor=1.0)
    with pytest.raises(ValueError, match="tokens do not divide by 8 devices"):
        experts.moe_expert_parallel(params, x[:60], sub_mesh(8, AXIS), axis_name=AXIS, top_k=2,
                                    capacity_factor=1.0)
    with pytest.raises(ValueError, match="x must be tokens"):
        experts.moe_dense(params, x[:, :4], top_k=2, capacity_factor=1.0)


def test_pure_helpers():
    assert moe.expert_capacity(64, n_experts=8, top_k=2, capacity_factor=1.0) == 16
    assert moe.expert_capacity(10, n_experts=8, top_k=1, capacity_factor=1.25) == 2  # ceil
    # group 0: expert 0 four times against C = 2 (2 dropped); group 1: balanced (none)
    assignments = np.array([[[0], [0], [0], [0]], [[0], [1], [2], [3]]])
    assert moe.predicted_dropped(assignments, 2, 4) == 2
    assert moe.all_to_all_bytes(16, d_model=8, n_experts=8, top_k=2,
                                    capacity_factor=1.0) == 8 * 4 * 8 * 4
    assert experts.straggler_factor(np.array([4, 1, 1, 1, 1, 1, 1, 1]), 4) == pytest.approx(
        5 / 2.75)
    assert experts.straggler_factor(np.ones(8), 8) == 1.0
    # Switch's loss: 1 for a uniform load, E when one expert takes every token with certainty
    uniform = experts.load_balancing_loss(jnp.full(4, 8), jnp.full(4, 8.0), 32, 1)
    collapsed = experts.load_balancing_loss(jnp.array([32, 0, 0, 0]),
                                            jnp.array([32.0, 0, 0, 0]), 32, 1)
    assert float(uniform) == pytest.approx(1.0) and float(collapsed) == pytest.approx(4.0)


# ---- the programming assignment lab13.4 (the dispatch all-to-all), judged by the key -------

_KEY13 = grading.load_key(KEYS / "lab13.py")
_LAB13 = lab_sources("13", ["lab13-dispatch"])
_A2A = "jax.lax.all_to_all(buffers, axis_name, split_axis=0, concat_axis=1, tiled=True)"
_GATHERED = ("jax.lax.dynamic_slice_in_dim(jax.lax.all_gather(buffers, axis_name, axis=1, "
             "tiled=True), jax.lax.axis_index(axis_name) * (buffers.shape[0] // "
             "jax.lax.axis_size(axis_name)), buffers.shape[0] // jax.lax.axis_size(axis_name), 0)")


def _judge13(planted=None) -> grading.Verdict:
    return grading.judge(_KEY13, "lab13.4",
                         solution_functions(_LAB13, planted)["dispatch_to_experts"], {})


def test_lab13_dispatch_solution_passes_on_2_4_and_8_devices():
    assert sorted(e.n_devices for e in _KEY13["lab13.4"].exports) == [2, 4, 8]
    verdict = _judge13()
    assert verdict.passed, verdict.line


@pytest.mark.parametrize("planted, failed", [
    ((_A2A, _A2A.replace("concat_axis=1", "concat_axis=0")), "experts' slots on 2 devices"),
    ((_A2A, _GATHERED), "runs [('all-gather'"),  # right values, the wrong collective
])
def test_lab13_dispatch_bugs_fail_the_hidden_test_that_names_them(planted, failed):
    verdict = _judge13(planted)
    assert not verdict.passed and failed in verdict.line, verdict.line


def test_lab13_skeleton_is_refused():
    skeleton = {}
    exec(_LAB13[0].split("check.answer")[0], {"jax": jax}, skeleton)
    verdict = grading.judge(_KEY13, "lab13.4", skeleton["dispatch_to_experts"], {})
    assert not verdict.passed and "NotImplementedError" in verdict.line


# ---- claims lab 13 states and these tests hold ----------------------------------------------

@pytest.mark.parametrize("top_k, capacity_factor", [(1, 1.0), (2, 1.0), (2, 0.5)])
def test_route_renormalises_and_serves_assignments_first_come_in_token_order(top_k,
                                                                             capacity_factor):
    params, x = _case()
    capacity = moe.expert_capacity(T, n_experts=E, top_k=top_k, capacity_factor=capacity_factor)
    routing = experts.route(params["router"], x, top_k=top_k, capacity=capacity)
    np.testing.assert_allclose(np.asarray(routing.weight).sum(-1), np.ones(T), rtol=1e-6)
    order = np.asarray(routing.expert).ravel()         # token 0's choices best first, then 1's
    slots = np.asarray(routing.position).ravel()
    for e in range(E):
        np.testing.assert_array_equal(slots[order == e], np.arange(np.sum(order == e)))
    kept = np.asarray(routing.kept)
    assert kept.shape == (T, top_k)                    # kept + dropped = T * k
    np.testing.assert_array_equal(kept.ravel(), slots < capacity)


def test_straggler_factor_with_one_expert_per_device_is_the_hot_share_over_the_mean():
    lab13_load = np.r_[128, np.full(7, 32)]            # lab 13: 8 experts on 8 devices
    lab12_load = np.r_[4.0, np.ones(31)]               # lab 12: 32 experts on 32 GPUs
    for load in (lab13_load, lab12_load):
        assert experts.straggler_factor(load, load.size) == pytest.approx(
            load.max() / load.mean(), rel=1e-12)
