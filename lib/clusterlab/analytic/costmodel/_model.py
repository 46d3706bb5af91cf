"""NCCL 2.30.7's model of one collective on a cluster, before its validated band.

:func:`clusterlab.analytic.costmodel.cluster_collective` prices a collective the way NCCL prices it
when it picks an algorithm and a protocol: :mod:`clusterlab.analytic.costmodel._nccl` is a port of
``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime`` of one release (``NCCL_RELEASE``), fed with the
graphs its topology search would find on the node. No bandwidth or efficiency here is fitted to
a published row; ``LAUNCH_OVERHEAD_S`` and ``PIPELINE_FILL_CHUNKS`` are the two constants set
from rows (role "set"). This module turns a
:class:`clusterlab.catalog.hardware.ClusterSpec` into NCCL's view of the node's links and prices the
collective (:func:`estimate`); :mod:`clusterlab.analytic.costmodel.validation` holds the model
against the published rows and sets the band.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from clusterlab import _checks
from clusterlab.analytic.costmodel import _nccl
from clusterlab.analytic.costmodel.alpha_beta import busbw_factor
from clusterlab.catalog import hardware
from clusterlab.catalog.published import nccl_tests

#: The NCCL release whose tuning rules cluster_collective follows.
NCCL_RELEASE = _nccl.RELEASE
#: Achievable fraction of line rate of one NVLink and one NIC, as NCCL 2.30.7 counts them, for
#: the flow model (clusterlab.analytic.fabric) and line-rate arithmetic: an NVLink4 link is 20.6 of
# its
#: 25 GB/s (topo.h SM90_NVLINK_BW; S. Jeaugey, nccl-tests issue 212: "NCCL can get an effective
#: NVLink bandwidth of 370GB/s" of 450), and NCCL's search runs a 400 Gb/s NIC's channel at
#: 48 of its 50 GB/s (search.cc sm90SpeedArrayInter; 24 of 25 for 200 Gb/s, 12 of 12.5 for
#: 100 Gb/s; D. Addison, nccl-tests issue 290: "you should see 46-48GB/s per NIC"), so the flow
#: model's uncontended ring equals cluster_collective's.
NVLINK_EFFICIENCY = _nccl.NVLINK_BW_PER_LINK[90] / 25.0
NIC_EFFICIENCY = 48.0 / 50.0
#: Fixed cost of one collective call that NCCL's model leaves out (kernel launch, the
#: benchmark's synchronisation), in seconds: fitted to the 8x H200 sweep of stas00's
#: all_reduce_bench.py (a PyTorch benchmark, not nccl-tests) at <= 16 MiB, the rows with role
#: "set", jointly with ``PIPELINE_FILL_CHUNKS``; :func:`fit_set_parameters` recomputes both.
LAUNCH_OVERHEAD_S = 22.5e-6
#: The pipeline's fill in chunk-times of one channel (``_nccl.fill_time_us``): NCCL's tuning model
#: prices a full pipeline, and a collective pays a few chunk-times more before its pipeline is
#: full (the chunk sizes are NCCL 2.30.7's, enqueue.cc calcCollChunking). Set, together with
#: ``LAUNCH_OVERHEAD_S``, by the same role "set" rows (8x H200, <= 16 MiB):
#: :func:`clusterlab.analytic.costmodel.fit_set_parameters` recomputes both and a test checks them.
PIPELINE_FILL_CHUNKS = 2.5

PROTOCOLS = _nccl.PROTOCOLS
#: Algorithms as NCCL_ALGO names them (lower case), plus "pairwise" for all-to-all, which
#: NCCL runs as grouped send/receive, outside its tuning model.
CLUSTER_ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree", "collnet_direct", "collnet_chain",
                      "pat", "pairwise")
#: What a PCIe link carries as NCCL's topology counts it, GB/s per direction: 12 for Gen3 x16
#: (topo.h PCI_BW), 24 for Gen4 and 48 for Gen5 (NCCL_DEBUG=INFO topology dumps, e.g.
#: NVIDIA/nccl issue 1189: "PCI[48.0]" on an H20 server, issue 1499: "PCI[24.0]").
_NCCL_PCI_GBPS = {"PCIe3x16": 12.0, "PCIe4x16": 24.0, "PCIe5x16": 48.0, "PCIe6x16": 96.0}
#: NVLink's per-link line rate per direction by generation (hardware.LINKS: 6, 12, 18, 18 links).
_NVLINK_LINK_LINE = {2: 25e9, 3: 25e9, 4: 25e9, 5: 50e9}
SIZE_CLASSES = ("< 1 MiB", "1 MiB - 1 GiB", ">= 1 GiB")
#: Algorithms that reduce in the network's switches (NCCL CollNet over InfiniBand SHARP).
IN_NETWORK_ALGORITHMS = ("collnet_direct", "collnet_chain")
#: Appended to a regime's fabric where the switches reduce: "InfiniBand + SHARP".
IN_NETWORK_SUFFIX = " + SHARP"
#: The published rows' fabrics, and PCIe for a node whose GPUs talk over PCIe.
FABRICS = ("NVLink", "PCIe") + nccl_tests.FABRICS[1:]
FabricKind = Literal["NVLink", "PCIe", "InfiniBand", "RoCE", "EFA", "Ethernet"]


@dataclass(frozen=True)
class Regime:
    """Where a prediction lies, for reporting the model's error there."""

    nodes: str          # "1 node", "2 nodes" or ">2 nodes"
    fabric: str         # the network crossed: one of FABRICS (NVLink or PCIe on one node),
    #                     with IN_NETWORK_SUFFIX where its switches reduce (SHARP)
    ops: str            # "all_reduce", "all_gather/reduce_scatter" or "all_to_all"
    sizes: str          # one of SIZE_CLASSES

    def __str__(self) -> str:
        return f"{self.nodes}, {self.fabric}, {self.ops}, {self.sizes}"


def regime(op: str, nbytes: float, n_nodes: int, fabric: FabricKind, *,
           in_network: bool = False) -> Regime:
    """The :class:`Regime` of one collective (see :func:`validation_by_regime`).

    ``in_network``: the switches reduce (an :data:`IN_NETWORK_ALGORITHMS` run across nodes).
    Such a run is its own regime, since rows without SHARP say nothing of its error.
    """
    if fabric not in FABRICS:
        raise ValueError(f"Unknown fabric {fabric!r}; use one of {', '.join(FABRICS)}.")
    return Regime(nccl_tests.node_class(n_nodes),
                  fabric + (IN_NETWORK_SUFFIX if in_network else ""), nccl_tests.op_family(op),
                  SIZE_CLASSES[(nbytes >= 2**20) + (nbytes >= 2**30)])


def cluster_regime(estimate: CollectiveEstimate, cluster: hardware.ClusterSpec,
                   fabric: FabricKind | None = None) -> Regime:
    """The :class:`Regime` of an estimate on ``cluster``: its nodes counted as NCCL counts them
    (:func:`nccl_nodes`: NVLink domains where they span hosts, "1 NVLink domain" ...), the
    fabric (default: NVLink/PCIe inside one domain, else by the NIC's name), and ``+ SHARP``
    where the switches reduce."""
    view = nccl_nodes(cluster)
    kind = "pcie" if (cluster.intra_node_link or "").startswith("PCIe") else "nvlink"
    where = regime(estimate.op, estimate.nbytes, view.n_nodes,
                   fabric or fabric_of(cluster.nic, view.n_nodes, kind),
                   in_network=reduces_in_network(estimate.algorithm, view.n_nodes))
    if view is cluster:
        return where
    return replace(where, nodes=nccl_tests.domain_class(view.n_nodes))


def reduces_in_network(algorithm: str, n_nodes: int) -> bool:
    """Whether NCCL's ``algorithm`` reduces in the network's switches (InfiniBand SHARP): CollNet
    always, NVLS across nodes (NCCL 2.30.7 runs it only with CollNet, tuning.cc:503-505)."""
    return algorithm in IN_NETWORK_ALGORITHMS or (algorithm == "nvls" and n_nodes > 1)


def fabric_of(nic: str | None, n_nodes: int, intra_kind: str = "nvlink") -> str:
    """The fabric a configuration crosses: NVLink/PCIe on one node, else by the NIC's name
    (``IB-*``: InfiniBand; ``Ethernet-*``: Ethernet, unless told RoCE or EFA)."""
    if n_nodes == 1:
        return "NVLink" if intra_kind == "nvlink" else "PCIe"
    return "InfiniBand" if (nic or "").startswith("IB-") else "Ethernet"


@dataclass(frozen=True)
class CollectiveEstimate:
    """What :func:`cluster_collective` expects of one collective on one cluster.

    Attributes:
        op: the collective.
        nbytes: buffer in bytes, as nccl-tests counts it (its ``size`` column).
        n_nodes, gpus_per_node: the cluster (``n = n_nodes * gpus_per_node`` ranks).
        time_s: expected seconds.
        algbw: ``nbytes / time_s`` in bytes/s.
        busbw: ``algbw * busbw_factor(op, n)`` in bytes/s (what nccl-tests prints).
        algorithm: what NCCL 2.30.7 would run (NCCL_ALGO's names, lower case; "pairwise":
            all-to-all's grouped send/receive).
        protocol: LL, LL128 or Simple.
        low_busbw: below this a measured busbw is low: the model's largest over-prediction of a
            healthy published row in this regime, less ``BAND_MARGIN``
            (``UNVALIDATED_BAND`` where the regime has no validation).
        high_busbw: the line-rate busbw of the links a ring (or NVLS) uses; above it a
            measurement needs in-network reduction (NVLS, SHARP) or a 2-node tree.
        bottleneck: what sets the time in NCCL's model: "latency" (more than half of it), or
            the term that set the bandwidth: "NVLink", "PCIe", "network", or one of NCCL's caps
            ("LL cap", "LL128 channel cap", "tree channel cap", "NVLS-tree channel cap").
        regime: where the estimate lies (:class:`Regime`).
        validation: how far published rows back it, one of ``VALIDATION_LEVELS``
            ("validated", "tested", "extrapolated", "untested"; see :func:`with_band`).
        nccl_release: the NCCL release whose rules priced it.
    """

    op: str
    nbytes: float
    n_nodes: int
    gpus_per_node: int
    time_s: float
    algbw: float
    busbw: float
    algorithm: str
    protocol: str
    low_busbw: float
    high_busbw: float
    bottleneck: str
    regime: Regime | None = None
    validation: str = "untested"
    nccl_release: str = NCCL_RELEASE

    @property
    def validated(self) -> bool:
        """Whether its regime's rows validate it (within the tolerance, on their node counts)."""
        return self.validation == "validated"

    @property
    def n_gpus(self) -> int:
        return self.n_nodes * self.gpus_per_node


@dataclass(frozen=True)
class _NodeLinks:
    """One node's links as NCCL's topology counts them (what its search reads)."""

    intra_line: float       # node link per GPU per direction, bytes/s (line rate)
    intra_kind: str         # "nvlink" or "pcie"
    intra_nccl_gbps: float  # the node link as NCCL's topology counts it, GB/s
    nic_line: float         # one NIC's line rate, bytes/s (0 on one node)
    nics: int               # NICs per node
    pcie_nccl_gbps: float   # one GPU's PCIe link as NCCL counts it, GB/s
    nvswitch: bool          # NVSwitch multicast (NVLS) possible

    @property
    def net_line(self) -> float:
        return self.nic_line * self.nics


def nccl_nodes(cluster: hardware.ClusterSpec) -> hardware.ClusterSpec:
    """The cluster as NCCL 2.30.7 counts its nodes: one per NVLink domain.

    Where an NVLink domain spans hosts (MNNVL: an NVL72 rack of 4-GPU trays), NCCL fuses the
    topologies of a clique's hosts into one (src/graph/topo.cc:1887-1890, ncclTopoGetSystem),
    so its search finds graphs over the whole domain, and it counts one node per domain
    (src/init.cc:1285-1296; init.cc:878 sets nNvlDomains = nNodes). Its tuning model then
    prices a domain as one node of that many GPUs with all of its hosts' NICs: NVLink (and
    NVLS) inside a domain, the NICs between domains.

    Args:
        cluster: the cluster.

    Returns:
        ``cluster`` itself where domains end at the host; else one "node" per domain.
    """
    hosts = cluster.gpus_per_nvlink_domain // cluster.gpus_per_node
    if hosts == 1:
        return cluster
    nics = cluster.gpus_per_node if cluster.nics_per_node is None else cluster.nics_per_node
    network = cluster.network_bytes_per_s
    return replace(cluster, n_nodes=cluster.n_nvlink_domains,
                   gpus_per_node=cluster.gpus_per_nvlink_domain, nics_per_node=nics * hosts,
                   network_bytes_per_s=None if network is None else network * hosts,
                   nvlink_domain_gpus=None)


def _compute_capability(cluster: hardware.ClusterSpec) -> int:
    """The row of NCCL's tables; a GPU NCCL's tables do not name is read as Hopper's."""
    return _nccl.COMPUTE_CAPABILITY.get(cluster.gpu.name, 90)


def _node_links(cluster: hardware.ClusterSpec) -> _NodeLinks:
    """The node's links of ``cluster`` as NCCL counts them."""
    gpu = cluster.gpu
    compcap = _compute_capability(cluster)
    per_link = _nccl.NVLINK_BW_PER_LINK[max(c for c in _nccl.NVLINK_BW_PER_LINK
                                            if c <= compcap)]
    # An accelerator without NVLink (generation 0, e.g. a TPU in the planner's validation) is
    # counted as NVLink4 would be; its estimates lie in no validated regime anyway.
    nvlink_fraction = per_link * 1e9 / _NVLINK_LINK_LINE.get(gpu.nvlink_generation, 25e9)
    intra_line = cluster.node_link_bytes_per_s
    pcie = (cluster.intra_node_bytes_per_s is None and cluster.intra_node_link is not None
            and cluster.intra_node_link.startswith("PCIe"))
    kind = "pcie" if pcie else "nvlink"
    intra_nccl = (_NCCL_PCI_GBPS[cluster.intra_node_link] if pcie
                  else intra_line * nvlink_fraction / 1e9)
    nic_line, nics = 0.0, 0
    if cluster.n_nodes > 1 and cluster.network_bytes_per_s is not None:
        # The node's network rate, taken as one NIC per GPU.
        nics = cluster.gpus_per_node
        nic_line = cluster.network_bytes_per_s / nics
    elif cluster.n_nodes > 1:
        nics = (cluster.gpus_per_node if cluster.nics_per_node is None
                else cluster.nics_per_node)
        nic_line = hardware.link(cluster.nic).bytes_per_s
    nvswitch = kind == "nvlink" and intra_line == gpu.nvlink_bytes_per_s and compcap >= 90
    return _NodeLinks(intra_line=intra_line, intra_kind=kind, intra_nccl_gbps=intra_nccl,
                      nic_line=nic_line, nics=nics,
                      pcie_nccl_gbps=_NCCL_PCI_GBPS.get(gpu.pcie, 48.0), nvswitch=nvswitch)


def _topology(cluster: hardware.ClusterSpec, links: _NodeLinks) -> _nccl.Topology:
    """The graphs NCCL's search would find on ``cluster`` (:func:`_nccl.graphs`)."""
    return _nccl.graphs(compcap=_compute_capability(cluster), n_nodes=cluster.n_nodes,
                        gpus_per_node=cluster.gpus_per_node, intra_gbps=links.intra_nccl_gbps,
                        nvlink=links.intra_kind == "nvlink", nvswitch=links.nvswitch,
                        nic_gbps=links.nic_line / 1e9, nics_per_node=links.nics,
                        pcie_gbps=links.pcie_nccl_gbps, sharp=cluster.sharp)


def _all_to_all(nbytes: float, links: _NodeLinks, topo: _nccl.Topology,
                cluster: hardware.ClusterSpec) -> tuple[float, float, str]:
    """All-to-all as grouped send/receive (NCCL runs it outside its tuning model): each GPU
    sends ``(g-1)/n`` of the buffer over its node link and ``(n-g)/n`` over its share of the
    node's network channels, both at once; latency: a ring Simple step per group of 8 peers.
    This is the course's estimate, not NCCL's.

    Returns:
        ``(seconds, latency_s, bound)``.
    """
    g, n = cluster.gpus_per_node, cluster.n_gpus
    t_intra = (g - 1) / n * nbytes / (links.intra_nccl_gbps * 1e9)
    t_net = 0.0
    if cluster.n_nodes > 1:
        per_gpu_net = topo.ring.n_channels * topo.ring.bw_inter * 1e9 / g
        t_net = (n - g) / n * nbytes / per_gpu_net
    hw = _nccl._HW_LAT["net" if cluster.n_nodes > 1 else links.intra_kind]["ring"][2]
    latency_s = (_nccl._BASE_LAT["ring"][2] + math.ceil((n - 1) / 8) * hw) * 1e-6
    bound = "network" if t_net > t_intra else ("NVLink" if links.intra_kind == "nvlink"
                                               else "PCIe")
    return latency_s + LAUNCH_OVERHEAD_S + max(t_intra, t_net), latency_s, bound


def _high_busbw(op: str, algorithm: str, links: _NodeLinks,
                cluster: hardware.ClusterSpec) -> float:
    """The line-rate busbw of the links ``algorithm`` loads.

    A ring's busbw cannot pass the slower of its links. NVLS reduces in the switch, so on one
    node its algbw (not busbw) is bound by NVLink. On two nodes a tree, NVLS-tree or CollNet,
    and on any node count a reduction in the network's switches (CollNet, NVLS across nodes),
    sends each node's buffer across the network once each way, so its algbw is bound by all of
    a node's NICs together (and NVLink): busbw can reach ``2(n-1)/n`` times that.
    """
    n_nodes = cluster.n_nodes
    line = links.intra_line if n_nodes == 1 else min(links.intra_line, links.net_line)
    factor = busbw_factor("all_reduce", cluster.n_gpus)
    if algorithm == "nvls" and n_nodes == 1:
        return factor * links.intra_line
    if op == "all_reduce" and (n_nodes == 2 and algorithm in ("tree", "nvls_tree")
                               or reduces_in_network(algorithm, n_nodes)):
        return factor * min(links.intra_line, links.net_line)
    return line


def _check_options(op: str, algorithm: str, protocol: str) -> None:
    if op not in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        raise ValueError(f"cluster_collective prices all_reduce, all_gather, reduce_scatter "
                         f"and all_to_all, got {op!r}.")
    if algorithm != "auto" and algorithm not in CLUSTER_ALGORITHMS:
        raise ValueError(f"Unknown algorithm {algorithm!r}; use 'auto' or one of "
                         f"{', '.join(CLUSTER_ALGORITHMS)}.")
    if protocol != "auto" and protocol not in PROTOCOLS:
        raise ValueError(f"Unknown protocol {protocol!r}; use 'auto' or one of "
                         f"{', '.join(PROTOCOLS)}.")


def _unbanded(op: str, nbytes: float, cluster: hardware.ClusterSpec, *, time_s: float,
              algorithm: str, protocol: str, high_busbw: float,
              bottleneck: str) -> CollectiveEstimate:
    """An estimate with no band yet (:mod:`clusterlab.analytic.costmodel.validation` sets it)."""
    algbw = nbytes / time_s if time_s else math.inf
    busbw = algbw * busbw_factor(op, cluster.n_gpus) if time_s else math.inf
    return CollectiveEstimate(op=op, nbytes=nbytes, n_nodes=cluster.n_nodes,
                              gpus_per_node=cluster.gpus_per_node, time_s=time_s, algbw=algbw,
                              busbw=busbw, algorithm=algorithm, protocol=protocol,
                              low_busbw=0.0 if time_s else math.inf, high_busbw=high_busbw,
                              bottleneck=bottleneck)


def _tuned_options(op: str, topo: _nccl.Topology, cluster: hardware.ClusterSpec,
                   algorithm: str, protocol: str) -> list[_nccl.Tuned]:
    """The (algorithm, protocol) pairs NCCL considers, narrowed as NCCL_ALGO/NCCL_PROTO do."""
    options = _nccl.tune(topo, op)
    if algorithm != "auto":
        options = [t for t in options if t.algorithm == algorithm]
        if not options:
            raise ValueError(f"NCCL {NCCL_RELEASE} does not run {op} with algorithm "
                             f"{algorithm!r} on {cluster.n_nodes} x {cluster.gpus_per_node} "
                             f"{cluster.gpu.name}"
                             + (" (collnet needs sharp=True)" if algorithm.startswith("collnet")
                                else "") + "; use algorithm='auto'.")
    if protocol != "auto":
        options = [t for t in options if t.protocol == protocol]
        if not options:
            raise ValueError(f"No protocol {protocol!r} for {algorithm!r} here; use "
                             "protocol='auto'.")
    return options


def estimate(op: str, nbytes: float, cluster: hardware.ClusterSpec, *, algorithm: str = "auto",
             protocol: str = "auto") -> CollectiveEstimate:
    """:func:`clusterlab.analytic.costmodel.cluster_collective` without the band: NCCL's pick and
    time.

    Args:
        op: ``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"`` or ``"all_to_all"``.
        nbytes: the buffer in bytes, as nccl-tests' ``size`` column counts it.
        cluster: the cluster.
        algorithm: ``"auto"`` or one of :data:`CLUSTER_ALGORITHMS`.
        protocol: ``"auto"`` or one of :data:`PROTOCOLS`.

    Returns:
        A :class:`CollectiveEstimate` with ``low_busbw = 0`` and no regime.

    Raises:
        ValueError: unknown names, or an algorithm NCCL does not run there.
    """
    _check_options(op, algorithm, protocol)
    nbytes = _checks.positive("nbytes", nbytes)
    if cluster.n_gpus == 1:
        return _unbanded(op, nbytes, cluster, time_s=0.0, algorithm="none", protocol="none",
                         high_busbw=math.inf, bottleneck="none")
    view = nccl_nodes(cluster)
    links = _node_links(view)
    topo = _topology(view, links)
    if op == "all_to_all":
        if algorithm not in ("auto", "pairwise"):
            raise ValueError(f"NCCL runs all_to_all as grouped send/receive; use "
                             f"algorithm='auto' or 'pairwise', not {algorithm!r}.")
        seconds, latency, bound = _all_to_all(nbytes, links, topo, view)
        bound = "latency" if latency + LAUNCH_OVERHEAD_S > seconds / 2 else bound
        return _unbanded(op, nbytes, cluster, time_s=seconds, algorithm="pairwise",
                         protocol="Simple", high_busbw=_high_busbw(op, "ring", links, view),
                         bottleneck=bound)
    # NCCL picks by its own model (ncclTopoGetAlgoTime); the pick then also pays its pipeline's
    # fill, which that model leaves out (so the fill never changes the pick).
    timed = [(_nccl.algo_time_us(topo, op, t, nbytes) * 1e-6 + LAUNCH_OVERHEAD_S, t)
             for t in _tuned_options(op, topo, cluster, algorithm, protocol)]
    seconds, best = min(timed, key=lambda pair: pair[0])
    seconds += _nccl.fill_time_us(topo, best, nbytes, PIPELINE_FILL_CHUNKS) * 1e-6
    latency = best.latency_us * 1e-6 + LAUNCH_OVERHEAD_S
    high = _high_busbw(op, best.algorithm, links, view)
    bus = nbytes / seconds * busbw_factor(op, cluster.n_gpus)
    return _unbanded(op, nbytes, cluster, time_s=seconds, algorithm=best.algorithm,
                     protocol=best.protocol, high_busbw=max(high, bus),
                     bottleneck="latency" if latency > seconds / 2 else best.bound)
