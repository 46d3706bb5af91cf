"""Answer key of lab 04, tensor parallelism (instructor-only: student copies leave keys/ out)."""

from clusterlab import costmodel, grading, hardware


def _all_reduces(ns):
    # counted in the compiled step of the student cell's 6-block MLP on 2 devices
    return ns["counted"](ns["six"], ns["x0"], ns["y0"], 2)["all-reduce"].n_ops


_LAYER = costmodel.tensor_parallel_bytes_per_step(2 * 4096, 8192, 2, 8, bytes_per_element=2)

KEY = {
    "lab04.1": grading.equal(_all_reduces, name="all-reduces",
                             hint="Count the forward pass's and the backward pass's all-reduces "
                                  "separately; the 3-block check above counted both."),
    "lab04.2": grading.close(
        _LAYER.sent_bytes_per_device / hardware.link("NVLink4").bytes_per_s,
        name="all-reduce time",
        hint="Count a layer's all-reduces in a training step and the bytes of each (tokens x "
             "width x bytes per value); a ring sends a share of each over the link."),
}
