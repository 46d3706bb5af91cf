"""Answer key of lab 10, planning a cluster (instructor-only: student copies leave keys/ out).

``lab10.3`` is the assignment: the student's ``layout_model(n_params, global_batch, dp, tp, pp,
micro_batch, zero_stage)``, float32 arrays of K layouts in, ``(states_bytes, bubble)`` out, is
exported with ``jax.jit`` and judged on 8 layouts of 3B to 175B models the lab never shows,
case by case, against ``plan.predict``: ``Plan.states_bytes`` and the bubble's share of the
pipeline's time. Its contract is those two planner terms exactly, so the tolerance is float32
rounding (rtol 1e-5), where a wrong term is off by percents (Adam's state at 8 bytes instead
of 12: 25% at ZeRO-0; the bubble as (p - 1) / m: 6% at m = 16).
"""

from dataclasses import replace
from typing import NamedTuple

import numpy as np

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


# --- lab10.3: the student's model of a layout, judged against the planner's own terms --------

class _Layout(NamedTuple):
    """One hidden case: a dense workload of n_params on a cluster of H100s, one layout of it."""

    n_params: float
    global_batch: int
    dp: int
    tp: int
    pp: int
    micro_batch: int
    zero_stage: int

    def __str__(self) -> str:
        return (f"{self.n_params / 1e9:g}B parameters, batch {self.global_batch}, dp{self.dp} "
                f"tp{self.tp} pp{self.pp} ZeRO-{self.zero_stage}, micro-batch {self.micro_batch}")


# The lab shows 70B and 7B models on 512 and 1024 GPUs, batches of 512 and 1024; none of these.
# Every ZeRO stage, pp = 1 (no bubble) and pp > 1, tp = 1 and tp > 1. Planted bugs fail the first
# case that can tell them: ZeRO-0 with tp and pp first, ZeRO-1 second, ZeRO-2 third, ZeRO-3 fifth.
_LAYOUTS = (_Layout(13e9, 512, 16, 4, 2, 2, 0), _Layout(30e9, 768, 32, 8, 1, 1, 1),
            _Layout(30e9, 768, 8, 4, 8, 4, 2), _Layout(175e9, 1536, 16, 8, 16, 1, 1),
            _Layout(175e9, 1536, 64, 8, 4, 2, 3), _Layout(3e9, 256, 64, 1, 1, 4, 2),
            _Layout(3e9, 256, 8, 1, 8, 1, 0), _Layout(13e9, 512, 32, 2, 2, 8, 3))
_LAYOUT_ARGS = [((len(_LAYOUTS),), "float32")] * len(_Layout._fields)


def _planned(case: _Layout) -> tuple[float, float]:
    """(Plan.states_bytes, the bubble's share of the pipeline's time) of ``plan.predict``: the
    planner prices the bubble as ``bubble_s`` beside the work it idles next to (its compute, less
    the last stage's output layer, and the tensor-parallel all-reduces: prediction._bubble_s)."""
    n_gpus = case.dp * case.tp * case.pp
    workload = plan.Workload(case.n_params, seq_len=2048, global_batch=case.global_batch,
                             n_tokens=1e12)
    cluster = plan.cluster("H100", n_gpus, storage_read_bytes_per_s=20e9)
    layout = plan.Layout(dp=case.dp, tp=case.tp, pp=case.pp, zero_stage=case.zero_stage,
                         micro_batch=case.micro_batch)
    planned = plan.predict(workload, cluster, layout)
    work_s = (planned.compute_s - planned.output_layer_s + planned.tp_comm_s
              + planned.cp_comm_s + planned.ep_comm_s)
    return planned.states_bytes, planned.bubble_s / (planned.bubble_s + work_s)


def _check_layout_model(programs) -> None:
    (program,) = programs
    columns = [np.array([getattr(c, f) for c in _LAYOUTS], dtype=np.float32)
               for f in _Layout._fields]
    result = program(*columns)
    shapes = ([np.shape(r) for r in result] if isinstance(result, (tuple, list))
              else [np.shape(result)])
    if shapes != [(len(_LAYOUTS),)] * 2:
        raise grading.Refused(f"its result: shapes {shapes}; return (states_bytes, bubble), "
                              f"two float32 arrays with one value per layout, "
                              f"f32[{len(_LAYOUTS)}] each.")
    states, bubble = (np.asarray(r, dtype=np.float64) for r in result)
    for i, case in enumerate(_LAYOUTS):
        states_bytes, share = _planned(case)
        grading.require_close(
            f"{case}: its model-state bytes per GPU", states[i], states_bytes,
            hint="as the planner's Plan.states_bytes: a GPU holds N / (tp pp) parameters; "
                 "count each one's bytes of BF16 weight, BF16 gradient and Adam's FP32 state, "
                 "and divide by dp what the ZeRO stage shards.")
        grading.require_close(
            f"{case}: its pipeline bubble", bubble[i], share,
            hint="the share of the pipeline's time a stage idles in plain 1F1B (lab 05), with "
                 "m = micro-batches per replica per step.")


KEY = {
    "lab10.1": grading.close(_storage_gb_per_s, name="storage GB/s", rtol=0.01,
                             hint="Loading must take no longer than the rest of the step: which "
                                  "of the plan's times is that, and how many bytes does one step "
                                  "read? GB is 10^9 bytes."),
    "lab10.2": grading.equal(_gpus_needed, name="GPUs needed",
                             hint="Give the workload a deadline (dataclasses.replace) and let the "
                                  "planner search the 2 x 200G design's sizes."),
    "lab10.3": grading.code(
        _check_layout_model, name="layout model",
        hint="Per GPU: its share of the parameters, their bytes by ZeRO stage; per step: the "
             "micro-batches, then the bubble of p stages.",
        exports=[grading.Export(args=_LAYOUT_ARGS, n_devices=1)]),
    # no references: plan.predict (the expected values) runs in Python on one layout at a time;
    # it cannot be traced into a program of arrays
}
