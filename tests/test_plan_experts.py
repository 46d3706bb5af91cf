"""Expert parallelism in the planner (Workload.moe, Layout.ep, SearchSpace.ep, the CLI's
--expert-parallel): ep = 1 prices every dense model exactly as the planner before experts, the
experts' states are divided by ep, the all-to-all term equals its formula and grows with top-k,
broken rules are named, and a mixture-of-experts model that fits no layout without ep fits
with ep 8.

The MoE model is Mixtral 8x7B's shape (Jiang et al. 2024, Table 1 [jiang2024mixtral]): 32
layers of width 4096, 32 heads (8 key/value heads), 8 gated experts of width 14336 in every
layer, top-2; 46.7e9 parameters in all, 12.9e9 active per token.
"""

import contextlib
import io
import math
from dataclasses import replace

import pytest

from clusterlab.analytic import costmodel, flops, gemm, memory, plan
from clusterlab.analytic.moe import all_to_all_bytes
from clusterlab.analytic.plan import prediction
from clusterlab.analytic.plan.search import search_layouts, SearchSpace
from planner_history import assert_priced_as_before, run_old_planner

#: the commit that brought experts into the planner (its parent is the planner before them)
EP_COMMIT = "87219bb"

MIXTRAL_MOE = plan.MoE(n_experts=8, top_k=2, expert_mlp_width=14336)
MIXTRAL = plan.Workload(46.7e9, 4096, 512, n_tokens=1e12, n_layers=32, d_model=4096,
                        n_heads=32, n_kv_heads=8, moe=MIXTRAL_MOE)
PER_EXPERT = 3 * 4096 * 14336            # a gated expert: gate, up and down, d x f each
W70 = plan.Workload(70e9, 4096, 512, n_tokens=1e12, n_layers=80, d_model=8192, n_heads=64,
                    vocab_size=128_256)


NO_OVERLAP = plan.Assumptions(overlap_grad_reduce=False)


def _cluster(n_gpus: int):
    return plan.cluster("H100", n_gpus, storage_read_bytes_per_s=1e12)


# --- ep = 1 is the planner before experts ----------------------------------------------------

FIELDS = ("memory_bytes", "states_bytes", "activation_bytes", "compute_s", "tp_comm_s",
          "cp_comm_s", "pp_comm_s", "bubble_s", "dp_comm_s", "optimizer_s", "data_wait_s",
          "step_s", "mfu")
DENSE_LAYOUTS = [
    (dict(dp=64, tp=8, pp=1), "flash"),
    (dict(dp=16, tp=8, pp=4, zero_stage=1, micro_batch=2), "selective"),
    (dict(dp=8, tp=4, pp=16, zero_stage=1, virtual_stages=5), "flash"),
    (dict(dp=128, tp=4, pp=1, zero_stage=3), "full"),
]
OLD_SCRIPT = """
import json, sys
from dataclasses import replace
from clusterlab.analytic import plan
from clusterlab.analytic.plan.search import search_layouts, SearchSpace
fields = json.loads(sys.argv[2])
# overlap off: the old planner's fixed fraction and the modelled window differ by design
def no_overlap(assumptions=plan.Assumptions()):
    return replace(assumptions, dp_overlap=0.0)
rows = [[r.run] + [getattr(plan.predict(r.plan.workload, r.plan.hardware, r.plan.layout,
                                        no_overlap(r.plan.assumptions)), f) for f in fields]
        for r in plan.validation_table()]
w = plan.Workload(70e9, 4096, 512, n_tokens=1e12, n_layers=80, d_model=8192, n_heads=64,
                  vocab_size=128_256)
c = plan.cluster("H100", 512, storage_read_bytes_per_s=1e12)
layouts = [[getattr(plan.predict(replace(w, recompute=policy), c, plan.Layout(**kwargs),
                                 no_overlap()), f)
            for f in fields] for kwargs, policy in json.loads(sys.argv[1])]
# the four policies both planners price (the old one's space reads today's gemm policies)
found = search_layouts(w, c, no_overlap(),
                       space=SearchSpace(micro_batches=(1, 2), virtual_stages=(1, 2),
                                         zero_stages=(0, 1),
                                         recompute=("flash", "none", "selective", "full")),
                       limit=8)
search = [found.n_candidates, [[str(p.layout), p.workload.recompute_policy, p.step_s]
                               for p in found.plans]]
import clusterlab.analytic.plan.workload as workload
print(json.dumps([workload.__file__, hasattr(plan.Layout(), "ep"), rows, layouts, search]))
"""


LONG_CONTEXT_ROW = "Llama 3 405B, 16384 H100, 131K context"


def test_ep_1_prices_every_dense_model_exactly_as_the_planner_before_experts(tmp_path):
    """The planner before experts (lib/clusterlab/analytic/plan at EP_COMMIT's parent, on the same
    rest of the library) and this one agree to the last bit: every row of the validation
    table, four dense layouts of a 70B model, and a default-space search's ranking, with the
    data-parallel overlap off in both (the old planner hid a fixed fraction; this one models
    the backward window), but for ZeRO-3's collectives, now run in every micro-batch, and a
    search over ZeRO 0 and 1."""
    where, has_ep, old_rows, old_layouts, (old_candidates, old_ranking) = run_old_planner(
        EP_COMMIT, tmp_path, OLD_SCRIPT, DENSE_LAYOUTS, FIELDS)
    assert where.startswith(str(tmp_path)) and not has_ep   # the old planner ran, without ep

    # the rows the planner before experts had (Llama 3's 131K row came later, issue 38)
    rows = [r for r in plan.validation_table() if r.run != LONG_CONTEXT_ROW]
    assert [r.run for r in rows] == [r[0] for r in old_rows] and len(rows) == 12
    for row, before in zip(rows, old_rows):
        assert row.plan.layout.ep == 1 and row.plan.workload.moe is None
        # multi-head, as the old planner counted activations (Llama 3's rows now carry
        # its 8 key/value heads, which only shrink their memory)
        again = plan.predict(replace(row.plan.workload, n_kv_heads=None), row.plan.hardware,
                             row.plan.layout,
                             replace(row.plan.assumptions, overlap_grad_reduce=False))
        assert_priced_as_before(again, dict(zip(FIELDS, before[1:])), FIELDS)
    for (kwargs, policy), before in zip(DENSE_LAYOUTS, old_layouts):
        p = plan.predict(replace(W70, recompute=policy), _cluster(512),
                         plan.Layout(**kwargs, ep=1), NO_OVERLAP)
        assert_priced_as_before(p, dict(zip(FIELDS, before)), FIELDS)
        assert p.ep_comm_s == 0.0 and p.ep_estimate is None
        assert plan.EP_TERM not in p.breakdown()
    # ZeRO 0 and 1, whose collectives both planners run once a step
    space = SearchSpace(micro_batches=(1, 2), virtual_stages=(1, 2), zero_stages=(0, 1),
                        recompute=("flash", "none", "selective", "full"))
    assert space.ep == (1,) and SearchSpace().ep == (1,)
    for searched in (space, replace(space, ep=(1,))):
        found = search_layouts(W70, _cluster(512), NO_OVERLAP, space=searched, limit=8)
        assert found.n_candidates == old_candidates
        assert [[str(p.layout), p.workload.recompute_policy, p.step_s]
                for p in found.plans] == old_ranking
    print(f"ep = 1 equals the planner before experts: {len(rows)} validation rows, "
          f"{len(DENSE_LAYOUTS)} layouts x {len(FIELDS)} fields, a search of "
          f"{old_candidates} candidates (its {len(old_ranking)} best in the same order)")


# --- the model: parameters, FLOPs, validation -------------------------------------------------

def test_mixtral_counts_its_parameters_and_active_flops():
    """46.7e9 parameters of which 32 x 8 experts of 3 d f; a token runs 2 of the 8, so 12.9e9
    are active (Jiang et al. 2024), and the FLOPs are PaLM's 6 N_active + 12 L s d."""
    assert MIXTRAL.params_per_expert == PER_EXPERT
    assert MIXTRAL.expert_params == 32 * 8 * PER_EXPERT
    active = 46.7e9 - 32 * 6 * PER_EXPERT
    assert round(active / 1e9, 1) == 12.9
    assert MIXTRAL.flops_per_token == flops.transformer_flops_per_token(active, 32, 4096, 4096)
    assert MIXTRAL.flops_per_token < 0.3 * replace(MIXTRAL, moe=None).flops_per_token
    # the expert GEMMs of one token's two copies, forward and backward: 6 FLOPs per expert
    # parameter and copy, the experts' share of 6 N_active per layer
    assert sum(g.flops for g in gemm.expert_mlp_gemms(2, 4096, 14336)) == 6 * 2 * PER_EXPERT
    print(f"Mixtral: {MIXTRAL.expert_params / 1e9:.1f}e9 expert parameters, "
          f"{active / 1e9:.2f}e9 active, {MIXTRAL.flops_per_token / 1e9:.1f} GFLOP per token")


def _moe_layer_parts_s(gpu, rows: int, local_experts: int, routed_tokens: int) -> float:
    """A Mixtral MoE layer (one micro-batch of 4096 tokens, tp 8, sequence parallel) summed
    from clusterlab.analytic.gemm's parts: the dense layer less its MLP GEMMs and GeLU, the
    experts as grouped GEMMs, the router's GEMMs and the dispatcher's kernels."""
    shape = dict(tensor_parallel=8, recompute="flash")
    dense_s = gemm.transformer_layer_time_s(gpu, 4096, 1, 4096, 32, ffn_hidden=43008,
                                            sequence_parallel=True, **shape)
    mlp_s = sum(gemm.gemm_time_s(g, gpu) for g in gemm.transformer_layer_gemms(
        4096, 1, 4096, 32, ffn_hidden=43008, **shape) if g.name.startswith("mlp_"))
    gelu_s = sum(k.hbm_bytes for k in gemm.transformer_layer_elementwise(
        4096, 1, 4096, 32, ffn_hidden=43008, sequence_parallel=True, **shape)
        if k.name == "gelu") / gpu.hbm_bytes_per_s
    experts_s = sum(gemm.grouped_gemm_time_s(g, local_experts, gpu)
                    for g in gemm.expert_mlp_gemms(rows, 4096, 14336, **shape))
    router_s = sum(gemm.gemm_time_s(g, gpu) for g in gemm.router_gemms(routed_tokens, 4096, 8))
    kernels_s = sum(k.hbm_bytes for k in gemm.moe_elementwise(
        routed_tokens, 4096, 14336, top_k=2, n_experts=8, received_rows=rows * local_experts,
        local_experts=local_experts, **shape)) / gpu.hbm_bytes_per_s
    return dense_s - mlp_s - gelu_s + experts_s + router_s + kernels_s


def test_moe_compute_runs_top_k_experts_as_grouped_gemms_and_ep_changes_only_their_shape():
    c = _cluster(64)
    base = plan.predict(MIXTRAL, c, plan.Layout(dp=8, tp=8))
    sharded = plan.predict(MIXTRAL, c, plan.Layout(dp=8, tp=8, ep=8))
    # ep 1: 8 local experts of 4096 * 2 / 8 = 1024 rows; ep 8: one expert of 8 * 1024 rows.
    # The same expert FLOPs on each GPU (balanced load), in fewer, fuller GEMMs.
    assert prediction.expert_rows(MIXTRAL, base.layout) == 1024
    assert prediction.expert_rows(MIXTRAL, sharded.layout) == 8192
    microbatches = 512 // 8
    routed = 4096 // 8                      # sequence parallel: each tp GPU routes s / tp
    assert base.compute_s == pytest.approx(
        microbatches * 32 * _moe_layer_parts_s(c.gpu, 1024, 8, routed), rel=1e-12)
    assert sharded.compute_s == pytest.approx(
        microbatches * 32 * _moe_layer_parts_s(c.gpu, 8192, 1, routed), rel=1e-12)
    assert sharded.compute_s != base.compute_s
    calibrated = plan.predict(MIXTRAL, c, plan.Layout(dp=8, tp=8),
                              plan.Assumptions(compute_efficiency=0.5))
    assert calibrated.compute_s == pytest.approx(
        MIXTRAL.tokens_per_step * MIXTRAL.flops_per_token / (64 * c.gpu.bf16_flops * 0.5),
        rel=1e-12)
    # three dense layers in front (DeepSeek-V3-style): their MLP takes the rest of n_params
    mixed = replace(MIXTRAL, n_params=50e9, moe=replace(MIXTRAL_MOE, n_moe_layers=29))
    dense_width = (50e9 - 29 * 8 * PER_EXPERT - 4 * 4096**2 * 32) / (2 * 4096 * 3)
    assert mixed.mlp_width == pytest.approx(dense_width, rel=1e-12)
    mixed_plan = plan.predict(mixed, c, plan.Layout(dp=8, tp=8))
    dense_layer_s = gemm.transformer_layer_time_s(c.gpu, 4096, 1, 4096, 32,
                                                  ffn_hidden=dense_width, tensor_parallel=8,
                                                  sequence_parallel=True, recompute="flash")
    assert mixed_plan.compute_s == pytest.approx(
        microbatches * (29 * _moe_layer_parts_s(c.gpu, 1024, 8, routed) + 3 * dense_layer_s),
        rel=1e-12)
    print(f"compute {base.compute_s:.2f} s per step, {sharded.compute_s:.2f} s with ep 8 "
          f"(one expert of 8,192 rows per GPU); per-FLOP model {calibrated.compute_s:.2f} s "
          f"at 50% of peak")


@pytest.mark.parametrize("make, match", [
    (lambda: plan.MoE(8, 9, 14336), "top_k \\(9\\) exceeds the 8 experts"),
    (lambda: plan.MoE(8, 2, 14336, capacity_factor=0.0), "capacity_factor"),
    (lambda: plan.MoE(0, 1, 14336), "n_experts"),
    (lambda: replace(MIXTRAL, moe=replace(MIXTRAL_MOE, n_moe_layers=33)),
     "n_moe_layers \\(33\\) exceeds the 32 layers"),
    (lambda: replace(MIXTRAL, n_params=40e9), "n_params counts every parameter"),
    (lambda: replace(MIXTRAL, n_params=45e9, moe=replace(MIXTRAL_MOE, n_moe_layers=31)),
     "leave no MLP beside attention's 4 d\\^2 .* and the experts"),
    (lambda: replace(MIXTRAL, moe=(8, 2, 14336)), "moe must be a plan.MoE"),
    (lambda: SearchSpace(ep=(0,)), "SearchSpace.ep must be positive integers"),
    (lambda: SearchSpace(pp=()), "SearchSpace.pp must be positive integers"),
])
def test_bad_models_are_refused_with_the_fix(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# --- memory: the experts' states / ep -------------------------------------------------------

def test_expert_states_divide_by_ep_and_mixtral_fits_only_with_it():
    """dp 8 x tp 8 on 64 H100 without ZeRO: every GPU holds 1/8 of all 46.7e9 parameters'
    16 bytes, 93 GB, more than the 77 GB usable. With ep 8 it holds 1/64 of the experts:
    fits."""
    c = _cluster(64)
    without = plan.predict(MIXTRAL, c, plan.Layout(dp=8, tp=8))
    assert without.states_bytes == memory.training_memory_per_device(46.7e9 / 8, 8, 0)
    assert not without.fits
    dense = 46.7e9 - MIXTRAL.expert_params
    for ep in (2, 4, 8):
        p = plan.predict(MIXTRAL, c, plan.Layout(dp=8, tp=8, ep=ep))
        assert p.states_bytes == pytest.approx(
            memory.training_memory_per_device(dense / 8, 8, 0)
            + memory.training_memory_per_device(MIXTRAL.expert_params / (8 * ep), 8 // ep, 0),
            rel=1e-12)
        assert p.activation_bytes == without.activation_bytes
        assert p.optimizer_s == pytest.approx(
            (dense / 8 + MIXTRAL.expert_params / (8 * ep)) * 28 / c.gpu.hbm_bytes_per_s,
            rel=1e-12)
    with_ep = plan.predict(MIXTRAL, c, plan.Layout(dp=8, tp=8, ep=8))
    assert with_ep.fits
    # ZeRO-1 shards the experts' optimizer state over the dp / ep GPUs that hold them
    zero1 = plan.predict(MIXTRAL, _cluster(128), plan.Layout(dp=16, tp=8, ep=8, zero_stage=1))
    assert zero1.states_bytes == pytest.approx(
        memory.training_memory_per_device(dense / 8, 16, 1)
        + memory.training_memory_per_device(MIXTRAL.expert_params / 64, 2, 1), rel=1e-12)
    print(f"dp8 tp8: {without.memory_bytes / 1e9:.1f} GB without ep, "
          f"{with_ep.memory_bytes / 1e9:.1f} GB with ep 8 (of {with_ep.memory_limit_bytes / 1e9:.1f})")


def test_search_finds_no_layout_without_ep_and_one_with_ep_8():
    """Without a pipeline and without ZeRO (pp and ZeRO-3 would shard the experts too): no
    layout of 64 H100 holds Mixtral, and the error names expert parallelism; with ep 1 and 8
    the best layout has ep 8, and every layout that fits has it."""
    space = SearchSpace(micro_batches=(1,), virtual_stages=(1,), recompute=("flash",),
                        zero_stages=(0,), pp=(1,))
    with pytest.raises(ValueError, match="No layout fits.*expert parallelism \\(SearchSpace.ep"):
        search_layouts(MIXTRAL, _cluster(64), space=space)
    result = search_layouts(MIXTRAL, _cluster(64), space=replace(space, ep=(1, 8)))
    best = result.plans[0]
    assert best.fits and best.layout.ep == 8 and best.layout.pp == 1
    assert all(p.layout.ep == 8 for p in result.plans)
    assert any(r.reason == "does not fit in memory" for r in result.refused)
    assert best.ep_comm_s > 0 and best.network_model == "untested"
    # a dense model's error does not offer experts
    with pytest.raises(ValueError, match="No layout fits") as dense_error:
        search_layouts(replace(W70, n_params=400e9, vocab_size=None), _cluster(64),
                       space=space)
    assert "expert parallelism" not in str(dense_error.value)
    print(f"best of {result.n_candidates}: {best.layout}, {best.memory_bytes / 1e9:.1f} GB, "
          f"step {best.step_s:.2f} s, all-to-alls {best.ep_comm_s:.2f} s")


# --- the all-to-all term ---------------------------------------------------------------------

@pytest.mark.parametrize("tp, dp, nodes", [(8, 8, 8), (1, 64, 1), (4, 16, 4)])
def test_all_to_all_term_equals_the_formula_and_grows_with_top_k(tp, dp, nodes):
    """Per MoE layer and micro-batch 4 all-to-alls (6 with full recomputation) of
    clusterlab.analytic.moe.all_to_all_bytes' buffer, each cluster_collective's on the GPUs the ep
    group spans: 8 consecutive dp ranks, one node when tp = 1, else across nodes with their
    share of the NICs. The buffer, and the term, grow with k."""
    c = _cluster(64)
    layout = plan.Layout(dp=dp, tp=tp, ep=8)
    microbatches = 512 // dp
    local = 8 // nodes
    spec = replace(c, n_nodes=nodes, gpus_per_node=local)
    if nodes > 1:        # the group's share of each node's NICs: one per GPU (rail-optimized)
        spec = replace(spec, nics_per_node=local)
    terms = []
    for k in (1, 2, 4):
        w = replace(MIXTRAL, moe=replace(MIXTRAL_MOE, top_k=k))
        nbytes = prediction.expert_all_to_all_bytes(w, layout)
        assert nbytes == all_to_all_bytes(4096, d_model=4096, n_experts=8, top_k=k,
                                                  capacity_factor=1.0, bytes_per_element=2)
        assert nbytes == 8 * (4096 * k // 8) * 4096 * 2
        one = costmodel.cluster_collective("all_to_all", nbytes, spec).time_s
        p = plan.predict(w, c, layout)
        assert p.ep_comm_s == pytest.approx(microbatches * 32 * 4 * one, rel=1e-12)
        assert p.ep_estimate.nbytes == nbytes and not p.ep_estimate.validated
        assert p.ep_estimate.n_nodes == nodes
        assert p.breakdown()[plan.EP_TERM] == p.ep_comm_s
        assert p.step_s == pytest.approx(sum(p.breakdown().values()), rel=1e-12)
        full = plan.predict(replace(w, recompute="full"), c, layout)
        assert full.ep_comm_s == pytest.approx(microbatches * 32 * 6 * one, rel=1e-12)
        terms.append(p.ep_comm_s)
    assert terms[0] < terms[1] < terms[2]
    print(f"tp{tp} dp{dp} ep8 on {nodes} node(s): all-to-alls {terms[0]:.3f}, {terms[1]:.3f}, "
          f"{terms[2]:.3f} s per step for k = 1, 2, 4")


@pytest.mark.parametrize("tokens, cf, k", [(4096, 1.0, 2), (1000, 1.25, 2), (7, 2.0, 3),
                                           (2048, 0.5, 8)])
def test_all_to_all_bytes_are_the_buffer_of_the_layer_lab_13_runs(tokens, cf, k):
    """The planner's buffer is the expert layer's (one function, clusterlab.analytic.moe's, which
    lab 13 checks against the compiled layer), E * ceil(cf T k / E) * d * 2 with the rounding."""
    w = replace(MIXTRAL, seq_len=tokens,
                moe=plan.MoE(16, k, 14336, n_moe_layers=1, capacity_factor=cf))
    got = prediction.expert_all_to_all_bytes(w, plan.Layout(dp=16, tp=8, ep=8))
    want = all_to_all_bytes(tokens, d_model=4096, n_experts=16, top_k=k,
                                    capacity_factor=cf, bytes_per_element=2)
    assert got == want
    assert got == 16 * math.ceil(cf * tokens * k / 16) * 4096 * 2
    assert all_to_all_bytes.__module__ == "clusterlab.analytic.moe"   # one function


def test_expert_gradients_are_reduced_over_the_gpus_that_hold_the_same_experts():
    """dp 16 x tp 4 x ep 8: the dense gradients over the 16 dp GPUs (2 per node, 8 nodes),
    the experts' over the 2 that hold the same experts (8 dp ranks apart: 2 nodes)."""
    c = _cluster(64)
    p = plan.predict(MIXTRAL, c, plan.Layout(dp=16, tp=4, ep=8), NO_OVERLAP)
    dense_bytes = (46.7e9 - MIXTRAL.expert_params) / 4 * 2
    expert_bytes = MIXTRAL.expert_params / 32 * 2
    expected = (plan.dp_all_reduce_s(dense_bytes, 2, 8, c)
                + plan.dp_all_reduce_s(expert_bytes, 1, 2, c))
    assert p.dp_comm_s == pytest.approx(expected, rel=1e-12)
    without = plan.predict(MIXTRAL, c, plan.Layout(dp=16, tp=4), NO_OVERLAP)
    assert without.dp_comm_s == pytest.approx(
        plan.dp_all_reduce_s(46.7e9 / 4 * 2, 2, 8, c), rel=1e-12)
    assert p.dp_comm_s < without.dp_comm_s
    print(f"data-parallel all-reduce {without.dp_comm_s:.3f} s without ep, {p.dp_comm_s:.3f} s "
          f"with ep 8")


# --- rules -----------------------------------------------------------------------------------

def test_bad_ep_is_named_by_the_rules_and_predict():
    assert plan.broken_rule(MIXTRAL, plan.Layout(dp=16, tp=4, ep=16)) == \
        "ep does not divide the experts"
    assert plan.broken_rule(MIXTRAL, plan.Layout(dp=4, tp=8, pp=2, ep=8)) == \
        "ep does not divide dp (expert-parallel ranks are data-parallel ranks)"
    assert plan.broken_rule(W70, plan.Layout(dp=8, tp=8, ep=2)) == \
        "expert parallelism needs a mixture-of-experts workload"
    assert plan.broken_rule(MIXTRAL, plan.Layout(dp=8, tp=8, ep=8)) is None
    with pytest.raises(ValueError, match="ep does not divide dp .* an ep \\(here 8\\) dividing "
                                         "dp and the experts \\(8\\)"):
        plan.predict(MIXTRAL, _cluster(64), plan.Layout(dp=4, tp=8, pp=2, ep=8))
    with pytest.raises(ValueError, match="needs a mixture-of-experts workload .* the workload "
                                         "is dense"):
        plan.predict(W70, _cluster(64), plan.Layout(dp=8, tp=8, ep=2))
    with pytest.raises(ValueError, match="dense workload has no all-to-all"):
        prediction.expert_all_to_all_bytes(W70, plan.Layout(dp=8, ep=2))
    # a search whose every ep breaks a rule says which
    space = SearchSpace(micro_batches=(1,), virtual_stages=(1,), recompute=("flash",), ep=(3,))
    with pytest.raises(ValueError, match="refused: .*ep does not divide the experts"):
        search_layouts(MIXTRAL, _cluster(64), space=space)
    assert str(plan.Layout(dp=8, tp=8, ep=8)) == "dp8 tp8 pp1 ep8 ZeRO-0"


def test_validation_table_has_no_moe_row():
    """Why the expert-parallel terms are marked untested: no published MoE training run."""
    assert all(r.plan.workload.moe is None and r.plan.layout.ep == 1
               for r in plan.validation_table())


# --- the command line ------------------------------------------------------------------------

MIXTRAL_ARGS = ["plan", "--params", "46.7e9", "--layers", "32", "--d-model", "4096",
                "--experts", "8", "--top-k", "2", "--expert-mlp", "14336", "--gpus", "64",
                "--batch", "512", "--tokens", "1e12", "--recompute", "flash",
                "--micro-batches", "1", "--virtual-stages", "1", "--zero", "0", "--top", "3"]


def _cli(args: list[str]) -> tuple[int, str, str]:
    from clusterlab.course import cli as cli
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(args)
    return code, out.getvalue(), err.getvalue()


def test_cli_prices_the_expert_parallel_degrees_it_is_given():
    code, out, _ = _cli(MIXTRAL_ARGS + ["--expert-parallel", "8"])
    assert code == 0
    lines = out.splitlines()
    layout_line = next(line for line in lines if line.startswith("layout:"))
    assert " ep8 " in layout_line, layout_line
    term = next(line for line in lines if line.startswith(plan.EP_TERM))
    workload = plan.Workload(46.7e9, 4096, 512, n_tokens=1e12, n_layers=32, d_model=4096,
                             moe=MIXTRAL_MOE)
    space = SearchSpace(micro_batches=(1,), virtual_stages=(1,), recompute=("flash",),
                        zero_stages=(0,), ep=(8,))
    cli_cluster = plan.cluster("H100", 64, storage_read_bytes_per_s=20e9)   # the CLI's storage
    best = search_layouts(workload, cli_cluster, space=space, limit=3).plans[0]
    assert term.startswith(f"{plan.EP_TERM}: {best.ep_comm_s:.3f} s per step, 4 per MoE layer")
    assert "unvalidated: no published all-to-all measurement" in term
    header = next(line for line in lines if line.startswith("layout "))
    assert "ep a2a" in header
    assert "MoE layers of 8 experts (top-2" in out
    code, _, err = _cli(["plan", "--params", "7e9", "--gpus", "8", "--tokens", "1e9",
                         "--top-k", "2"])
    assert code == 2 and "give --experts too" in err
    print(term)


def test_cli_without_a_pipeline_needs_expert_parallelism():
    # as test_search_finds_no_layout_without_ep_and_one_with_ep_8, from the command line
    code, _, err = _cli(MIXTRAL_ARGS + ["--pipeline-parallel", "1"])
    assert code == 2 and "expert parallelism (SearchSpace.ep" in err, err
    code, out, _ = _cli(MIXTRAL_ARGS + ["--pipeline-parallel", "1", "--expert-parallel", "1,8"])
    assert code == 0
    best = next(line for line in out.splitlines() if line.startswith("layout:"))
    assert " pp1 ep8 " in best, best
    rows = [line for line in out.splitlines() if line.startswith("dp")]
    assert rows and all(" pp1 " in row for row in rows)
