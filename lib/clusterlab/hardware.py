"""A catalog of GPUs and links, every number with its source.

Units are SI and stated in every field name: 1 GB = 1e9 bytes, 1 TB/s = 1e12 bytes/s.
Link bandwidths are *per direction* (unidirectional), per GPU or per port; vendors often quote
the bidirectional sum (NVIDIA's "900 GB/s" for H100 NVLink is 450 GB/s each way), and the
``quoted`` field keeps the vendor's figure so the two can be compared. Network rates are quoted in
bits per second (400 Gb/s NDR = 50 GB/s).

Keys in ``references.bib`` are given in each ``source``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    """One accelerator, as its datasheet states it (SXM form factor, dense math)."""

    name: str
    memory_bytes: float            # HBM capacity as marketed (GB = 1e9 bytes)
    hbm_bytes_per_s: float         # peak HBM bandwidth
    bf16_flops: float              # dense BF16/FP16 tensor-core FLOP/s, no sparsity
    nvlink_bytes_per_s: float      # NVLink per GPU, per direction
    nvlink_generation: int
    source: str                    # datasheet, key in references.bib
    pcie: str = "PCIe5x16"         # key in LINKS: the GPU's host link (GPU-NIC traffic crosses it)


@dataclass(frozen=True)
class Link:
    """One kind of link: an NVLink, a PCIe slot, a network port."""

    name: str
    bytes_per_s: float   # per direction
    quoted: str          # the figure as the vendor or standard quotes it
    source: str


GPUS: dict[str, GPU] = {
    gpu.name: gpu for gpu in (
        GPU("V100", memory_bytes=32e9, hbm_bytes_per_s=900e9, bf16_flops=125e12,
            nvlink_bytes_per_s=150e9, nvlink_generation=2,
            source="NVIDIA Tesla V100 datasheet (SXM2; FP16 tensor, V100 has no BF16; PCIe "
                   "Gen3) [nvidia_v100_datasheet]", pcie="PCIe3x16"),
        GPU("A100", memory_bytes=80e9, hbm_bytes_per_s=2.039e12, bf16_flops=312e12,
            nvlink_bytes_per_s=300e9, nvlink_generation=3,
            source="NVIDIA A100 datasheet (80GB SXM; PCIe Gen4) [nvidia_a100_datasheet]",
            pcie="PCIe4x16"),
        GPU("H100", memory_bytes=80e9, hbm_bytes_per_s=3.35e12, bf16_flops=989e12,
            nvlink_bytes_per_s=450e9, nvlink_generation=4,
            source="NVIDIA H100 datasheet (SXM5; 1,979 TFLOPS is with sparsity) "
                   "[nvidia_h100_datasheet]"),
        GPU("H200", memory_bytes=141e9, hbm_bytes_per_s=4.8e12, bf16_flops=989e12,
            nvlink_bytes_per_s=450e9, nvlink_generation=4,
            source="NVIDIA H200 datasheet (SXM) [nvidia_h200_datasheet]"),
        GPU("B200", memory_bytes=180e9, hbm_bytes_per_s=8e12, bf16_flops=2.25e15,
            nvlink_bytes_per_s=900e9, nvlink_generation=5,
            source="NVIDIA DGX B200 datasheet: 1,440 GB, 64 TB/s HBM3e and 72 PFLOPS FP8 "
                   "(sparse) for 8 GPUs, so 180 GB, 8 TB/s and 2.25 PFLOPS dense BF16 each "
                   "[nvidia_dgx_b200_datasheet]"),
    )
}

LINKS: dict[str, Link] = {
    link.name: link for link in (
        Link("NVLink2", 150e9, "300 GB/s bidirectional per GPU (6 links x 50 GB/s)",
             "NVIDIA Tesla V100 datasheet [nvidia_v100_datasheet]"),
        Link("NVLink3", 300e9, "600 GB/s bidirectional per GPU (12 links x 50 GB/s)",
             "NVIDIA A100 datasheet [nvidia_a100_datasheet]"),
        Link("NVLink4", 450e9, "900 GB/s bidirectional per GPU (18 links x 50 GB/s)",
             "NVIDIA H100 datasheet [nvidia_h100_datasheet]"),
        Link("NVLink5", 900e9, "1.8 TB/s bidirectional per GPU (18 links x 100 GB/s)",
             "NVIDIA DGX B200 datasheet [nvidia_dgx_b200_datasheet]"),
        Link("PCIe3x16", 15.75e9, "8 GT/s per lane, 128b/130b encoding, 16 lanes",
             "PCI Express Base Specification 3.0 [pcie_specs]"),
        Link("PCIe4x16", 31.5e9, "16 GT/s per lane, 128b/130b encoding, 16 lanes",
             "PCI Express Base Specification 4.0 [pcie_specs]"),
        Link("PCIe5x16", 63e9, "32 GT/s per lane, 128b/130b encoding, 16 lanes",
             "PCI Express Base Specification 5.0 [pcie_specs]"),
        Link("IB-HDR", 25e9, "200 Gb/s per port", "NVIDIA ConnectX-6 VPI datasheet; IBTA "
             "roadmap [ibta_roadmap]"),
        Link("IB-NDR", 50e9, "400 Gb/s per port", "NVIDIA ConnectX-7 datasheet; IBTA roadmap "
             "[ibta_roadmap]"),
        Link("IB-XDR", 100e9, "800 Gb/s per port", "NVIDIA ConnectX-8 SuperNIC datasheet; IBTA "
             "roadmap [ibta_roadmap]"),
        Link("Ethernet-100G", 12.5e9, "100 Gb/s per port", "IEEE 802.3 [ieee_8023]"),
        Link("Ethernet-200G", 25e9, "200 Gb/s per port", "IEEE 802.3 [ieee_8023]"),
        Link("Ethernet-400G", 50e9, "400 Gb/s per port", "IEEE 802.3 [ieee_8023]"),
        Link("Ethernet-800G", 100e9, "800 Gb/s per port", "IEEE 802.3df-2024 [ieee_8023]"),
    )
}


def gpu(name: str) -> GPU:
    """Look up a GPU by name (case-insensitive); unknown names list the known ones."""
    return _lookup(GPUS, name, "GPU")


def link(name: str) -> Link:
    """Look up a link by name (case-insensitive); unknown names list the known ones."""
    return _lookup(LINKS, name, "link")


def _lookup(table: dict, name: str, kind: str):
    for key, value in table.items():
        if key.lower() == str(name).lower():
            return value
    raise ValueError(f"Unknown {kind} {name!r}. Known {kind}s: {', '.join(table)}.")


@dataclass(frozen=True)
class Node:
    """One GPU server as its vendor specifies it (the compute fabric only, not storage NICs)."""

    name: str
    gpu: str               # key in GPUS
    gpus_per_node: int
    nvswitch_chips: int    # NVSwitch chips on the baseboard
    nvlink: str            # key in LINKS: NVLink per GPU, per direction
    nics_per_node: int     # compute-fabric NICs, one per GPU
    nic: str               # key in LINKS: one NIC port, per direction
    pcie: str              # key in LINKS: host link of each GPU and NIC
    cpu_cores: int         # CPU cores in total (two sockets)
    source: str            # key in references.bib


NODES: dict[str, Node] = {
    node.name: node for node in (
        Node("DGX A100", gpu="A100", gpus_per_node=8, nvswitch_chips=6, nvlink="NVLink3",
             nics_per_node=8, nic="IB-HDR", pcie="PCIe4x16", cpu_cores=128,
             source="NVIDIA DGX A100 datasheet: 8x A100, 6 NVSwitches, 8x single-port ConnectX-6 "
                    "200 Gb/s HDR, 2x AMD EPYC 7742 [nvidia_dgx_a100_datasheet]"),
        Node("DGX H100", gpu="H100", gpus_per_node=8, nvswitch_chips=4, nvlink="NVLink4",
             nics_per_node=8, nic="IB-NDR", pcie="PCIe5x16", cpu_cores=112,
             source="NVIDIA DGX H100 datasheet: 8x H100, 4 NVSwitches, 8x single-port ConnectX-7 "
                    "400 Gb/s, 2x Xeon Platinum 8480C [nvidia_dgx_h100_datasheet]"),
        Node("DGX B200", gpu="B200", gpus_per_node=8, nvswitch_chips=2, nvlink="NVLink5",
             nics_per_node=8, nic="IB-NDR", pcie="PCIe5x16", cpu_cores=112,
             source="NVIDIA DGX B200 datasheet: 8x B200, 2 NVSwitches, 8x single-port ConnectX-7 "
                    "400 Gb/s, 2x Xeon Platinum 8570 [nvidia_dgx_b200_datasheet]"),
    )
}


def node(name: str) -> Node:
    """Look up a server by name (case-insensitive); unknown names list the known ones."""
    return _lookup(NODES, name, "node")


@dataclass(frozen=True)
class Fabric:
    """A vendor reference design of a compute fabric (a two-tier, rail-optimized leaf-spine)."""

    name: str
    node: str                    # key in NODES
    nodes_per_group: int         # servers in one scalable unit (one rail leaf per GPU each)
    n_groups: int                # scalable units
    n_leaves: int
    n_spines: int
    leaf_spine_cables: int       # cables between leaves and spines, in total
    link: str                    # key in LINKS: every cable of the fabric
    source: str


FABRICS: dict[str, Fabric] = {
    fabric.name: fabric for fabric in (
        Fabric("SuperPOD B200 4SU", node="DGX B200", nodes_per_group=32, n_groups=4,
               n_leaves=32, n_spines=16, leaf_spine_cables=1024, link="IB-NDR",
               source="NVIDIA DGX SuperPOD reference architecture (DGX B200), table of "
                      "component counts: 4 SUs, 128 nodes, 1024 GPUs, 32 leaf and 16 spine "
                      "switches, 1024 node-leaf and 1024 leaf-spine cables, NDR 400 Gb/s "
                      "[nvidia_superpod_b200_ra]"),
    )
}


def fabric(name: str) -> Fabric:
    """Look up a reference fabric by name (case-insensitive); unknown names list the known ones."""
    return _lookup(FABRICS, name, "fabric")


def ridge_point(gpu_spec: GPU | str) -> float:
    """Arithmetic intensity (FLOP per byte of HBM traffic) where a GPU's roofline bends.

    Below it a kernel is memory-bound (HBM bandwidth limits it), above it compute-bound.

    Args:
        gpu_spec: a :class:`GPU` or its name.

    Returns:
        ``bf16_flops / hbm_bytes_per_s`` in FLOP/byte.

    References:
        Williams, Waterman & Patterson, "Roofline", CACM 52(4), 2009.
        https://doi.org/10.1145/1498765.1498785
    """
    spec = gpu(gpu_spec) if isinstance(gpu_spec, str) else gpu_spec
    return spec.bf16_flops / spec.hbm_bytes_per_s


def roofline_flops(gpu_spec: GPU | str, intensity_flops_per_byte: float) -> float:
    """Attainable FLOP/s of a kernel with the given arithmetic intensity (the roofline).

    Args:
        gpu_spec: a :class:`GPU` or its name.
        intensity_flops_per_byte: FLOPs the kernel does per byte it moves to or from HBM (> 0).

    Returns:
        ``min(bf16_flops, intensity * hbm_bytes_per_s)`` in FLOP/s.
    """
    spec = gpu(gpu_spec) if isinstance(gpu_spec, str) else gpu_spec
    if not intensity_flops_per_byte > 0:
        raise ValueError(f"intensity_flops_per_byte must be positive, got "
                         f"{intensity_flops_per_byte!r}.")
    return min(spec.bf16_flops, intensity_flops_per_byte * spec.hbm_bytes_per_s)
