"""Answer key of chapter 09's exercises (instructor-only: student copies leave keys/ out).

Each expected value is computed here as the chapter's solution computes it, for the chapter's
model, ``serving.LLAMA_3_70B``.
"""

import math

from clusterlab.analytic import serving
from clusterlab.catalog import hardware
from clusterlab.course import grading

LLAMA = serving.LLAMA_3_70B
H200 = hardware.gpu("H200")
MS = 1e3


def _kv_fp8(tokens: int = 32_768) -> tuple[float, int, int]:
    return (LLAMA.kv_cache_bytes(tokens, 1, bytes_per_element=1) / 1e9,
            *(serving.max_batch(LLAMA, tokens, gpu=H200, tp=8, bytes_per_element=b)
              for b in (2, 1)))


def _crossovers() -> tuple[float, ...]:
    return tuple(serving.crossover_batch(LLAMA, s, gpu=name)
                 for name in ("H200", "B200") for s in (0, 1024))


def _tensor_parallel(context: int = 4096) -> tuple[float, ...]:
    parts = []
    for tp in (8, 4):
        step = serving.decode_step(LLAMA, 1, context, gpu=H200, tp=tp)
        parts += [100 * step.communication_s / step.time_s,
                  max(step.compute_s, step.memory_s) * MS]
    return tuple(parts)


def _disaggregated(prompt: int = 8192) -> tuple[float, float, float]:
    prefill_s = serving.prefill_step(LLAMA, prompt, gpu=H200, tp=8).time_s
    one, eight = (serving.kv_transfer_time_s(LLAMA, prompt, link="IB-NDR", n_links=n)
                  for n in (1, 8))
    return one * MS, eight * MS, eight / prefill_s


def _sizes() -> tuple[int, int, int, int, int]:
    decode = serving.size_serving(LLAMA, gpu="B200", target_tokens_per_s=1e6, max_tpot_s=0.030,
                                  seq_len=2048)
    prompts_per_s = 1e6 / 1024          # conversations finishing per second, 1024 tokens each
    prefill = [tp * math.ceil(prompts_per_s * serving.prefill_step(
        LLAMA, 1024, gpu="B200", tp=tp).time_s) for tp in (8, 1)]
    return decode.gpus, decode.tp, decode.batch, *prefill


KEY = {
    "ch09.1": grading.close(
        _kv_fp8(), rtol=1e-3,     # tight enough to pin the sequence counts
        name="(FP8 cache GB of one sequence, sequences with a BF16 cache, with an FP8 cache)",
        hint="kv_cache_bytes and serving.max_batch take bytes_per_element: 2 for BF16, 1 for "
             "FP8; the server is 8 H200s with t = 8."),
    "ch09.2": grading.close(
        _crossovers(), rtol=1e-2,
        name="(b* on the H200 at s = 0, at s = 1024, on the B200 at s = 0, at s = 1024)",
        hint="serving.crossover_batch(model, s, gpu=...) for each GPU and sequence length; "
             "at s = 0 it is the GPU's ridge point."),
    "ch09.3": grading.close(
        _tensor_parallel(), rtol=1e-2,
        name="(communication % at t = 8, ms per token without it at t = 8, the same two at "
             "t = 4)",
        hint="serving.decode_step returns compute_s, memory_s and communication_s; without "
             "communication a token takes the longer of compute and memory."),
    "ch09.4": grading.close(
        _disaggregated(), rtol=1e-2,
        name="(ms over one NIC, ms over eight NICs, fraction of the prefill time over eight)",
        hint="serving.kv_transfer_time_s with link='IB-NDR' and n_links; the prefill time is "
             "serving.prefill_step's time_s on 8 H200s at t = 8."),
    "ch09.5": grading.equal(
        _sizes(),
        name="(decode GPUs, decode t, decode batch, prefill GPUs at t = 8, prefill GPUs at t = 1)",
        hint="serving.size_serving gives the decode plan; the prefill pool needs enough "
             "replicas for 1e6 / 1024 prompts per second, rounded up, times t GPUs each."),
}
