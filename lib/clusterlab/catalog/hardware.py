"""A catalog of GPUs and links, every number with its source.

Units are SI and stated in every field name: 1 GB = 1e9 bytes, 1 TB/s = 1e12 bytes/s. Memory is
the exception that proves the rule: HBM comes in powers of two, so an H100's "80 GB" is 80 GiB
less what the driver reserves (nvidia-smi: 81,559 MiB); ``GPU.memory_bytes`` holds that measured
total where a source gives it, ``GPU.marketed_memory_bytes`` the datasheet's figure.
Link bandwidths are *per direction* (unidirectional), per GPU or per port; vendors often quote
the bidirectional sum (NVIDIA's "900 GB/s" for H100 NVLink is 450 GB/s each way), and the
``quoted`` field keeps the vendor's figure so the two can be compared. Network rates are quoted in
bits per second (400 Gb/s NDR = 50 GB/s).

Keys in ``references.bib`` are given in each ``source``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from clusterlab import _checks

#: The tensor-core precisions the catalog gives peaks for (:func:`peak_flops`).
Precision = Literal["bf16", "fp8"]


@dataclass(frozen=True)
class GPU:
    """One accelerator, as its datasheet states it (SXM form factor, dense math)."""

    name: str
    memory_bytes: float            # HBM capacity: what nvidia-smi reports (MiB = 2**20 bytes)
    #                                where a source gives it, else as marketed (the source says)
    hbm_bytes_per_s: float         # peak HBM bandwidth
    bf16_flops: float              # dense BF16/FP16 tensor-core FLOP/s, no sparsity
    nvlink_bytes_per_s: float      # NVLink per GPU, per direction
    nvlink_generation: int
    source: str                    # datasheet, key in references.bib
    pcie: str = "PCIe5x16"         # key in LINKS: the GPU's host link (GPU-NIC traffic crosses it)
    fp8_flops: float | None = None  # dense FP8 tensor-core FLOP/s, no sparsity; None: no FP8 units
    tdp_w: float | None = None     # maximum board power (TDP/TGP) in W; None: the source gives
    #                                only the power of the whole system (GB200/GB300 racks)
    marketed_memory_bytes: float | None = None  # the datasheet's "80 GB" (GB = 1e9 bytes);
    #                                None: the same as memory_bytes (no measured total known)
    #: streaming multiprocessors (SMs) of the SXM part, from the architecture whitepaper; the
    #: GEMM model (clusterlab.analytic.gemm) runs tiles in waves over them. None: no source cited,
    # and
    #: clusterlab.analytic.gemm prices its matmuls at the ceiling alone, without wave quantization.
    sm_count: int | None = None

    def __post_init__(self) -> None:
        if self.marketed_memory_bytes is None:
            object.__setattr__(self, "marketed_memory_bytes", self.memory_bytes)


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
            source="NVIDIA Tesla V100 datasheet (SXM2; FP16 tensor, V100 has no BF16 and no FP8; "
                   "PCIe Gen3; max power 300 W) [nvidia_v100_datasheet]; memory: the marketed "
                   "32 GB, no nvidia-smi total of the SXM2 32 GB part found to cite",
            pcie="PCIe3x16",
            tdp_w=300.0),
        GPU("A100", memory_bytes=81920 * 2**20, marketed_memory_bytes=80e9,
            hbm_bytes_per_s=2.039e12, bf16_flops=312e12,
            nvlink_bytes_per_s=300e9, nvlink_generation=3,
            source="NVIDIA A100 datasheet (80GB SXM; PCIe Gen4; no FP8; max TDP 400 W) "
                   "[nvidia_a100_datasheet]; memory: 80 GB as marketed, 81,920 MiB (80 GiB) as "
                   "nvidia-smi reports it [modal_client_pr2797]; 108 SMs "
                   "[nvidia_ampere_whitepaper]",
            pcie="PCIe4x16", tdp_w=400.0, sm_count=108),
        GPU("H100", memory_bytes=81559 * 2**20, marketed_memory_bytes=80e9,
            hbm_bytes_per_s=3.35e12, bf16_flops=989e12,
            nvlink_bytes_per_s=450e9, nvlink_generation=4,
            source="NVIDIA H100 datasheet (SXM5; 1,979 TFLOPS BF16 and 3,958 TFLOPS FP8 are with "
                   "sparsity, half of each dense; max TDP up to 700 W) [nvidia_h100_datasheet]; "
                   "memory: 80 GB as marketed, 81,559 MiB as nvidia-smi reports each 'H100 80GB "
                   "HBM3' [nccl_issue1264]; 132 SMs (SXM5) [nvidia_hopper_whitepaper]",
            fp8_flops=1979e12, tdp_w=700.0, sm_count=132),
        GPU("H200", memory_bytes=143771 * 2**20, marketed_memory_bytes=141e9,
            hbm_bytes_per_s=4.8e12, bf16_flops=989e12,
            nvlink_bytes_per_s=450e9, nvlink_generation=4,
            source="NVIDIA H200 datasheet (SXM; 3,958 TFLOPS FP8 with sparsity, half dense; max "
                   "TDP up to 700 W) [nvidia_h200_datasheet]; memory: 141 GB as marketed, "
                   "143,771 MiB as nvidia-smi reports it [modal_gpu_memory_capacity]",
            fp8_flops=1979e12, tdp_w=700.0),
        GPU("B200", memory_bytes=183359 * 2**20, marketed_memory_bytes=180e9,
            hbm_bytes_per_s=8e12, bf16_flops=2.25e15,
            nvlink_bytes_per_s=900e9, nvlink_generation=5,
            source="NVIDIA DGX B200 datasheet: 1,440 GB, 64 TB/s HBM3e and 72 PFLOPS FP8 "
                   "(sparse) for 8 GPUs, so 180 GB, 8 TB/s, 4.5 PFLOPS dense FP8 and 2.25 PFLOPS "
                   "dense BF16 each [nvidia_dgx_b200_datasheet]; TGP 1,000 W as NVIDIA's "
                   "partners declare it in MLPerf system descriptions [mlperf_inference_b200]; "
                   "memory: 180 GB as marketed, 183,359 MiB as nvidia-smi reports it "
                   "[trtllm_issue10278]",
            fp8_flops=4.5e15, tdp_w=1000.0),
        GPU("GB200", memory_bytes=13.4e12 / 72, hbm_bytes_per_s=576e12 / 72,
            bf16_flops=360e15 / 72 / 2, nvlink_bytes_per_s=900e9, nvlink_generation=5,
            source="NVIDIA GB200 NVL72 datasheet, divided over its 72 Blackwell GPUs: up to "
                   "13.4 TB HBM3e at 576 TB/s, 720 PFLOPS FP8 and 360 PFLOPS BF16 with sparsity "
                   "(half dense), NVLink 130 TB/s [nvidia_gb200_nvl72_datasheet]; NICs on PCIe "
                   "Gen5 (ConnectX-7) [nvidia_dgx_gb200_user_guide]; memory: the marketed "
                   "share, no nvidia-smi total found to cite",
            fp8_flops=720e15 / 72 / 2),
        GPU("GB300", memory_bytes=288e9, hbm_bytes_per_s=576e12 / 72,
            bf16_flops=360e15 / 72 / 2, nvlink_bytes_per_s=900e9, nvlink_generation=5,
            source="NVIDIA GB300 NVL72 datasheet, divided over its 72 Blackwell Ultra GPUs: "
                   "576 TB/s HBM3e, 720 PFLOPS FP8 and 360 PFLOPS BF16 with sparsity (half "
                   "dense), NVLink 130 TB/s, one ConnectX-8 800 Gb/s SuperNIC per GPU "
                   "[nvidia_gb300_nvl72_datasheet]; 288 GB HBM3e and PCIe Gen6 per GPU "
                   "[nvidia_blackwell_ultra_blog]; memory: the marketed 288 GB, no nvidia-smi "
                   "total found to cite",
            pcie="PCIe6x16", fp8_flops=720e15 / 72 / 2),
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
             "NVIDIA DGX B200 datasheet [nvidia_dgx_b200_datasheet]; the same per GPU through "
             "the NVLink Switch trays of a GB200 NVL72 (130 TB/s for 72 GPUs) "
             "[nvidia_gb200_nvl72_datasheet]"),
        Link("PCIe3x16", 15.75e9, "8 GT/s per lane, 128b/130b encoding, 16 lanes",
             "PCI Express Base Specification 3.0 [pcie_specs]"),
        Link("PCIe4x16", 31.5e9, "16 GT/s per lane, 128b/130b encoding, 16 lanes",
             "PCI Express Base Specification 4.0 [pcie_specs]"),
        Link("PCIe5x16", 63e9, "32 GT/s per lane, 128b/130b encoding, 16 lanes",
             "PCI Express Base Specification 5.0 [pcie_specs]"),
        Link("PCIe6x16", 121e9, "64 GT/s per lane, FLIT mode 242/256, 16 lanes",
             "PCI Express Base Specification 6.0: PAM4 at 64 GT/s, 256-byte flits of which 242 "
             "carry TLP and DLLP bytes (8 CRC, 6 FEC) [pcie6_spec]"),
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
    max_power_w: float     # the whole server at full load, W (the datasheet's "system power")
    storage_nics: int      # cards for storage and in-band management (the front-end side),
    storage_nic: str       # key in LINKS: one port of each counted (see the source)
    source: str            # key in references.bib


NODES: dict[str, Node] = {
    node.name: node for node in (
        Node("DGX A100", gpu="A100", gpus_per_node=8, nvswitch_chips=6, nvlink="NVLink3",
             nics_per_node=8, nic="IB-HDR", pcie="PCIe4x16", cpu_cores=128, max_power_w=6.5e3,
             storage_nics=2, storage_nic="Ethernet-200G",
             source="NVIDIA DGX A100 datasheet: 8x A100, 6 NVSwitches, 8x single-port ConnectX-6 "
                    "200 Gb/s HDR, 2x dual-port ConnectX-6 up to 200 Gb/s for storage and "
                    "in-band management, 2x AMD EPYC 7742, 6.5 kW max "
                    "[nvidia_dgx_a100_datasheet]"),
        Node("DGX H100", gpu="H100", gpus_per_node=8, nvswitch_chips=4, nvlink="NVLink4",
             nics_per_node=8, nic="IB-NDR", pcie="PCIe5x16", cpu_cores=112, max_power_w=10.2e3,
             storage_nics=2, storage_nic="Ethernet-400G",
             source="NVIDIA DGX H100 datasheet: 8x H100, 4 NVSwitches, 8x single-port ConnectX-7 "
                    "400 Gb/s, 2x dual-port ConnectX-7 up to 400 Gb/s for storage and in-band "
                    "management, 2x Xeon Platinum 8480C, ~10.2 kW max [nvidia_dgx_h100_datasheet]"),
        Node("DGX H200", gpu="H200", gpus_per_node=8, nvswitch_chips=4, nvlink="NVLink4",
             nics_per_node=8, nic="IB-NDR", pcie="PCIe5x16", cpu_cores=112, max_power_w=10.2e3,
             storage_nics=2, storage_nic="Ethernet-400G",
             source="NVIDIA DGX H200 datasheet: 8x H200, 4 NVSwitches, 8x single-port ConnectX-7 "
                    "400 Gb/s, 2x dual-port ConnectX-7 up to 400 Gb/s for storage and in-band "
                    "management, 2x Xeon Platinum 8480C, ~10.2 kW max [nvidia_dgx_h200_datasheet]"),
        Node("DGX B200", gpu="B200", gpus_per_node=8, nvswitch_chips=2, nvlink="NVLink5",
             nics_per_node=8, nic="IB-NDR", pcie="PCIe5x16", cpu_cores=112, max_power_w=14.3e3,
             storage_nics=2, storage_nic="Ethernet-400G",
             source="NVIDIA DGX B200 datasheet: 8x B200, 2 NVSwitches, 8x single-port ConnectX-7 "
                    "400 Gb/s, 2x Xeon Platinum 8570, ~14.3 kW max [nvidia_dgx_b200_datasheet]; "
                    "2x dual-port BlueField-3 for storage and in-band management, 400 Gb/s "
                    "[nvidia_dgx_b200_user_guide]"),
    )
}


def node(name: str) -> Node:
    """Look up a server by name (case-insensitive); unknown names list the known ones."""
    return _lookup(NODES, name, "node")


@dataclass(frozen=True)
class Rack:
    """A rack-scale system: one NVLink domain spanning a whole rack through NVLink Switch trays.

    In a DGX server the NVLink domain ends at the chassis (8 GPUs on one NVSwitch baseboard); in a
    GB200/GB300 NVL72 compute trays of 4 GPUs are cabled through a copper spine to NVLink Switch
    trays, so all 72 GPUs reach each other at full NVLink bandwidth (scale-up), and only traffic
    between racks crosses the NICs (scale-out).
    """

    name: str
    gpu: str                    # key in GPUS
    nvlink_domain_gpus: int     # GPUs that reach each other over NVLink (the scale-up domain)
    compute_trays: int
    gpus_per_tray: int
    nvlink_switch_trays: int    # 1U trays of NVLink Switch chips joining all compute trays
    nvlink: str                 # key in LINKS: NVLink per GPU, per direction
    nics_per_tray: int          # back-end (compute fabric) NICs per compute tray, one per GPU
    nic: str                    # key in LINKS: one back-end NIC port, per direction
    power_w: float | None       # facility power planned per rack, W; None: no vendor figure
    source: str


RACKS: dict[str, Rack] = {
    rack.name: rack for rack in (
        Rack("GB200 NVL72", gpu="GB200", nvlink_domain_gpus=72, compute_trays=18, gpus_per_tray=4,
             nvlink_switch_trays=9, nvlink="NVLink5", nics_per_tray=4, nic="IB-NDR",
             power_w=1.2e6 / 8,
             source="NVIDIA DGX GB200 user guide: 18 compute trays of 2 Grace CPUs and 4 "
                    "Blackwell GPUs, 9 NVLink switch trays, 4 single-port ConnectX-7 400 Gb/s per "
                    "tray [nvidia_dgx_gb200_user_guide]; 72 GPUs in one NVLink domain "
                    "[nvidia_gb200_nvl72_datasheet]; power: a scalable unit of 8 DGX GB200 racks "
                    "requires a TDP of 1.2 MW, 150 kW per rack with its share of the unit's "
                    "switches [nvidia_superpod_gb200_ra]"),
        Rack("GB300 NVL72", gpu="GB300", nvlink_domain_gpus=72, compute_trays=18, gpus_per_tray=4,
             nvlink_switch_trays=9, nvlink="NVLink5", nics_per_tray=4, nic="IB-XDR",
             power_w=None,
             source="NVIDIA GB300 NVL72 datasheet: 72 Blackwell Ultra GPUs and 36 Grace CPUs in "
                    "one NVLink domain, one ConnectX-8 800 Gb/s SuperNIC per GPU "
                    "[nvidia_gb300_nvl72_datasheet]; the same 18 compute and 9 NVLink switch "
                    "trays as the GB200 rack [nvidia_dgx_gb200_user_guide]"),
    )
}


def rack(name: str) -> Rack:
    """Look up a rack-scale system by name (case-insensitive); unknown names list the known ones."""
    return _lookup(RACKS, name, "rack")


def _system(spec: Node | Rack | str) -> Node | Rack:
    if isinstance(spec, (Node, Rack)):
        return spec
    if str(spec).lower() in (key.lower() for key in RACKS):
        return rack(spec)
    if str(spec).lower() in (key.lower() for key in NODES):
        return node(spec)
    raise ValueError(f"Unknown system {spec!r}: name a server ({', '.join(NODES)}) or a rack "
                     f"({', '.join(RACKS)}), or pass a hardware.Node or hardware.Rack.")


def nvlink_domain_gpus(system: Node | Rack | str) -> int:
    """GPUs that reach each other over NVLink: 8 in a DGX server, 72 in an NVL72 rack.

    Args:
        system: a :class:`Node`, a :class:`Rack` or the name of either.

    Returns:
        The size of the scale-up domain in GPUs.
    """
    spec = _system(system)
    return spec.nvlink_domain_gpus if isinstance(spec, Rack) else spec.gpus_per_node


def scale_up_bytes_per_s(system: Node | Rack | str) -> float:
    """NVLink bandwidth of one GPU to the rest of its NVLink domain, per direction (bytes/s)."""
    return link(_system(system).nvlink).bytes_per_s


def scale_out_bytes_per_s(system: Node | Rack | str) -> float:
    """Back-end network bandwidth per GPU, per direction (bytes/s): the system's NICs shared out.

    Args:
        system: a :class:`Node`, a :class:`Rack` or the name of either.

    Returns:
        NIC port rate times NICs, divided by GPUs (one 400 Gb/s NIC per GPU: 50e9).
    """
    spec = _system(system)
    if isinstance(spec, Rack):
        nics, gpus = spec.nics_per_tray * spec.compute_trays, spec.nvlink_domain_gpus
    else:
        nics, gpus = spec.nics_per_node, spec.gpus_per_node
    return link(spec.nic).bytes_per_s * nics / gpus


def storage_network_bytes_per_s(server: Node | str) -> float:
    """A server's storage and in-band (front-end) network bandwidth, per direction (bytes/s).

    One port per card is counted: a dual-port card sits on one PCIe x16 slot, which cannot
    carry two ports at line rate (two 400 Gb/s ports are 100 GB/s, PCIe 5.0 x16 is 63 GB/s).

    Args:
        server: a :class:`Node` or its name.

    Returns:
        ``storage_nics * storage_nic`` rate (100e9 for a DGX H100).
    """
    spec = node(server) if isinstance(server, str) else server
    if not isinstance(spec, Node):
        raise ValueError(f"storage_network_bytes_per_s needs a server (hardware.Node), got "
                         f"{type(spec).__name__}; the catalog has no storage NICs for racks.")
    return spec.storage_nics * link(spec.storage_nic).bytes_per_s


def scale_up_over_scale_out(system: Node | Rack | str) -> float:
    """How many times faster a GPU talks inside its NVLink domain than across the network.

    Args:
        system: a :class:`Node`, a :class:`Rack` or the name of either.

    Returns:
        ``scale_up_bytes_per_s / scale_out_bytes_per_s`` (dimensionless; 9 for a DGX H100).
    """
    return scale_up_bytes_per_s(system) / scale_out_bytes_per_s(system)


def power_per_gpu_w(system: Node | Rack | str) -> float:
    """Power drawn per GPU by the whole system (server or rack, CPUs, NICs and fans included), W.

    Args:
        system: a :class:`Node`, a :class:`Rack` or the name of either.

    Returns:
        ``max_power_w / gpus_per_node`` for a server, ``power_w / nvlink_domain_gpus`` for a rack.

    Raises:
        ValueError: the rack has no vendor power figure in the catalog.
    """
    spec = _system(system)
    if isinstance(spec, Node):
        return spec.max_power_w / spec.gpus_per_node
    if spec.power_w is None:
        raise ValueError(f"{spec.name} has no power figure in the catalog (its source gives "
                         f"none); use a rack with one: "
                         f"{', '.join(r.name for r in RACKS.values() if r.power_w is not None)}.")
    return spec.power_w / spec.nvlink_domain_gpus


def peak_flops(gpu_spec: GPU | str, *, precision: Precision = "bf16") -> float:
    """Dense (no sparsity) tensor-core peak of a GPU at a precision, FLOP/s.

    Args:
        gpu_spec: a :class:`GPU` or its name.
        precision: ``"bf16"`` (BF16/FP16) or ``"fp8"``.

    Returns:
        ``bf16_flops`` or ``fp8_flops``.

    Raises:
        ValueError: an unknown precision, or FP8 on a GPU without FP8 tensor cores (V100, A100).
    """
    spec = gpu(gpu_spec) if isinstance(gpu_spec, str) else gpu_spec
    if precision == "bf16":
        return spec.bf16_flops
    if precision != "fp8":
        raise ValueError(f"precision must be 'bf16' or 'fp8', got {precision!r}.")
    if spec.fp8_flops is None:
        with_fp8 = ", ".join(name for name, g in GPUS.items() if g.fp8_flops is not None)
        raise ValueError(f"{spec.name} has no FP8 tensor cores; FP8 needs one of: {with_fp8}.")
    return spec.fp8_flops


@dataclass(frozen=True)
class ClusterSpec:
    """A cluster of identical nodes, the one description every model of the course takes.

    ``costmodel.cluster_collective``, the planner, the fabric comparison, serving and the CLI all
    read a cluster from this type. Build one from a catalog server with :meth:`from_node`, or
    give the parts; names are keys of :data:`GPUS` and :data:`LINKS`. Bandwidths are per
    direction. Derive variants with :func:`dataclasses.replace` (e.g. another node count).

    Example:
        >>> ClusterSpec.from_node("DGX H100", n_nodes=4).n_gpus
        32
    """

    gpu: GPU | str                               # the accelerator; a name is looked up in GPUS
    n_nodes: int = 1
    gpus_per_node: int = 8
    nic: str | None = None                       # key of LINKS: one NIC port between nodes
    nics_per_node: int | None = None             # NICs NCCL uses per node; None: one per GPU
    intra_node_link: str | None = None           # key of LINKS replacing the GPU's NVLink
    intra_node_bytes_per_s: float | None = None  # or the node link's rate per GPU, directly
    network_bytes_per_s: float | None = None     # all of a node's NICs together, overriding
    #                                              nic x nics_per_node (nic still names the
    #                                              fabric's kind)
    sharp: bool = False                          # in-network reduction (InfiniBand SHARP)
    storage_read_bytes_per_s: float | None = None  # shared storage, sustained, whole cluster
    name: str = ""                               # a label for tables
    nvlink_domain_gpus: int | None = None        # GPUs of one NVLink domain spanning hosts
    #                                              (72: an NVL72 rack of 4-GPU hosts); None:
    #                                              the domain ends at the host

    def __post_init__(self) -> None:
        if isinstance(self.gpu, str):
            object.__setattr__(self, "gpu", gpu(self.gpu))
        elif not isinstance(self.gpu, GPU):
            raise ValueError(f"gpu must be a name in hardware.GPUS or a hardware.GPU, "
                             f"got {self.gpu!r}.")
        _checks.count("n_nodes", self.n_nodes)
        _checks.count("gpus_per_node", self.gpus_per_node)
        if self.nic is not None:
            object.__setattr__(self, "nic", link(self.nic).name)
        if self.nics_per_node is not None:
            _checks.count("nics_per_node", self.nics_per_node)
        if self.intra_node_link is not None and self.intra_node_bytes_per_s is not None:
            raise ValueError("Give intra_node_link (a name in hardware.LINKS) or "
                             "intra_node_bytes_per_s, not both.")
        if self.intra_node_link is not None:
            object.__setattr__(self, "intra_node_link", link(self.intra_node_link).name)
        for field in ("intra_node_bytes_per_s", "network_bytes_per_s",
                      "storage_read_bytes_per_s"):
            if getattr(self, field) is not None:
                _checks.positive(field, getattr(self, field))
        if (self.n_nodes > 1 and self.nic is None and self.network_bytes_per_s is None):
            raise ValueError(f"A cluster of {self.n_nodes} nodes needs a network: give nic "
                             f"(a name in hardware.LINKS, e.g. 'IB-NDR') or "
                             f"network_bytes_per_s.")
        if self.nvlink_domain_gpus is not None:
            self._check_nvlink_domain()

    def _check_nvlink_domain(self) -> None:
        """An NVLink domain holds whole hosts, and the cluster holds whole domains (or lies
        inside one)."""
        domain = _checks.count("nvlink_domain_gpus", self.nvlink_domain_gpus)
        if domain % self.gpus_per_node:
            raise ValueError(f"nvlink_domain_gpus={domain} is not a whole number of hosts of "
                             f"{self.gpus_per_node} GPUs; give a multiple of gpus_per_node "
                             f"(an NVL72 rack of 4-GPU hosts: 72).")
        if self.n_gpus % self.gpus_per_nvlink_domain:
            hosts = domain // self.gpus_per_node
            raise ValueError(f"{self.n_gpus} GPUs do not fill NVLink domains of {domain}; give "
                             f"a node count that fills whole domains ({hosts} hosts each), or "
                             "the GPUs per domain the run used as nvlink_domain_gpus.")

    @classmethod
    def from_rack(cls, system: Rack | str, n_racks: int = 1, **changes) -> ClusterSpec:
        """``n_racks`` of a catalog rack (:data:`RACKS`): its compute trays are the hosts, its
        NVLink domain spans them, and its back-end NICs join the racks."""
        spec = system if isinstance(system, Rack) else rack(system)
        _checks.count("n_racks", n_racks)
        fields = dict(gpu=spec.gpu, n_nodes=n_racks * spec.compute_trays,
                      gpus_per_node=spec.gpus_per_tray, nic=spec.nic,
                      nics_per_node=spec.nics_per_tray,
                      nvlink_domain_gpus=spec.nvlink_domain_gpus,
                      name=f"{n_racks} x {spec.name}")
        return cls(**(fields | changes))

    @classmethod
    def from_node(cls, server: Node | str, n_nodes: int = 1, **changes) -> ClusterSpec:
        """``n_nodes`` of a catalog server (:data:`NODES`), with any field changed by keyword."""
        spec = server if isinstance(server, Node) else node(server)
        fields = dict(gpu=spec.gpu, n_nodes=n_nodes, gpus_per_node=spec.gpus_per_node,
                      nic=spec.nic, nics_per_node=spec.nics_per_node,
                      name=f"{n_nodes} x {spec.name}")
        return cls(**(fields | changes))

    @property
    def n_gpus(self) -> int:
        return self.n_nodes * self.gpus_per_node

    @property
    def gpus_per_nvlink_domain(self) -> int:
        """GPUs that reach each other over NVLink: the host's, or the domain's where it spans
        hosts (all of the cluster's GPUs where the cluster lies inside one domain)."""
        if self.nvlink_domain_gpus is None:
            return self.gpus_per_node
        return min(self.nvlink_domain_gpus, self.n_gpus)

    @property
    def n_nvlink_domains(self) -> int:
        """NVLink domains in the cluster: the hosts, or the multi-host domains (NVL72 racks)."""
        return self.n_gpus // self.gpus_per_nvlink_domain

    @property
    def node_link_bytes_per_s(self) -> float:
        """Each GPU's link to the others in its node: NVLink unless replaced."""
        if self.intra_node_bytes_per_s is not None:
            return self.intra_node_bytes_per_s
        if self.intra_node_link is not None:
            return link(self.intra_node_link).bytes_per_s
        return self.gpu.nvlink_bytes_per_s

    @property
    def node_network_bytes_per_s(self) -> float:
        """Line rate of a node's NICs together, per direction (0 without a network)."""
        if self.network_bytes_per_s is not None:
            return self.network_bytes_per_s
        if self.nic is None:
            return 0.0
        nics = self.gpus_per_node if self.nics_per_node is None else self.nics_per_node
        return link(self.nic).bytes_per_s * nics

    @property
    def network_bytes_per_gpu(self) -> float:
        """The node's NICs shared out per GPU, per direction."""
        return self.node_network_bytes_per_s / self.gpus_per_node

    def describe(self) -> str:
        """One line, e.g. ``32 x H100 (4 nodes of 8), 8 x IB-NDR (400 Gb/s per port) per node``."""
        nodes = f"{self.n_nodes} node{'s' if self.n_nodes > 1 else ''}"
        text = f"{self.n_gpus} x {self.gpu.name} ({nodes} of {self.gpus_per_node})"
        if self.gpus_per_nvlink_domain > self.gpus_per_node:
            text += (f" in {self.n_nvlink_domains} NVLink domain"
                     f"{'s' if self.n_nvlink_domains > 1 else ''} of "
                     f"{self.gpus_per_nvlink_domain}")
        if self.network_bytes_per_s is not None:
            return text + f", {self.network_bytes_per_s * 8 / 1e9:g} Gb/s per node"
        if self.nic is not None:
            nics = self.gpus_per_node if self.nics_per_node is None else self.nics_per_node
            return text + f", {nics} x {self.nic} ({link(self.nic).quoted}) per node"
        return text


@dataclass(frozen=True)
class ReferenceFabric:
    """A vendor reference design of a compute fabric (a two-tier, rail-optimized leaf-spine).

    Its counts of switches and cables, as the vendor publishes them; the graph built from it is
    :func:`clusterlab.analytic.topology.from_fabric`'s, its flows
    :mod:`clusterlab.analytic.fabric`'s.
    """

    name: str
    node: str                    # key in NODES
    nodes_per_group: int         # servers in one scalable unit (one rail leaf per GPU each)
    n_groups: int                # scalable units
    n_leaves: int
    n_spines: int
    leaf_spine_cables: int       # cables between leaves and spines, in total
    link: str                    # key in LINKS: every cable of the fabric
    source: str


FABRICS: dict[str, ReferenceFabric] = {
    fabric.name: fabric for fabric in (
        ReferenceFabric(
            "SuperPOD B200 4SU", node="DGX B200", nodes_per_group=32, n_groups=4, n_leaves=32,
            n_spines=16, leaf_spine_cables=1024, link="IB-NDR",
            source="NVIDIA DGX SuperPOD reference architecture (DGX B200), table of component "
                   "counts: 4 SUs, 128 nodes, 1024 GPUs, 32 leaf and 16 spine switches, 1024 "
                   "node-leaf and 1024 leaf-spine cables, NDR 400 Gb/s [nvidia_superpod_b200_ra]"),
    )
}


def fabric(name: str) -> ReferenceFabric:
    """Look up a reference fabric by name (case-insensitive); unknown names list the known ones."""
    return _lookup(FABRICS, name, "fabric")


def ridge_point(gpu_spec: GPU | str, *, precision: Precision = "bf16") -> float:
    """Arithmetic intensity (FLOP per byte of HBM traffic) where a GPU's roofline bends.

    Below it a kernel is memory-bound (HBM bandwidth limits it), above it compute-bound.

    Args:
        gpu_spec: a :class:`GPU` or its name.
        precision: whose peak sets the roof, ``"bf16"`` or ``"fp8"`` (see :func:`peak_flops`).

    Returns:
        ``peak_flops(gpu_spec, precision=precision) / hbm_bytes_per_s`` in FLOP/byte.

    References:
        Williams, Waterman & Patterson, "Roofline", CACM 52(4), 2009.
        https://doi.org/10.1145/1498765.1498785
    """
    spec = gpu(gpu_spec) if isinstance(gpu_spec, str) else gpu_spec
    return peak_flops(spec, precision=precision) / spec.hbm_bytes_per_s


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
