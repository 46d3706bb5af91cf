"""Answer key of lab 04, tensor parallelism (instructor-only: student copies leave keys/ out)."""

from clusterlab import costmodel, grading, hardware


def _all_reduced_bytes(ns):
    # counted in the compiled step of the student cell's wide 6-block MLP on 4 devices
    return ns["counted"](ns["six"], ns["x0"], ns["y0"], 4)["all-reduce"].total_bytes


_LAYER = costmodel.tensor_parallel_bytes_per_step(2 * 4096, 8192, 2, 8, bytes_per_element=2)

KEY = {
    "lab04.1": grading.equal(_all_reduced_bytes, name="bytes all-reduced",
                             hint="Count the forward pass's and the backward pass's all-reduces "
                                  "separately, then ask which tensor each one carries: does the "
                                  "hidden width, or the device count, enter its size?"),
    "lab04.2": grading.close(
        _LAYER.sent_bytes_per_device / hardware.link("NVLink4").bytes_per_s,
        name="all-reduce time",
        hint="Count a layer's all-reduces in a training step and the bytes of each (tokens x "
             "width x bytes per value); a ring sends a share of each over the link."),
}
