"""Context parallelism in the planner (Layout.cp): cp = 1 prices as before the change, memory
and compute fall by cp where the formulas say, the K/V all-gather's bytes and time follow the
formula, the rules are named, and a long-sequence search picks cp where memory demands it."""

from dataclasses import replace

import pytest

from clusterlab.analytic import costmodel, memory, plan
from clusterlab.analytic.plan import prediction
from clusterlab.analytic.plan.search import search_layouts, SearchSpace
from clusterlab.device.parallel import context
from planner_history import assert_priced_as_before, run_old_planner

#: the commit before context parallelism entered the planner (its parent is the old planner)
CP_COMMIT = "e4cc5b1"

# Llama-3-70B-like: 80 layers x 8192, 64 heads, 8 key/value heads of 128
W70 = plan.Workload(70e9, 4096, 512, n_tokens=1e12, n_layers=80, d_model=8192, n_heads=64,
                    n_kv_heads=8, vocab_size=128_256)
LONG = replace(W70, seq_len=131_072, global_batch=64, n_tokens=1e11, vocab_size=None)


NO_OVERLAP = plan.Assumptions(overlap_grad_reduce=False)


def _cluster(n_gpus: int):
    return plan.cluster("H100", n_gpus, storage_read_bytes_per_s=1e12)


# Layouts of 512 H100s, one per regime: tp only, pipeline with ZeRO-1, interleaved, full
# recomputation with ZeRO-3.
OLD_LAYOUTS = [
    (dict(dp=64, tp=8, pp=1), "flash"),
    (dict(dp=16, tp=8, pp=4, zero_stage=1, micro_batch=2), "selective"),
    (dict(dp=8, tp=4, pp=16, zero_stage=1, virtual_stages=5), "flash"),
    (dict(dp=128, tp=4, pp=1, zero_stage=3), "full"),
]
FIELDS = ("memory_bytes", "states_bytes", "activation_bytes", "compute_s", "tp_comm_s",
          "pp_comm_s", "bubble_s", "dp_comm_s", "optimizer_s", "data_wait_s", "step_s")
OLD_SCRIPT = """
import json, sys
from dataclasses import replace
from clusterlab.analytic import plan
layouts = json.loads(sys.argv[1])
w = plan.Workload(70e9, 4096, 512, n_tokens=1e12, n_layers=80, d_model=8192, n_heads=64,
                  vocab_size=128_256)
c = plan.cluster("H100", 512, storage_read_bytes_per_s=1e12)
out = []
for kwargs, policy in layouts:
    # overlap off: the old planner's fixed fraction and the modelled window differ by design
    p = plan.predict(replace(w, recompute=policy), c, plan.Layout(**kwargs),
                     plan.Assumptions(dp_overlap=0.0))
    out.append({f: getattr(p, f) for f in json.loads(sys.argv[2])})
import clusterlab.analytic.plan.workload as workload
print(json.dumps([workload.__file__, hasattr(plan.Layout(), "cp"), out]))
"""


def test_cp_1_prices_every_layout_exactly_as_the_planner_before_cp(tmp_path):
    """The old planner (lib/clusterlab/analytic/plan at the commit before cp) and this one, on the same
    rest of the library, agree to the last bit for cp = 1, with the data-parallel overlap off
    in both (the old planner hid a fixed fraction; this one models the backward window), but
    for ZeRO-3's collectives, now run in each of the layout's 4 micro-batches."""
    where, has_cp, old = run_old_planner(CP_COMMIT, tmp_path, OLD_SCRIPT, OLD_LAYOUTS, FIELDS)
    assert where.startswith(str(tmp_path)) and not has_cp   # the old planner ran, without cp
    for (kwargs, policy), before in zip(OLD_LAYOUTS, old):
        # multi-head, as the old planner's workload (its activations had no K/V heads)
        now = plan.predict(replace(W70, recompute=policy, n_kv_heads=None), _cluster(512),
                           plan.Layout(**kwargs, cp=1), NO_OVERLAP)
        assert_priced_as_before(now, before, FIELDS)
        assert now.cp_comm_s == 0.0 and now.cp_estimate is None
        assert "context-parallel K/V all-gather" not in now.breakdown()
        assert str(now.layout) == str(plan.Layout(**kwargs))
    print(f"cp = 1 equals the old planner on {len(old)} layouts x {len(FIELDS)} fields")


@pytest.mark.parametrize("cp", [2, 4, 8])
@pytest.mark.parametrize("efficiency", [None, 0.5])
def test_memory_and_compute_fall_by_cp(cp, efficiency):
    """The same dp x tp x pp on cp times the GPUs: activations and compute / cp, the model
    states the same (ZeRO-0) or sharded over dp * cp (ZeRO-1), the step's tp messages / cp."""
    assumptions = plan.Assumptions(compute_efficiency=efficiency)
    kwargs = dict(dp=4, tp=4, pp=4, micro_batch=1)
    one = plan.predict(LONG, _cluster(64), plan.Layout(**kwargs), assumptions)
    many = plan.predict(LONG, _cluster(64 * cp), plan.Layout(**kwargs, cp=cp), assumptions)
    assert many.activation_bytes == pytest.approx(one.activation_bytes / cp, rel=1e-12)
    assert many.compute_s == pytest.approx(one.compute_s / cp, rel=1e-12)
    assert many.states_bytes == one.states_bytes
    assert many.model_flops_per_step == one.model_flops_per_step
    # the tp all-reduce carries s/cp tokens: cheaper, not cp times (latency stays)
    assert many.tp_comm_s < one.tp_comm_s
    zero1 = plan.predict(LONG, _cluster(64 * cp), plan.Layout(**kwargs, cp=cp, zero_stage=1))
    n_local = LONG.n_params / (4 * 4)
    assert zero1.states_bytes == pytest.approx(
        memory.training_memory_per_device(n_local, 4 * cp, 1), rel=1e-12)
    assert zero1.states_bytes < many.states_bytes
    print(f"cp={cp}, efficiency {efficiency}: activations {one.activation_bytes / 1e9:.1f} -> "
          f"{many.activation_bytes / 1e9:.2f} GB, compute {one.compute_s:.2f} -> "
          f"{many.compute_s:.3f} s")


@pytest.mark.parametrize("cp", [2, 4, 8, 16])
def test_zigzag_gives_every_gpu_one_cpth_of_the_causal_work(cp):
    """Why compute / cp holds for causal attention: zig-zag chunks give each GPU the same
    number of score blocks, 1/cp of all; the contiguous split does not (negative control)."""
    zigzag = context.causal_blocks_per_device(cp, "zigzag")
    assert len(set(zigzag)) == 1 and zigzag[0] * cp == sum(zigzag)
    contiguous = context.causal_blocks_per_device(cp, "contiguous")
    assert max(contiguous) > sum(contiguous) / cp
    print(f"cp={cp}: zig-zag {zigzag[0]} blocks per GPU; contiguous {min(contiguous)} to "
          f"{max(contiguous)}")


@pytest.mark.parametrize("tp, cp, micro_batch, nodes", [(8, 2, 1, 2), (2, 4, 1, 1),
                                                         (4, 16, 2, 8), (1, 8, 1, 1)])
def test_kv_all_gather_bytes_and_time_follow_the_formula(tp, cp, micro_batch, nodes):
    """Bytes: 2 (K, V) x kv_heads/tp x head_dim x s/cp x micro-batch x 2 bytes per GPU; time:
    per layer of the stage and micro-batch two all-gathers and one reduce-scatter of the
    gathered buffer, each cluster_collective's on the GPUs the cp group spans."""
    layout = plan.Layout(dp=2, tp=tp, pp=2, cp=cp, micro_batch=micro_batch)
    c = _cluster(layout.n_gpus)
    per_gpu = prediction.kv_all_gather_bytes(LONG, layout)
    assert per_gpu == 2 * (8 / tp) * 128 * (131_072 / cp) * micro_batch * 2
    local = min(cp, 8 // tp)
    assert local * nodes == cp
    spec = replace(c, n_nodes=nodes, gpus_per_node=local)
    if nodes > 1:        # the group's share of each node's NICs: one per GPU (rail-optimized)
        spec = replace(spec, nics_per_node=local)
    gather = costmodel.cluster_collective("all_gather", per_gpu * cp, spec).time_s
    scatter = costmodel.cluster_collective("reduce_scatter", per_gpu * cp, spec).time_s
    p = plan.predict(LONG, c, layout)
    microbatches = LONG.global_batch // layout.dp // micro_batch
    expected = microbatches * (80 / 2) * (2 * gather + scatter)
    assert p.cp_comm_s == pytest.approx(expected, rel=1e-12)
    assert p.breakdown()["context-parallel K/V all-gather"] == p.cp_comm_s
    assert p.step_s == pytest.approx(sum(p.breakdown().values()), rel=1e-12)
    full = plan.predict(replace(LONG, recompute="full"), c, layout)
    assert full.cp_comm_s == pytest.approx(microbatches * 40 * (3 * gather + scatter), rel=1e-12)
    print(f"tp{tp} cp{cp} mbs{micro_batch}: {per_gpu / 2**20:.1f} MiB per GPU per layer, "
          f"{p.cp_comm_s:.3f} s per step on {nodes} node(s)")


def test_broken_rules_are_named():
    bad_seq = replace(LONG, seq_len=131_072 + 8)          # 131080 = 8 x 16385: not 2*16 | s
    rule = plan.broken_rule(bad_seq, plan.Layout(dp=2, tp=4, pp=1, cp=16))
    assert rule == "sequence not divisible into 2 * cp zig-zag chunks"
    assert plan.broken_rule(bad_seq, plan.Layout(dp=2, tp=4, pp=1, cp=4)) is None
    thirds = replace(LONG, seq_len=98_304)                 # 6 x 16384: zig-zag over cp = 3 works
    assert plan.broken_rule(thirds, plan.Layout(dp=2, tp=2, pp=1, cp=3)) is None
    rule = plan.broken_rule(thirds, plan.Layout(dp=2, tp=2, pp=1, cp=3), gpus_per_node=8)
    assert rule == "tp * cp neither divides a node nor is whole nodes"
    assert plan.broken_rule(LONG, plan.Layout(dp=2, tp=4, pp=1, cp=4), gpus_per_node=8) is None
    # ZeRO shards over dp * cp: dp = 1 with cp > 1 is allowed, dp = cp = 1 is not
    assert plan.broken_rule(LONG, plan.Layout(dp=1, tp=8, cp=2, zero_stage=1)) is None
    assert plan.broken_rule(LONG, plan.Layout(dp=1, tp=8, zero_stage=1)) == "ZeRO needs dp > 1"
    with pytest.raises(ValueError, match="2 \\* cp zig-zag chunks"):
        plan.predict(bad_seq, _cluster(128), plan.Layout(dp=2, tp=4, pp=1, cp=16))
    with pytest.raises(ValueError, match="tp \\* cp neither divides"):
        plan.predict(thirds, _cluster(96), plan.Layout(dp=16, tp=2, pp=1, cp=3))
    with pytest.raises(ValueError, match="dp\\*tp\\*pp\\*cp = 256 GPUs .* has 512"):
        plan.predict(LONG, _cluster(512), plan.Layout(dp=8, tp=8, pp=1, cp=4))
    with pytest.raises(ValueError, match="n_kv_heads"):
        replace(W70, n_kv_heads=7)
    print("rules named: zig-zag divisibility, tp * cp placement, GPU count, kv heads")


def test_default_search_space_has_no_cp_and_the_same_candidates():
    assert SearchSpace().cp == (1,)
    space = SearchSpace(micro_batches=(1, 2), virtual_stages=(1,))
    default = search_layouts(W70, _cluster(512), space=space, limit=5)
    explicit = search_layouts(W70, _cluster(512), space=replace(space, cp=(1,)), limit=5)
    assert default.n_candidates == explicit.n_candidates
    assert [p.step_s for p in default.plans] == [p.step_s for p in explicit.plans]
    assert all(p.layout.cp == 1 for p in default.plans)


def test_long_sequences_need_cp_and_the_search_picks_it():
    """A 70B model at 131,072 tokens on 512 H100s with FlashAttention (no full recomputation):
    no layout fits without cp; with cp in (1, 2, 4, 8, 16) the best does, with cp > 1, and
    every layout that fits has cp large enough to bring the activations under the limit."""
    space = SearchSpace(micro_batches=(1,), virtual_stages=(1,), recompute=("flash",))
    with pytest.raises(ValueError, match="No layout fits"):
        search_layouts(LONG, _cluster(512), space=space)
    for cp in (2, 4):    # nor with cp 2 or 4 alone: memory demands more
        with pytest.raises(ValueError, match="No layout fits"):
            search_layouts(LONG, _cluster(512), space=replace(space, cp=(1, cp)))
    result = search_layouts(LONG, _cluster(512), space=replace(space, cp=(1, 2, 4, 8, 16)))
    best = result.plans[0]
    assert best.fits and best.layout.cp > 1
    assert all(p.layout.cp >= 8 for p in result.plans)
    assert best.cp_comm_s > 0 and best.cp_comm_s < best.compute_s
    print(f"best of {result.n_candidates}: {best.layout}, {best.memory_bytes / 1e9:.1f} GB of "
          f"{best.memory_limit_bytes / 1e9:.1f}, step {best.step_s:.1f} s, K/V collectives "
          f"{best.cp_comm_s:.2f} s, MFU {100 * best.mfu:.1f}%; "
          f"{len(result.plans)} fit, all with cp >= {min(p.layout.cp for p in result.plans)}")


def test_cli_searches_the_context_parallel_degrees_it_is_given():
    # 131,072-token sequences of a 70B model on 512 H100s: nothing fits without cp (the error
    # names context parallelism); with --context-parallel 1,8,16 the best layout has cp > 1.
    import contextlib
    import io

    from clusterlab.course import cli as cli
    args = ["plan", "--params", "70e9", "--gpu", "H100", "--gpus", "512", "--seq-len", "131072",
            "--batch", "64", "--tokens", "1e9", "--recompute", "flash", "--top", "1"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli.main(args) == 2
    assert "context parallelism" in err.getvalue()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(args + ["--context-parallel", "1,8,16"]) == 0
    best = next(line for line in out.getvalue().splitlines() if line.startswith("layout:"))
    assert " cp8 " in best or " cp16 " in best, best
