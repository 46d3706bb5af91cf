"""Answer key of lab 01, measuring collectives (instructor-only: student copies leave keys/ out)."""

from clusterlab.analytic import costmodel
from clusterlab.catalog import hardware
from clusterlab.course import grading

KEY = {
    "lab01.1": grading.close(
        costmodel.collective_steps_and_bytes("all_gather", 64 * 2**20, 16)[1],
        name="bytes sent per device",
        hint="Count the blocks of the output, their size, and how many of them a device passes "
             "on: it never sends the block it received last."),
    "lab01.2": grading.close(
        costmodel.busbw("all_to_all", 4 * 2**20, 2.0e-3, 8) / 1e9, name="busbw (GB/s)",
        hint="busbw is algbw (size / time) times the collective's busbw factor (the table at the "
             "top of the lab); GB/s is 10^9 bytes/s, 4 MiB is 4 x 2^20 bytes."),
    "lab01.3": grading.close(
        costmodel.collective_time("all_reduce", 2**20, 8, hardware.link("NVLink4").bytes_per_s,
                                  latency=5e-6) * 1e6,
        name="1 MiB all-reduce time (us)",
        hint="Add the latency of every step of the ring to the time its bytes take on the link; "
             "count steps and bytes per device as the ring all-reduce does."),
}
