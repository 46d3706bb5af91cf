"""Answer key of lab 03, data parallelism (instructor-only: student copies leave keys/ out)."""

from clusterlab import collectives, costmodel, grading, hardware


def _bf16_bytes_on_16(ns):
    return costmodel.data_parallel_bytes_per_step(ns["n_params"], 2, 16)


def _all_reduces(ns):
    # counted in the compiled program of the step the student's cell builds
    return collectives.summarize(ns["step_collectives"](ns["dp_1_5mib"]))["all-reduce"].n_ops


KEY = {
    "lab03.1": grading.close(_bf16_bytes_on_16, name="bytes sent",
                             hint="Start from the gradient's size in bf16; what share of it does "
                                  "a ring all-reduce send from each of p devices?"),
    "lab03.2": grading.equal(_all_reduces, name="all-reduce count",
                             hint="How many buckets does the gradient fill, and what else does "
                                  "the step all-reduce? The bucket table above shows the rule."),
    "lab03.3": grading.close(
        costmodel.collective_time("all_reduce", 1e9 * 2, 8, hardware.link("NVLink4").bytes_per_s),
        name="all-reduce time",
        hint="Which bytes does a ring all-reduce put on each GPU's link, and at what speed? "
             "Answer in seconds."),
}
