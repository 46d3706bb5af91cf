"""clusterlab.analytic.fabric: the flow-level model of collectives with contention.

Where the answer is known it must come out: max-min fairness on a textbook example; the closed
form of a step against the event-driven loop; without contention, the course's one network
model (costmodel.cluster_collective) and the three-phase hierarchical formula; d-mod-k routing
is non-blocking for a shift permutation on a non-blocking fat tree; oversubscription and ECMP
collisions cost what counting flows per link says. SimGrid cross-checks the sharing itself in
tests/test_fabric_simgrid.py.

What the comparison with cluster_collective means here. The flow model keeps its own link
efficiencies (costmodel.NVLINK_EFFICIENCY and NIC_EFFICIENCY: 370.8 of NVLink4's 450 GB/s, 48
of a 50 GB/s NIC), while cluster_collective is NCCL's own tuning model (costmodel.NCCL_RELEASE),
whose bandwidth is what NCCL's topology search finds: a number of channels times a per-channel
speed taken from a fixed list of speed steps (a 25 GB/s HDR NIC carries 24, a 50 GB/s NDR NIC
48, one H100 ring channel on NVLink 30, 12 of them: 360 GB/s). So the comparison is ring
against ring, NCCL forced to ring/Simple, latencies set to zero in the flow model and removed
from cluster_collective (its time minus its latency, obtained as ``t(2S) - t(S)``). Asserted
below, for each configuration: the flow model's time equals its own bound by hand
(``2 (n-1)/n S`` over the slowest per-GPU share: NVLink, 8/7 NVLink when a channel leaves
through the NIC, or the NICs) to 1e-12; NCCL's time equals ``2 (n-1)/n S`` over its ring
graph's ``channels x speed`` to 1e-12; and the two differ exactly by the ratio of those
bandwidths, which stays within 4%: across servers it is 1 while NIC_EFFICIENCY is NCCL's own
speed step (48/50 = 24/25 = 0.96, costmodel), and on one server 360 against 370.8 GB/s.

The double binary tree (algorithm="tree") is compared the same way, on a network-bound
configuration (8 NICs of 6.25 GB/s per server; costmodel given the same
``network_bytes_per_s``; 1 GiB, above the sizes of NCCL's tree correction). Per direction, a
server of the flow model's tree moves half the buffer per tree edge it has: on 2 servers each
is the root of one tree and a leaf of the other, D per direction, so the time is ``D / net``;
from 4 servers (even counts) some server is inside one tree (parent and two children) and a
leaf of the other, 2D, so the time is ``2 D / net``. NCCL's model halves the same way: on 2
nodes the tree's intra-node bandwidth is raised to twice the network's (search.cc), so its
bus bandwidth is ``0.92 x channels x 2 speed`` (tuning.cc's tree factor), from 4 nodes
``0.92 x channels x speed``; the two models then differ by the same ratio at every node count,
``NIC_EFFICIENCY x 6.25 / (0.92 x 6.0)`` (6.0 GB/s: NCCL's speed step under 6.25), asserted.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from clusterlab.analytic import costmodel, fabric, topology
from clusterlab.catalog import hardware
from clusterlab.analytic.costmodel import _nccl

GIB = 2**30
NVLINK = 450e9          # H100 NVLink4 per direction
HDR, NDR = 25e9, 50e9   # one NIC port per direction


def _rail(n_nodes, nic, **kw):
    graph = topology.rail_optimized(n_nodes, 8, nic_bytes_per_s=nic, nvlink_bytes_per_s=NVLINK,
                                    **kw)
    return fabric.Fabric(graph, net_hop_latency_s=0.0, nvlink_hop_latency_s=0.0)


def _nccl_ring(n_nodes, nic_gbps=0.0):
    """NCCL's ring graph for servers of 8 H100 with 8 NICs of ``nic_gbps`` (GB/s) each, as
    cluster_collective derives it (NVLink4: 18 links x 20.6 GB/s; PCIe Gen5: 48)."""
    return _nccl.graphs(compcap=90, n_nodes=n_nodes, gpus_per_node=8,
                        intra_gbps=18 * _nccl.NVLINK_BW_PER_LINK[90], nvlink=True,
                        nvswitch=True, nic_gbps=nic_gbps, nics_per_node=8 if n_nodes > 1 else 0,
                        pcie_gbps=48.0).ring


def _ring_s(nbytes, n, busbw):
    """A ring all-reduce's bandwidth term: 2 (n-1)/n of the buffer at ``busbw``."""
    return 2 * (n - 1) / n * nbytes / busbw


def _bandwidth_term(op, nbytes, *, algorithm="auto", protocol="auto", **cluster):
    """cluster_collective's time without its latency: t(2S) - t(S) (latency is size-free).
    ``cluster``: the ClusterSpec's fields.

    The pipeline fill is left out too: it grows with the buffer until one loop of chunks (on 16
    nodes 8 x 128 x 2 MiB, above the 1 GiB asked here), so t(2S) - t(S) would hold part of it,
    and the flow model it is compared with has no fill.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(costmodel._model, "PIPELINE_FILL_CHUNKS", 0.0)
        spec = hardware.ClusterSpec(**cluster)
        one = costmodel.cluster_collective(op, nbytes, spec, algorithm=algorithm,
                                           protocol=protocol).time_s
        two = costmodel.cluster_collective(op, 2 * nbytes, spec, algorithm=algorithm,
                                           protocol=protocol).time_s
    return two - one


# --- Max-min fairness ----------------------------------------------------------------------------

def test_max_min_rates_textbook_example():
    # Link A (10) carries flows 0 and 1; link B (4) carries flows 1, 2, 3. B fills first at
    # 4/3 each; flow 0 then takes the rest of A: 10 - 4/3.
    incidence = sp.csr_matrix(np.array([[1, 1, 0, 0], [0, 1, 1, 1]], dtype=float))
    rates = fabric.max_min_rates(incidence, np.array([10.0, 4.0]))
    np.testing.assert_allclose(rates, [10 - 4 / 3, 4 / 3, 4 / 3, 4 / 3], rtol=1e-12)


def test_an_unlimited_link_never_limits():
    # The textbook example with a third link, of infinite capacity, under every flow: same
    # rates; flows on unlimited links only are refused.
    incidence = sp.csr_matrix(np.array([[1, 1, 0, 0], [0, 1, 1, 1], [1, 1, 1, 1]],
                                       dtype=float))
    rates = fabric.max_min_rates(incidence, np.array([10.0, 4.0, np.inf]))
    np.testing.assert_allclose(rates, [10 - 4 / 3, 4 / 3, 4 / 3, 4 / 3], rtol=1e-12)
    with pytest.raises(ValueError, match="unlimited"):
        fabric.max_min_rates(sp.csr_matrix(np.ones((1, 2))), np.array([np.inf]))


def test_max_min_rejects_a_flow_without_links():
    with pytest.raises(ValueError, match="crosses no link"):
        fabric.max_min_rates(sp.csr_matrix((2, 1)), np.ones(2))


def test_closed_form_equals_the_event_loop():
    # A shuffled ring on a 2:1 fat tree with ECMP collides unevenly: several rate levels.
    f = fabric.Fabric(topology.fat_tree(8, 8, 4, 50e9), net_hop_latency_s=0.0)
    ranks = np.random.default_rng(0).permutation(64)
    step = fabric.steps(f, "all_reduce", GIB, ranks, aware=False)[0]
    incidence, flow_of, _ = f.route(step.src, step.dst, policy="ecmp", seed=3, qps=2)
    size = np.full(incidence.shape[1], 1e6)
    rates = fabric.max_min_rates(incidence, f.capacity_bytes_per_s)
    assert np.ptp(rates) > 0.1 * rates.max()          # really contended, several levels
    closed = fabric.step_seconds(incidence, f.capacity_bytes_per_s, size)
    events = fabric.fluid_seconds(incidence, f.capacity_bytes_per_s, size)
    assert closed == pytest.approx(events, rel=1e-9)


# --- Without contention: the network model --------------------------------------------------------

@pytest.mark.parametrize("n_nodes", [2, 4, 16])
def test_network_bound_ring_against_cluster_collective(n_nodes):
    # HDR NICs (25 GB/s): both models are bound by the network.
    f = _rail(n_nodes, HDR)
    ours = fabric.collective(f, "all_reduce", GIB, policy="ecmp")
    theirs = _bandwidth_term("all_reduce", GIB, gpu="H100", n_nodes=n_nodes, nic="IB-HDR",
                             algorithm="ring", protocol="Simple")
    n = 8 * n_nodes
    flow_bw = 8 * costmodel.NIC_EFFICIENCY * HDR                  # 192 GB/s per server
    ring = _nccl_ring(n_nodes, HDR / 1e9)
    nccl_bw = ring.n_channels * ring.bw_inter * 1e9                # 8 x 24 = 192 GB/s
    assert ours.latency_s == 0
    assert ours.time_s == pytest.approx(_ring_s(GIB, n, flow_bw), rel=1e-12)
    assert theirs == pytest.approx(_ring_s(GIB, n, nccl_bw), rel=1e-12)
    assert theirs / ours.time_s == pytest.approx(flow_bw / nccl_bw, rel=1e-12)
    assert 0.96 < theirs / ours.time_s <= 1 + 1e-12   # equal while NIC_EFFICIENCY = 48/50


def test_one_server_ring_against_cluster_collective():
    f = _rail(1, NDR)
    ours = fabric.collective(f, "all_reduce", GIB)
    theirs = _bandwidth_term("all_reduce", GIB, gpu="H100", n_nodes=1, algorithm="ring",
                             protocol="Simple")
    flow_bw = costmodel.NVLINK_EFFICIENCY * NVLINK                # 370.8 GB/s
    ring = _nccl_ring(1)
    nccl_bw = ring.n_channels * ring.bw_intra * 1e9                # 12 x 30 = 360 GB/s
    assert ours.time_s == pytest.approx(_ring_s(GIB, 8, flow_bw), rel=1e-12)
    assert theirs == pytest.approx(_ring_s(GIB, 8, nccl_bw), rel=1e-12)
    assert 1.0 < theirs / ours.time_s < 1.04      # NCCL's channels fill 360 of 370.8 GB/s


def test_ndr_ring_across_servers_is_bound_by_the_nics_in_both_models():
    # NDR NICs (8 x 50 GB/s): in the flow model a GPU carries 7 of 8 channels on NVLink (the
    # one it hands to the NIC does not cross it), so its NVLink share is 8/7 x 370.8 = 424
    # GB/s and the NICs (8 x 48 = 384 GB/s) bind; NCCL's search finds the same 8 channels of
    # 48 GB/s, also below what NVLink carries. (Before NCCL's own model, cluster_collective
    # charged every channel to NVLink, 370.8 GB/s.)
    f = _rail(4, NDR)
    ours = fabric.collective(f, "all_reduce", GIB)
    theirs = _bandwidth_term("all_reduce", GIB, gpu="H100", n_nodes=4, nic="IB-NDR",
                             algorithm="ring", protocol="Simple")
    intra = costmodel.NVLINK_EFFICIENCY * NVLINK
    net = 8 * costmodel.NIC_EFFICIENCY * NDR
    flow_bw = min(8 / 7 * intra, net)
    assert flow_bw == net
    ring = _nccl_ring(4, NDR / 1e9)
    nccl_bw = ring.n_channels * ring.bw_inter * 1e9
    assert nccl_bw < 8 / 7 * intra
    assert ours.time_s == pytest.approx(_ring_s(GIB, 32, flow_bw), rel=1e-12)
    assert theirs == pytest.approx(_ring_s(GIB, 32, nccl_bw), rel=1e-12)
    assert 0.96 < theirs / ours.time_s <= 1 + 1e-12


@pytest.mark.parametrize("nic,name", [(HDR, "IB-HDR"), (NDR, "IB-NDR")])
def test_sprayed_all_to_all_against_cluster_collective(nic, name):
    # cluster_collective's all-to-all is the course's estimate (NCCL does not price it): each
    # GPU sends (n-g)/n of the buffer over its share of the ring graph's network channels; the
    # flow model sprays the same bytes over the NICs at NIC_EFFICIENCY. Their ratio is the
    # ratio of those bandwidths (1 while NIC_EFFICIENCY is NCCL's 48/50).
    f = _rail(4, nic)
    ours = fabric.collective(f, "all_to_all", GIB, policy="spray")
    theirs = _bandwidth_term("all_to_all", GIB, gpu="H100", n_nodes=4, nic=name)
    ring = _nccl_ring(4, nic / 1e9)
    nccl_bw = ring.n_channels * ring.bw_inter * 1e9
    assert theirs == pytest.approx(24 / 32 * GIB / (nccl_bw / 8), rel=1e-12)
    assert theirs / ours.time_s == pytest.approx(8 * costmodel.NIC_EFFICIENCY * nic / nccl_bw,
                                                 rel=1e-12)


def test_hierarchical_equals_the_three_phase_formula():
    f = _rail(4, HDR)
    ours = fabric.collective(f, "all_reduce", GIB, algorithm="hierarchical")
    formula = costmodel.hierarchical_all_reduce_time(
        GIB, 8, 4, costmodel.NVLINK_EFFICIENCY * NVLINK, costmodel.NIC_EFFICIENCY * HDR)
    assert ours.time_s == pytest.approx(formula, rel=1e-12)


def test_latency_is_counted_per_step_along_the_longest_path():
    graph = topology.fat_tree(2, 2, 1, 50e9)
    f = fabric.Fabric(graph, net_hop_latency_s=1e-6)
    result = fabric.collective(f, "all_gather", 4e6)      # ring 0-1-2-3: hops 2, 4, 2, 4
    assert result.steps == 3
    assert result.latency_s == pytest.approx(3 * 4e-6, rel=1e-12)
    assert result.time_s == pytest.approx(result.transfer_s + result.latency_s)


def test_a_sprayed_flow_has_one_paths_latency():
    # 8 spines: spraying spreads a flow over 8 paths of 4 links; its latency is one path's.
    f = fabric.Fabric(topology.fat_tree(2, 2, 8, 50e9), net_hop_latency_s=1e-6)
    for policy in fabric.POLICIES:
        _, _, latency = f.route(np.array([0]), np.array([3]), policy=policy)
        assert latency[0] == pytest.approx(4e-6, rel=1e-12)


# --- Contention --------------------------------------------------------------------------------

def test_dmodk_is_non_blocking_for_a_shift_permutation():
    # Zahavi (2010): on a non-blocking fat tree d-mod-k routes any shift permutation without
    # two flows on one link, so a ring in host order runs at line rate.
    f = fabric.Fabric(topology.fat_tree(8, 8, 8, 50e9), net_hop_latency_s=0.0)
    ring = fabric.collective(f, "all_gather", GIB, policy="dmodk")
    line = 63 / 64 * GIB / (costmodel.NIC_EFFICIENCY * 50e9)
    assert ring.time_s == pytest.approx(line, rel=1e-12)


def test_ecmp_collisions_slow_a_shuffled_ring_and_spraying_removes_them():
    f = fabric.Fabric(topology.fat_tree(8, 8, 8, 50e9), net_hop_latency_s=0.0)
    ranks = np.random.default_rng(0).permutation(64)
    line = 63 / 64 * GIB / (costmodel.NIC_EFFICIENCY * 50e9)
    spray = fabric.collective(f, "all_gather", GIB, ranks, aware=False, policy="spray")
    assert spray.time_s == pytest.approx(line, rel=1e-12)
    ecmp = [fabric.collective(f, "all_gather", GIB, ranks, aware=False, seed=s).time_s
            for s in range(4)]
    # Each seed's slowdown is a whole number: the most flows hashed onto one link.
    slowdown = np.array(ecmp) / line
    np.testing.assert_allclose(slowdown, np.round(slowdown), rtol=1e-9)
    assert slowdown.min() >= 2


def test_more_queue_pairs_never_hurt_on_average():
    f = fabric.Fabric(topology.fat_tree(8, 8, 8, 50e9), net_hop_latency_s=0.0)
    ranks = np.random.default_rng(0).permutation(64)
    mean = {q: np.mean([fabric.collective(f, "all_gather", GIB, ranks, aware=False, seed=s,
                                          qps=q).time_s for s in range(8)]) for q in (1, 16)}
    spray = fabric.collective(f, "all_gather", GIB, ranks, aware=False, policy="spray").time_s
    assert spray < mean[16] < mean[1]


def test_oversubscription_halves_a_ring_that_crosses_every_leaf():
    # 2:1 leaves, and the shuffled ring sends every host's flow off its leaf (sprayed).
    f = fabric.Fabric(topology.fat_tree(4, 4, 2, 50e9), net_hop_latency_s=0.0)
    ranks = np.arange(16).reshape(4, 4).T.ravel()       # 0, 4, 8, 12, 1, 5, ...: leaf to leaf
    ring = fabric.collective(f, "all_gather", GIB, ranks, aware=False, policy="spray")
    line = 15 / 16 * GIB / (costmodel.NIC_EFFICIENCY * 50e9)
    assert ring.time_s == pytest.approx(2 * line, rel=1e-12)


def test_pxn_keeps_cross_rail_traffic_off_the_spines():
    f = _rail(4, NDR, nodes_per_group=4)
    ranks = [0, 9, 18, 27]                  # one GPU per server, each on another rail
    step = fabric.steps(f, "all_to_all", GIB, ranks)[0]
    spines = np.array([f.names[h].startswith("spine") for h in f.head])
    for pxn, expect_spine in ((False, True), (True, False)):
        incidence, _, _ = f.route(step.src, step.dst, pxn=pxn)
        on_spines = incidence[spines].sum() > 0
        assert on_spines == expect_spine


def test_skewed_load_slows_the_all_to_all():
    f = _rail(4, NDR)
    even = fabric.collective(f, "all_to_all", GIB, policy="spray")
    load = np.ones(32)
    load[0] = 4.0
    skewed = fabric.collective(f, "all_to_all", GIB, policy="spray", load=load)
    assert skewed.time_s > 1.5 * even.time_s


# --- Bad input ----------------------------------------------------------------------------------

def test_bad_input_names_the_fix():
    f = _rail(2, NDR)
    with pytest.raises(ValueError, match="routing policy"):
        fabric.collective(f, "all_reduce", GIB, policy="random")
    with pytest.raises(ValueError, match="qps"):
        fabric.collective(f, "all_reduce", GIB, qps=0)
    with pytest.raises(ValueError, match="twice"):
        fabric.collective(f, "all_reduce", GIB, ranks=[0, 1, 1])
    with pytest.raises(ValueError, match="all_to_all"):
        fabric.collective(f, "broadcast", GIB)
    with pytest.raises(ValueError, match="ring or hierarchical or tree"):
        fabric.collective(f, "all_reduce", GIB, algorithm="binomial")
    with pytest.raises(ValueError, match="same number of GPUs in every server"):
        fabric.collective(f, "all_reduce", GIB, ranks=[0, 1, 8], algorithm="tree")
    with pytest.raises(ValueError, match="whole number of nodes"):
        fabric.double_binary_tree(0)
    with pytest.raises(ValueError, match="channels"):
        fabric.collective(f, "all_reduce", GIB, channels=0)
    with pytest.raises(ValueError, match="endpoint positions"):
        fabric.collective(f, "all_reduce", GIB, ranks=[0, 99])
    with pytest.raises(ValueError, match="share GPUs"):
        fabric.collective(f, "all_reduce", GIB, groups=[[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="applies to all_to_all"):
        fabric.collective(f, "all_reduce", GIB, load=[1.0] * 16)
    with pytest.raises(ValueError, match="efficiency"):
        fabric.Fabric(topology.fat_tree(2, 2, 1, 50e9), nic_efficiency=1.5)


def test_sweep_runs_collective_per_value():
    f = fabric.Fabric(topology.fat_tree(4, 4, 2, 50e9), net_hop_latency_s=0.0)
    ranks = np.random.default_rng(0).permutation(16)
    swept = fabric.sweep(f, "all_gather", GIB, over="seed", values=[0, 1, 2], ranks=ranks,
                         aware=False, progress=False)
    direct = [fabric.collective(f, "all_gather", GIB, ranks, aware=False, seed=s).time_s
              for s in (0, 1, 2)]
    assert [r.time_s for r in swept] == direct
    with pytest.raises(ValueError, match="over must name"):
        fabric.sweep(f, "all_gather", GIB, over="colour", values=[1])
    with pytest.raises(ValueError, match="do not also fix"):
        fabric.sweep(f, "all_gather", GIB, over="seed", values=[1], seed=2)


# --- topology.rail_pods: the Llama-3-like fabric ---------------------------------------------------

def test_rail_pods_oversubscribes_only_between_pods():
    graph = topology.rail_pods(2, 8, nodes_per_group=4, spines_per_pod=2, n_cores=2,
                               pod_oversubscription=7, nvlink_bytes_per_s=NVLINK)
    assert topology.count_kinds(graph) == {"core": 2, "spine": 4, "leaf": 32, "nvswitch": 16,
                                           "gpu": 128}
    assert topology.oversubscription(graph, "pod0.su0.rail0") == pytest.approx(1.0)
    assert topology.oversubscription(graph, "pod1.spine1") == pytest.approx(7.0)
    assert graph.nodes["gpu64"]["pod"] == 1 and graph.nodes["gpu64"]["node"] == 8
    # Inside a pod: non-blocking; across pods: a pod's spines carry 1/7 of its NICs.
    pod0 = topology.endpoints(graph)[:64]
    pod1 = topology.endpoints(graph)[64:]
    assert topology.cut_bandwidth(graph, pod0, pod1) == pytest.approx(64 * 50e9 / 7)
    with pytest.raises(ValueError, match="pod_oversubscription"):
        topology.rail_pods(2, 8, pod_oversubscription=0.5)


def test_an_all_to_all_across_pods_feels_the_oversubscription():
    def busbw(oversubscription, groups):
        graph = topology.rail_pods(2, 8, nodes_per_group=4, spines_per_pod=2, n_cores=2,
                                   pod_oversubscription=oversubscription,
                                   nvlink_bytes_per_s=NVLINK)
        f = fabric.Fabric(graph, net_hop_latency_s=0.0, nvlink_hop_latency_s=0.0)
        return fabric.collective(f, "all_to_all", GIB, groups=groups, policy="spray").busbw
    # One group per rail: the 8 servers of pod 0, or 4 servers of each pod.
    inside = [list(range(r, 64, 8)) for r in range(8)]
    across = [list(range(r, 32, 8)) + list(range(64 + r, 96, 8)) for r in range(8)]
    assert busbw(7, inside) == pytest.approx(busbw(1, inside), rel=1e-12)
    # across pods, the 7:1 core at least halves the all-to-all's bus bandwidth (exactly half
    # here: the pod's uplinks, not the NICs, bound it)
    assert busbw(7, across) <= 0.5 * busbw(1, across) * (1 + 1e-12)


# --- The double binary tree ----------------------------------------------------------------

def test_double_binary_tree_is_nccls():
    # The two illustrations of NCCL's src/graph/trees.cc: 12 ranks (mirrored second tree) and
    # 13 ranks (shifted by one), written out as parents.
    first, second = fabric.double_binary_tree(12)
    assert first.tolist() == [-1, 2, 4, 2, 8, 6, 4, 6, 0, 10, 8, 10]
    assert second.tolist() == [1, 3, 1, 11, 5, 7, 5, 3, 9, 7, 9, -1]
    first, second = fabric.double_binary_tree(13)
    assert first.tolist() == [-1, 2, 4, 2, 8, 6, 4, 6, 0, 10, 12, 10, 8]
    assert second.tolist() == [9, -1, 3, 5, 3, 9, 7, 5, 7, 1, 11, 0, 11]


@pytest.mark.parametrize("n", [2, 5, 8, 12, 13, 64, 100])
def test_each_tree_spans_the_nodes_and_inner_nodes_are_leaves_of_the_other(n):
    trees = fabric.double_binary_tree(n)
    children = []
    for parent in trees:
        assert (parent == -1).sum() == 1                  # one root ...
        for r in range(n):                                # ... that every node reaches
            node, hops = r, 0
            while parent[node] >= 0 and hops <= n:
                node, hops = parent[node], hops + 1
            assert parent[node] == -1
        kids = np.bincount(parent[parent >= 0], minlength=n)
        assert kids.max() <= 2                            # binary
        children.append(kids)
    if n % 2 == 0:      # mirrored: no node has children in both trees
        assert not ((children[0] > 0) & (children[1] > 0)).any()


def _slow_nics(n_nodes):
    """Servers of 8 H100 whose 8 NICs are slow enough that the network bounds the tree."""
    return _rail(n_nodes, 6.25e9)


@pytest.mark.parametrize("n_nodes", [2, 4, 8, 16])
def test_tree_against_cluster_collective(n_nodes):
    f = _slow_nics(n_nodes)
    ours = fabric.collective(f, "all_reduce", GIB, algorithm="tree", policy="spray")
    theirs = _bandwidth_term("all_reduce", GIB, gpu="H100", n_nodes=n_nodes,
                             network_bytes_per_s=8 * 6.25e9, algorithm="tree",
                             protocol="Simple")
    net = 8 * costmodel.NIC_EFFICIENCY * 6.25e9
    per_node = 1 if n_nodes == 2 else 2          # buffers per direction, the busiest server
    assert ours.time_s == pytest.approx(per_node * GIB / net, rel=1e-12)
    speed = _nccl_ring(n_nodes, 6.25).bw_inter   # NCCL's speed step under 6.25 GB/s: 6.0
    assert speed == 6.0
    # NCCL's tree busbw: 0.92 x 8 channels x speed (x 2 on two nodes), algbw = busbw / 2
    nccl_algbw = 0.92 * 8 * speed * 1e9 * (2 if n_nodes == 2 else 1) / 2
    assert theirs == pytest.approx(GIB / nccl_algbw, rel=1e-12)
    ratio = costmodel.NIC_EFFICIENCY * 6.25 / (0.92 * speed)       # 1.064 at every count
    assert theirs / ours.time_s == pytest.approx(ratio, rel=1e-12)


def test_tree_carries_twice_what_the_ring_does_per_server():
    # Same configuration: the ring moves 2 (n-1)/n D per server and direction, the tree 2 D.
    f = _slow_nics(4)
    ring = fabric.collective(f, "all_reduce", GIB, policy="spray")
    tree = fabric.collective(f, "all_reduce", GIB, algorithm="tree", policy="spray")
    assert tree.time_s / ring.time_s == pytest.approx(32 / 31, rel=1e-12)


def test_tree_flows_and_latency_fill():
    # 4 hosts (no servers): per tree 3 edges, each up and down: 12 flows of D/2.
    f = fabric.Fabric(topology.fat_tree(2, 2, 1, 50e9), net_hop_latency_s=1e-6)
    (step,) = fabric.steps(f, "all_reduce", 4e6, algorithm="tree")
    assert len(step.src) == 12 and np.all(step.nbytes == 2e6)
    pairs = sorted(zip(step.src.tolist(), step.dst.tolist()))
    assert pairs == sorted([(1, 2), (2, 1), (2, 0), (0, 2), (3, 2), (2, 3),      # 0-2-{1,3}
                            (2, 1), (1, 2), (1, 3), (3, 1), (0, 1), (1, 0)])     # 3-1-{0,2}
    result = fabric.collective(f, "all_reduce", 4e6, algorithm="tree")
    # Fill: up and down the depth-2 trees, 4 hops, each charged the longest path (4 links).
    assert result.latency_s == pytest.approx(4 * 4e-6, rel=1e-12)


# --- The contention factor for the planner ------------------------------------------------

def test_contention_factor_is_one_without_contention():
    f = _rail(4, NDR)
    assert fabric.contention_factor(f, GIB) == pytest.approx(1.0, rel=1e-12)
    assert fabric.contention_factor(f, GIB, algorithm="tree") == pytest.approx(1.0, rel=1e-12)


def test_core_free_capacity_frees_only_switch_to_switch_links():
    f = fabric.Fabric(topology.fat_tree(4, 4, 2, 50e9))
    free = f.core_free_capacity()
    kinds = [(f.graph.nodes[f.names[t]]["kind"], f.graph.nodes[f.names[h]]["kind"])
             for t, h in zip(f.tail, f.head)]
    core = np.array(["gpu" not in k for k in kinds])
    assert core.any() and (~core).any()
    assert np.isinf(free[core]).all()
    np.testing.assert_array_equal(free[~core], f.capacity_bytes_per_s[~core])
    # Unequal flows (a skewed all-to-all, the event loop) on it: only the hosts' links count.
    load = np.random.default_rng(1).gamma(1.0, size=16)
    (step,) = fabric.steps(f, "all_to_all", GIB, load=load)
    contended, _ = fabric.step_time(f, step, policy="dmodk")
    freed, _ = fabric.step_time(f, step, policy="dmodk", capacity_bytes_per_s=free)
    busiest = max(np.bincount(step.src, step.nbytes).max(),
                  np.bincount(step.dst, step.nbytes).max())
    assert freed >= busiest / (costmodel.NIC_EFFICIENCY * 50e9) * (1 - 1e-12)
    assert freed <= contended


def test_contention_factor_counts_oversubscription_and_collisions():
    # Every flow crosses a 2:1 leaf (sprayed): the core halves the ring.
    f = fabric.Fabric(topology.fat_tree(4, 4, 2, 50e9), net_hop_latency_s=0.0)
    ranks = np.arange(16).reshape(4, 4).T.ravel()
    assert fabric.contention_factor(f, GIB, ranks, aware=False, policy="spray") == \
        pytest.approx(2.0, rel=1e-12)
    # ECMP on a non-blocking fat tree: the factor is the most flows hashed onto one link.
    f = fabric.Fabric(topology.fat_tree(8, 8, 8, 50e9), net_hop_latency_s=0.0)
    ranks = np.random.default_rng(0).permutation(64)
    line = 2 * 63 / 64 * GIB / (costmodel.NIC_EFFICIENCY * 50e9)
    for seed in range(3):
        factor = fabric.contention_factor(f, GIB, ranks, aware=False, seed=seed)
        contended = fabric.collective(f, "all_reduce", GIB, ranks, aware=False, seed=seed)
        assert factor == pytest.approx(contended.time_s / line, rel=1e-12)
        assert factor >= 2 and factor == pytest.approx(round(factor), rel=1e-9)


def test_planner_takes_the_contention_factor():
    from clusterlab.analytic import plan

    w = plan.Workload(8e9, 2048, 256, n_tokens=1e9, n_layers=32, d_model=4096)
    hw = plan.cluster("H100", 64, storage_read_bytes_per_s=1e12)
    base = plan.Assumptions(compute_efficiency=0.5, overlap_grad_reduce=False)
    assert plan.Assumptions().dp_contention_factor == 1.0
    across = plan.Layout(dp=8, tp=8)                    # one replica per node: 8 nodes
    inside = plan.Layout(dp=8, tp=1, pp=8)              # dp inside each node
    for layout in (across, inside):
        default = plan.predict(w, hw, layout, base)
        slowed = plan.predict(w, hw, layout, plan.Assumptions(
            compute_efficiency=0.5, overlap_grad_reduce=False, dp_contention_factor=1.75))
        assert default.dp_comm_s > 0
        expect = 1.75 if layout is across else 1.0     # only a group spanning nodes
        assert slowed.dp_comm_s == pytest.approx(expect * default.dp_comm_s, rel=1e-12)
        assert slowed.compute_s == default.compute_s and slowed.tp_comm_s == default.tp_comm_s
    with pytest.raises(ValueError, match="dp_contention_factor .* >= 1"):
        plan.Assumptions(dp_contention_factor=0.5)


# --- Claims lab 12 states and these tests hold --------------------------------------------------

def test_flow_ring_equals_the_network_models_bandwidth_term_on_lab12s_cluster():
    # Lab 12's opening: 4 HDR servers, the flow model's ring is cluster_collective's bandwidth term.
    ours = fabric.collective(_rail(4, HDR), "all_reduce", GIB).time_s
    theirs = _bandwidth_term("all_reduce", GIB, gpu="H100", n_nodes=4, nic="IB-HDR",
                             algorithm="ring", protocol="Simple")
    assert ours == pytest.approx(theirs, rel=1e-9)


def test_a_hot_expert_slows_the_all_to_all_by_its_share_over_the_average():
    # Lab 12's skewed load: one expert of a rail-aligned 32-wide group receives 4x each other's
    # bytes; its NIC sets the time, so the time grows by 4 * 32 / 35, not by 4.
    f = _rail(32, NDR)
    group = np.arange(32) * 8                              # rail 0 of every server
    hot = np.ones(32)
    hot[0] = 4.0
    even = fabric.collective(f, "all_to_all", 64 * 2**20, groups=[group]).time_s
    skewed = fabric.collective(f, "all_to_all", 64 * 2**20, groups=[group], load=hot).time_s
    assert skewed / even == pytest.approx(hot[0] / hot.mean(), rel=1e-9)


def test_contention_factor_is_at_least_one_for_every_seed():
    # A scattered job on lab 12's kind of cluster: contention only slows, ring or tree.
    f = _rail(32, NDR, nodes_per_group=8, n_spines=8)
    ranks = (np.random.default_rng(3).permutation(32)[:8, None] * 8 + np.arange(8)).ravel()
    for algorithm in ("ring", "tree"):
        factors = [fabric.contention_factor(f, GIB, ranks, algorithm=algorithm, seed=s)
                   for s in range(4)]
        assert min(factors) >= 1 - 1e-9


def test_planner_scales_the_whole_reduction_and_exposes_at_most_it():
    # Lab 12's 8B model on 256 H100 (TP 8, DP 32, ZeRO-1), overlap on: dp_reduce_s grows by the
    # factor as given, and the exposed part dp_comm_s never exceeds the whole reduction.
    from clusterlab.analytic import plan

    workload = plan.Workload(8e9, 4096, 512, n_tokens=1e12)
    hw = plan.cluster("H100", 256, storage_read_bytes_per_s=20e9)
    layout = plan.Layout(dp=32, tp=8, zero_stage=1)
    free = plan.predict(workload, hw, layout)
    for factor in (1.3, 2.5):
        p = plan.predict(workload, hw, layout, plan.Assumptions(dp_contention_factor=factor))
        assert p.dp_reduce_s == pytest.approx(factor * free.dp_reduce_s, rel=1e-9)
        assert free.dp_comm_s <= free.dp_reduce_s and p.dp_comm_s <= p.dp_reduce_s
