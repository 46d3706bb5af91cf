"""Answer key of chapter 05's exercises (instructor-only: student copies leave keys/ out).

Each expected value is computed here as the chapter's solution computes it.
"""

import numpy as np

from clusterlab.analytic import costmodel, memory
from clusterlab.catalog import hardware
from clusterlab.course import grading

N_7B, BF16 = 7e9, 2
SEQ, MICRO, HID, HEADS = 2048, 1, 12288, 96   # the chapter's GPT-3 175B layer: s, b, h, a
TP = 8
ACT_BYTES = MICRO * SEQ * HID * BF16           # one bf16 activation tensor, b*s*h values


def _lowest_zero_stage() -> int:
    return next(s for s in range(4) if memory.training_memory_per_device(13e9, 32, s) <= 40e9)


def _micro_batches() -> int:
    return next(m for m in range(1, 1000) if costmodel.pipeline_bubble_fraction(16, m) <= 0.1)


def _activation_reduction() -> float:
    act_none = memory.transformer_layer_activation_bytes(SEQ, MICRO, HID, HEADS)
    act_sp_sel = memory.transformer_layer_activation_bytes(
        SEQ, MICRO, HID, HEADS, tensor_parallel=TP, sequence_parallel=True,
        recompute="selective")
    return act_none / act_sp_sel


def _fsdp_time() -> tuple[float, float]:
    dp_bytes = costmodel.sharded_data_parallel_bytes_per_step(N_7B, BF16, 64, 0)
    z3_bytes = costmodel.sharded_data_parallel_bytes_per_step(N_7B, BF16, 64, 3)
    port = hardware.link("IB-NDR").bytes_per_s
    return z3_bytes / port, (z3_bytes - dp_bytes) / port


def _interleaved() -> tuple[int, float]:
    def idle(v: int) -> float:
        return costmodel.pipeline_bubble_fraction(8, 16, "interleaved", virtual_stages=v)

    v_min = next(v for v in range(1, 64) if idle(v) <= 0.1)
    return v_min, 100 * idle(v_min)


def _zero_bubble() -> tuple[int, float]:
    one_f_one_b = costmodel.pipeline_bubble_fraction(8, 32, "1f1b")
    bubble_over_work = one_f_one_b / (1 - one_f_one_b) / 3
    zb_h1 = bubble_over_work / (1 + bubble_over_work)
    v_same = next(v for v in range(1, 9) if np.isclose(
        costmodel.pipeline_bubble_fraction(8, 32, "interleaved", virtual_stages=v), zb_h1))
    return v_same, (8 * v_same - 1) / (8 - 1)


def _hsdp() -> tuple[float, float, float, float]:
    gpus, group = 128, 8
    hsdp_gb = memory.training_memory_per_device(N_7B, group, 3) / 1e9
    zero3_gb = memory.training_memory_per_device(N_7B, gpus, 3) / 1e9
    per_gpu_gb = costmodel.collective_steps_and_bytes(
        "all_reduce", N_7B * BF16 / group, gpus // group)[1] / 1e9   # every hop crosses a NIC
    zero3_ring_gb = costmodel.sharded_data_parallel_bytes_per_step(N_7B, BF16, gpus, 3) / 1e9
    # 16 of the 128 ring hops leave a node
    zero3_node_gb = group * zero3_ring_gb * (gpus // group) / gpus
    return hsdp_gb, group * per_gpu_gb, zero3_gb, zero3_node_gb


def _tensor_parallel_ms() -> tuple[float, float]:
    rack = hardware.rack("GB200 NVL72")
    in_rack = costmodel.cluster_collective("all_reduce", ACT_BYTES,
                                           hardware.ClusterSpec(gpu=rack.gpu, gpus_per_node=32))
    across = costmodel.cluster_collective("all_reduce", ACT_BYTES, hardware.ClusterSpec(
        n_nodes=4, gpu="B200", gpus_per_node=8, nic="IB-NDR"))
    return in_rack.time_s * 1e3, across.time_s * 1e3


KEY = {
    "ch05.1": grading.equal(
        _lowest_zero_stage(), name="lowest ZeRO stage",
        hint="memory.training_memory_per_device(n, dp, stage) gives each stage's bytes per "
             "GPU; try the stages from 0 up against 40 GB (40e9 bytes)."),
    "ch05.2": grading.equal(
        _micro_batches(), name="micro-batches",
        hint="The bubble fraction is (p-1)/(m+p-1); find the smallest whole m that brings it "
             "to 10 % or less."),
    "ch05.3": grading.close(
        _activation_reduction(), rtol=1e-2, name="activation reduction factor",
        hint="Divide the layer's activations with no parallelism by those with t = 8, sequence "
             "parallelism and selective recomputation "
             "(memory.transformer_layer_activation_bytes)."),
    "ch05.4": grading.close(
        _fsdp_time(), rtol=1e-2, name="(communication seconds per step, of which the extra "
                                      "all-gather)",
        hint="Each GPU's ZeRO-3 bytes per step over one port's bytes_per_s; the extra "
             "all-gather is what ZeRO-3 sends beyond plain data parallelism."),
    "ch05.5": grading.close(
        _interleaved(), rtol=1e-2, name="(virtual stages v, idle percent)",
        hint="With v virtual stages the idle fraction is (p-1)/(v m + p-1); find the smallest "
             "whole v at 10 % or less and give its fraction in percent."),
    "ch05.6": grading.close(
        _zero_bubble(), rtol=1e-2, name="(virtual stages v, times as many messages)",
        hint="Turn 1F1B's idle fraction f into bubble over work f/(1-f), take a third, turn it "
             "back into an idle fraction, then match interleaving's; messages grow as "
             "(p v - 1)/(p - 1)."),
    "ch05.7": grading.close(
        _hsdp(), rtol=1e-2,
        name="(HSDP GB per GPU, HSDP GB per node on the network, ZeRO-3 GB per GPU, ZeRO-3 GB "
             "per node on the network)",
        hint="HSDP shards states over a node's 8 GPUs and all-reduces gradient shards over the "
             "16 replicas; in ZeRO-3's ring over 128 GPUs only the hops between nodes use the "
             "network."),
    "ch05.8": grading.close(
        _tensor_parallel_ms(), rtol=1e-2,
        name="(all-reduce ms inside the NVL72, all-reduce ms across four DGX B200)",
        hint="One b s h bf16 tensor of the GPT-3 layer; costmodel.cluster_collective prices it "
             "on a hardware.ClusterSpec of 32 GPUs in one rack, or 4 nodes of 8 with one "
             "IB-NDR NIC per GPU."),
}
