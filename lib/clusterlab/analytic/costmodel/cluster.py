"""One model of collectives across nodes: NCCL 2.30.7's own tuning model, with its band.

:func:`cluster_collective` takes the one cluster description,
:class:`clusterlab.catalog.hardware.ClusterSpec` (build a variant with ``dataclasses.replace``).
"""

from __future__ import annotations

from typing import Literal

from clusterlab.analytic.costmodel import _model, validation
from clusterlab.analytic.costmodel._model import CollectiveEstimate, FabricKind
from clusterlab.catalog import hardware

ClusterOp = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
ClusterAlgorithm = Literal["auto", "ring", "tree", "nvls", "nvls_tree", "collnet_direct",
                           "collnet_chain", "pat", "pairwise"]
Protocol = Literal["auto", "LL", "LL128", "Simple"]


def cluster_collective(op: ClusterOp, nbytes: float, cluster: hardware.ClusterSpec, *,
                       algorithm: ClusterAlgorithm = "auto", protocol: Protocol = "auto",
                       fabric: FabricKind | None = None) -> CollectiveEstimate:
    """Expected time and bus bandwidth of one NCCL collective on a cluster.

    NCCL prices every algorithm and protocol with its own model and runs the fastest; this is
    that model, from NCCL 2.30.7 (``NCCL_RELEASE``; :mod:`clusterlab.analytic.costmodel._nccl` cites
    ``src/graph/tuning.cc`` line by line), plus ``LAUNCH_OVERHEAD_S`` per call and the fill of
    the pipeline NCCL's model leaves out (``PIPELINE_FILL_CHUNKS`` chunk-times of one channel,
    with NCCL's chunk sizes from ``src/enqueue.cc`` calcCollChunking; it never changes the pick):

    * **The graphs.** NCCL's topology search finds channels and a per-channel bandwidth for
      each algorithm; here they come from the node's links as NCCL counts them (an NVLink4 link
      is 20.6 GB/s, so 370.8 GB/s per H100; a 400 Gb/s NIC is 50, searched at 48). That
      derivation is the one approximation of NCCL's code (``_nccl.graphs``).
    * **The ring** is one flat ring over all ``n`` ranks per channel: across nodes each channel
      crosses every node's network twice per all-reduce, whatever the node count.
    * **The tree** sends each byte up and down a tree of nodes once each way; on two nodes its
      intra-node bandwidth may reach twice the network's (search.cc), and NVLS-tree's network
      bandwidth is doubled (tuning.cc "Handle 2 node case of NVLSTree"), which is why on two
      nodes busbw can pass the NICs' line rate with no in-network reduction.
    * **NVLS** (NVLink SHARP, one node of H100/H200/B200) at NCCL's per-architecture efficiency
      (0.85 Hopper, 0.74 Blackwell); **NVLS-tree** across NVSwitch nodes; **CollNet** (IB SHARP)
      with ``sharp=True``; **PAT** for all-gather/reduce-scatter at one GPU per node.
    * **Protocols**: LL at half of Simple capped by ``llMaxBws``, LL128 at 92% capped per
      channel, on by default on NVLink nodes (Hopper and Blackwell included).
    * **The fill**: NCCL's model prices a full pipeline; the first chunks of each channel fill
      it, so the fill grows with the size until one loop of chunks is full (ring: 2 MiB x
      ranks per channel with Simple; NVLS: 16-128 KiB x heads), then stays: the middle sizes
      (1 MiB - 1 GiB) are where it counts.
    * **All-to-all** is grouped send/receive, which NCCL does not price: a course estimate
      (each GPU's node link and network share in parallel).

    The errors per regime against published rows (:func:`validation_by_regime`) set the band
    (``UNVALIDATED_BAND`` with fewer than ``MIN_VALIDATION_ROWS`` rows) and the estimate's
    ``validation``: "validated" only where the regime's median |error| is within ``TOLERANCE``
    and its rows span the estimate's node count and node size ("extrapolated" where not).
    A run whose switches reduce (CollNet, or NVLS across nodes, with ``sharp=True``) lies in
    its own regime, e.g. "2 nodes, InfiniBand + SHARP, all_reduce, >= 1 GiB": rows without
    SHARP do not validate it.

    Args:
        op: ``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"`` or ``"all_to_all"``.
        nbytes: the buffer in bytes, as nccl-tests' ``size`` column counts it.
        cluster: the cluster (:class:`~clusterlab.catalog.hardware.ClusterSpec`, e.g.
            ``ClusterSpec.from_node("DGX H100", n_nodes=2)``); with ``sharp=True`` in it the
            network reduces in its switches (InfiniBand SHARP, NCCL CollNet).
        algorithm: ``"auto"`` or one of :data:`CLUSTER_ALGORITHMS` to force it (as
            ``NCCL_ALGO`` does); ``"collnet_*"`` need ``sharp=True``.
        protocol: ``"auto"`` or one of :data:`PROTOCOLS` (as ``NCCL_PROTO``).
        fabric: the network's kind for the validation regime, one of :data:`FABRICS`
            (default: by the NIC's name).

    Returns:
        A :class:`CollectiveEstimate` (time, algbw, busbw, algorithm, protocol, band, regime).

    Raises:
        ValueError: unknown names, a network missing for several nodes, or an algorithm that
            NCCL does not run there (e.g. NVLS across nodes without SHARP).

    References:
        NVIDIA NCCL v2.30.7-1 ``src/graph`` (tuning.cc, search.cc, topo.h); nccl-tests
        ``doc/PERFORMANCE.md``; :mod:`clusterlab.catalog.published.nccl_tests`.
    """
    estimate = _model.estimate(op, nbytes, cluster, algorithm=algorithm, protocol=protocol)
    return estimate if cluster.n_gpus == 1 else _with_regime_band(estimate, cluster, fabric)


def _with_regime_band(estimate: CollectiveEstimate, spec: hardware.ClusterSpec,
                      fabric: FabricKind | None) -> CollectiveEstimate:
    """The estimate with its validation regime and the band its published rows set."""
    where = _model.cluster_regime(estimate, spec, fabric)
    return validation.with_band(estimate, where, _model.nccl_nodes(spec))


def all_reduce_time(nbytes: float, cluster: hardware.ClusterSpec) -> float:
    """Seconds of an all-reduce of ``nbytes`` per GPU: ``cluster_collective(...).time_s``.

    Args:
        nbytes: the buffer each GPU all-reduces, in bytes.
        cluster: the cluster.

    Returns:
        Seconds, NCCL's pick (the band is not needed for a time).
    """
    return _model.estimate("all_reduce", nbytes, cluster).time_s
