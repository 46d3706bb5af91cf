"""NCCL 2.30.7's own cost model of a collective, ported from its source (NumPy-free, no JAX).

NCCL picks an algorithm (ring, tree, NVLS, NVLS-tree, CollNet, PAT) and a protocol (LL, LL128,
Simple) for each call by pricing every pair with ``latency + bytes / bandwidth`` and taking the
fastest (``ncclTopoGetAlgoTime``). The bandwidths and latencies come from
``ncclTopoTuneModel``, which reads the *graphs* that NCCL's topology search found (per algorithm:
a channel count and a per-channel bandwidth inside and between nodes). This module is that
model, rule by rule, from one release:

    NVIDIA/nccl v2.30.7-1 (commit 73100d2, 2026-06-04), ``src/graph/tuning.cc`` (lines cited
    as ``tuning.cc:N``), ``src/graph/search.cc`` and ``src/graph/topo.h``; the chunk sizes of
    the pipeline's fill (:func:`chunking`, :func:`fill_time_us`) from ``src/enqueue.cc``
    (calcCollChunking), ``src/transport/nvls.cc``, ``src/init.cc`` and ``src/include``, read
    at tag v2.30.7-1 (commit 73cf112 of NVIDIA/nccl as fetched; its tuning.cc line numbers are
    the ones cited here).

What is *not* NCCL's code is :func:`graphs` and the depth of the fill (how many chunk-times it
lasts, a parameter set from rows; NCCL's tuning model has no fill). NCCL finds its graphs by a
timed recursive search over the real PCI/NVLink/NIC topology (``ncclTopoCompute``,
search.cc:1137-1290); here they are derived from a node's link totals by the rules that search
follows (its speed arrays, the channel duplication, the tree's raised intra-node bandwidth),
which is an approximation. On a real system ``NCCL_DEBUG=INFO`` prints the graphs NCCL found
("Pattern 4, crossNic 0, nChannels 16, bw 24.000000/24.000000, ..."), and :class:`Graph` takes
them as they are printed.

Assumed where NCCL reads the machine: an x86 Intel host (``getNetOverhead`` 1 us,
``llMaxBws`` row 0 across nodes), InfiniBand-like networks with no extra plugin latency
(``graphs[a]->latencyInter = 0``), a balanced tree (no ``* .85`` for the simple tree pattern),
``NCCL_PAT_ENABLE`` and ``NCCL_LL128_C2C`` at their defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

RELEASE = "2.30.7"
SOURCE = "NVIDIA/nccl v2.30.7-1 (commit 73100d2, 2026-06-04), src/graph/tuning.cc"

ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOCOLS = ("LL", "LL128", "Simple")

# --- Constants of tuning.cc (ncclTunerConstantsDefaults, tuning.cc:146-211) -------------------
# Latencies in us, bandwidths in GB/s; per algorithm, per protocol (LL, LL128, Simple).
_BASE_LAT = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4),
             "collnet_direct": (0, 0, 0), "collnet_chain": (0, 0, 0),
             "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0), "pat": (8.0, 8.0, 8.0)}
_HW_LAT = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4),
               "collnet_direct": (0, 0, 3.7), "collnet_chain": (0, 0, 2.8),
               "nvls": (0, 0, 25), "nvls_tree": (0, 0, 25), "pat": (0, 0, 4.0)},
    "pcie": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7),
             "collnet_direct": (0, 0, 3.7), "collnet_chain": (0, 0, 2.8),
             "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0), "pat": (0, 0, 4.0)},
    "net": {"tree": (5.0, 8.5, 14), "ring": (2.7, 4.0, 14.0),
            "collnet_direct": (0, 0, 31), "collnet_chain": (0, 0, 30),
            "nvls": (0, 0, 18), "nvls_tree": (0, 0, 20.9), "pat": (0, 0, 14)},
}
# Per architecture (Volta, Ampere, Hopper, Blackwell) and node count (1, 2, more): the LL cap
# (row by GPU on one node, by CPU vendor across nodes: row 0 Intel, row 1 AMD), and per-channel
# caps of ring LL128, tree LL128, tree and NVLS-tree.
_LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))
_PER_CH_RING_LL128 = ((20.0,) * 3, (20.0,) * 3, (36.7,) * 3, (40.0,) * 3)
_PER_CH_TREE_LL128 = ((20.0,) * 3, (20.0,) * 3, (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))
_PER_CH_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))
_PER_CH_NVLS_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5),
                     (0.0, 96.0, 80.0))
# NVLS efficiency per architecture (tuning.cc:139-144): none before Hopper.
_NVLS_EFFICIENCY = (0.0, 0.0, 0.85, 0.74)
# Tree correction per log2(bytes / 64), 64 B to 512 MiB (tuning.cc:623-628).
_TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
           1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9,
              .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9, .9),
}
_NET_OVERHEAD_US = 1.0          # getNetOverhead on an x86 Intel host (tuning.cc:226-231)

# --- Constants of the topology (topo.h:19-25) and the search (search.cc:1051-1065) ------------
#: NCCL's bandwidth of one NVLink, GB/s per direction, by compute capability (topo.h).
NVLINK_BW_PER_LINK = {60: 18.0, 70: 20.0, 80: 20.0, 90: 20.6, 100: 40.1}
_SPEED_INTRA = {0: (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
                90: (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
                100: (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0)}
_SPEED_INTER = {0: (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0,
                    4.0, 3.0, 2.4, 1.2, 0.24, 0.12),
                90: (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0,
                     2.4, 1.2, 0.24, 0.12),
                100: (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5,
                      15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12)}
_MAX_CHANNELS = 32              # MAXCHANNELS / 2: what one search may find before duplication
_NVLS_MAX_ARITY = 32            # NCCL_MAX_NVLS_ARITY

#: Compute capability of the catalog's GPUs (what NCCL's tables are indexed by).
COMPUTE_CAPABILITY = {"V100": 70, "A100": 80, "H100": 90, "H200": 90, "B200": 100,
                      "GB200": 100, "GB300": 100}


def _arch(compcap: int) -> int:
    """tuning.cc:263-266: the row of the per-architecture tables."""
    return 3 if compcap >= 100 else 2 if compcap >= 90 else 1 if compcap >= 80 else 0


@dataclass(frozen=True)
class Graph:
    """One algorithm's graph as NCCL's search returns it (``NCCL_DEBUG=INFO``: "Pattern P,
    crossNic C, nChannels N, bw INTRA/INTER")."""

    n_channels: int
    bw_intra: float          # GB/s per channel inside a node
    bw_inter: float          # GB/s per channel between nodes


@dataclass(frozen=True)
class Topology:
    """What ``ncclTopoTuneModel`` reads: the communicator and one graph per algorithm."""

    compcap: int
    n_nodes: int
    gpus_per_node: int
    nvlink: bool             # the graphs' typeIntra is NVLink (else PCIe)
    ring: Graph
    tree: Graph
    nvls: Graph | None       # None: no NVSwitch multicast (NVLS) here
    collnet: Graph | None    # None: no in-network reduction (CollNet, IB SHARP)
    link_bound: str = "NVLink"   # what limits the ring and tree graphs: NVLink, PCIe, network

    @property
    def n_ranks(self) -> int:
        return self.n_nodes * self.gpus_per_node


def _speeds(table: dict, compcap: int) -> tuple[float, ...]:
    return table[100 if compcap >= 100 else 90 if compcap >= 90 else 0]


def _search(speeds, cap_per_gpu: float, per_channel_max: float, *, max_channels: int,
            nics: int = 0, nic_gbps: float = 0.0) -> tuple[int, float]:
    """Channels and per-channel speed the search settles on (search.cc:1155-1232).

    It starts from the fastest speed no single path exceeds, finds as many channels as the
    links carry, and tries slower speeds while they are more than .49 of the best found,
    keeping the most bandwidth in total (first found on a tie). Across nodes each NIC carries
    as many channels as fit in its bandwidth at that speed.
    """
    best = (0, 0.0)
    for speed in speeds:
        if speed > per_channel_max:
            continue
        if best[0] and speed / best[1] <= .49:
            break
        channels = max_channels if math.isinf(cap_per_gpu) else min(
            max_channels, int(cap_per_gpu / speed + 1e-9))
        if nics:
            channels = min(channels, nics * int(nic_gbps / speed + 1e-9))
        if channels * speed > best[0] * best[1]:
            best = (channels, speed)
    if not best[0]:
        best = (1, speeds[-1])
    return best


def _dup(channels: int, speed: float, compcap: int) -> tuple[int, float]:
    """ncclTopoDupChannels (search.cc:1036-1049): fast channels are split in two."""
    if speed < 25.0 or (compcap > 80 and speed < 50.0 and channels > 4):
        return channels, speed
    doubled = min(2 * channels, 2 * _MAX_CHANNELS)
    return doubled, speed / math.ceil(doubled / channels)


def graphs(*, compcap: int, n_nodes: int, gpus_per_node: int, intra_gbps: float, nvlink: bool,
           nvswitch: bool, nic_gbps: float = 0.0, nics_per_node: int = 0,
           pcie_gbps: float = math.inf, sharp: bool = False) -> Topology:
    """The graphs NCCL's search would find, from a node's link totals (an approximation).

    Args:
        compcap: compute capability (90 for H100).
        n_nodes, gpus_per_node: the communicator.
        intra_gbps: one GPU's node link as NCCL's topology counts it, GB/s per direction
            (NVLink: links x ``NVLINK_BW_PER_LINK``, 370.8 on H100; the "totalBw" NCCL prints).
        nvlink: whether that link is NVLink (else PCIe).
        nvswitch: whether the GPUs hang off NVSwitches with multicast (NVLS).
        nic_gbps: one NIC as NCCL reads it (GB/s, 50 for 400 Gb/s), nics_per_node of them.
        pcie_gbps: one GPU's PCIe link to its NIC as NCCL counts it (48 for Gen5 x16).
        sharp: whether the network reduces (CollNet).
    """
    g = gpus_per_node
    if n_nodes == 1:
        speeds = _speeds(_SPEED_INTRA, compcap)
        ring = _dup(*_search(speeds, intra_gbps, intra_gbps, max_channels=_MAX_CHANNELS),
                    compcap)
        # Patterns other than the ring need not close the loop (search.cc:1166).
        tree_cap = intra_gbps * g / (g - 1) if g > 1 else intra_gbps
        tree = _dup(*_search(speeds, tree_cap, intra_gbps, max_channels=_MAX_CHANNELS), compcap)
        ring_graph = Graph(ring[0], ring[1], ring[1])
        tree_graph = Graph(tree[0], tree[1], tree[1])
        nvls = None
        if nvswitch and compcap >= 90 and g >= 2:
            # Each NVLS channel pulls from one GPU, so there are as many as GPUs
            # (search.cc:1019-1022), at a speed all of them fit through one GPU's links.
            channels = min(g, _NVLS_MAX_ARITY)
            speed = next((s for s in speeds if s * channels <= intra_gbps), speeds[-1])
            # Pass 2 raises an NVLS graph's bwInter while it is below twice bwIntra
            # (search.cc:1274-1277): e.g. "nChannels 8, bw 40.000000/60.000000" on H100.
            nvls = Graph(channels, speed, max(s for s in speeds if s <= 2 * speed))
        return Topology(compcap, 1, g, nvlink, ring_graph, tree_graph, nvls, None,
                        "NVLink" if nvlink else "PCIe")
    speeds = _speeds(_SPEED_INTER, compcap)
    path = min(nic_gbps, pcie_gbps)
    # A ring enters a node through one NIC and leaves through another, so each GPU's node link
    # carries (g-1)/g of the channels; the NICs carry each channel once.
    cap = intra_gbps * g / (g - 1) if g > 1 else math.inf
    # Each GPU's PCIe link carries its share of the channels to and from the NICs.
    channels, speed = _search(speeds, min(cap, g * pcie_gbps), path,
                              max_channels=_MAX_CHANNELS, nics=nics_per_node, nic_gbps=nic_gbps)
    channels, speed = _dup(channels, speed, compcap)
    ring_graph = Graph(channels, speed, speed)
    # Trees (and CollNet) raise bwIntra up to twice bwInter while the node's links carry it
    # (search.cc:1275-1279, "increase bwIntra for trees (2 nodes or collnet)").
    above = [s for s in speeds if speed < s <= 2 * speed and channels * s <= cap]
    tree_graph = Graph(channels, max(above, default=speed), speed)
    nvls = None
    if nvswitch and compcap >= 90 and g >= 2:
        # One head per NIC-attached GPU, at most NCCL_MAX_NVLS_ARITY (search.cc:1125-1127).
        heads = min(g, nics_per_node, _NVLS_MAX_ARITY)
        # A head sends through its own GPU's NICs (all of them where a GPU has several). Each
        # NVLS channel loads every GPU's NVLink (ncclTopoSearchTryNvls, search.cc:410-441), so
        # the channels together fit in one GPU's NVLink; pass 2 then raises bwInter while it
        # is below twice bwIntra (search.cc:1274-1277), up to the head's NICs.
        head_nics = max(1, nics_per_node // g) * nic_gbps
        speed = next((s for s in speeds if s <= head_nics and s * heads <= intra_gbps),
                     speeds[-1])
        inter = max((s for s in speeds if s <= min(2 * speed, head_nics)), default=speed)
        nvls = Graph(heads, speed, inter)
    collnet = tree_graph if sharp else None
    # For the label only: compare line rates. NCCL counts a PCIe Gen3 x16 link as 12 of its
    # 15.75 GB/s (topo.h PCI_BW), the same share for later generations.
    pcie_line = pcie_gbps * 15.75 / 12.0
    limits = {"network": nics_per_node * nic_gbps, "PCIe": g * pcie_line,
              "NVLink" if nvlink else "PCIe": cap}
    bound = min(limits, key=limits.get)
    return Topology(compcap, n_nodes, g, nvlink, ring_graph, tree_graph, nvls, collnet, bound)


@dataclass(frozen=True)
class Tuned:
    """One (algorithm, protocol) as ``ncclTopoTuneModel`` prices it."""

    algorithm: str
    protocol: str
    bandwidth_gbps: float    # NCCL's "bandwidth": bytes per us / 1000 of the buffer
    latency_us: float
    bound: str = ""          # the term that set the bandwidth: NVLink, PCIe, network, or a cap


def _graph(topo: Topology, algorithm: str) -> Graph | None:
    if algorithm in ("nvls", "nvls_tree"):
        return topo.nvls
    if algorithm.startswith("collnet"):
        return topo.collnet
    return topo.tree if algorithm in ("tree", "pat") else topo.ring


def tune(topo: Topology, op: str) -> list[Tuned]:
    """ncclTopoTuneModel (tuning.cc:240-420 and the enable rules at 495-545) for one op.

    Args:
        topo: the communicator and its graphs.
        op: ``"all_reduce"``, ``"all_gather"`` or ``"reduce_scatter"``.

    Returns:
        Every (algorithm, protocol) NCCL would consider, enabled and with a bandwidth above 0.
    """
    out = []
    for algorithm in ALGORITHMS:
        graph = _graph(topo, algorithm)
        if graph is None or not _algorithm_enabled(topo, op, algorithm):
            continue
        for p, protocol in enumerate(PROTOCOLS):
            if not _protocol_enabled(topo, algorithm, protocol):
                continue
            priced = _bandwidth(topo, op, algorithm, protocol, graph)
            if priced is None:
                continue
            bus, bound = priced
            out.append(Tuned(algorithm, protocol, bus, _latency(topo, op, algorithm, p, graph),
                             bound))
    return out


def _algorithm_enabled(topo: Topology, op: str, algorithm: str) -> bool:
    """Which algorithms NCCL considers for ``op`` here (tuning.cc:287-291, 500-510)."""
    gather = op in ("all_gather", "reduce_scatter")
    if gather and algorithm not in ("pat", "ring", "nvls", "collnet_direct"):
        return False
    if op == "all_reduce" and algorithm == "pat":
        return False
    # NVLS-tree needs several nodes, NVLS across nodes needs CollNet; PAT needs one GPU per
    # node (tuning.cc:214-221); CollNet-direct all-gather needs CollNet's iallgather
    # (tuning.cc:355-372).
    if algorithm == "nvls_tree" and topo.n_nodes == 1:
        return False
    if algorithm == "nvls" and topo.n_nodes > 1 and topo.collnet is None:
        return False
    if algorithm == "pat" and topo.n_nodes != topo.n_ranks:
        return False
    return not (algorithm == "collnet_direct" and gather)


def _protocol_enabled(topo: Topology, algorithm: str, protocol: str) -> bool:
    """NVLS, NVLS-tree, PAT and CollNet run Simple only (tuning.cc:296-299, 340-341); LL128 is
    on by default on NVLink nodes from Volta on (tuning.cc:518-535)."""
    if algorithm in ("nvls", "nvls_tree", "pat") or algorithm.startswith("collnet"):
        return protocol == "Simple"
    return protocol != "LL128" or (topo.nvlink and topo.compcap >= 70)


def _bandwidth(topo: Topology, op: str, algorithm: str, protocol: str,
               graph: Graph) -> tuple[float, str] | None:
    """NCCL's bandwidth of one (algorithm, protocol), GB/s of the buffer, and what set it
    (tuning.cc:300-381); None where NCCL gives it none."""
    n_nodes, n_ranks = topo.n_nodes, topo.n_ranks
    ppn = n_ranks / n_nodes
    arch = _arch(topo.compcap)
    index2 = min(n_nodes, 3) - 1
    ll_max = _LL_MAX_BW[arch if n_nodes == 1 else 0][index2]
    gather = op in ("all_gather", "reduce_scatter")
    bw = graph.bw_intra if (n_nodes <= 2 or algorithm.startswith("collnet")) else graph.bw_inter
    bound = "network" if algorithm.startswith("collnet") else topo.link_bound
    if algorithm in ("nvls", "nvls_tree"):            # tuning.cc:306-322
        if graph.n_channels < 2:
            return None
        intra = graph.bw_intra * _NVLS_EFFICIENCY[arch] * (graph.n_channels - 1) / graph.n_channels
        intra *= 2.0 if op == "all_reduce" else (ppn - 1) / ppn
        inter = graph.bw_inter * (2 if n_nodes <= 2 and algorithm == "nvls_tree" else 1)
        cap = _PER_CH_NVLS_TREE[arch][index2] if algorithm == "nvls_tree" else math.inf
        bw = min(intra, inter, cap)
        bound = "NVLink" if bw == intra else "network" if bw == inter else "NVLS-tree channel cap"
    bus = graph.n_channels * bw
    # "Various model refinements" (tuning.cc:325-347).
    if algorithm == "ring" and protocol == "LL":
        bus, bound = _cap(bus * .5, bound, ll_max, "LL cap")
    if algorithm == "ring" and protocol == "LL128":
        bus, bound = _cap(bus * .92, bound, graph.n_channels * _PER_CH_RING_LL128[arch][index2],
                          "LL128 channel cap")
    if algorithm == "tree" and op == "all_reduce":
        bus, bound = _cap(bus * .92, bound, graph.n_channels * _PER_CH_TREE[arch][index2],
                          "tree channel cap")
    if algorithm == "tree" and protocol == "LL":
        bus, bound = _cap(bus / 3.8, bound, ll_max, "LL cap")
    if algorithm == "tree" and protocol == "LL128":
        bus, bound = _cap(bus * (7.0 / 9.0 if n_nodes == 1 else 120.0 / 128.0), bound,
                          graph.n_channels * _PER_CH_TREE_LL128[arch][index2],
                          "LL128 channel cap")
    if algorithm == "pat":
        bus *= .75
    if algorithm == "collnet_direct":
        factor = ppn / graph.n_channels            # GPUs per NIC
        factor -= (factor - 1) / 2
        bus /= factor
        if topo.compcap >= 90:
            bus *= .85
    # Bus bandwidth to algorithm bandwidth (tuning.cc:375-381).
    if not (algorithm != "ring" and gather):
        n_steps = 2 * (n_ranks - 1) if op == "all_reduce" else n_ranks - 1
        bus *= n_ranks / n_steps if algorithm in ("ring", "nvls", "nvls_tree") else .5
    return (bus, bound) if bus > 0 else None


def _cap(value: float, bound: str, cap: float, label: str) -> tuple[float, str]:
    """``min(value, cap)``, and which of the two set it."""
    return (cap, label) if cap < value else (value, bound)


def _latency(topo: Topology, op: str, algorithm: str, p: int, graph: Graph) -> float:
    """The latency half of ncclTopoTuneModel (tuning.cc:382-431), in us."""
    n_nodes, n_ranks = topo.n_nodes, topo.n_ranks
    ppn = n_ranks / n_nodes
    intra_hw = "nvlink" if topo.nvlink else "pcie"
    lat = _BASE_LAT[algorithm][p]
    intra = _HW_LAT[intra_hw][algorithm][p]
    inter = _HW_LAT["net"]["tree" if ppn == 1 else algorithm][p]   # + latencyInter (0 here)
    log_nodes = int(math.log2(n_nodes))
    local = int(ppn) - 1
    if algorithm == "ring":
        n_steps = 2 * (n_ranks - 1) if op == "all_reduce" else n_ranks - 1
        overhead = (_NET_OVERHEAD_US * (3 if PROTOCOLS[p] == "Simple" else 1)
                    if n_nodes > 1 else 0.0)
        intra = max(intra, overhead)
        inter_steps = 0 if n_nodes == 1 else 2 * (n_nodes - 1) if op == "all_reduce" \
            else n_nodes - 1
        return lat + (n_steps - inter_steps) * intra + inter_steps * inter
    if algorithm == "tree":
        return lat + 2 * (local * intra + log_nodes * inter)
    if algorithm == "collnet_direct":
        return lat + 2 * (min(1, local) * intra + local * 0.4) + inter
    if algorithm == "collnet_chain":
        return lat + 2 * local * intra + inter
    if algorithm == "nvls":
        return intra + (inter if n_nodes > 1 else 0.0)
    if algorithm == "nvls_tree":
        return lat + intra + 2 * log_nodes * inter
    return lat + log_nodes * (inter / 3.5) + n_ranks * 2.8         # pat


def algo_time_us(topo: Topology, op: str, tuned: Tuned, nbytes: float) -> float:
    """ncclTopoGetAlgoTime (tuning.cc:630-654) for one call (``numPipeOps = 1``), in us."""
    bw, lat = tuned.bandwidth_gbps, tuned.latency_us
    log_size = int(math.log2(nbytes)) - 6 if nbytes >= 64 else -1
    if op == "all_reduce" and 0 <= log_size < 23 and tuned.algorithm == "tree":
        bw *= _TREE_CORRECTION[tuned.protocol][log_size]
    if (op == "all_reduce" and 0 <= log_size < 24 and tuned.algorithm == "nvls_tree"
            and topo.compcap >= 100):
        bw *= _TREE_CORRECTION[tuned.protocol][log_size]
    if (tuned.algorithm == "ring" and tuned.protocol == "Simple" and topo.n_nodes > 1
            and op == "all_reduce" and nbytes / (topo.ring.n_channels * topo.n_ranks) >= 64):
        lat *= 1.9 if topo.compcap < 80 else 1.4          # "Plateau effect of ring"
    return lat + nbytes / (1000 * bw)


# --- The chunks a collective is cut into (enqueue.cc calcCollChunking), for the pipeline fill ----
# NCCL's tuning model (above) prices the steady state of a pipeline: ``latency + bytes / bw``. The
# kernel moves each channel's share in chunks, and a pipeline of chunks is only full after its
# first chunks have gone through: a fill of a few chunk-times that the tuning model leaves out.
# The chunk sizes are NCCL's, from one release (v2.30.7-1):
#   src/include/device.h: NCCL_STEPS 8, NCCL_LL_LINES_PER_THREAD 8, NCCL_LL128_ELEMS_PER_THREAD 120;
#   src/init.cc (computeBuffSizes): DEFAULT_BUFFSIZE 4 MiB (Simple), DEFAULT_LL_BUFFSIZE
#     8 x 512 threads x 8 steps x 16 B, DEFAULT_LL128_BUFFSIZE 120 x 640 threads x 8 steps x 8 B;
#   src/include/collectives.h: ALLREDUCE/ALLGATHER/REDUCESCATTER_CHUNKSTEPS = NCCL_STEPS / 2;
#   src/enqueue.cc calcCollChunking: stepSize = buffSize / NCCL_STEPS, chunkSize = stepSize x
#     chunkSteps (ring Simple only; 1 otherwise), LL halves it, LL128 keeps 15 of 16 elements;
#     ring loops hold nRanks chunks per channel, NVLS and NVLS-tree nHeads; the tree and NVLS
#     shrink rules are ported below;
#   src/transport/nvls.cc ncclNvlsTuning: NVLS_NCHANNELS_SM90 16, _SM100_NVL 24, _SM100 32,
#     NCCL_NVLS_CHUNKSIZE 128 KiB, treeMaxChunkSize 64 KiB from 4 nodes (ncclNvlsTreeSm100Tuning
#     for Blackwell across nodes).
_NCCL_STEPS = 8
_STEP_BYTES = {"Simple": (1 << 22) // _NCCL_STEPS, "LL": 8 * 512 * _NCCL_STEPS * 16 // _NCCL_STEPS,
               "LL128": 120 * 640 * _NCCL_STEPS * 8 // _NCCL_STEPS}
_RING_SIMPLE_CHUNK_STEPS = _NCCL_STEPS // 2
_NVLS_CHUNK = 128 * 1024


def _protocol_chunk(protocol: str, chunk_steps: int) -> int:
    """calcCollChunking's starting chunk: stepSize x chunkSteps, LL halved, LL128 15/16."""
    chunk = _STEP_BYTES[protocol] * chunk_steps
    if protocol == "LL":
        return chunk // 2
    if protocol == "LL128":
        return chunk // 16 * 15
    return chunk


def _nvls_setup(topo: Topology) -> tuple[int, int, int]:
    """ncclNvlsTuning (nvls.cc): NVLS channels (CTAs), chunk and NVLS-tree's largest chunk.

    Assumed: a GPU reaches its NIC through a PCIe switch (path PXB, as on HGX boards), and the
    NIC bandwidth NCCL reads is the ring graph's per-channel network speed.
    """
    n_nodes, ppn = topo.n_nodes, topo.gpus_per_node
    channels = 16 if topo.compcap < 100 else 24 if n_nodes == 1 else 32
    chunk, tree_max = _NVLS_CHUNK, 0
    if topo.compcap >= 100 and n_nodes > 1:            # ncclNvlsTreeSm100Tuning
        nic = topo.ring.bw_inter
        if n_nodes == 2 and nic >= 48.0:
            channels, tree_max = 32, 128 * 1024
            if ppn <= 4:
                chunk = tree_max = 256 * 1024
            elif ppn >= 16 or (ppn <= 8 and nic < 96.0):    # path PXB assumed
                tree_max = 64 * 1024
        elif nic >= 96.0:
            channels, chunk, tree_max = ((24, 256 * 1024, 256 * 1024) if ppn <= 8
                                         else (32, chunk, 128 * 1024 if ppn < 32 else 65536))
        elif nic >= 48.0:
            channels, tree_max = 24, 64 * 1024          # PXB
    if not tree_max:
        tree_max = 65536 if n_nodes >= 4 else chunk
    return channels, chunk, tree_max


def chunking(topo: Topology, tuned: Tuned, nbytes: float) -> tuple[int, int, int]:
    """The chunk NCCL cuts a collective into (enqueue.cc calcCollChunking, v2.30.7-1).

    Args:
        topo: the communicator and its graphs.
        tuned: the algorithm and protocol that run.
        nbytes: the buffer in bytes.

    Returns:
        ``(channels, chunk_bytes, chunks_per_loop)``: the channels (CTAs) that run it, the
        largest chunk one channel moves per step, and the chunks one loop of one channel holds
        (ring: nRanks; tree: 1; NVLS, NVLS-tree: the heads). ``chunk_bytes`` 0: not modelled
        (PAT, CollNet).
    """
    algorithm, protocol = tuned.algorithm, tuned.protocol
    if algorithm == "ring":
        steps = _RING_SIMPLE_CHUNK_STEPS if protocol == "Simple" else 1
        return topo.ring.n_channels, _protocol_chunk(protocol, steps), topo.n_ranks
    if algorithm == "tree":
        channels, chunk = topo.tree.n_channels, _protocol_chunk(protocol, 1)
        if protocol == "LL128":
            ppn = topo.gpus_per_node
            steps = 1 + int(math.log2(topo.n_nodes)) + 0.1 * ppn
            while nbytes // (channels * chunk) < steps * 64 / ppn and chunk > 131072:
                chunk //= 2
            while nbytes // (channels * chunk) < steps * 16 / ppn and chunk > 32768:
                chunk //= 2
        return channels, chunk, 1
    if algorithm in ("nvls", "nvls_tree"):
        channels, chunk, tree_max = _nvls_setup(topo)
        heads = topo.nvls.n_channels if topo.nvls is not None else topo.gpus_per_node
        ops = channels * heads
        if algorithm == "nvls":
            chunk = min(chunk, _STEP_BYTES["Simple"])
            for factor, floor in ((64, 65536), (8, 32768), (2, 16384)):
                if nbytes < factor * ops * chunk and chunk > floor:
                    chunk = floor
        else:
            chunk = min(chunk, tree_max)
            for factor, floor in ((32, 262144), (16, 131072), (4, 65536), (1, 32768)):
                if nbytes < factor * ops * chunk and chunk > floor:
                    chunk = floor
        return channels, chunk, heads
    return 1, 0, 1


def fill_time_us(topo: Topology, tuned: Tuned, nbytes: float, depth_chunks: float) -> float:
    """The pipeline's fill, in us: ``depth_chunks`` chunk-times of one channel.

    One channel moves ``nbytes / channels`` at ``bandwidth / channels``; its chunk is NCCL's
    (:func:`chunking`), or smaller when the buffer does not fill one loop (the kernel then
    cuts ``nbytes / (channels x chunks_per_loop)``). So the fill is ``depth x min(chunk x
    channels, nbytes / chunks_per_loop) / bandwidth``: proportional to the size while the loop
    is not full, then constant. ``depth_chunks`` is a parameter set from rows (see
    :data:`clusterlab.analytic.costmodel.PIPELINE_FILL_CHUNKS`), not a constant of NCCL's source.
    """
    channels, chunk, per_loop = chunking(topo, tuned, nbytes)
    if not chunk:
        return 0.0
    return depth_chunks * min(chunk * channels, nbytes / per_loop) / (1000 * tuned.bandwidth_gbps)
