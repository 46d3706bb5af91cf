"""Answer key of chapter 05b's exercises (instructor-only: student copies leave keys/ out).

Each expected value is computed here as the chapter's solution computes it.
"""

from clusterlab.analytic import costmodel, flops
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


def _ring_across_nodes() -> tuple[float, float]:
    gqa = dict(n_heads=LLAMA_HEADS, n_kv_heads=LLAMA_KV_HEADS)
    across = context.ring_overlap_min_block_tokens(
        H100.bf16_flops, hardware.link("IB-NDR").bytes_per_s, **gqa)
    return across, across / context.ring_overlap_min_block_tokens(
        H100.bf16_flops, NVLINK4.bytes_per_s, **gqa)


def _ring_backward(c: int = 16, seq: int = 131072, head_dim: int = 128) -> tuple[float, float]:
    backward = context.ring_attention_backward_traffic(1, seq, LLAMA_KV_HEADS, head_dim, c,
                                                       bytes_per_element=2,
                                                       grad_bytes_per_element=4)
    forward = context.ring_attention_traffic(1, seq, LLAMA_KV_HEADS, head_dim, c,
                                             bytes_per_element=2)
    return (backward.sent_bytes_per_device / 1e6,
            backward.sent_bytes_per_device / forward.sent_bytes_per_device)


KEY = {
    "ch05b.1": grading.close(
        _tensor_parallel_overlap(), rtol=1e-2,
        name="(communication's fraction of the layer time, speed-up when hidden)",
        hint="Only the compute time changes: the layer's FLOPs over t GPUs at 30 % of the "
             "bf16 peak. Hidden, the layer takes the longer of compute and communication."),
    "ch05b.2": grading.close(
        _ring_across_nodes(), rtol=1e-2,
        name="(tokens per GPU across nodes, times the NVLink figure)",
        hint="context.ring_overlap_min_block_tokens with the IB-NDR port's bandwidth and the "
             "grouped key-value heads; only the link changes from the NVLink case."),
    "ch05b.3": grading.close(
        _ring_backward(), rtol=1e-2,
        name="(MB each GPU sends per layer in the backward pass, times the forward's bytes)",
        hint="c - 1 key-value blocks in bf16 and c gradient blocks in FP32, each block "
             "2 (s/c) a_kv h_head values; the forward sends only the c - 1 key-value blocks."),
}
