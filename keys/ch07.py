"""Answer key of chapter 07's exercises (instructor-only: student copies leave keys/ out).

Each expected value is computed here as the chapter's solution computes it.
"""

from dataclasses import replace

import numpy as np

from clusterlab.analytic import flops, plan, reliability
from clusterlab.catalog import hardware
from clusterlab.course import grading


def _mfu_7b() -> tuple[float, float]:
    per_token = flops.transformer_flops_per_token(7e9, 32, 4096, 4096)
    return (flops.mfu(8e6 * per_token, 1024, hardware.gpu("H100").bf16_flops),
            1 - 6 * 7e9 / per_token)


def _fp8() -> tuple[float, float, float, float]:
    achieved = 700e12
    steps = [plan.fabric_step(replace(plan.FABRIC_JOB, bytes_per_grad=b),
                              plan.FABRIC_CLUSTERS["B"]).step_s for b in (2, 4)]
    return (100 * flops.mfu(achieved, 1, hardware.peak_flops("H100", precision="fp8")),
            100 * flops.mfu(achieved, 1, hardware.peak_flops("H100", precision="bf16")), *steps)


def _stragglers(n_steps: int = 500) -> tuple[float, ...]:
    means = []
    for jitter in (0.05, 0.01):
        healthy = reliability.synchronous_step_times_s(4096, n_steps, mean_step_s=1.0,
                                                       std_step_s=jitter, seed=1)
        slow_gpu = reliability.synchronous_step_times_s(1, n_steps, mean_step_s=1.15,
                                                        std_step_s=jitter * 1.15, seed=2)
        with_slow = np.maximum(reliability.synchronous_step_times_s(
            4095, n_steps, mean_step_s=1.0, std_step_s=jitter, seed=1), slow_gpu)
        means += [healthy.mean(), with_slow.mean()]
    return tuple(means)


KEY = {
    "ch07.1": grading.close(
        _mfu_7b(), rtol=1e-2, name="(MFU as a fraction, attention's share of the FLOPs per token)",
        hint="flops.transformer_flops_per_token counts 6N plus attention; MFU is tokens per "
             "second times that over GPUs x the bf16 peak; attention is what exceeds 6N."),
    "ch07.2": grading.close(
        _fp8(), rtol=1e-2,
        name="(MFU % of the FP8 peak, MFU % of the BF16 peak, step s reducing in BF16, step s "
             "reducing in FP32)",
        hint="Use hardware.peak_flops for each precision; for the steps, replace FABRIC_JOB's "
             "bytes_per_grad (2 or 4) and call plan.fabric_step on cluster B."),
    "ch07.3": grading.close(
        _stragglers(), rtol=1e-2,
        name="(mean step s at 5% jitter: healthy, with the slow GPU; at 1% jitter: healthy, "
             "with the slow GPU)",
        hint="reliability.synchronous_step_times_s over 500 steps; for the slow GPU, take the "
             "maximum of 4095 healthy GPUs and one of mean 1.15 s, its jitter scaled too."),
}
