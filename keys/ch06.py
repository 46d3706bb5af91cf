"""Answer key of chapter 06's exercises (instructor-only: student copies leave keys/ out).

Each expected value is computed here as the chapter's solution computes it, from the chapter's
workloads (restated below: ResNet-50 on ImageNet on A100s, the 70B language model on H100s).
"""

import math

from clusterlab.analytic import flops, memory, storage
from clusterlab.catalog import hardware
from clusterlab.course import grading

IMAGES_PER_S_PER_A100 = 2470                 # ResNet-50 v1.5, mixed precision, 1x A100 80GB
IMAGE_BYTES = 138e9 / 1_281_167              # ILSVRC2012's training tar over its images
TOKENS_PER_S_PER_H100 = storage.tokens_per_s_per_gpu(
    flops.training_flops(70e9, 1), hardware.gpu("H100").bf16_flops, 0.4)


def _video() -> tuple[float, int]:
    return (storage.required_read_bytes_per_s(512, 40, 2e6) / 1e9,
            storage.max_gpus_fed(20e9, 40, 2e6))


def _serial(target: float = 0.9) -> tuple[float, float]:
    n_gpus, batch_per_gpu = 1024, 256
    compute_s = batch_per_gpu / IMAGES_PER_S_PER_A100
    step_bytes = n_gpus * batch_per_gpu * IMAGE_BYTES
    knee = storage.required_read_bytes_per_s(n_gpus, IMAGES_PER_S_PER_A100, IMAGE_BYTES)
    read = step_bytes / (compute_s * (1 - target) / target)    # t_l = t_c (1 - u) / u
    return read / 1e9, read / knee


def _checkpoint() -> tuple[float, float]:
    checkpoint = memory.checkpoint_bytes(405e9)
    return checkpoint / 1e12, storage.required_write_bytes_per_s(checkpoint, 120) / 1e9


def _video_node() -> tuple[float, int, float]:
    node = storage.required_read_bytes_per_s(8, 30, 50e6)    # 8 GPUs, 30 clips/s of 50 MB
    return (node / 1e9, math.ceil(node / hardware.link("IB-NDR").bytes_per_s),
            storage.host_memory_bytes_per_s(node, gpudirect_storage=False) / 1e9)


KEY = {
    "ch06.1": grading.close(
        _video(), rtol=1e-3, name="(read GB/s for 512 GPUs, GPUs a 20 GB/s system feeds)",
        hint="Multiply GPUs x clips per second x bytes per clip; the GPUs fed are the whole "
             "number of one GPU's reads that fit in 20 GB/s."),
    "ch06.2": grading.close(
        _serial(), rtol=1e-2, name="(read GB/s for 90% compute, multiple of the knee)",
        hint="Solve t_c / (t_c + t_l) = 0.9 for the load time t_l; the throughput reads one "
             "step's bytes in t_l; the knee reads them in t_c."),
    "ch06.3": grading.close(
        _checkpoint(), rtol=1e-2, name="(checkpoint TB, write GB/s for two minutes)",
        hint="memory.checkpoint_bytes counts the weights and optimizer states a checkpoint "
             "keeps; write it in 120 s."),
    "ch06.4": grading.equal(
        (storage.max_gpus_fed(1e9, TOKENS_PER_S_PER_H100, 4),
         storage.max_gpus_fed(1e9, IMAGES_PER_S_PER_A100, IMAGE_BYTES)),
        name="(H100s fed training the 70B model, A100s fed training ResNet-50)",
        hint="storage.max_gpus_fed needs what one GPU consumes: tokens per second of 4 bytes "
             "for the language model, images per second of one stored JPEG for ResNet-50."),
    "ch06.5": grading.close(
        _video_node(), rtol=1e-2,
        name="(read GB/s per node, 400 Gb/s storage ports per node, host memory GB/s "
             "without GPUDirect Storage)",
        hint="A node has 8 GPUs; round the ports up; without GPUDirect Storage each byte "
             "crosses host memory on its way in and on its way out."),
}
