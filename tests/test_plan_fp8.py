"""The planner against published 2025-26 runs outside its main table (issue 38, item 5), each
kind apart: FP8 training (the linear GEMMs at the FP8 peak, attention and the rest in BF16),
held to three Llama 3 runs on H100 (Megatron-Bridge's performance summary:
clusterlab.catalog.published.fp8_runs). Nothing is fitted to them. Mixtures of experts, held to
GPT-OSS 120B runs from the same summary, are tested in tests/test_plan_moe_grouped.py.

Errors (tokens per second per GPU, (predicted - published) / published):

=======================  =========  ==========  ==========
run                      published  as BF16     as FP8
=======================  =========  ==========  ==========
Llama 3 8B, 8 H100       14,451     -20.8%      +23.2%
Llama 3 70B, 64 H100     1,602      -30.2%      +1.4%
Llama 3.1 405B, 1024     292        -23.6%      +18.4%
=======================  =========  ==========  ==========

Priced as BF16 the planner is too slow by 21-30%; as FP8 it is too fast by 1-23% (median
18.4%): FP8's own casts and scaling are not priced, and its GEMMs are assumed to reach the BF16
GEMMs' fraction of their peak (no FP8 matmul benchmark in the course). Every row is within 25%;
the median is not within 10%.
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
    ("Llama 3 8B", -0.208, 0.232), ("Llama 3 70B", -0.302, 0.014),
    ("Llama 3.1 405B", -0.236, 0.184)])
def test_fp8_rows_before_and_after(name, as_bf16, as_fp8):
    assert AS_BF16[name].error == pytest.approx(as_bf16, abs=0.02)
    assert FP8[name].error == pytest.approx(as_fp8, abs=0.02)
    assert abs(FP8[name].error) < 0.25 and FP8[name].fits


def test_fp8_errors_summarised_by_source():
    (summary,) = plan.validation.source_summary(list(FP8.values()))
    assert summary["source"] == "megatron_bridge_perf" and summary["rows"] == 3
    assert summary["median"] == pytest.approx(0.184, abs=0.02)
    # honest about the goals: every row within 25%, the median above 10%
    assert max(abs(r.error) for r in FP8.values()) <= plan.validation.ROW_GOAL
    assert statistics.median(abs(r.error) for r in FP8.values()) > plan.validation.MEDIAN_GOAL


def test_only_the_linear_gemms_run_at_the_fp8_peak():
    h100 = hardware.gpu("H100")
    shape = dict(ffn_hidden=14336, tensor_parallel=1, sequence_parallel=False,
                 recompute="flash")
    args = (8192, 1, 4096, 32)
    bf16 = prediction._layer_time_s(h100, "bf16", *args, **shape)
    fp8 = prediction._layer_time_s(h100, "fp8", *args, **shape)
    gemms = gemm.transformer_layer_gemms(*args, ffn_hidden=14336)
    attention = set(gemm.LAYER_GEMM_GROUPS["attention"])
    attention_s = sum(gemm.gemm_time_s(g, h100) for g in gemms if g.name in attention)
    kernels_s = sum(k.hbm_bytes for k in gemm.transformer_layer_elementwise(
        *args, ffn_hidden=14336)) / h100.hbm_bytes_per_s
    linear_s = bf16 - attention_s - kernels_s
    # the linear GEMMs twice as fast (1979 / 989 TFLOP/s), the rest unchanged
    assert fp8 == pytest.approx(attention_s + kernels_s + linear_s * 989 / 1979, rel=0.01)
    assert bf16 / 2 < fp8 < bf16


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
