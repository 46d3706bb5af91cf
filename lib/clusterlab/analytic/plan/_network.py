"""The planner's one door to :func:`clusterlab.analytic.costmodel.cluster_collective`: an all-reduce
on a
:class:`clusterlab.catalog.hardware.ClusterSpec`, and a group's share of a cluster as a spec."""

from __future__ import annotations

import functools
from dataclasses import replace

from clusterlab.analytic import costmodel
from clusterlab.analytic.costmodel.cluster import ClusterOp
from clusterlab.catalog import hardware
from clusterlab.catalog.hardware import ClusterSpec


def all_reduce(nbytes: float, group: ClusterSpec) -> costmodel.CollectiveEstimate:
    """NCCL's all-reduce of ``nbytes`` per GPU over every GPU of ``group`` (see
    :func:`collective`)."""
    return collective("all_reduce", nbytes, group)


# A search prices thousands of candidate layouts that share a few dozen (op, bytes, group)
# triples (3,552 calls, 35 distinct, for lab 10's 1,024-GPU search); the model is a pure function
# of its arguments (a frozen ClusterSpec, a frozen estimate returned), so each is priced once.
@functools.lru_cache(maxsize=4096)
def collective(op: ClusterOp, nbytes: float,
               group: ClusterSpec) -> costmodel.CollectiveEstimate:
    """NCCL's ``op`` of an ``nbytes`` buffer (nccl-tests' ``size``: for an all-gather the
    gathered output, for a reduce-scatter its input) over every GPU of ``group``.

    The estimate is marked untested where no published row can back it whatever its regime:
    a network without a named NIC (its fabric is unknown) or an accelerator outside the catalog
    (a TPU in the planner's validation tests is priced as if NCCL ran on it). Estimates are
    cached per argument triple.
    """
    estimate = costmodel.cluster_collective(op, nbytes, group)
    if (group.n_nodes > 1 and group.nic is None) or not _nccl_knows(group.gpu):
        estimate = replace(estimate, validation="untested")
    return estimate


def _nccl_knows(gpu: hardware.GPU) -> bool:
    """Whether ``gpu`` is one of the catalog's GPUs, whose NCCL rules and published rows the
    network model has."""
    return hardware.GPUS.get(gpu.name.upper()) == gpu or gpu in hardware.GPUS.values()


def group_of(cluster: ClusterSpec, local: int, nodes: int) -> ClusterSpec:
    """The part of ``cluster`` one parallel group runs on: ``local`` GPUs in each of ``nodes``
    nodes, with those GPUs' share of each node's network.

    NCCL's search sees the group's real NICs (one 100G port is one channel path at 12 GB/s,
    not eight NICs of 1.56), so a share that is a whole number of the cluster's NICs stays NICs;
    only a fractional share (or a cluster given by its rate) becomes a line rate per node.
    """
    if nodes == 1:
        return replace(cluster, n_nodes=1, gpus_per_node=local)
    share_bytes_per_s = cluster.node_network_bytes_per_s * local / cluster.gpus_per_node
    nics = (0.0 if cluster.nic is None
            else share_bytes_per_s / hardware.link(cluster.nic).bytes_per_s)
    if nics >= 1 and abs(nics - round(nics)) < 1e-9:
        network = dict(nics_per_node=round(nics), network_bytes_per_s=None)
    else:
        network = dict(network_bytes_per_s=share_bytes_per_s)
    return replace(cluster, n_nodes=nodes, gpus_per_node=local, **network)
