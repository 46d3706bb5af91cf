"""Unit tests of clusterlab.analytic.topology against values derived by hand."""

import networkx as nx
import pytest

from clusterlab.analytic import topology
from clusterlab.catalog import hardware

NDR = hardware.link("IB-NDR").bytes_per_s  # 50e9 bytes/s per direction (400 Gb/s)


# ---- builders ------------------------------------------------------------------------------

def test_node_graph_shape_and_kinds():
    graph = topology.node_graph(8, nvlink_bytes_per_s=450e9)
    assert topology.count_kinds(graph) == {"nvswitch": 1, "gpu": 8}
    assert topology.endpoints(graph) == [f"gpu{i}" for i in range(8)]
    assert graph["gpu3"]["nvswitch0"]["bytes_per_s"] == 450e9
    # Any two GPUs: GPU - NVSwitch - GPU, one path.
    assert topology.hop_count(graph, "gpu0", "gpu7") == 2
    assert topology.shortest_path_count(graph, "gpu0", "gpu7") == 1


def test_node_graph_bisection_is_half_the_gpus_times_nvlink():
    # 4 GPUs on each side, each can push its full NVLink rate through the switch.
    graph = topology.node_graph(8, nvlink_bytes_per_s=450e9)
    assert topology.bisection_bandwidth(graph) == pytest.approx(4 * 450e9)


def test_fat_tree_counts_and_merged_parallel_links():
    graph = topology.fat_tree(4, 8, 2, NDR, links_per_spine=4)
    assert topology.count_kinds(graph) == {"spine": 2, "leaf": 4, "gpu": 32}
    # 4 cables leaf-to-spine are one edge of 4x the capacity.
    assert graph["leaf0"]["spine1"]["links"] == 4
    assert graph["leaf0"]["spine1"]["bytes_per_s"] == pytest.approx(4 * NDR)
    assert graph.nodes["gpu9"]["leaf"] == 1  # host 9 sits on leaf 9 // 8


def test_nonblocking_fat_tree_has_full_bisection():
    # 4 leaves x 4 hosts, 4 spines: uplinks = downlinks, so hosts/2 * link rate.
    graph = topology.fat_tree(4, 4, 4, NDR)
    assert topology.oversubscription(graph, "leaf0") == pytest.approx(1.0)
    assert topology.bisection_bandwidth(graph) == pytest.approx(16 / 2 * NDR)


def test_two_to_one_oversubscription_halves_bisection():
    # Same leaves and hosts, 2 spines: 4 down, 2 up per leaf.
    graph = topology.fat_tree(4, 4, 2, NDR)
    assert topology.oversubscription(graph, "leaf2") == pytest.approx(2.0)
    full = topology.bisection_bandwidth(topology.fat_tree(4, 4, 4, NDR))
    assert topology.bisection_bandwidth(graph) == pytest.approx(full / 2)
    assert topology.bisection_bandwidth(graph) == pytest.approx(4 * NDR)


def test_oversubscription_from_slower_uplinks():
    # 8 hosts at 400 Gb/s, 2 spines x 1 cable at 800 Gb/s: 400 GB/s down vs 200 GB/s up.
    graph = topology.fat_tree(2, 8, 2, NDR, uplink_bytes_per_s=2 * NDR)
    assert topology.oversubscription(graph, "leaf0") == pytest.approx(2.0)
    # Each leaf's uplinks cap the cut: 2 spines x 100 GB/s.
    assert topology.bisection_bandwidth(graph) == pytest.approx(2 * 2 * NDR)


def test_hop_counts_and_path_counts_in_a_two_tier_fat_tree():
    graph = topology.fat_tree(3, 4, 5, NDR)
    assert topology.hop_count(graph, "gpu0", "gpu3") == 2    # same leaf: host-leaf-host
    assert topology.hop_count(graph, "gpu0", "gpu4") == 4    # host-leaf-spine-leaf-host
    assert topology.shortest_path_count(graph, "gpu0", "gpu3") == 1
    assert topology.shortest_path_count(graph, "gpu0", "gpu11") == 5  # one per spine
    assert topology.shortest_path_count(graph, "gpu0", "gpu11") == len(
        list(nx.all_shortest_paths(graph, "gpu0", "gpu11")))


def test_three_tier_k_ary_fat_tree():
    # Al-Fares k=4: 16 hosts, 8 leaves, 8 spines, 4 cores, non-blocking.
    k = 4
    graph = topology.fat_tree_3tier(k, k // 2, k // 2, k // 2, k // 2, NDR)
    assert topology.count_kinds(graph) == {"core": 4, "spine": 8, "leaf": 8, "gpu": 16}
    assert topology.oversubscription(graph, "leaf0") == pytest.approx(1.0)
    assert topology.oversubscription(graph, "spine0") == pytest.approx(1.0)
    assert topology.bisection_bandwidth(graph) == pytest.approx(16 / 2 * NDR)
    assert topology.hop_count(graph, "gpu0", "gpu1") == 2     # same leaf
    assert topology.hop_count(graph, "gpu0", "gpu2") == 4     # same pod, other leaf
    assert topology.hop_count(graph, "gpu0", "gpu15") == 6    # other pod, through a core
    assert topology.shortest_path_count(graph, "gpu0", "gpu2") == k // 2
    assert topology.shortest_path_count(graph, "gpu0", "gpu15") == (k // 2) ** 2


def test_three_tier_with_thin_core_is_limited_by_the_core():
    # 2 pods x 2 leaves x 4 hosts, 2 spines per pod, 1 core per plane: a spine has 2 links
    # down and 1 up (2:1), so pod-to-pod traffic is 2 spines x 1 link per pod.
    graph = topology.fat_tree_3tier(2, 2, 4, 2, 1, NDR)
    assert topology.oversubscription(graph, "spine0") == pytest.approx(2.0)
    assert topology.bisection_bandwidth(graph) == pytest.approx(2 * NDR)


def test_rail_optimized_wiring_and_bisection():
    graph = topology.rail_optimized(4, 4, nic_bytes_per_s=NDR, n_spines=2)
    # GPU r of every server on rail leaf r; 4 rails, 1 group.
    assert topology.count_kinds(graph) == {"spine": 2, "leaf": 4, "gpu": 16}
    assert set(graph["su0.rail2"]) >= {"gpu2", "gpu6", "gpu10", "gpu14"}
    assert topology.hop_count(graph, "gpu0", "gpu4") == 2    # same rail, other server
    assert topology.hop_count(graph, "gpu0", "gpu5") == 4    # other rail: through a spine
    assert topology.shortest_path_count(graph, "gpu0", "gpu5") == 2
    # Servers 0-1 against 2-3: every GPU talks to its twin on its own rail at NIC rate.
    assert topology.bisection_bandwidth(graph) == pytest.approx(8 * NDR)
    # Default links_per_spine makes each leaf non-blocking: 4 down, 2 spines x 2 up.
    assert topology.oversubscription(graph, "su0.rail0") == pytest.approx(1.0)


def test_rail_split_needs_spines_or_nvlink():
    # Rails 0-1 against rails 2-3: without NVLink all traffic climbs to the spines, whose
    # capacity is 2 leaves x 4 uplinks x NDR; with NVLink each GPU also crosses inside its server.
    def split(graph):
        ends = topology.endpoints(graph)
        low = [e for e in ends if graph.nodes[e]["local_rank"] < 2]
        return low, [e for e in ends if e not in low]

    fabric = topology.rail_optimized(4, 4, nic_bytes_per_s=NDR, n_spines=2)
    assert topology.bisection_bandwidth(fabric, halves=split(fabric)) == pytest.approx(8 * NDR)
    nvlink = topology.rail_optimized(4, 4, nic_bytes_per_s=NDR, n_spines=1, links_per_spine=1,
                                     nvlink_bytes_per_s=450e9)
    # 8 GPUs x 450 GB/s over NVLink, plus 2 rail leaves x 1 uplink.
    assert topology.bisection_bandwidth(nvlink, halves=split(nvlink)) == pytest.approx(
        8 * 450e9 + 2 * NDR)


def test_rail_groups_joined_by_thin_spines():
    # 2 groups of 2 servers, 2 rails, one spine and one cable per leaf: the halves are the two
    # groups, and each group reaches the spine through 2 leaves x 1 cable.
    graph = topology.rail_optimized(4, 2, nic_bytes_per_s=NDR, nodes_per_group=2, n_spines=1,
                                    links_per_spine=1)
    assert topology.oversubscription(graph, "su0.rail0") == pytest.approx(2.0)
    assert topology.bisection_bandwidth(graph) == pytest.approx(2 * NDR)
    assert topology.hop_count(graph, "gpu0", "gpu4") == 4


def test_random_splits_never_exceed_the_ordered_split():
    graph = topology.fat_tree(4, 4, 2, NDR)
    ordered = topology.bisection_bandwidth(graph)
    assert topology.bisection_bandwidth(graph, random_splits=8, seed=1) <= ordered


def test_cut_bandwidth_of_one_host_is_its_link():
    graph = topology.fat_tree(2, 2, 1, NDR)
    assert topology.cut_bandwidth(graph, ["gpu0"], ["gpu3"]) == pytest.approx(NDR)


# ---- errors --------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(n_leaves=0, hosts_per_leaf=4, n_spines=2, link_bytes_per_s=NDR), "n_leaves"),
    (dict(n_leaves=2, hosts_per_leaf=-1, n_spines=2, link_bytes_per_s=NDR), "hosts_per_leaf"),
    (dict(n_leaves=2, hosts_per_leaf=4, n_spines=1.5, link_bytes_per_s=NDR), "n_spines"),
    (dict(n_leaves=2, hosts_per_leaf=4, n_spines=2, link_bytes_per_s=0), "link_bytes_per_s"),
    (dict(n_leaves=2, hosts_per_leaf=4, n_spines=2, link_bytes_per_s=NDR,
          uplink_bytes_per_s=-1.0), "uplink_bytes_per_s"),
])
def test_fat_tree_rejects_impossible_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        topology.fat_tree(**kwargs)


def test_other_builders_reject_impossible_input():
    with pytest.raises(ValueError, match="gpus_per_node"):
        topology.node_graph(0)
    with pytest.raises(ValueError, match="nvlink_bytes_per_s"):
        topology.node_graph(8, nvlink_bytes_per_s=float("nan"))
    with pytest.raises(ValueError, match="nodes_per_group must divide n_nodes"):
        topology.rail_optimized(6, 8, nodes_per_group=4)
    with pytest.raises(ValueError, match="cores_per_plane"):
        topology.fat_tree_3tier(2, 2, 2, 2, 0, NDR)


def test_bisection_rejects_odd_endpoints_and_bad_halves():
    with pytest.raises(ValueError, match="even number of endpoints"):
        topology.bisection_bandwidth(topology.fat_tree(1, 3, 1, NDR))
    graph = topology.fat_tree(2, 2, 1, NDR)
    with pytest.raises(ValueError, match="equal sizes"):
        topology.bisection_bandwidth(graph, halves=(["gpu0"], ["gpu1", "gpu2"]))
    with pytest.raises(ValueError, match="disjoint"):
        topology.bisection_bandwidth(graph, halves=(["gpu0", "gpu1"], ["gpu1", "gpu2"]))
    with pytest.raises(ValueError, match="not in the graph"):
        topology.hop_count(graph, "gpu0", "gpu99")


def test_oversubscription_rejects_endpoints_and_top_tier():
    graph = topology.fat_tree(2, 2, 1, NDR)
    with pytest.raises(ValueError, match="kind 'gpu'"):
        topology.oversubscription(graph, "gpu0")
    with pytest.raises(ValueError, match="no uplinks"):
        topology.oversubscription(graph, "spine0")


def test_disconnected_graph_has_no_path():
    graph = topology.node_graph(2)
    graph.add_node("gpu9", kind="gpu", index=9)
    with pytest.raises(ValueError, match="disconnected"):
        topology.hop_count(graph, "gpu0", "gpu9")
    with pytest.raises(ValueError, match="disconnected"):
        topology.shortest_path_count(graph, "gpu0", "gpu9")


# ---- hardware additions used by chapters 02-03 (roofline, nodes, fabrics) -------------------

def test_ridge_point_and_roofline():
    h100 = hardware.gpu("H100")
    ridge = hardware.ridge_point("H100")
    assert ridge == pytest.approx(989e12 / 3.35e12)
    # Below the ridge: bandwidth times intensity; above: the peak.
    assert hardware.roofline_flops(h100, 10.0) == pytest.approx(10.0 * 3.35e12)
    assert hardware.roofline_flops(h100, 10 * ridge) == pytest.approx(989e12)
    assert hardware.roofline_flops(h100, ridge) == pytest.approx(989e12)
    with pytest.raises(ValueError, match="intensity_flops_per_byte must be positive"):
        hardware.roofline_flops(h100, 0.0)


def test_nodes_and_fabrics_refer_to_known_parts():
    for spec in hardware.NODES.values():
        hardware.gpu(spec.gpu), hardware.link(spec.nvlink), hardware.link(spec.nic)
        hardware.link(spec.pcie)
        assert spec.nics_per_node == spec.gpus_per_node  # one NIC per GPU
        assert "[" in spec.source
    for spec in hardware.FABRICS.values():
        node = hardware.node(spec.node)
        assert spec.n_leaves == spec.n_groups * node.gpus_per_node  # one leaf per rail per group
        assert spec.leaf_spine_cables % (spec.n_leaves * spec.n_spines) == 0
    with pytest.raises(ValueError, match="Known nodes"):
        hardware.node("DGX-1")


def test_superpod_fabric_is_non_blocking_with_full_bisection():
    spec = hardware.fabric("SuperPOD B200 4SU")
    rate = hardware.link(spec.link).bytes_per_s
    graph = topology.from_fabric(spec)
    # 1024 leaf-spine cables over 32 leaves x 16 spines: 2 cables per leaf-spine pair.
    assert graph["su0.rail0"]["spine0"]["links"] == 2
    assert graph.nodes["gpu8"]["node"] == 1 and graph.nodes["gpu8"]["local_rank"] == 0
    assert topology.count_kinds(graph) == {"spine": 16, "leaf": 32, "gpu": 1024}
    assert topology.oversubscription(graph, "su0.rail0") == pytest.approx(1.0)
    assert topology.bisection_bandwidth(graph) == pytest.approx(1024 / 2 * rate)
