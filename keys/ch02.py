"""Answer key of chapter 02's exercises (instructor-only: student copies leave keys/ out).

Each expected value is computed here as the chapter's solution computes it.
"""

from clusterlab.analytic import flops
from clusterlab.catalog import hardware
from clusterlab.course import grading

K = 4096            # the layer's hidden size in ch02.2


def _ridge_gain() -> tuple[float, float]:
    gain = hardware.gpu("H200").hbm_bytes_per_s / hardware.gpu("H100").hbm_bytes_per_s
    return hardware.ridge_point("H100"), gain


def _matmul_intensity(m: int) -> float:
    # 2 m K^2 FLOPs over 2 bytes x (m K + K^2 + m K) values
    return 2 * m * K * K / (2 * (2 * m * K + K * K))


def _matmul() -> tuple[int, float]:
    ridge = hardware.ridge_point("B200")
    m_min = next(m for m in range(1, 100 * K) if _matmul_intensity(m) >= ridge)
    fraction = hardware.roofline_flops("B200", _matmul_intensity(32)) / hardware.gpu(
        "B200").bf16_flops
    return m_min, fraction


def _drain_s() -> tuple[float, ...]:
    return tuple(spec.gpus_per_node * hardware.gpu(spec.gpu).memory_bytes
                 / (spec.nics_per_node * hardware.link(spec.nic).bytes_per_s)
                 for spec in hardware.NODES.values())


def _mfu() -> tuple[float, float]:
    n_gpus, per_gpu_flops = 1024, 600e12
    return tuple(flops.mfu(n_gpus * per_gpu_flops, n_gpus,
                           hardware.peak_flops("H100", precision=precision))
                 for precision in ("bf16", "fp8"))


def _nvl72() -> tuple[float, int]:
    rack, node = hardware.rack("GB200 NVL72"), hardware.node("DGX H100")

    def out(spec):
        return hardware.scale_out_bytes_per_s(spec) * hardware.nvlink_domain_gpus(spec)

    return out(rack) / out(node), hardware.nvlink_domain_gpus(rack) // hardware.nvlink_domain_gpus(
        node)


def _fused_add() -> tuple[float, float]:
    intensity = 4 / (4 * 2)   # 4 FLOPs per element, on 4 tensors of 2-byte bf16 values
    return intensity, (hardware.roofline_flops("B200", intensity)
                       / hardware.roofline_flops("A100", intensity))


KEY = {
    "ch02.1": grading.close(
        _ridge_gain(), rtol=1e-2,
        name="(intensity below which the H200 is faster, in FLOP/byte; its largest speed-up)",
        hint="A kernel gains only where the H100 is memory-bound: below its ridge point. The "
             "most it gains is where both are memory-bound, the ratio of their HBM bandwidths."),
    "ch02.2": grading.close(
        _matmul(), rtol=1e-3,      # tight enough to pin the whole m
        name="(smallest m that is compute-bound on a B200, fraction of peak at m = 32)",
        hint="FLOPs are 2 m K^2; bytes are 2 x (m K + K^2 + m K). Find the first whole m whose "
             "intensity reaches the B200's ridge point, then apply the roofline at m = 32."),
    "ch02.3": grading.close(
        hardware.link("NVLink3").bytes_per_s / hardware.link("PCIe4x16").bytes_per_s, rtol=1e-2,
        name="NVLink3 over PCIe 4.0 x16",
        hint="Divide the two links' bytes_per_s, both per direction."),
    "ch02.4": grading.close(
        _drain_s(), rtol=1e-2,
        name="seconds to send one server's HBM out of its NICs, per server of hardware.NODES "
             "in its order",
        hint="Eight GPUs' memory_bytes over the server's NICs times one NIC's bytes_per_s; one "
             "value per server, in the order hardware.NODES lists them."),
    "ch02.5": grading.close(
        _mfu(), rtol=1e-2, name="(MFU against the BF16 peak, MFU against the FP8 peak)",
        hint="MFU is the achieved FLOP/s over GPUs x peak; take the dense peaks of "
             "hardware.peak_flops for each precision, as fractions, not percent."),
    "ch02.6": grading.close(
        _nvl72(), rtol=1e-2,
        name="(DGX H100 servers' worth of network in one NVL72, times larger NVLink domain)",
        hint="A system's scale-out is its per-GPU scale-out times the GPUs of its NVLink "
             "domain; compare the rack's with the server's, then the two domains' GPU counts."),
    "ch02.7": grading.close(
        _fused_add(), rtol=1e-2,
        name="(arithmetic intensity in FLOP/byte, B200 speed-up over the A100)",
        hint="Count the bytes of all four tensors, read and written, per element; the kernel "
             "is memory-bound, so the roofline gives its FLOP/s on each GPU."),
}
