"""Answer key of chapter 08b's exercises (instructor-only: student copies leave keys/ out).

Each expected value is computed here as the chapter's solution computes it, from the published
Llama 3 405B rows (Dubey et al. 2024, Table 4) and the planner.
"""

from clusterlab.analytic import costmodel, plan
from clusterlab.analytic.plan import validation
from clusterlab.catalog.published import training_runs
from clusterlab.course import grading

GIB = 2**30


def _run(n_gpus: int) -> training_runs.MfuRun:
    return next(r for r in training_runs.LLAMA3_405B if r.n_gpus == n_gpus)


def _smaller_run_bubble() -> tuple[int, float, float]:
    run = _run(8192)
    micro_batches = run.global_batch // run.dp
    return (micro_batches, (run.pp - 1) / micro_batches,
            costmodel.pipeline_bubble_fraction(run.pp, micro_batches, "1f1b"))


def _unsharded_memory_gib() -> tuple[float, float]:
    published = validation.llama3_plan(_run(16384))
    layout = plan.Layout(dp=published.layout.dp, tp=published.layout.tp,
                         pp=published.layout.pp, zero_stage=0)
    unsharded = plan.predict(published.workload, published.hardware, layout)
    return unsharded.states_bytes / GIB, unsharded.memory_bytes / GIB


KEY = {
    "ch08b.1": grading.close(
        _smaller_run_bubble(), rtol=1e-2,
        name="(micro-batches, bubble of the ideal step, bubble of the real step)",
        hint="Each replica runs global batch / dp micro-batches of one sequence; the two "
             "conventions divide p - 1 by m and by m + p - 1."),
    "ch08b.2": grading.close(
        _unsharded_memory_gib(), rtol=1e-2, name="(model states GiB, total GiB)",
        hint="Predict the published layout with zero_stage=0 and read states_bytes and "
             "memory_bytes, in GiB (2**30 bytes)."),
}
