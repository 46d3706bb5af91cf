"""The planner against published figures: its error on each, stated and bounded.

Every published figure below is compared with what ``clusterlab`` predicts for the same
configuration from datasheet numbers and the planner's *default* assumptions
(``plan.Assumptions()``: compute priced per GEMM by ``clusterlab.analytic.gemm`` from SM counts, HBM
bandwidth and a published matmul benchmark's ceiling, the data-parallel all-reduce hidden only
behind the backward pass of a step's last micro-batch, as Megatron Core overlaps it). Nothing is fitted to these runs. Each test states the error found when it was written
(``(predicted - published) / published``) and asserts it stays within a stated tolerance, so a
change to the models that moves a prediction shows up here.

Summary of the errors (rounded; the table the planner's rows come from is
``plan.validation_table()``, shown in chapter 08 and lab 10):

==============================================  ==========  ==========  =======
figure                                           published   predicted   error
==============================================  ==========  ==========  =======
ring all-reduce busbw, 8 x H100 (NCCL #1455)     367.5 GB/s  353.5 GB/s  -3.8%
NVLink SHARP all-reduce busbw, 8 x H100          480 GB/s    474.0 GB/s  -1.3%
Megatron-LM 1T, 3072 A100 (HFU, recompute)       52%         61.9%       +19%
PaLM 540B, 6144 TPU v4 (MFU)                     46.2%       47.1%       +2.0%
Llama 3 405B, 8192 H100 (MFU)                    43%         43.3%       +0.8%
Llama 3 405B, 16384 H100 (MFU)                   41%         33.0%       -19%
Llama 3 405B, 16384 H100, 131K context (MFU)     38%         36.6%       -3.6%
Korthikanti Table 5, 8 rows (iteration time)     see below               -7% to -14%
==============================================  ==========  ==========  =======

The per-GEMM compute model reaches 63-66% of the A100's peak on these models' layers (the
benchmark's ceiling, 86.9%, less wave quantization, memory-bound attention and element-wise
kernels); the 2021-22 Megatron runs reached less (HFU 52-57%), so their times are
under-predicted (Korthikanti, -7% to -14%, median |error| 9.0% with the optimizer step and the
last stage's output layer priced: within the issue's goal of 10%, not for the 22B nor for
selective recomputation) and Megatron 1T's HFU over-predicted (+19%). The benchmark was measured with 2025 software (torch 2.6, CUDA 12.6);
the gap is not fitted away.

The bandwidth rows are priced by ``costmodel.cluster_collective`` (see
``tests/test_network_model.py`` for its whole validation); the MFU model under-predicts Llama 3
because it prices the pipeline bubble of the plain 1F1B schedule, (p-1)/(m+p-1), while Llama 3 used an interleaved schedule that the
paper's table does not quantify.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from clusterlab.analytic import costmodel, flops, plan
from clusterlab.catalog import hardware
from clusterlab.catalog.published import training_runs


def _error(predicted: float, published: float) -> float:
    return (predicted - published) / published


# --- nccl-tests bus bandwidth on one 8-GPU server ---------------------------------------------
# The planner prices every all-reduce with costmodel.cluster_collective, NCCL's own tuning
# model of costmodel.NCCL_RELEASE (2.30.7): no bandwidth in it is fitted to a published row.
# The figures below come from NCCL issue 1455 (8 H100 SXM, all_reduce_perf -b 2G -e 4G): ring
# "about 365-370 GBps" (367.5 here) and NVLS 480 GB/s at 8 GPUs. Before NCCL's model the
# planner priced the ring at line rate (+22%) and NVLS as a switch at line rate (+64%).
BUFFER_BYTES = 4 * 2**30


def test_ring_all_reduce_busbw_on_dgx_h100():
    estimate = costmodel.cluster_collective("all_reduce", BUFFER_BYTES,
                                            hardware.ClusterSpec(gpu="H100"), algorithm="ring")
    error = _error(estimate.busbw, 367.5e9)
    # Error -3.8% (353.5 GB/s): NCCL's search finds 12 ring channels of 30 GB/s on the 18
    # NVLink4 links it counts at 20.6 GB/s each (370.8), 360 GB/s, less latency, launch and
    # the pipeline fill (costmodel.PIPELINE_FILL_CHUNKS, 5e95c6e; -2.4% before it).
    assert estimate.protocol == "Simple" and estimate.nccl_release == costmodel.NCCL_RELEASE
    assert error == pytest.approx(-0.038, abs=0.01)
    assert abs(error) < 0.05


def test_nvlink_sharp_all_reduce_busbw_on_dgx_h100():
    estimate = costmodel.cluster_collective("all_reduce", BUFFER_BYTES,
                                            hardware.ClusterSpec(gpu="H100"))
    assert estimate.algorithm == "nvls"            # NCCL's choice on 8 H100 for large buffers
    error = _error(estimate.busbw, 480e9)
    # Error -1.3% (474.0 GB/s): NCCL's NVLS model, 8 channels of 40 GB/s at Hopper's NVLS
    # efficiency 0.85, (n-1)/n of it, doubled for the all-reduce: 476 GB/s, less latency and the pipeline fill.
    assert estimate.validated
    assert error == pytest.approx(-0.013, abs=0.01)
    assert abs(error) < 0.03


# --- The validation table (plan.validation): published runs, predicted, asserted ------------
# Every row below is a row of plan.validation_table(), the one function chapter 08 and lab 10
# show; each test asserts the row's error as found (rounded, abs=0.01) so that reverting a step
# term (the optimizer step, the output layer on the last stage) or any model change that moves
# a prediction fails here. No row sets a parameter.
#
# Errors before and after the step terms of issue 24, item 1 (the optimizer step; the output
# layer on the last stage). Under the network model of 10fb513: Korthikanti Table 5 median
# |error| 15.9% -> 15.3% (optimizer step alone) -> 12.1% (-12.5%..-22.0% -> -8.9%..-17.6%),
# Megatron 1T HFU +27.5% -> +21.5%, PaLM +2.0% -> +1.4%, Llama 3 405B +4.4% -> -0.1% and
# -17.4% -> -20.1%. Under the network model of 5e95c6e (NCCL's pipeline fill, which slows the
# tensor-parallel all-reduces; its constants are set on 8 x H200 nccl-tests rows, none of
# these), asserted below: Korthikanti median 9.0% (-7.1%..-13.7%), Megatron 1T +19.2%, PaLM
# +1.4%, Llama 3 -0.2% and -20.2%.

ROWS = {row.run: row for row in plan.validation_table()}


def _row(name: str):
    row = ROWS[name]
    print(f"{row.run}: published {row.published:.4g}, predicted {row.predicted:.4g}, "
          f"error {row.error:+.1%}")
    assert not row.sets_parameter
    return row


def test_megatron_1t_on_3072_a100():
    # Narayanan et al. 2021, Table 1 [narayanan2021]: 1008B parameters, 128 layers, hidden
    # 25600, sequence 2048, batch 3072, tensor 8 x pipeline 64 x data 6 on 3072 A100 (DGX A100,
    # 8 HDR NICs per node [nvidia_dgx_a100_datasheet]), full activation recomputation;
    # 163 TFLOP/s per GPU = 52% of the 312 TFLOP/s peak. Their FLOP count includes the
    # recomputed forward pass, so 52% is a hardware FLOPs utilization (HFU); the MFU is 3/4 of
    # it, 39%.
    row = _row("Megatron-LM 1T, 3072 A100")
    predicted = row.plan
    # Error +19.1% (predicted HFU 61.9%; +19.2% with a fixed half of the all-reduce hidden,
    # +27.5% before the output layer was priced): per GEMM the layer
    # reaches 81% of peak (the A100's matmul ceiling 86.9% less wave quantization and the
    # memory-bound attention GEMMs and element-wise kernels); the bubble (10% of the step),
    # the tensor-parallel all-reduces (8%) and the last stage's output layer (5%: two layers a
    # stage and the 51,200 x 25600 logits) lower it. Megatron's 2021 kernels reached less of the
    # peak than the 2025 benchmark's: over-predicted, within the 25% goal.
    assert row.metric == "HFU" and row.published == 0.52
    assert row.error == pytest.approx(0.191, abs=0.01)
    assert abs(row.error) < 0.25
    assert predicted.output_layer_s / predicted.step_s == pytest.approx(0.046, abs=0.01)
    assert predicted.mfu == pytest.approx(0.75 * predicted.hfu)


def test_palm_540b_on_6144_tpu_v4():
    # Chowdhery et al. 2022, sections 4-5 and Table 3 [chowdhery2022]: 540B parameters, 118
    # layers, width 18432 (attention 48 x 256 = 12288), sequence 2048, batch 2048, two pods of
    # 3072 TPU v4 chips, 12-way model parallel and 256-way fully sharded data parallel (ZeRO-3
    # in the planner's terms) inside a pod, 2-way data parallel across pods, rematerialization;
    # 46.2% MFU. A TPU is not a GPU: plan.validation.TPU_V4 takes one pod as one "node" whose
    # interconnect (ICI) gives each chip 1.1 PB/s / 4096 [google_tpu_v4]. PaLM rematerialized
    # only part of the forward pass (HFU 57.8% = 1.25 x MFU); the planner's is all of it (4/3).
    row = _row("PaLM 540B, 6144 TPU v4")
    # Error +2.0% (predicted 47.1%; +1.4% with a fixed half of the all-reduce hidden; ZeRO-3's
    # gathers and scatter of its one micro-batch now hide behind its forward and backward
    # passes): the TPU's GEMMs at the
    # unmeasured GPU's ceiling (72.9%) without wave quantization; full recomputation (-6%
    # against PaLM's 1.25) and the tensor-parallel all-reduces (8% of the step), priced as NCCL
    # would on NVLink, lower it. Nothing here is validated for a TPU: the plan says so.
    assert row.error == pytest.approx(0.020, abs=0.01)
    assert abs(row.error) < 0.10
    assert not row.plan.validated


@pytest.mark.parametrize("name, expected_error, tolerance", [
    # Dubey et al. 2024, Table 4 [dubey2024] (published.training_runs.LLAMA3_405B): 8192 GPUs,
    # dp 64, 43% BF16 MFU; 16384 GPUs, dp 128, 41%. With a fixed half of the all-reduce hidden:
    # -0.2%, -20.2%; before the output layer was priced: +4.4%, -17.4%; before attention was
    # priced as a fused causal kernel at its measured rate (gemm.fused_attention_time_s):
    # -0.0%, -20.0% and -9.2% for the 131K row.
    ("Llama 3 405B, 8192 H100", 0.008, 0.10),        # predicted 43.3%
    ("Llama 3 405B, 16384 H100", -0.194, 0.25),      # predicted 33.0%
    # 131,072-token sequences over cp 16, dp 8: 16 micro-batches, the same bubble fraction
    ("Llama 3 405B, 16384 H100, 131K context", -0.036, 0.25),   # predicted 36.6%
])
def test_llama3_405b_on_h100(name, expected_error, tolerance):
    row = _row(name)
    # With 16 stages and 2048/dp micro-batches of one sequence per replica (32 at 8192 GPUs,
    # 16 at 16384), the plain bubble (p-1)/(m+p-1) is 32% and 48% of the pipeline's time; Llama 3
    # interleaved its schedule, which divides the bubble, so the planner under-predicts, and
    # more so at 16384 GPUs where the bubble is larger.
    assert row.error == pytest.approx(expected_error, abs=0.02)
    assert abs(row.error) < tolerance


def test_llama3_error_is_the_bubble():
    # The claim in the comment above, checked: with an interleaved schedule of v = 4 chunks
    # per GPU (an illustration, not a figure from the paper) the bubble is a quarter and the
    # planner over-predicts the MFU at 16384 GPUs (+21%) where the plain schedule
    # under-predicts it (-20%): the published run lies between the two schedules.
    run = training_runs.LLAMA3_405B[1]
    plain = plan.validation.llama3_plan(run)
    interleaved = plan.validation.llama3_plan(run, virtual_stages=4)
    assert interleaved.bubble_s == pytest.approx(plain.bubble_s / 4)
    assert plain.mfu < run.mfu < interleaved.mfu
    assert _error(interleaved.mfu, run.mfu) == pytest.approx(0.206, abs=0.02)
    assert plain.bubble_s / plain.step_s > 0.4


# --- Korthikanti et al. 2022: Table 5 times, Figure 1 memory (published.training_runs) -------

@pytest.mark.parametrize("run", training_runs.rows(with_memory=True), ids=str)
def test_korthikanti_figure_1_memory(run):
    # States at 18 bytes per parameter and activations with the interleaved schedule's
    # in-flight factor 1 + (p-1)/(p v): both within 0.1% of Figure 1 (as Calculon transcribes
    # it; its bars agree with the paper's formulas, so this checks their composition). The
    # output layer's weights and logits (on the last stage) are not in Figure 1's first stage.
    predicted = plan.validation.korthikanti_plan(run)
    states_error = _error(predicted.states_bytes / 2**30, run.states_gib)
    activation_error = _error(predicted.activation_bytes / 2**30, run.activations_gib)
    print(f"{run.name} {run.recompute}: states {states_error:+.2%}, "
          f"activations {activation_error:+.2%}")
    assert abs(states_error) < 0.001 and abs(activation_error) < 0.001


# Errors with the per-GEMM compute model (clusterlab.analytic.gemm; A100: 108 SMs, matmul ceiling 86.9%
# of peak), the optimizer step (30 bytes a parameter over HBM: 0.040 s of the 22B's step, 3%)
# and the output layer on the last stage (51,200 x h logits and their cross-entropy: 0.6% of the
# 22B's step, 2% of 175B's, 5-6% of 530B's and 1T's, where a stage has 3 or 2 layers):
# full 22B -8.2%, 175B -7.9%, 530B -9.4%, 1T -7.1%; selective 22B -13.7%, 175B -11.8%,
# 530B -12.4%, 1T -8.5%. Median |error| 9.0% (15.9% before these terms and 5e95c6e's pipeline
# fill; 12.1% with these terms under the network model before it): within the 10% goal; every
# row is still under-predicted, the benchmark's ceiling (2025 software) being above what
# Megatron's 2022 kernels reached. Selective recomputation is under-predicted more than full:
# the time it adds is attention's score kernels, priced at the datasheet's HBM bandwidth.
KORTHIKANTI_ERRORS = [-0.082, -0.137, -0.079, -0.118, -0.094, -0.124, -0.071, -0.085]


@pytest.mark.parametrize("run, expected", list(zip(training_runs.rows(timed=True),
                                                   KORTHIKANTI_ERRORS)), ids=str)
def test_korthikanti_table_5_times(run, expected):
    row = _row(f"Korthikanti {run.name}, {run.recompute}")
    assert row.published == run.iteration_s
    assert row.error == pytest.approx(expected, abs=0.01)
    assert abs(row.error) < 0.25


def test_step_terms_of_issue_24_are_priced():
    # The optimizer step and the output layer are in the step (each assertion fails if its term
    # is dropped): the 22B's optimizer step is 21.7e9 / 8 parameters x 30 bytes over the
    # A100's 2.039 TB/s; its output layer is on its one stage; with pp > 1 the bubble's fill
    # and drain leave the output layer out.
    full_22b = ROWS["Korthikanti 22B, full"].plan
    params = 12 * 48 * 6144**2 / 8
    assert full_22b.optimizer_s == pytest.approx(params * 30 / 2.039e12, rel=1e-3)
    assert full_22b.output_layer_s > 0
    large = ROWS["Korthikanti 1T, full"].plan
    assert large.output_layer_s / large.compute_s == pytest.approx(0.046, abs=0.01)
    m, p = 512, 64
    assert large.bubble_s == pytest.approx(
        (large.compute_s - large.output_layer_s + large.tp_comm_s) * (p - 1) / m)


def test_korthikanti_errors_by_regime():
    # Median |error| per regime (plan.validation.regime_summary): small (22B) against large
    # (175B-1T) models, full against selective recomputation. The goal (median <= 10%) is met
    # overall, for the large models and for full recomputation, not for the 22B (10.9%) nor for
    # selective recomputation (12.1%); every row is within 25%, every Korthikanti row
    # under-predicted.
    summary = plan.validation.regime_summary(list(ROWS.values()))
    medians = {name: s["median_abs_error"] for name, s in summary.items()}
    print({name: f"{m:.1%}" for name, m in medians.items()})
    expected = {"all": 0.085, "Korthikanti 22B": 0.109, "Korthikanti 175B-1T": 0.090,
                "utilization": 0.036, "Korthikanti full": 0.080,
                "Korthikanti selective": 0.121}
    assert medians == pytest.approx(expected, abs=0.01)
    korthikanti = [r for r in ROWS.values() if r.run.startswith("Korthikanti")]
    assert len(korthikanti) == 8 and all(r.error < 0 for r in korthikanti)
    assert statistics.median(abs(r.error) for r in korthikanti) == pytest.approx(0.090,
                                                                                  abs=0.01)
    assert max(abs(r.error) for r in ROWS.values()) < 0.25
    assert summary["all"]["rows"] == 13


def test_validation_table_formats_every_row():
    text = plan.validation.format_validation_table(list(ROWS.values()))
    for row in ROWS.values():
        assert row.run in text and f"{row.error:+.1%}" in text
    summary = plan.validation.format_regime_summary(
        plan.validation.regime_summary(list(ROWS.values())))
    assert "Korthikanti selective" in summary
    cells = plan.validation.table_cells(list(ROWS.values()))
    assert len(cells) == 13 and all(len(c) == len(plan.validation.TABLE_HEADER) for c in cells)


def test_regimes_outside_the_goals_are_named():
    # where the planner is not to be trusted to the goals' precision: the 22B (median 10.9%)
    # and selective recomputation (12.1%). The utilization rows' median is 3.6% with Llama 3's
    # 131K row (10.5% without it; Llama 3 on 16384 H100 still at -19.4%); every other regime
    # meets both goals
    summary = plan.validation.regime_summary(list(ROWS.values()))
    outside = plan.validation.outside_goals(summary)
    assert set(outside) == {"Korthikanti 22B", "Korthikanti selective"}
    assert all(s["max_abs_error"] < plan.validation.ROW_GOAL for s in summary.values())


# --- memory fit and signed errors per source (issue 38, item 4) --------------------------------

def test_every_row_is_checked_against_the_planners_memory_model():
    """Every published layout but Llama 3's fits the planner's memory model. Llama 3 405B's
    first stage (8 layers, 8 K/V heads, sequences of 8192 without recomputation) needs 72.8 GiB
    of 71.7 usable; the row says why the run fit (one layer fewer on the first stage, Dubey et
    al. 2024, section 3.3.2), and with that layer removed the model fits it."""
    rows = list(ROWS.values())
    assert {r.run for r in rows if not r.fits} == {
        "Llama 3 405B, 8192 H100", "Llama 3 405B, 16384 H100",
        "Llama 3 405B, 16384 H100, 131K context"}
    for row in rows:
        assert row.fits == (row.plan.memory_bytes <= row.plan.memory_limit_bytes)
        assert bool(row.memory_note) == (not row.fits)
    llama = ROWS["Llama 3 405B, 8192 H100"].plan
    assert llama.memory_bytes / 2**30 == pytest.approx(72.8, abs=0.1)
    assert llama.memory_limit_bytes / 2**30 == pytest.approx(71.7, abs=0.1)
    # grouped-query attention (8 of 128 heads) keeps 30.25 of the 34 s b h: 80.3 GiB without it
    multi_head = plan.predict(replace(llama.workload, n_kv_heads=None), llama.hardware,
                              llama.layout)
    assert multi_head.memory_bytes / 2**30 == pytest.approx(80.3, abs=0.1)
    balanced = plan.validation.one_layer_fewer_first_stage_bytes(llama)
    assert balanced < llama.memory_limit_bytes < llama.memory_bytes
    text = plan.validation.format_validation_table(rows)
    assert "72.8 (71.7)" in text and "no, see note" in text
    assert text.count("note: Llama 3 405B") == 3 and "section 3.3.2" in text


def test_errors_per_source_are_signed_and_kept_apart():
    summary = {s["source"]: s for s in plan.validation.source_summary(list(ROWS.values()))}
    assert set(summary) == {"korthikanti2022", "narayanan2021", "chowdhery2022", "dubey2024"}
    assert all(s["kind"] == "dense" and not s["sets_parameter"] for s in summary.values())
    korthikanti = summary["korthikanti2022"]
    # every Korthikanti step time is too short: the planner is optimistic there
    assert korthikanti["rows"] == 8 and korthikanti["highest"] < 0
    assert korthikanti["median"] == pytest.approx(-0.090, abs=0.01)
    assert korthikanti["lowest"] == pytest.approx(-0.137, abs=0.01)
    assert summary["narayanan2021"]["median"] == pytest.approx(0.191, abs=0.02)
    assert summary["dubey2024"]["lowest"] == pytest.approx(-0.194, abs=0.02)
    assert summary["dubey2024"]["rows"] == 3
    assert summary["dubey2024"]["median"] == pytest.approx(-0.036, abs=0.01)
    text = plan.validation.format_source_summary(list(summary.values()))
    assert "korthikanti2022  dense  8" in text and "-13.7%" in text


def test_the_goals_hold_on_the_rows_that_set_no_parameter():
    """Issue 38's goals on the rows that set nothing (all thirteen, all dense): median |error|
    8.5% <= 10% and the largest 19.4% <= 25%. No mixture-of-experts row is in the table, so
    nothing is claimed for one."""
    rows = [r for r in ROWS.values() if not r.sets_parameter]
    assert len(rows) == 13 and all(r.plan.workload.moe is None for r in rows)
    median = statistics.median(abs(r.error) for r in rows)
    assert median == pytest.approx(0.085, abs=0.005) and median <= plan.validation.MEDIAN_GOAL
    largest = max(abs(r.error) for r in rows)
    assert largest == pytest.approx(0.194, abs=0.005) and largest <= plan.validation.ROW_GOAL


def test_llama3_long_context_row_from_table_4():
    """Dubey et al. 2024, Table 4's third row, read from the catalog (mfu_records) and set no
    parameter: 16384 H100, tp 8, cp 16, pp 16, dp 8, 128 sequences of 131,072 tokens, 38% MFU.
    Each GPU holds 8,192 tokens of a sequence, so its memory is the 16384-GPU 8K row's. The
    plain 1F1B bubble (16 micro-batches on 16 stages) is 48% of the predicted step; an
    interleaved schedule of v = 2 would give 47.9%. The step prices attention as a causal
    fused kernel runs it (the unmasked half, at its measured rate); the MFU counts the whole
    s x s matrix, PaLM's convention. Table 4 does not say which count its 380 TFLOP/s use: if
    the masked half is left out, the published MFU in the planner's convention is
    38% x 1.40 = 53%, and the error would be -31%, not -3.6%."""
    row = ROWS["Llama 3 405B, 16384 H100, 131K context"]
    run = plan.validation.LLAMA3_LONG_CONTEXT
    assert (run.source.startswith("Dubey et al. 2024") and run.source.endswith("Table 4")
            and not row.sets_parameter and row.source == "dubey2024")
    layout, workload = row.plan.layout, row.plan.workload
    assert (layout.tp, layout.cp, layout.pp, layout.dp) == (8, 16, 16, 8)
    assert (workload.seq_len, workload.global_batch, row.published) == (131072, 128, 0.38)
    assert row.plan.cp_comm_s > 0 and workload.recompute_policy == "flash"
    eight_k = ROWS["Llama 3 405B, 16384 H100"].plan
    assert row.plan.activation_bytes == pytest.approx(eight_k.activation_bytes, rel=1e-6)
    assert row.plan.bubble_s / row.plan.step_s == pytest.approx(0.475, abs=0.01)
    interleaved = plan.predict(workload, row.plan.hardware, replace(layout, virtual_stages=2))
    assert interleaved.mfu == pytest.approx(0.479, abs=0.01)
    convention = flops.mfu_convention_over_causal(405e9, 126, 131072, 16384)
    assert convention == pytest.approx(1.40, abs=0.01)
    assert _error(row.predicted, row.published * convention) == pytest.approx(-0.31, abs=0.01)
