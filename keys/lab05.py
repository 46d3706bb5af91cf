"""Answer key of lab 05, pipeline parallelism (instructor-only: student copies leave keys/ out)."""

from clusterlab import grading
from clusterlab.parallel import pipeline

# the smallest m whose 8-stage schedule idles at most 1/8 of its slots (counted, not the formula)
_SMALLEST_M = next(m for m in range(1, 200)
                   if pipeline.make_schedule(8, m).idle_fraction <= 1 / 8 + 1e-12)

KEY = {
    "lab05.1": grading.equal(_SMALLEST_M, name="micro-batches",
                             hint="Write the bubble's share of the step in terms of p and m, and "
                                  "find the first m for which it is at most 1/8."),
    "lab05.2": grading.close(pipeline.make_schedule(8, 32, "gpipe").stash_slots()[0]
                             / pipeline.make_schedule(8, 32, "1f1b").stash_slots()[0],
                             name="ratio",
                             hint="How many micro-batches' inputs does stage 0 hold at its peak "
                                  "under each schedule? The bytes per micro-batch cancel."),
}
