"""Answer key of chapter 08's exercises (instructor-only: student copies leave keys/ out).

Each expected value is computed here as the chapter's solution computes it, on the chapter's
job (``plan.FABRIC_JOB``) and clusters (``plan.FABRIC_CLUSTERS``).
"""

from dataclasses import replace

import numpy as np

from clusterlab.analytic import costmodel, memory, plan, reliability, storage
from clusterlab.catalog import hardware
from clusterlab.course import grading

DAY_S = 86400.0
JOB = plan.FABRIC_JOB
CLUSTERS = plan.FABRIC_CLUSTERS


def _floor() -> tuple[float, int]:
    floor = costmodel.cluster_collective("all_reduce", JOB.gradient_bytes,
                                         replace(CLUSTERS["B"], n_nodes=8192))
    a_step_s = plan.fabric_step(JOB, CLUSTERS["A"]).step_s
    fewest_ports = next(k for k in range(1, 65) if plan.fabric_step(
        JOB, replace(CLUSTERS["B"], nics_per_node=k)).step_s < a_step_s)
    return JOB.steps * floor.time_s / DAY_S, fewest_ports


def _overlap() -> tuple[float, float]:
    b_step = plan.fabric_step(JOB, CLUSTERS["B"])
    eta_max = plan.BACKWARD_FRACTION * b_step.compute_s / b_step.communication_s
    return eta_max, plan.fabric_step(JOB, CLUSTERS["B"], overlap=1.0).step_s


def _smallest_dp(n_params: float, stage: int, budget_bytes: float = 60e9) -> int:
    return next(d for d in range(1, 100_000)
                if memory.training_memory_per_device(n_params, d, stage) <= budget_bytes)


def _operations() -> tuple[float, float, float, float]:
    # the chapter's budget: Llama 3's 419 failures in 54 days on 16,384 GPUs, the 7B model's
    # checkpoint written at 20 GB/s, a 10-minute restart
    per_gpu_mtbf_s = reliability.mtbf_from_failures_s(419, 54 * DAY_S, 16384)
    write_s = storage.checkpoint_write_s(memory.checkpoint_bytes(7e9), 20e9)
    restart_s = 10 * 60
    mtbf_s = reliability.cluster_mtbf_s(per_gpu_mtbf_s, 16384)
    interval_s = reliability.young_interval_s(write_s, mtbf_s)
    lost = reliability.expected_lost_fraction(interval_s, write_s, mtbf_s, restart_s)
    lost_half = reliability.expected_lost_fraction(interval_s, write_s, mtbf_s, restart_s / 2)
    return mtbf_s / 3600, interval_s / 60, 100 * lost, 100 * lost_half


def _power() -> tuple[int, int, float, float, float]:
    def h100s(pue: float) -> int:
        return plan.gpus_within_power("DGX H100", 10e6, pue=pue, other_it_fraction=0.1)

    gb200 = plan.gpus_within_power("GB200 NVL72", 10e6, pue=1.15)
    h100 = h100s(1.5)
    pue = next(p for p in np.arange(1.5, 1.0, -0.001) if h100s(p) >= h100 + 1000)
    return (gb200, h100, gb200 * hardware.peak_flops("GB200", precision="fp8") / 1e18,
            h100 * hardware.peak_flops("H100", precision="fp8") / 1e18, float(pue))


KEY = {
    "ch08.1": grading.close(
        _floor(), rtol=1e-2, name="(days with no compute term, fewest ports per node that beat A)",
        hint="A step is then the all-reduce alone: its time on 8192 B nodes times the job's "
             "steps, in days. For the ports, raise nics_per_node until B's step is shorter "
             "than A's."),
    "ch08.2": grading.close(
        _overlap(), rtol=1e-2, name="(largest useful eta as a fraction, B's best step in s)",
        hint="B hides at most its backward pass, BACKWARD_FRACTION of its compute: eta stops "
             "helping when eta times the all-reduce reaches that; its best step is "
             "compute + all-reduce - backward."),
    "ch08.3": grading.equal(
        (_smallest_dp(7e9, 1), _smallest_dp(70e9, 3)),
        name="(smallest d for 7B at stage 1, smallest d for 70B at stage 3)",
        hint="Loop d from 1 and stop at the first whose memory.training_memory_per_device is "
             "at most 60e9 bytes."),
    "ch08.4": grading.close(
        _operations(), rtol=1e-2,
        name="(cluster MTBF in hours, Young's interval in minutes, % of time lost, % lost "
             "with half the restart time)",
        hint="Scale the per-GPU MTBF to 16,384 GPUs, set Young's interval from the checkpoint "
             "write time, and keep that interval when you halve the restart."),
    "ch08.5": grading.close(
        _power(), rtol=1e-4,       # tight enough to pin the GPU counts
        name="(GB200 GPUs, H100 GPUs, GB200 dense FP8 EFLOP/s, H100 dense FP8 EFLOP/s, PUE "
             "for 1,000 more H100s, in steps of 0.001 down from 1.5)",
        hint="plan.gpus_within_power counts the GPUs; multiply by hardware.peak_flops at "
             "fp8 for EFLOP/s (10^18); lower the PUE in steps of 0.001 until 1,000 more "
             "H100s fit."),
}
