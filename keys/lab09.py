"""Answer key of lab 09, several hosts (instructor-only: student copies leave keys/ out)."""

from clusterlab.analytic import costmodel
from clusterlab.course import grading

KEY = {
    # the inter-host phase: a ring all-reduce over 8 hosts of 1/8 of the 1 GiB buffer
    "lab09.1": grading.close(costmodel.collective_steps_and_bytes("all_reduce", 2**30 / 8, 8)[1],
                             name="network bytes per GPU",
                             hint="Which part of the buffer does each GPU carry across hosts, and "
                                  "among how many peers is that ring all-reduce?"),
    "lab09.2": grading.close(
        costmodel.hierarchical_all_reduce_time(2**30, 8, 8, 450e9, 50e9, intra_latency=3e-6,
                                               inter_latency=10e-6),
        name="hierarchical all-reduce time",
        hint="Build the two-level model with both links' bandwidths and latencies (bytes/s and "
             "seconds) and ask it for the hierarchical all-reduce of 2**30 bytes."),
}
