"""The planner against published 2025-26 runs outside its main table (issue 38, item 5), each
kind apart: FP8 training (the linear GEMMs at the FP8 peak, attention and the rest in BF16),
held to three Llama 3 runs on H100 (Megatron-Bridge's performance summary:
clusterlab.catalog.published.fp8_runs). Nothing is fitted to them. Mixtures of experts, held to
GPT-OSS 120B runs from the same summary, are tested in tests/test_plan_moe_grouped.py.

Errors (tokens per second per GPU, (predicted - published) / published):

=======================  =========  ==========  ====================  ==================
run                      published  as BF16     as FP8, casts unpriced  as FP8, casts priced
=======================  =========  ==========  ====================  ==================
Llama 3 8B, 8 H100       14,451     -18.8%      +28.1%                +18.4%
Llama 3 70B, 64 H100     1,602      -29.3%      +3.3%                 -0.9%
Llama 3.1 405B, 1024     292        -23.0%      +19.8%                +15.8%
=======================  =========  ==========  ====================  ==================

Priced as BF16 the planner is too slow by 19-29%. As FP8 with Transformer Engine's
current-scaling casts priced by their bytes (prediction.fp8_cast_bytes: an amax pass, the cast,
and on Hopper a transposed FP8 copy for the backward), the median signed error is +15.8% (it is
+19.8% with the casts unpriced). Attention is a fused causal kernel at its measured rate
(gemm.fused_attention_time_s); with the whole score matrix at the GEMM ceiling, as before that
was priced, the three rows were +14.3%, -2.6% and +14.5%. Its GEMMs are still assumed to reach the BF16 GEMMs' fraction
of their peak (no FP8 matmul benchmark in the course). Every row is within 25%; the median
|error| is not within 10%.
"""

from __future__ import annotations

import statistics

import pytest

from clusterlab.analytic import gemm, plan
from clusterlab.analytic.plan import prediction
from clusterlab.catalog import hardware

FP8 = {r.run.split(",")[0]: r for r in plan.validation.fp8_validation_table()}
AS_BF16 = {r.run.split(",")[0]: r for r in plan.validation.fp8_validation_table(precision="bf16")}


@pytest.mark.parametrize("name, as_bf16, as_fp8", [
    ("Llama 3 8B", -0.188, 0.184), ("Llama 3 70B", -0.293, -0.009),
    ("Llama 3.1 405B", -0.230, 0.158)])
def test_fp8_rows_before_and_after(name, as_bf16, as_fp8):
    assert AS_BF16[name].error == pytest.approx(as_bf16, abs=0.02)
    assert FP8[name].error == pytest.approx(as_fp8, abs=0.02)
    assert abs(FP8[name].error) < 0.25 and FP8[name].fits


def test_fp8_errors_summarised_by_source():
    (summary,) = plan.validation.source_summary(list(FP8.values()))
    assert summary["source"] == "megatron_bridge_perf" and summary["rows"] == 3
    assert summary["median"] == pytest.approx(0.158, abs=0.02)
    # honest about the goals: every row within 25%, the median above 10%
    assert max(abs(r.error) for r in FP8.values()) <= plan.validation.ROW_GOAL
    assert statistics.median(abs(r.error) for r in FP8.values()) > plan.validation.MEDIAN_GOAL


T, D, F = 8192, 4096, 14336   # Llama 3 8B's tokens a micro-batch, width and MLP width
LAYER = (8192, 1, 4096, 32)
SHAPE = dict(ffn_hidden=F, tensor_parallel=1, sequence_parallel=False, recompute="flash")


def test_only_the_linear_gemms_run_at_the_fp8_peak_beside_their_casts():
    h100 = hardware.gpu("H100")
    bf16 = prediction._layer_time_s(h100, "bf16", *LAYER, **SHAPE)
    fp8 = prediction._layer_time_s(h100, "fp8", *LAYER, **SHAPE)
    gemms = gemm.transformer_layer_gemms(*LAYER, ffn_hidden=F)
    attention = set(gemm.LAYER_GEMM_GROUPS["attention"])
    attention_s = sum(gemm.gemm_time_s(g, h100) for g in gemms if g.name in attention)
    kernels_s = sum(k.hbm_bytes for k in gemm.transformer_layer_elementwise(
        *LAYER, ffn_hidden=F)) / h100.hbm_bytes_per_s
    linear_s = bf16 - attention_s - kernels_s
    # Transformer Engine's current-scaling casts on Hopper, by hand: each linear GEMM's input
    # (4 bytes a value where LayerNorm computed the amax: QKV, MLP up; else 6) and its output's
    # gradient (6: amax read 2, cast read 2, FP8 and transposed FP8 written 1 + 1):
    # QKV 4 T D + 6 T 3D, output projection 6 T D + 6 T D, MLP up 4 T D + 6 T F,
    # MLP down 6 T F + 6 T D
    casts_s = T * (44 * D + 12 * F) / h100.hbm_bytes_per_s
    # the linear GEMMs twice as fast (1979 / 989 TFLOP/s), the rest unchanged, the casts added
    assert fp8 == pytest.approx(attention_s + kernels_s + linear_s * 989 / 1979 + casts_s,
                                rel=0.01)
    assert casts_s / fp8 > 0.05   # 7% of the layer: the 1% check above sees them dropped
    assert bf16 / 2 < fp8 < bf16


def test_fp8_casts_follow_the_recipe_and_the_architecture():
    cast = prediction.fp8_cast_bytes
    # Hopper: amax read, cast read, FP8 and its transposed copy written
    assert cast(1000, transposed_copy=True) == 6000
    assert cast(1000, transposed_copy=True, amax_fused=True) == 4000
    # Blackwell reads the columnwise usage in place: no transposed copy
    assert cast(1000, transposed_copy=False) == 5000
    # gathered over 8 GPUs: the rowwise cast on the shard (5 bytes on 125 values), the
    # transposed copy from the gathered FP8 tensor (read 1, write 1 on all 1000)
    assert cast(1000, transposed_copy=True, gathered_over=8) == 5 * 125 + 2 * 1000
    gemms = gemm.transformer_layer_gemms(*LAYER, ffn_hidden=F)
    b200 = sum(k.hbm_bytes for k in prediction.fp8_activation_casts(
        hardware.gpu("B200"), gemms, tensor_parallel=1, sequence_parallel=False))
    assert b200 == T * (36 * D + 10 * F)   # one byte a value fewer than Hopper, every tensor
    # full recomputation quantizes every linear input again in the recomputed forward
    full = gemm.transformer_layer_gemms(*LAYER, ffn_hidden=F, recompute="flash_full")
    again = [k for k in prediction.fp8_activation_casts(
        hardware.gpu("H100"), full, tensor_parallel=1, sequence_parallel=False)
        if k.pass_ == "recompute"]
    assert sum(k.hbm_bytes for k in again) == T * (4 * D + 6 * D + 4 * D + 6 * F)


def test_fp8_weights_are_cast_once_a_step():
    row = FP8["Llama 3 8B"]   # 32 layers, tp = pp = 1, 16 micro-batches a step
    h100, p = hardware.gpu("H100"), row.plan
    microbatches = p.workload.global_batch // (p.layout.dp * p.layout.micro_batch)
    layer_s = prediction._layer_time_s(h100, "fp8", *LAYER, ffn_hidden=p.workload.mlp_width,
                                       tensor_parallel=1, sequence_parallel=False,
                                       recompute="flash")
    f = p.workload.mlp_width
    # QKV d x 3d, output projection d x d, MLP d x f and f x d: 6 bytes a weight (Hopper)
    weights_s = 32 * 6 * (4 * D * D + 2 * D * f) / h100.hbm_bytes_per_s
    assert p.compute_s - p.output_layer_s == pytest.approx(
        32 * microbatches * layer_s + weights_s, rel=1e-9)
    assert prediction._fp8_weight_casts_s(p.workload, p.hardware, p.layout) == pytest.approx(
        weights_s)


def test_fp8_mfu_is_over_the_fp8_peak_and_needs_fp8_units():
    row = FP8["Llama 3 70B"]
    flops_per_s = row.plan.model_flops_per_step / row.plan.step_s
    assert row.plan.mfu == pytest.approx(flops_per_s / (64 * 1979e12))
    with pytest.raises(ValueError, match="A100 has no FP8 tensor cores"):
        plan.predict(plan.Workload(8e9, 4096, 64, precision="fp8"),
                     plan.cluster("A100", 8, storage_read_bytes_per_s=1e12), plan.Layout(dp=8))
    with pytest.raises(ValueError, match="precision is 'bf16' or 'fp8'"):
        plan.Workload(8e9, 4096, 64, precision="fp16")
    with pytest.raises(ValueError, match="compute_efficiency=None"):
        plan.predict(plan.Workload(8e9, 4096, 64, precision="fp8"),
                     plan.cluster("H100", 8, storage_read_bytes_per_s=1e12), plan.Layout(dp=8),
                     plan.Assumptions(compute_efficiency=0.5))
