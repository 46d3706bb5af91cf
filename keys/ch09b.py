"""Answer key of chapter 09b's exercises (instructor-only: student copies leave keys/ out).

Each expected value is computed here as the chapter's solution computes it: Llama 3 70B on
8 H200s, sequences of 4096 tokens, 512 output tokens, 3584-token prompts.
"""

import bisect
import math

from clusterlab.analytic import quantization, queueing, serving
from clusterlab.catalog import hardware
from clusterlab.course import grading

LLAMA = serving.LLAMA_3_70B
H200 = hardware.gpu("H200")
CONTEXT, OUTPUT = 4096, 512
PROMPT = CONTEXT - OUTPUT


def _tpot_s(batch: int, kv_cache: str) -> float:
    return quantization.quantized_decode_step(LLAMA, batch, CONTEXT, gpu=H200, tp=8,
                                              kv_cache=kv_cache).time_s


def _requests_per_s(kv_cache: str, objective_s: float = 0.050) -> float:
    fits = serving.max_batch(LLAMA, CONTEXT, gpu=H200, tp=8,
                             bytes_per_element=quantization.FORMAT_BYTES[kv_cache])
    best = bisect.bisect_right(range(1, fits + 1), objective_s,
                               key=lambda b: _tpot_s(b, kv_cache))
    return best / (OUTPUT * _tpot_s(best, kv_cache))


def _prefill_pool(ttft_s: float = 0.300) -> tuple[float, int]:
    prefill_s = serving.prefill_step(LLAMA, PROMPT, gpu=H200, tp=8).time_s
    x = (ttft_s - prefill_s) / prefill_s
    rate = 2 * x / (1 + 2 * x) / prefill_s
    assert math.isclose(prefill_s + queueing.md1_mean_wait_s(rate, prefill_s), ttft_s)
    return rate, math.ceil(_requests_per_s("bf16") / rate)


KEY = {
    "ch09b.1": grading.close(
        (_requests_per_s("bf16"), _requests_per_s("fp8")), rtol=1e-2,
        name="(requests/s with a BF16 cache, with an FP8 cache)",
        hint="Take the largest batch that fits (serving.max_batch with bytes_per_element), "
             "lower it until the step meets 50 ms, then apply Little's law: batch / (512 x TPOT)."),
    "ch09b.2": grading.close(
        _prefill_pool(), rtol=1e-2,
        name="(prompts/s per prefill replica, prefill replicas per decode replica)",
        hint="Solve S + rho S / (2 (1 - rho)) = 0.3 s for rho, divide by the prefill time S, "
             "then round the decode replica's requests/s over it up to a whole replica."),
}
