"""Answer key of chapter 07c's exercises (instructor-only: student copies leave keys/ out).

Each expected value is computed here as the chapter's solution computes it.
"""

from dataclasses import replace

from clusterlab.analytic import flops, plan
from clusterlab.analytic.plan import mfu_table
from clusterlab.catalog import hardware
from clusterlab.catalog.published import mfu_records
from clusterlab.course import grading

N_PARAMS, N_LAYERS, SEQ, WIDTH = 12 * 96 * 12288**2, 96, 2048, 12288   # MegaScale's Table 1
BATCH, N_GPUS = 6144, 12288


def _table_2_mfus() -> tuple[float, float]:
    per_token = flops.transformer_flops_per_token(N_PARAMS, N_LAYERS, SEQ, WIDTH)
    return tuple(100 * flops.mfu(BATCH * SEQ / step_s * per_token, N_GPUS,
                                 hardware.peak_flops("A100"))
                 for step_s in (6.34, 8.57))


def _full_recomputation() -> tuple[float, float]:
    run = next(r for r in mfu_records.PUBLISHED_RUNS if r.system == "MegaScale")
    planned = mfu_table.run_plan(run)
    full = plan.predict(replace(planned.workload, recompute="full"), planned.hardware,
                        planned.layout)
    return full.step_s, 100 * full.mfu


KEY = {
    "ch07c.1": grading.close(
        _table_2_mfus(), rtol=1e-2, name="(MegaScale MFU %, Megatron-LM MFU %)",
        hint="Tokens per second are 6144 x 2048 over the iteration time; times "
             "flops.transformer_flops_per_token of Table 1's shape, over 12,288 A100 BF16 "
             "peaks."),
    "ch07c.2": grading.close(
        _full_recomputation(), rtol=1e-2, name="(step seconds, MFU %) with full recomputation",
        hint="Take the MegaScale row's plan (mfu_table.run_plan) and predict again with "
             "replace(workload, recompute='full') on the same hardware and layout."),
}
