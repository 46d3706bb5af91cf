"""Answer key of chapter 05b's exercises (instructor-only: student copies leave keys/ out).

Each expected value is computed here as the chapter's solution computes it.
"""

import numpy as np

from clusterlab.analytic import costmodel, flops, moe
from clusterlab.catalog import hardware
from clusterlab.course import grading
from clusterlab.device.parallel import context

SEQ, MICRO, HID = 2048, 1, 12288              # the chapter's GPT-3 layer: s, b, h
TP = 8
H100, NVLINK4 = hardware.gpu("H100"), hardware.link("NVLink4")
LLAMA_HEADS, LLAMA_KV_HEADS = 128, 8          # Llama 3 405B's query and key-value heads


def _tensor_parallel_overlap(mfu: float = 0.3) -> tuple[float, float]:
    act_bytes = MICRO * SEQ * HID * 2
    comm_s = 4 * costmodel.collective_steps_and_bytes("all_reduce", act_bytes,
                                                      TP)[1] / NVLINK4.bytes_per_s
    layer_flops = flops.transformer_flops_per_token(12 * HID**2, 1, SEQ, HID) * SEQ * MICRO
    compute_s = layer_flops / TP / (mfu * H100.bf16_flops)
    return comm_s / (comm_s + compute_s), (comm_s + compute_s) / max(comm_s, compute_s)


def _capacity(n_experts: int = 16, k: int = 2, tokens: int = 480) -> tuple[int, int, float]:
    to_hot = tokens * k // 4                                   # a quarter of the assignments
    cold = 1 + np.arange(tokens * k - to_hot) % (n_experts - 1)  # the rest cycle over 1..15
    routed = np.concatenate([np.stack([np.zeros(to_hot, int), cold[:to_hot]], axis=1),
                             cold[to_hot:].reshape(-1, k)])
    dropped, slots = [], []
    for factor in (1.0, 1.5):
        capacity = moe.expert_capacity(tokens, n_experts=n_experts, top_k=k,
                                       capacity_factor=factor)
        dropped.append(moe.predicted_dropped(routed, capacity, n_experts))
        slots.append(n_experts * capacity)
    return dropped[0], dropped[1], slots[1] / slots[0]


def _ring_across_nodes() -> tuple[float, float]:
    gqa = dict(n_heads=LLAMA_HEADS, n_kv_heads=LLAMA_KV_HEADS)
    across = context.ring_overlap_min_block_tokens(
        H100.bf16_flops, hardware.link("IB-NDR").bytes_per_s, **gqa)
    return across, across / context.ring_overlap_min_block_tokens(
        H100.bf16_flops, NVLINK4.bytes_per_s, **gqa)


KEY = {
    "ch05b.1": grading.close(
        _tensor_parallel_overlap(), rtol=1e-2,
        name="(communication's fraction of the layer time, speed-up when hidden)",
        hint="Only the compute time changes: the layer's FLOPs over t GPUs at 30 % of the "
             "bf16 peak. Hidden, the layer takes the longer of compute and communication."),
    "ch05b.2": grading.close(
        _capacity(), rtol=1e-3,    # tight enough to pin the counts
        name="(assignments dropped at factor 1.0, dropped at 1.5, buffer growth factor)",
        hint="Capacity is ceil(c T k / E) per expert; only expert 0 overflows, by its "
             "assignments beyond capacity; each buffer holds E times capacity slots."),
    "ch05b.3": grading.close(
        _ring_across_nodes(), rtol=1e-2,
        name="(tokens per GPU across nodes, times the NVLink figure)",
        hint="context.ring_overlap_min_block_tokens with the IB-NDR port's bandwidth and the "
             "grouped key-value heads; only the link changes from the NVLink case."),
}
