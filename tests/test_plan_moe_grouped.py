"""Mixtures of experts priced as grouped GEMMs (issue 38, items 4 and 5): the experts of a GPU
as Transformer Engine's grouped GEMM of the rows each expert receives, the router and the
dispatcher's permutations by their bytes, the busiest expert's load as the pace
(``MoE.load_imbalance``), the all-to-all on NVLink inside a rack's NVLink domain, and the
published GPT-OSS 120B rows (clusterlab.catalog.published.moe_runs) with their signed errors.

No row sets a parameter: the load imbalance of every row is 1.0 because the benchmarks force
the balance (the summary's note), and nothing else is read from the rows.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest

from clusterlab.analytic import gemm, plan
from clusterlab.analytic.plan import prediction, validation
from clusterlab.catalog import hardware
from clusterlab.catalog.published import moe_runs
from conftest import ROOT

H100 = hardware.gpu("H100")
MIXTRAL_MOE = plan.MoE(n_experts=8, top_k=2, expert_mlp_width=14336)
MIXTRAL = plan.Workload(46.7e9, 4096, 512, n_tokens=1e12, n_layers=32, d_model=4096,
                        n_heads=32, n_kv_heads=8, moe=MIXTRAL_MOE)

#: the published GPT-OSS 120B rows' errors, (predicted - published) / published, with the
#: experts priced as grouped GEMMs and the release's eager expert kernels (the clamp, the fc2
#: bias, moe_act recomputation but on GB300) priced (in moe_runs.ROWS's order)
ERRORS = {"GPT-OSS 120B, 64 H100, NeMo 25.11": 0.509,
          "GPT-OSS 120B, 64 H100, NeMo 26.02": 0.716,
          "GPT-OSS 120B, 64 B200, NeMo 25.11": 1.198,
          "GPT-OSS 120B, 64 GB200, NeMo 25.11": 0.859,
          "GPT-OSS 120B, 64 GB300, NeMo 25.11": 0.691}
#: the same rows with the grouped GEMMs but without the release's eager expert kernels
ERRORS_WITHOUT_RELEASE_KERNELS = {"GPT-OSS 120B, 64 H100, NeMo 25.11": 0.712,
                                  "GPT-OSS 120B, 64 H100, NeMo 26.02": 0.923,
                                  "GPT-OSS 120B, 64 B200, NeMo 25.11": 1.317,
                                  "GPT-OSS 120B, 64 GB200, NeMo 25.11": 1.126,
                                  "GPT-OSS 120B, 64 GB300, NeMo 25.11": 0.872}


# --- the grouped GEMM -----------------------------------------------------------------------

def _tile_s(k: int) -> float:
    """One 256 x 128 tile of depth k on one of the H100's 132 SMs at the MAMF ceiling."""
    return 2 * 256 * 128 * k / (H100.bf16_flops * gemm.matmul_ceiling(H100) / H100.sm_count)


def test_grouped_gemm_runs_four_experts_at_a_time_in_shared_waves():
    """GPT-OSS's fc1 of one expert over 1,024 rows: 4 x 45 = 180 tiles. Alone it takes two
    waves of 132 SMs; four on Transformer Engine's four streams share 6 waves (720 tiles);
    sixteen at once would share 22 (2,880 tiles)."""
    fc1 = gemm.Gemm("expert_fc1", 1024, 5760, 2880)
    separate = gemm.grouped_gemm_time_s(fc1, 16, H100, streams=1)
    grouped = gemm.grouped_gemm_time_s(fc1, 16, H100)
    pooled = gemm.grouped_gemm_time_s(fc1, 16, H100, streams=16)
    assert separate == pytest.approx(16 * 2 * _tile_s(2880), rel=1e-12)
    assert grouped == pytest.approx(4 * 6 * _tile_s(2880), rel=1e-12)
    assert pooled == pytest.approx(22 * _tile_s(2880), rel=1e-12)
    assert pooled < grouped < separate
    # a last round of two: 4 + 2 experts
    assert gemm.grouped_gemm_time_s(fc1, 6, H100) == pytest.approx(
        gemm.gemm_time_s(replace(fc1, batch=4), H100)
        + gemm.gemm_time_s(replace(fc1, batch=2), H100), rel=1e-12)
    assert gemm.GROUPED_GEMM_STREAMS == 4
    print(f"16 experts x 1,024 rows: {separate * 1e3:.3f} ms one at a time, {grouped * 1e3:.3f} "
          f"ms four at a time, {pooled * 1e3:.3f} ms all at once")
    with pytest.raises(ValueError, match="n_gemms"):
        gemm.grouped_gemm_time_s(fc1, 0, H100)


@pytest.mark.parametrize("recompute, passes", [("flash", 3), ("selective", 3), ("full", 4),
                                               ("flash_full", 4)])
def test_expert_gemms_count_a_gated_mlps_flops(recompute, passes):
    """fc1 (gate and up) and fc2 hold a gated expert's 3 d f weights: 6 d f / t FLOPs a row
    forward, the same for dgrad and for wgrad, once more when the forward is recomputed."""
    gemms = gemm.expert_mlp_gemms(1000, 2880, 2880, tensor_parallel=2, recompute=recompute)
    assert sum(g.flops for g in gemms) == pytest.approx(passes * 1000 * 6 * 2880 * 2880 / 2)
    assert {g.name for g in gemms} == {"expert_fc1", "expert_fc2"}
    with pytest.raises(ValueError, match="rows"):
        gemm.expert_mlp_gemms(0, 2880, 2880)


def test_router_gemms_are_the_logits_and_their_gradients():
    gemms = gemm.router_gemms(4096, 2880, 128)
    assert [g.pass_ for g in gemms] == ["forward", "dgrad", "wgrad"]
    assert sum(g.flops for g in gemms) == 3 * 2 * 4096 * 2880 * 128


def test_moe_kernels_move_the_bytes_of_the_dispatcher_and_the_activation():
    """A hand count: 4 tokens of width 8, top-2 of 4 experts, 6 rows received by 2 local
    experts of width 16. Forward: router softmax and top-k 2 x 4 x 16 logits = 128 bytes;
    permutation 1 (read 32, write 64 values) and permutation 2 (read and write 48) = 384 bytes,
    the combine's mirror the same; the activation reads 6 x 32 and writes 6 x 16 values (576).
    Backward: the same, the activation 6 x 80 values (960)."""
    args = dict(top_k=2, n_experts=4, received_rows=6, local_experts=2)
    kernels = gemm.moe_elementwise(4, 8, 16, **args)
    by_pass = {p: sum(k.hbm_bytes for k in kernels if k.pass_ == p) for p in ("forward", "dgrad")}
    assert by_pass == {"forward": 128 + 384 + 384 + 576, "dgrad": 128 + 384 + 384 + 960}
    full = gemm.moe_elementwise(4, 8, 16, recompute="full", **args)
    assert sum(k.hbm_bytes for k in full) == 1472 + 1856 + 1472
    # one local expert: no permutation 2 (Megatron Core sorts only with several)
    one = gemm.moe_elementwise(4, 8, 16, **(args | dict(local_experts=1)))
    assert sum(k.hbm_bytes for k in one) == (128 + 192 + 192 + 576) + (128 + 192 + 192 + 960)


def test_gpt_oss_expert_kernels_of_the_release_move_their_bytes():
    """The same hand count with GPT-OSS's two eager expert kernels of Megatron Core 0.15. The
    clamp: 8 f values a row forward (2 x 16 x 8 x 6 rows = 1,536 bytes), 10 f backward (1,920).
    The fc2 bias added expert by expert: 6 d values a row each way (2 x 8 x 6 x 6 = 576).
    moe_act recomputation runs the activation and its clamp again (576 + 1,536)."""
    args = dict(top_k=2, n_experts=4, received_rows=6, local_experts=2)
    base = gemm.moe_elementwise(4, 8, 16, **args)
    gpt_oss = gemm.moe_elementwise(4, 8, 16, activation_clamp=True, expert_bias=True, **args)
    extra = {p: sum(k.hbm_bytes for k in gpt_oss if k.pass_ == p)
             - sum(k.hbm_bytes for k in base if k.pass_ == p) for p in ("forward", "dgrad")}
    assert extra == {"forward": 1536 + 576, "dgrad": 1920 + 576}
    recomputed = gemm.moe_elementwise(4, 8, 16, activation_clamp=True, expert_bias=True,
                                      recompute_activation=True, **args)
    again = [k for k in recomputed if k.pass_ == "recompute"]
    assert sorted(k.name for k in again) == ["expert_activation", "expert_activation_clamp"]
    assert sum(k.hbm_bytes for k in again) == 576 + 1536
    # full recomputation already runs every forward again: moe_act adds nothing to it
    full = dict(activation_clamp=True, expert_bias=True, recompute="full")
    assert (gemm.moe_elementwise(4, 8, 16, recompute_activation=True, **full, **args)
            == gemm.moe_elementwise(4, 8, 16, **full, **args))
    assert gemm.clamp_bytes_per_row(2880, tensor_parallel=2) == {"forward": 2 * 8 * 1440,
                                                                 "dgrad": 2 * 10 * 1440}


# --- the planner's MoE layer -----------------------------------------------------------------

def test_load_imbalance_makes_the_busiest_expert_the_pace():
    c = plan.cluster("H100", 64, storage_read_bytes_per_s=1e12)
    layout = plan.Layout(dp=8, tp=8, ep=8)
    balanced = plan.predict(MIXTRAL, c, layout)
    skewed_workload = replace(MIXTRAL, moe=replace(MIXTRAL_MOE, load_imbalance=1.5))
    skewed = plan.predict(skewed_workload, c, layout)
    assert prediction.expert_rows(MIXTRAL, layout) == 8 * 4096 * 2 // 8
    assert prediction.expert_rows(skewed_workload, layout) == math.ceil(1.5 * 8192)
    assert skewed.compute_s > balanced.compute_s
    # the all-to-alls keep capacity_factor's buffers: only the experts' rows grow
    assert skewed.ep_comm_s == balanced.ep_comm_s
    assert MIXTRAL_MOE.load_imbalance == 1.0
    with pytest.raises(ValueError, match="at least 1 \\(1.0: balanced\\)"):
        plan.MoE(8, 2, 14336, load_imbalance=0.9)
    with pytest.raises(ValueError, match="Workload.moe"):
        prediction.expert_rows(replace(MIXTRAL, n_params=8e9, moe=None), layout)
    print(f"compute {balanced.compute_s:.2f} s balanced, {skewed.compute_s:.2f} s with the "
          f"busiest expert at 1.5 x the mean")


def test_dense_layers_do_not_see_the_experts_pricing():
    """A dense model's compute is transformer_layer_time_s per layer, as before experts."""
    dense = plan.Workload(8e9, 4096, 512, n_layers=32, d_model=4096, n_heads=32)
    c = plan.cluster("H100", 64, storage_read_bytes_per_s=1e12)
    predicted = plan.predict(dense, c, plan.Layout(dp=64))
    layer_s = gemm.transformer_layer_time_s(H100, 4096, 1, 4096, 32, ffn_hidden=dense.mlp_width)
    assert predicted.compute_s == pytest.approx(8 * 32 * layer_s, rel=1e-12)


def _gb200_plan(nvlink_domain_gpus: int | None) -> plan.Plan:
    run = next(r for r in moe_runs.ROWS if r.gpu == "GB200")
    return validation.moe_plan(run._replace(nvlink_domain_gpus=nvlink_domain_gpus))


def test_expert_all_to_all_stays_on_nvlink_inside_a_racks_domain():
    """GPT-OSS on 64 GB200 with ep 64: one all-to-all over 16 trays of 4. Inside the rack's
    NVLink domain NCCL prices it over NVLink; were the domain to end at each tray, 60 of every
    64 peers would be across the NICs."""
    rack, trays = _gb200_plan(64), _gb200_plan(None)
    assert rack.ep_estimate.bottleneck == "NVLink"
    assert trays.ep_estimate.bottleneck == "network"
    assert trays.ep_comm_s > 2 * rack.ep_comm_s
    assert rack.ep_estimate.validation == "untested"      # no published all-to-all row
    print(f"ep all-to-alls {rack.ep_comm_s:.3f} s per step in the NVLink domain, "
          f"{trays.ep_comm_s:.3f} s across the NICs")


# --- the published rows ----------------------------------------------------------------------

def test_moe_rows_are_reported_apart_and_still_too_fast():
    """Every GPT-OSS 120B row is predicted too fast, by 51% to 120%: the grouped GEMMs, the
    router, the permutations and the release's eager expert kernels are priced, the load is
    balanced by the benchmarks, the all-to-alls are on NVLink, and what is left is not priced
    (host-side work: kernel launches and the dispatcher's device-to-host synchronisations). The
    B200 row shows it: the planner makes B200 2.13 times the H100 on the same batch,
    micro-batch and ep; the published runs differ by 1.46. No goal holds for a mixture of
    experts."""
    rows = validation.moe_validation_table()
    assert {r.run: r.error for r in rows} == {
        run: pytest.approx(error, abs=0.005) for run, error in ERRORS.items()}
    assert not any(r.sets_parameter for r in rows)
    (summary,) = validation.source_summary(rows)
    assert summary["kind"] == "moe" and summary["rows"] == 5
    assert summary["lowest"] > validation.ROW_GOAL
    h100, b200 = rows[0], rows[2]
    assert b200.predicted / h100.predicted == pytest.approx(2.13, abs=0.01)
    assert b200.published / h100.published == pytest.approx(1.46, abs=0.01)
    first, *others = rows
    assert not first.fits and "does not say what the run recomputed" in first.memory_note
    assert all(r.fits and r.memory_note == "" for r in others)
    print(validation.format_validation_table(rows))
    print(validation.format_source_summary([summary]))


def _without_release_kernels(predicted: plan.Plan) -> plan.Plan:
    """The same prediction with the experts' clamp, fc2 bias and moe_act recomputation off."""
    moe = replace(predicted.workload.moe, activation_clamp=False, expert_bias=False,
                  recompute_activation=False)
    return plan.predict(replace(predicted.workload, moe=moe), predicted.hardware,
                        predicted.layout)


def test_the_releases_expert_kernels_move_every_row_toward_its_published_figure():
    """GPT-OSS's clamp and concatenation before the activation, its fc2 bias added expert by
    expert (both eager in Megatron Core 0.15) and, but on GB300, moe_act recomputation: priced
    by their bytes they take 11 to 27 points off every row. They only slow the step: each
    row's prediction drops and its all-to-alls stay."""
    for row in validation.moe_validation_table():
        plain = _without_release_kernels(row.plan)
        plain_error = validation.tokens_per_s_per_gpu(plain) / row.published - 1
        assert plain_error == pytest.approx(ERRORS_WITHOUT_RELEASE_KERNELS[row.run], abs=0.005)
        assert 0.11 < plain_error - row.error < 0.28, (row.run, plain_error, row.error)
        assert row.plan.ep_comm_s == plain.ep_comm_s
        print(f"{row.run}: {plain_error:+.1%} without the release's kernels, "
              f"{row.error:+.1%} with them")
    gb300 = next(r for r in moe_runs.ROWS if r.gpu == "GB300")
    assert not validation.moe_plan(gb300).workload.moe.recompute_activation


def test_moe_release_kernel_flags_are_true_or_false():
    """A flag given as a string or a number is refused, naming the field."""
    for flag in ("activation_clamp", "expert_bias", "recompute_activation"):
        with pytest.raises(ValueError, match=f"MoE.{flag} is True or False"):
            plan.MoE(8, 2, 14336, **{flag: "moe_act"})


#: the commit that priced the experts as grouped GEMMs (its parent ran them as one balanced
#: MLP at a dense GEMM's efficiency)
GROUPED_COMMIT = "90ef2ba"
#: the same rows' errors before it, on today's catalog and cluster descriptions
ERRORS_BEFORE = {"GPT-OSS 120B, 64 H100, NeMo 25.11": 0.823,
                 "GPT-OSS 120B, 64 H100, NeMo 26.02": 1.045,
                 "GPT-OSS 120B, 64 B200, NeMo 25.11": 1.362,
                 "GPT-OSS 120B, 64 GB200, NeMo 25.11": 1.239,
                 "GPT-OSS 120B, 64 GB300, NeMo 25.11": 0.973}
BEFORE_SCRIPT = """
import json
from clusterlab.analytic.plan import validation
# the parent's MoE has no fields for the release's expert kernels: it priced none of them
parents_moe = validation.MoE
validation.MoE = lambda *shape, activation_clamp, expert_bias, recompute_activation: (
    parents_moe(*shape))
print(json.dumps({r.run: r.error for r in validation.moe_validation_table()}))
"""


def test_every_moe_row_is_closer_than_with_one_balanced_mlp(tmp_path):
    """Before and after, the same rows: prediction.py and workload.py of GROUPED_COMMIT's parent
    (the experts as one MLP of their FLOPs over the micro-batch's tokens, no router or
    permutation) on today's library, both without the release's expert kernels. Every row
    moves toward its published figure, by 5 to 12 points; none gets near."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("this checkout has no git history, so the planner before the change cannot "
                    "be rebuilt for the comparison; run it in a git clone")
    lib = tmp_path / "lib"
    shutil.copytree(ROOT / "lib" / "clusterlab", lib / "clusterlab")
    for module in ("prediction.py", "workload.py"):     # the layer's pricing and its widths
        old = subprocess.run(["git", "show",
                              f"{GROUPED_COMMIT}^:lib/clusterlab/analytic/plan/{module}"],
                             cwd=ROOT, check=True, capture_output=True, text=True).stdout
        (lib / "clusterlab" / "analytic" / "plan" / module).write_text(old)
    run = subprocess.run([sys.executable, "-c", BEFORE_SCRIPT], cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(lib)), capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    before = json.loads(run.stdout)
    assert before == {row: pytest.approx(e, abs=0.005) for row, e in ERRORS_BEFORE.items()}
    after = {r.run: validation.tokens_per_s_per_gpu(_without_release_kernels(r.plan))
             / r.published - 1 for r in validation.moe_validation_table()}
    for row, error in after.items():
        assert 0.04 < before[row] - error < 0.13, (row, before[row], error)
    for row in after:
        print(f"{row}: {before[row]:+.1%} before, {after[row]:+.1%} after")


def test_the_unpriced_time_grows_with_tokens_and_a_faster_gpu_does_not_shrink_it():
    """Where the rest is: the published step less the predicted one, per layer pass on the
    critical path. H100, 26.02: 1,280 x 4,096 tokens / (5,993 x 64) = 13.67 s published, 83 x 9
    passes (80 micro-batches, 4 stages). On H100 it grows from 7.6 ms (4,096 tokens a
    micro-batch) to 20 ms (16,384); on B200 at the H100 25.11 row's batch, micro-batch and ep it
    is larger still (30 ms), so it is not a term that a faster GPU shrinks. The growth rests on
    the 25.11 table's micro-batch of 4, which the release's configuration file gives as 1
    (tests/test_plan_moe_release.py)."""
    rows = {r.run: r for r in validation.moe_validation_table()}
    h100_mb4, h100_mb1, b200 = (rows[f"GPT-OSS 120B, 64 {gpu}, NeMo {release}"]
                                for gpu, release in (("H100", "25.11"), ("H100", "26.02"),
                                                     ("B200", "25.11")))
    published_step_s = 1280 * 4096 / (5993 * 64)
    assert validation.unpriced_s_per_layer_pass(h100_mb1) == pytest.approx(
        (published_step_s - h100_mb1.plan.step_s) / (83 * 9), rel=1e-12)
    seconds = {name: validation.unpriced_s_per_layer_pass(r)
               for name, r in (("H100 mb1", h100_mb1), ("H100 mb4", h100_mb4), ("B200", b200))}
    assert seconds["H100 mb1"] == pytest.approx(7.6e-3, abs=0.1e-3)
    assert seconds["H100 mb4"] == pytest.approx(19.8e-3, abs=0.1e-3)
    assert seconds["B200"] == pytest.approx(30.2e-3, abs=0.1e-3)
    print({name: f"{s * 1e3:.1f} ms" for name, s in seconds.items()})
    with pytest.raises(ValueError, match="needs a 'tokens/s per GPU' row"):
        validation.unpriced_s_per_layer_pass(validation.validation_table()[0])
    interleaved = next(r for r in validation.fp8_validation_table()
                       if r.plan.layout.virtual_stages > 1)
    with pytest.raises(ValueError, match="interleaves its pipeline"):
        validation.unpriced_s_per_layer_pass(interleaved)
