"""Answer key of lab 12, the fabric at scale (instructor-only: student copies leave keys/ out)."""

import numpy as np

from clusterlab.analytic import fabric
from clusterlab.course import grading


def _fewest_qps_near_spraying(ns):
    # the lab's scattered 256-GPU job: mean busbw over seeds 0-7 per QP count, against spraying
    mean_busbw = {q: np.mean([r.busbw for r in fabric.sweep(
        ns["cluster"], "all_reduce", ns["GIB"], over="seed", values=range(8),
        ranks=ns["scattered"], qps=q, progress=False)]) for q in (1, 2, 4, 8, 16)}
    return min(q for q, b in mean_busbw.items() if b >= 0.95 * ns["sprayed"] * 1e9)


KEY = {
    "lab12.1": grading.equal(_fewest_qps_near_spraying, name="queue pairs",
                             hint="For each QP count, average the busbw of the 8 seeds and hold "
                                  "it against the sprayed busbw (sprayed is in GB/s, busbw in "
                                  "bytes/s)."),
}
