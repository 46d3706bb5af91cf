"""Answer key of chapter 01's exercises (instructor-only: student copies leave keys/ out).

Each expected value is computed here as the chapter's solution computes it.
"""

import math
from dataclasses import replace

from clusterlab.analytic import flops, memory, plan
from clusterlab.catalog import hardware
from clusterlab.course import grading

DAY_S = 86400.0


def _capacity() -> tuple[float, int]:
    states = memory.training_memory_per_device(405e9, dp=1, zero_stage=0)
    return states, math.ceil(states / hardware.gpu("H200").memory_bytes)


def _gpt3() -> tuple[float, float]:
    total = flops.training_flops(175e9, 300e9)
    return total, flops.time_to_train_s(total, 1024, hardware.gpu("A100").bf16_flops, 0.4) / DAY_S


def _b_with(ports: int):
    return plan.fabric_step(plan.FABRIC_JOB, replace(plan.FABRIC_CLUSTERS["B"],
                                                     nics_per_node=ports))


def _fewest_ports() -> int:
    return next(k for k in range(1, 65) if _b_with(k).communication_s <= _b_with(k).compute_s)


KEY = {
    "ch01.1": grading.close(
        _capacity(), rtol=1e-2, name="(model-state bytes, fewest H200 GPUs)",
        hint="Multiply the parameters by the bytes of states per parameter; then divide by one "
             "H200's memory in bytes and round up, since a GPU holds whole states only."),
    "ch01.2": grading.close(
        _gpt3(), rtol=1e-2, name="(training FLOPs, days on 1024 A100s)",
        hint="6 N D counts the FLOPs; the time divides them by GPUs x peak BF16 FLOP/s x MFU, "
             "in seconds, then by the seconds of a day."),
    "ch01.3": grading.close(
        _b_with(1).communication_s / _b_with(8).communication_s, rtol=1e-2,
        name="communication shrink factor (1 port over 8 ports)",
        hint="Divide cluster B's communication time with one port by its time with eight, both "
             "from plan.fabric_step with the same job."),
    "ch01.4": grading.equal(
        _fewest_ports(), name="fewest 100 Gb/s ports per server",
        hint="Raise nics_per_node one at a time and stop at the first count whose "
             "communication time is no longer than the compute time."),
}
