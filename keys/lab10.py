"""Answer key of lab 10, planning a cluster (instructor-only: student copies leave keys/ out)."""

from dataclasses import replace

from clusterlab.analytic import plan
from clusterlab.course import grading

_DAY_S = 24 * 3600.0


def _storage_gb_per_s(ns):
    # C's best plan, from the lab: the step's bytes in the time the step spends not waiting
    c_plan, vision = ns["best"]["C starved storage"], ns["vision"]
    step_bytes = vision.tokens_per_step * vision.bytes_per_token
    return step_bytes / (c_plan.step_s - c_plan.data_wait_s) / 1e9


def _gpus_needed(ns):
    # chapter 8's B2 fabric: two 200 Gb/s Ethernet ports per node (not shown by the lab)
    three_days = replace(ns["vision"], time_budget_s=3 * _DAY_S)
    design = plan.cluster("H100", 8, storage_read_bytes_per_s=20e9, fabric_link="Ethernet-200G",
                          nics_per_node=2)
    return plan.gpus_needed(three_days, design).hardware.n_gpus


KEY = {
    "lab10.1": grading.close(_storage_gb_per_s, name="storage GB/s", rtol=0.01,
                             hint="Loading must take no longer than the rest of the step: which "
                                  "of the plan's times is that, and how many bytes does one step "
                                  "read? GB is 10^9 bytes."),
    "lab10.2": grading.equal(_gpus_needed, name="GPUs needed",
                             hint="Give the workload a deadline (dataclasses.replace) and let the "
                                  "planner search the 2 x 200G design's sizes."),
}
