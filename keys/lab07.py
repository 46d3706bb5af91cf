"""Answer key of lab 07, the data path and checkpoints (instructor-only: student copies leave
keys/ out)."""

from clusterlab.analytic import reliability, storage
from clusterlab.course import grading

# a 25 ms step on 256 samples of 150 kB each
_KNEE_BYTES_PER_S = storage.required_read_bytes_per_s(1, 256 / 0.025, 150e3)
_LOAD_AT_HALF_MS = storage.load_time_s(256 * 150e3, _KNEE_BYTES_PER_S / 2) * 1e3

KEY = {
    "lab07.1": grading.close(_KNEE_BYTES_PER_S / 1e9, name="read bandwidth at the knee (GB/s)",
                             hint="What must arrive for each step, and how long is a step? "
                                  "GB is 10^9 bytes, kB 10^3."),
    "lab07.2": grading.close(storage.starved_step_time_s(25.0, _LOAD_AT_HALF_MS, prefetch=False),
                             name="step time without prefetching (ms)",
                             hint="How long does loading one batch take at half the bandwidth? "
                                  "Without prefetching the GPU waits for it, then computes."),
    "lab07.3": grading.close(reliability.young_interval_s(30.0, 3 * 3600.0),
                             name="checkpoint interval (s)",
                             hint="Young's formula balances the time spent writing checkpoints "
                                  "against the work a failure loses; put both times in seconds."),
}
