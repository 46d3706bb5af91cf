"""The planner against published figures: its error on each, stated and bounded.

Every published figure below is compared with what ``clusterlab`` predicts for the same
configuration from datasheet numbers and the planner's *default* assumptions
(``plan.Assumptions()``: compute priced per GEMM by ``clusterlab.gemm`` from SM counts, HBM
bandwidth and a published matmul benchmark's ceiling, half of the data-parallel all-reduce
hidden). Nothing is fitted to these runs. Each test states the error found when it was written
(``(predicted - published) / published``) and asserts it stays within a stated tolerance, so a
change to the models that moves a prediction shows up here.

Summary of the errors (rounded):

==============================================  ==========  ==========  =======
figure                                           published   predicted   error
==============================================  ==========  ==========  =======
ring all-reduce busbw, 8 x H100 (NCCL #1455)     367.5 GB/s  358.6 GB/s  -2.4%
NVLink SHARP all-reduce busbw, 8 x H100          480 GB/s    474.6 GB/s  -1.1%
Megatron-LM 1T, 3072 A100 (HFU, recompute)       52%         66.3%       +27%
PaLM 540B, 6144 TPU v4 (MFU)                     46.2%       47.1%       +2.0%
Llama 3 405B, 8192 H100 (MFU)                    43%         44.9%       +4.4%
Llama 3 405B, 16384 H100 (MFU)                   41%         33.9%       -17%
Korthikanti Table 5, 8 rows (iteration time)     see below               -12% to -22%
==============================================  ==========  ==========  =======

The per-GEMM compute model reaches 63-66% of the A100's peak on these models' layers (the
benchmark's ceiling, 86.9%, less wave quantization, memory-bound attention and element-wise
kernels); the 2021-22 Megatron runs reached less (HFU 52-57%), so their times are
under-predicted (Korthikanti, -12% to -22%, median |error| 15.9%: the issue's goal of 10% is
not met) and Megatron 1T's HFU over-predicted (+27%). The benchmark was measured with 2025
software (torch 2.6, CUDA 12.6); the gap is not fitted away.

The bandwidth rows are priced by ``costmodel.cluster_collective`` (see
``tests/test_network_model.py`` for its whole validation); the MFU model under-predicts Llama 3
because it prices the pipeline bubble of the plain 1F1B schedule, (p-1)/(m+p-1), while Llama 3 used an interleaved schedule that the
paper's table does not quantify.
"""

from __future__ import annotations

import statistics

import pytest

from clusterlab import costmodel, hardware, plan
from clusterlab.published import training_runs


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
    estimate = costmodel.cluster_collective("all_reduce", BUFFER_BYTES, gpu="H100",
                                            algorithm="ring")
    error = _error(estimate.busbw, 367.5e9)
    # Error -2.4% (358.6 GB/s): NCCL's search finds 12 ring channels of 30 GB/s on the 18
    # NVLink4 links it counts at 20.6 GB/s each (370.8), 360 GB/s, less latency and launch.
    assert estimate.protocol == "Simple" and estimate.nccl_release == costmodel.NCCL_RELEASE
    assert error == pytest.approx(-0.024, abs=0.01)
    assert abs(error) < 0.03


def test_nvlink_sharp_all_reduce_busbw_on_dgx_h100():
    estimate = costmodel.cluster_collective("all_reduce", BUFFER_BYTES, gpu="H100")
    assert estimate.algorithm == "nvls"            # NCCL's choice on 8 H100 for large buffers
    error = _error(estimate.busbw, 480e9)
    # Error -1.1% (474.6 GB/s): NCCL's NVLS model, 8 channels of 40 GB/s at Hopper's NVLS
    # efficiency 0.85, (n-1)/n of it, doubled for the all-reduce: 476 GB/s, less latency.
    assert estimate.validated
    assert error == pytest.approx(-0.011, abs=0.01)
    assert abs(error) < 0.03


# --- Utilization of published training runs --------------------------------------------------

def test_megatron_1t_on_3072_a100():
    # Narayanan et al. 2021, Table 1 [narayanan2021]: 1008B parameters, 128 layers, hidden
    # 25600, sequence 2048, batch 3072, tensor 8 x pipeline 64 x data 6 on 3072 A100 (DGX A100,
    # 8 HDR NICs per node [nvidia_dgx_a100_datasheet]), full activation recomputation;
    # 163 TFLOP/s per GPU = 52% of the 312 TFLOP/s peak. Their FLOP count includes the
    # recomputed forward pass, so 52% is a hardware FLOPs utilization (HFU); the MFU is 3/4 of
    # it, 39%.
    workload = plan.Workload(1008e9, 2048, 3072, n_tokens=1e12, n_layers=128, d_model=25600,
                             recompute=True)
    cluster = plan.cluster("A100", 3072, storage_read_bytes_per_s=100e9, fabric_link="IB-HDR")
    predicted = plan.predict(workload, cluster, plan.Layout(dp=6, tp=8, pp=64))
    error = _error(predicted.hfu, 0.52)
    # Error +27.5% (predicted HFU 66.3%; 50.2% at the former constant 0.6 of peak): per GEMM
    # the layer reaches 81% of peak (the A100's matmul ceiling 86.9% less wave quantization and
    # the memory-bound attention GEMMs and element-wise kernels), the bubble (11% of the step)
    # and tensor-parallel all-reduces (6%) lower it; Megatron's 2021 kernels reached less of
    # the peak than the 2025 benchmark's. Beyond the 25% goal: the planner over-predicts this
    # run's utilization.
    assert error == pytest.approx(0.275, abs=0.01)
    assert abs(error) < 0.30
    assert predicted.mfu == pytest.approx(0.75 * predicted.hfu)


TPU_V4 = hardware.GPU(
    "TPU v4", memory_bytes=32 * 2**30, hbm_bytes_per_s=1.2e12, bf16_flops=275e12,
    # nvlink_generation 4: the planner prices the pod's all-reduces as NCCL would on NVLink4
    # (cluster_collective needs an NVLink generation; it has no model of ICI).
    nvlink_bytes_per_s=1.1e15 / 4096, nvlink_generation=4,
    source="Google Cloud TPU v4 documentation: 275 TFLOP/s bf16, 32 GiB HBM2 at 1200 GB/s, "
           "1.1 PB/s all-reduce bandwidth per 4096-chip pod [google_tpu_v4]")


def test_palm_540b_on_6144_tpu_v4():
    # Chowdhery et al. 2022, sections 4-5 and Table 3 [chowdhery2022]: 540B parameters, 118
    # layers, width 18432 (attention 48 x 256 = 12288), sequence 2048, batch 2048, two pods of 3072 TPU v4
    # chips, 12-way model parallel and 256-way fully sharded data parallel (ZeRO-3 in the
    # planner's terms) inside a pod, 2-way data parallel across pods, rematerialization;
    # 46.2% MFU. A TPU is not a GPU: the planner takes one pod as one "node" whose interconnect
    # (ICI) gives each chip 1.1 PB/s / 4096 = 269 GB/s of all-reduce bandwidth [google_tpu_v4],
    # and the data-centre network between the pods 81 Tb/s per pod (section 4 of the paper),
    # 3.3 GB/s per chip. PaLM rematerialized only part of the forward pass (HFU 57.8% = 1.25 x
    # MFU); the planner's recomputation is all of it (4/3).
    cluster = hardware.ClusterSpec(TPU_V4, n_nodes=2, gpus_per_node=3072,
                                   intra_node_bytes_per_s=1.1e15 / 4096,
                                   network_bytes_per_s=81e12 / 8, storage_read_bytes_per_s=1e12,
                                   name="PaLM: 2 pods of 3072 TPU v4")
    # d_model is the model width, 18432, which sizes the tensor-parallel all-reduces; the
    # planner also uses it for the attention FLOPs, over-counting them by 0.5% of the total.
    workload = plan.Workload(540e9, 2048, 2048, n_tokens=780e9, n_layers=118, d_model=18432,
                             recompute=True)
    predicted = plan.predict(workload, cluster,
                             plan.Layout(dp=512, tp=12, pp=1, zero_stage=3, micro_batch=4))
    error = _error(predicted.mfu, 0.462)
    # Error +2.0% (predicted 47.1%; -10.2% at the former constant 0.6): a TPU has no SM count
    # and no matmul benchmark row in clusterlab.gemm, so its GEMMs run at the unmeasured GPU's
    # ceiling (72.9%, the lowest NVIDIA row) without wave quantization; the full recomputation
    # the planner assumes (4/3 of the FLOPs, not PaLM's 1.25: -6%) and the tensor-parallel
    # all-reduces (8% of the step), priced as NCCL would run them on NVLink, lower it. Nothing
    # in this pricing is validated for a TPU: the plan says so.
    assert error == pytest.approx(0.020, abs=0.01)
    assert abs(error) < 0.10
    assert not predicted.validated


@pytest.mark.parametrize("run, expected_error, tolerance", [
    # Dubey et al. 2024, Table 4 [dubey2024] (published.training_runs.LLAMA3_405B): 8192 GPUs,
    # dp 64, 43% BF16 MFU; 16384 GPUs, dp 128, 41%.
    # Per-GEMM compute (H100: 132 SMs, ceiling 80.3%) in place of the constant 0.6 of peak:
    (training_runs.LLAMA3_405B[0], 0.044, 0.10),       # predicted 44.9% (36.2% at 0.6)
    (training_runs.LLAMA3_405B[1], -0.174, 0.20),      # predicted 33.9% (27.3% at 0.6)
], ids=["8192 GPUs", "16384 GPUs"])
def test_llama3_405b_on_h100(run, expected_error, tolerance):
    error = _error(plan.predict_published(run).mfu, run.mfu)
    # With 16 stages and 2048/dp micro-batches of one sequence per replica (32 at 8192 GPUs,
    # 16 at 16384), the plain bubble (p-1)/(m+p-1) is 32% and 48% of the pipeline's time; Llama 3
    # interleaved its schedule, which divides the bubble, so the planner under-predicts, and
    # more so at 16384 GPUs where the bubble is larger.
    assert error == pytest.approx(expected_error, abs=0.02)
    assert abs(error) < tolerance


def test_llama3_error_is_the_bubble():
    # The claim in the comment above, checked: with an interleaved schedule of v = 4 chunks
    # per GPU (an illustration, not a figure from the paper) the bubble is a quarter and the
    # planner over-predicts the MFU at 16384 GPUs (+27%) where the plain schedule
    # under-predicts it (-17%): the published run lies between the two schedules.
    run = training_runs.LLAMA3_405B[1]
    plain = plan.predict_published(run)
    interleaved = plan.predict_published(run, virtual_stages=4)
    assert interleaved.bubble_s == pytest.approx(plain.bubble_s / 4)
    assert plain.mfu < run.mfu < interleaved.mfu
    assert _error(interleaved.mfu, run.mfu) == pytest.approx(0.266, abs=0.02)
    assert plain.bottleneck == "pipeline bubble"


# --- Korthikanti et al. 2022: Table 5 times, Figure 1 memory (published.training_runs) -------

MEGATRON = plan.Assumptions(fp32_grad_accumulation=True)   # Megatron's 18 bytes per parameter


def _korthikanti(run):
    workload = plan.Workload(run.n_params, run.seq_len, run.global_batch, n_tokens=1e12,
                             n_layers=run.n_layers, d_model=run.hidden, n_heads=run.n_heads,
                             recompute=run.recompute)
    cluster = plan.cluster(run.gpu, run.n_gpus, storage_read_bytes_per_s=1e12,
                           fabric_link="IB-HDR")
    layout = plan.Layout(dp=1, tp=run.tp, pp=run.pp, micro_batch=run.micro_batch,
                         virtual_stages=run.virtual_stages,
                         sequence_parallel=run.sequence_parallel)
    return plan.predict(workload, cluster, layout, MEGATRON)


@pytest.mark.parametrize("run", training_runs.rows(with_memory=True), ids=str)
def test_korthikanti_figure_1_memory(run):
    # States at 18 bytes per parameter and activations with the interleaved schedule's
    # in-flight factor 1 + (p-1)/(p v): both within 0.1% of Figure 1 (as Calculon transcribes
    # it; its bars agree with the paper's formulas, so this checks their composition).
    predicted = _korthikanti(run)
    states_error = _error(predicted.states_bytes / 2**30, run.states_gib)
    activation_error = _error(predicted.activation_bytes / 2**30, run.activations_gib)
    print(f"{run.name} {run.recompute}: states {states_error:+.2%}, "
          f"activations {activation_error:+.2%}")
    assert abs(states_error) < 0.001 and abs(activation_error) < 0.001


# Errors found with the per-GEMM compute model (clusterlab.gemm; A100: 108 SMs, matmul ceiling
# 86.9% of peak): full 22B -16.2%, 175B -12.5%, 530B -15.1%, 1T -13.1%; selective 22B -22.0%,
# 175B -16.5%, 530B -18.9%, 1T -15.7%. Median |error| 15.9% (10.2% at the former constant 0.6
# of peak, -16% to +13%): the spread across sizes shrank from 29 to 10 points, but every row is
# now under-predicted, the benchmark's ceiling (2025 software) being above what Megatron's
# 2022 kernels reached. The goal of a 10% median is not met; every row is within 25%.
# Selective recomputation is under-predicted more than full: the time it adds is attention's
# score kernels, priced at the datasheet's HBM bandwidth.
KORTHIKANTI_ERRORS = [-0.162, -0.220, -0.125, -0.165, -0.151, -0.189, -0.131, -0.157]


@pytest.mark.parametrize("run, expected", list(zip(training_runs.rows(timed=True),
                                                   KORTHIKANTI_ERRORS)), ids=str)
def test_korthikanti_table_5_times(run, expected):
    error = _error(_korthikanti(run).step_s, run.iteration_s)
    print(f"{run.name} {run.recompute}: {error:+.1%}")
    assert error == pytest.approx(expected, abs=0.01)
    assert abs(error) < 0.25


def _median_abs(errors: list[float]) -> float:
    return statistics.median(abs(e) for e in errors)


def test_korthikanti_errors_by_regime():
    # Median |error| per regime: small (22B) against large (175B-1T) models, full against
    # selective recomputation. The goal (median <= 10%) is not met in any regime; every row is
    # within 25%, and every row is under-predicted.
    errors = {run: _error(_korthikanti(run).step_s, run.iteration_s)
              for run in training_runs.rows(timed=True)}
    regimes = {
        "all": list(errors.values()),
        "22B": [e for r, e in errors.items() if r.name == "22B"],
        ">= 175B": [e for r, e in errors.items() if r.name != "22B"],
        "full": [e for r, e in errors.items() if r.recompute == "full"],
        "selective": [e for r, e in errors.items() if r.recompute == "selective"],
    }
    medians = {name: _median_abs(errs) for name, errs in regimes.items()}
    print({name: f"{m:.1%}" for name, m in medians.items()})
    expected = {"all": 0.159, "22B": 0.191, ">= 175B": 0.154, "full": 0.141,
                "selective": 0.177}
    assert medians == pytest.approx(expected, abs=0.01)
    assert all(e < 0 for e in errors.values())
    assert max(abs(e) for e in errors.values()) < 0.25
