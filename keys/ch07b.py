"""Answer key of chapter 07b's exercises (instructor-only: student copies leave keys/ out).

Each expected value is computed here as the chapter's solution computes it, from the per-GPU
MTBF the chapter reads off Llama 3 405B's 419 interruptions in 54 days on 16,384 H100s.
"""

import math

import numpy as np

from clusterlab.analytic import flops, memory, reliability, storage
from clusterlab.catalog import hardware
from clusterlab.course import grading

HOUR_S, DAY_S = 3600.0, 86400.0
LLAMA3_GPUS = 16384
PER_GPU_MTBF_S = reliability.mtbf_from_failures_s(419, 54 * DAY_S, LLAMA3_GPUS)


def _failures() -> tuple[float, float]:
    return (reliability.expected_failures(4096, PER_GPU_MTBF_S, 30 * DAY_S),
            reliability.cluster_mtbf_s(PER_GPU_MTBF_S, 4096) / HOUR_S)


def _intervals_min() -> tuple[float, float, float]:
    job_mtbf_s = reliability.cluster_mtbf_s(PER_GPU_MTBF_S, LLAMA3_GPUS)
    grid_s = np.linspace(60, 4 * HOUR_S, 100_000)
    lost = reliability.expected_lost_fraction(grid_s, 60.0, job_mtbf_s, restart_s=300)
    return (grid_s[np.argmin(lost)] / 60, reliability.young_interval_s(60, job_mtbf_s) / 60,
            reliability.daly_interval_s(60, job_mtbf_s) / 60)


def _causes() -> tuple[float, float, float]:
    per_week = reliability.expected_failures(100_000, PER_GPU_MTBF_S, 7 * DAY_S)
    counts = reliability.LLAMA3_405B_INTERRUPTIONS
    total = sum(n for _, n in counts.values())
    return (per_week, per_week * counts["Silent data corruption"][1] / total,
            per_week * counts["Network switch/cable"][1] / total)


def _in_memory_goodput_restart_min(n_gpus: int = 131072) -> float:
    # the chapter's strategies(): in-memory checkpoints of the 405B job, 16M tokens per step at
    # 400 TFLOP/s per GPU, each GPU's shard copied over PCIe 5, intervals in whole steps
    step_s = (flops.transformer_flops_per_token(405e9, 126, 8192, 16384) * 16 * 2**20
              / (n_gpus * 400e12))
    delta = storage.checkpoint_write_s(memory.checkpoint_bytes(405e9) / n_gpus,
                                       hardware.link("PCIe5x16").bytes_per_s)
    mtbf = reliability.cluster_mtbf_s(PER_GPU_MTBF_S, n_gpus)
    interval = step_s * math.ceil(reliability.daly_interval_s(delta, mtbf) / step_s)
    restarts_s = np.linspace(1.0, 600.0, 6000)
    goodputs = np.array([reliability.goodput_fraction(interval, delta, mtbf, r)
                         for r in restarts_s])
    return restarts_s[goodputs >= 0.95].max() / 60


KEY = {
    "ch07b.1": grading.close(
        _failures(), rtol=1e-2, name="(interruptions in 30 days, job MTBF in hours)",
        hint="Failures add up over GPUs: the job's MTBF is the per-GPU MTBF over the GPU "
             "count, and the interruptions are the days over that MTBF."),
    "ch07b.2": grading.close(
        _intervals_min(), rtol=1e-2,
        name="(grid minimum in minutes, Young's interval in minutes, Daly's in minutes)",
        hint="Evaluate reliability.expected_lost_fraction on a fine grid of intervals (1 min "
             "to 4 h) for the 16,384-GPU job's MTBF and take the interval of its minimum."),
    "ch07b.3": grading.close(
        _causes(), rtol=1e-2,
        name="(interruptions per week, from silent data corruption, from network switches "
             "and cables)",
        hint="Scale the expected failures to 100,000 GPUs and one week; each cause's share is "
             "its count over the sum of all counts in LLAMA3_405B_INTERRUPTIONS."),
    "ch07b.4": grading.close(
        _in_memory_goodput_restart_min(), rtol=1e-2,
        name="largest restart time in minutes for 95% goodput",
        hint="Keep the in-memory strategy's write time and interval for 131,072 GPUs and "
             "lower R until reliability.goodput_fraction reaches 0.95."),
}
