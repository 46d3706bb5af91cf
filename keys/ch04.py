"""Answer key of chapter 04's exercises (instructor-only: student copies leave keys/ out).

Each expected value is computed here as the chapter's solution computes it.
"""

import math

from clusterlab.analytic import costmodel
from clusterlab.catalog import hardware
from clusterlab.course import grading

NVLINK4 = hardware.link("NVLink4")
IB_NDR = hardware.link("IB-NDR")
# the chapter's illustrative latencies per step (ALPHA_NVLINK_S, ALPHA_IB_S), shown to the
# student in the exercises' text
ALPHA_NVLINK_S = 2e-6
ALPHA_IB_S = 5e-6
GRADIENT_BYTES = 7e9 * 2      # the 7B model's bf16 gradients


def _nccl_tests() -> tuple[float, float, float, float]:
    size_bytes, time_s = 1073741824, 5000e-6
    busbw_8 = costmodel.busbw("all_reduce", size_bytes, time_s, 8)
    return (costmodel.algbw(size_bytes, time_s) / 1e9, busbw_8 / 1e9,
            busbw_8 / NVLINK4.bytes_per_s,
            costmodel.busbw("all_reduce", size_bytes, time_s, 4) / 1e9)


def _fsdp() -> tuple[float, float]:
    def sent(collective: str) -> float:
        return costmodel.collective_steps_and_bytes(collective, GRADIENT_BYTES, 64)[1]

    fsdp_bytes = 2 * sent("all_gather") + sent("reduce_scatter")
    return fsdp_bytes, fsdp_bytes / sent("all_reduce")


def _crossover_mib(n: int = 16) -> float:
    log_n = math.log2(n)
    return ALPHA_NVLINK_S * NVLINK4.bytes_per_s * (2 * (n - 1) - log_n) / (
        log_n - 2 * (n - 1) / n) / 2**20


def _moe_layer_ms() -> float:
    buffer_bytes = 8192 * 4096 * 2     # tokens x hidden x bf16, per GPU
    one_s = costmodel.collective_time("all_to_all", buffer_bytes, n_devices=64,
                                      bandwidth=IB_NDR.bytes_per_s, latency=ALPHA_IB_S)
    return 4 * one_s * 1e3


KEY = {
    "ch04.1": grading.close(
        _nccl_tests(), rtol=1e-2,
        name="(algbw GB/s, busbw GB/s on 8 GPUs, that busbw over NVLink4's bandwidth, busbw "
             "GB/s on 4 GPUs)",
        hint="algbw is size over time; busbw multiplies it by the all-reduce's factor "
             "2(n-1)/n; NVLink4's bandwidth is per direction; GB/s is 10^9 bytes/s."),
    "ch04.2": grading.close(
        _fsdp(), rtol=1e-2,
        name="(bytes each GPU sends per step, times the data-parallel all-reduce's bytes)",
        hint="Two all-gathers of all parameters and one reduce-scatter of all gradients, each "
             "sending (n-1)/n of the array from a GPU; an all-reduce sends twice that."),
    "ch04.3": grading.close(
        _crossover_mib(), rtol=1e-2, name="crossover message size (MiB)",
        hint="Equate the ring's 2(n-1) alpha + 2 (n-1)/n S beta with recursive doubling's "
             "log2(n) (alpha + S beta), solve for S, and give it in MiB (2^20 bytes)."),
    "ch04.4": grading.close(
        _moe_layer_ms(), rtol=1e-2, name="all-to-all time of one layer per step (ms)",
        hint="One all-to-all of a GPU's whole token buffer takes (n-1) alpha + (n-1)/n S beta; "
             "a layer runs four per step, two forward and two backward."),
}
