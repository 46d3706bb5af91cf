"""Answer key of chapter 03's exercises (instructor-only: student copies leave keys/ out).

Each expected value is computed here as the chapter's solution computes it.
"""

import math

from clusterlab.analytic import costmodel, memory, storage, topology
from clusterlab.catalog import hardware
from clusterlab.course import grading

B = hardware.link("IB-NDR").bytes_per_s      # the chapter's b: one 400 Gb/s link, per direction


def _oversubscribed() -> tuple[float, float]:
    graph = topology.fat_tree(n_leaves=8, hosts_per_leaf=12, n_spines=4, link_bytes_per_s=B)
    return topology.oversubscription(graph, "leaf0"), topology.bisection_bandwidth(graph) / 1e12


def _k_ary(k: int = 16) -> tuple[int, float, int]:
    tree = topology.fat_tree_3tier(n_pods=k, leaves_per_pod=k // 2, hosts_per_leaf=k // 2,
                                   spines_per_pod=k // 2, cores_per_plane=k // 2,
                                   link_bytes_per_s=B)
    ends = topology.endpoints(tree)
    return (len(ends), topology.bisection_bandwidth(tree) / 1e12,
            topology.shortest_path_count(tree, ends[0], ends[-1]))


def _rails() -> tuple[float, float]:
    def cut_gb_s(nvlink: float | None) -> float:
        graph = topology.rail_optimized(8, 8, nic_bytes_per_s=B, n_spines=1, links_per_spine=1,
                                        nvlink_bytes_per_s=nvlink)
        ends = topology.endpoints(graph)
        low = [e for e in ends if graph.nodes[e]["local_rank"] < 4]
        halves = (low, [e for e in ends if e not in low])
        return topology.bisection_bandwidth(graph, halves=halves) / 1e9

    return cut_gb_s(None), cut_gb_s(hardware.link("NVLink4").bytes_per_s)


def _crowded_placements() -> tuple[float, float, float]:
    gpus = topology.endpoints(topology.fat_tree(n_leaves=4, hosts_per_leaf=16, n_spines=4,
                                                link_bytes_per_s=B))
    placements = ((gpus[0:8], gpus[8:16]),                               # one leaf
                  (gpus[0:8], gpus[16:24]),                              # two leaves
                  (gpus[0:4] + gpus[16:20], gpus[32:36] + gpus[48:52]))  # four leaves
    crowded = topology.fat_tree(n_leaves=4, hosts_per_leaf=16, n_spines=4, link_bytes_per_s=B,
                                uplink_bytes_per_s=B / 4)
    return tuple(topology.cut_bandwidth(crowded, *halves) / 1e9 for halves in placements)


def _ecmp(flows: int = 32) -> tuple[int, int, float]:
    pod_graph = topology.from_fabric(hardware.fabric("SuperPOD B200 4SU"))
    ends = topology.endpoints(pod_graph)
    cables = sum(edge["links"] for neighbour, edge in pod_graph["su0.rail0"].items()
                 if pod_graph.nodes[neighbour]["kind"] == "spine")
    # the i-th flow must miss the i cables already taken
    no_collision = math.prod(max(0.0, 1 - i / cables) for i in range(flows))
    return topology.shortest_path_count(pod_graph, ends[0], ends[-1]), cables, no_collision


def _nvl72_cuts() -> tuple[float, float]:
    rack = hardware.rack("GB200 NVL72")
    per_rack = hardware.nvlink_domain_gpus(rack)
    racks = topology.rail_optimized(8, per_rack,
                                    nic_bytes_per_s=hardware.scale_out_bytes_per_s(rack),
                                    n_spines=1,
                                    nvlink_bytes_per_s=hardware.scale_up_bytes_per_s(rack))
    ends = topology.endpoints(racks)
    half = len(ends) // 2
    return (topology.cut_bandwidth(racks, ends[:half], ends[half:]) / 1e12,
            topology.cut_bandwidth(racks, ends[:per_rack // 2],
                                   ends[per_rack // 2:per_rack]) / 1e12)


def _two_networks() -> tuple[float, float]:
    n_params, n_nodes = 405e9, 256
    dgx = hardware.node("DGX H100")
    share_s = storage.checkpoint_write_s(memory.checkpoint_bytes(n_params) / n_nodes,
                                         hardware.storage_network_bytes_per_s(dgx))
    all_reduce = costmodel.cluster_collective(
        "all_reduce", n_params / dgx.gpus_per_node * 2,       # each GPU's bf16 gradient shard
        hardware.ClusterSpec(gpu=dgx.gpu, n_nodes=n_nodes, gpus_per_node=1, nic=dgx.nic,
                             nics_per_node=1))
    return share_s, all_reduce.time_s


KEY = {
    "ch03.1": grading.close(
        _oversubscribed(), rtol=1e-2, name="(leaf oversubscription, bisection TB/s)",
        hint="A leaf's oversubscription is its links down over its links up; "
             "topology.bisection_bandwidth gives the min-cut in bytes/s, and a TB/s is 10^12."),
    "ch03.2": grading.close(
        _k_ary(), rtol=4e-4,       # tight enough to pin the GPU count
        name="(GPUs, bisection TB/s, shortest paths between pods)",
        hint="Build topology.fat_tree_3tier with k pods of k/2 leaves of k/2 hosts, k/2 spines "
             "per pod and k/2 cores per plane; count endpoints and paths between the first "
             "and the last GPU."),
    "ch03.3": grading.close(
        _rails(), rtol=1e-2, name="(GB/s between the rail halves without NVLink, with NVLink4)",
        hint="Split the endpoints by their local_rank attribute (below 4 or not) and pass the "
             "two lists as halves to topology.bisection_bandwidth, once per graph."),
    "ch03.4": grading.close(
        _crowded_placements(), rtol=1e-2,
        name="(GB/s for the one-leaf, two-leaf, four-leaf placements)",
        hint="Rebuild the 4-leaf tree with uplink_bytes_per_s a quarter of a link, keep the "
             "placements' halves, and take topology.cut_bandwidth of each."),
    "ch03.5": grading.close(
        _ecmp(), rtol=1e-2,
        name="(spines a flow can cross, uplink cables of the leaf, chance of no shared cable)",
        hint="Sum the links attribute over the leaf's edges to spines; the i-th flow must avoid "
             "the i cables already taken, so multiply (1 - i / cables) over the 32 flows."),
    "ch03.6": grading.close(
        _nvl72_cuts(), rtol=1e-2, name="(TB/s between 4 racks and 4 racks, TB/s between two "
                                       "halves of one rack)",
        hint="One server per rack with the rack's 72 GPUs; cut the endpoints in two halves of "
             "the whole list, then the first rack's GPUs in two halves of 36."),
    "ch03.7": grading.close(
        _two_networks(), rtol=1e-2,
        name="(seconds to write a server's checkpoint share, seconds of the gradient all-reduce)",
        hint="A server writes 1/256 of memory.checkpoint_bytes at its storage network's rate; "
             "each GPU all-reduces its tensor-parallel shard (1/8 of the parameters, bf16) over "
             "256 nodes of one GPU and one NIC each."),
}
