"""costmodel.cluster_collective: NCCL 2.30.7's own tuning model (clusterlab.analytic.costmodel._nccl),
and its validation against published nccl-tests rows (clusterlab.catalog.published.nccl_tests), by regime.

The expected values below are worked by hand from the rules of NCCL's src/graph/tuning.cc and
search.cc (v2.30.7-1) that clusterlab.analytic.costmodel._nccl cites, not copied from the model's output.
Each "old rules" test pins a claim that NCCL 2.7.5's rules (the course's previous model) got wrong.
"""

from __future__ import annotations

import math

import pytest

from clusterlab.analytic import costmodel, plan
from clusterlab.analytic.costmodel import _model, _nccl, validation
from clusterlab.catalog import hardware
from clusterlab.catalog.published import nccl_tests

MIB, GIB = 2**20, 2**30


def _topo(gpu="H100", **kwargs):
    """The graphs the model derives for ``ClusterSpec(gpu, **kwargs)``."""
    cluster = hardware.ClusterSpec(gpu=gpu, **kwargs)
    return _model._topology(cluster, _model._node_links(cluster))


def _tuned(topo, op, algorithm, protocol):
    return next(t for t in _nccl.tune(topo, op)
                if t.algorithm == algorithm and t.protocol == protocol)


# --- The graphs, as NCCL's topology counts the links ---------------------------------------------

def test_h100_node_graphs():
    topo = _topo("H100")
    # 18 NVLink4 links x 20.6 GB/s (topo.h SM90_NVLINK_BW) = 370.8, NCCL's "totalBw 370.8".
    # Ring: 6 channels at 60 GB/s fit (360), duplicated to 12 at 30 (search.cc DupChannels).
    assert (topo.ring.n_channels, topo.ring.bw_intra) == (12, 30.0)
    # NVLS: one channel per GPU at 40 (8 x 40 <= 370.8), bwInter raised to 60: "nChannels 8,
    # bw 40.000000/60.000000" as NCCL_DEBUG prints it on H100.
    assert (topo.nvls.n_channels, topo.nvls.bw_intra, topo.nvls.bw_inter) == (8, 40.0, 60.0)


def test_two_h100_nodes_graphs():
    topo = _topo("H100", n_nodes=2, nic="IB-NDR", nics_per_node=8)
    # One channel per 400G NIC (50 GB/s), searched at 48 (sm90SpeedArrayInter); no duplication
    # on Hopper below 50 GB/s with more than 4 channels.
    assert (topo.ring.n_channels, topo.ring.bw_inter) == (8, 48.0)
    assert topo.nvls.n_channels == 8 and topo.collnet is None


# --- The rules of tuning.cc that the old (2.7.5) rules got wrong ---------------------------------

def test_ll128_is_on_for_hopper_and_blackwell():
    # tuning.cc:518-535: LL128 on by default on NVLink nodes from Volta on, Hopper included.
    for gpu in ("A100", "H100", "B200"):
        assert any(t.protocol == "LL128" for t in _nccl.tune(_topo(gpu), "all_reduce"))
    pcie = _topo("A100", intra_node_link="PCIe4x16")
    assert not any(t.protocol == "LL128" for t in _nccl.tune(pcie, "all_reduce"))



def test_ll_is_capped_per_architecture_and_node_count():
    # Ring LL = min(llMaxBw, Simple / 2); across > 2 nodes on an Intel host llMaxBw is 20.4 GB/s,
    # then converted to algbw by n / (2 (n - 1)).
    topo = _topo("H100", n_nodes=4, nic="IB-NDR", nics_per_node=8)
    n = 32
    ll = _tuned(topo, "all_reduce", "ring", "LL")
    assert ll.bandwidth_gbps == pytest.approx(20.4 * n / (2 * (n - 1)))
    # So NCCL cannot run ring/LL at 60-79 GB/s busbw on 4 DGX H100 (the old model's Fig. 15).
    for size in (8 * MIB, 25 * MIB):
        est = costmodel.cluster_collective("all_reduce", size,
                                           hardware.ClusterSpec(gpu="H100", n_nodes=4, nic="IB-NDR",
                                                                nics_per_node=8))
        assert (est.algorithm, est.protocol) != ("ring", "LL")


def test_tree_is_capped_per_channel_not_at_80_gbps():
    # Tree: min(0.92 x channels x bw, channels x perChMaxTreeBw) then x 0.5 to algbw: 4 DGX H100
    # give min(0.92 x 8 x 48, 8 x 36.0) / 2 = 144 GB/s algbw, busbw 279: not 2.7.5's 80 cap.
    topo = _topo("H100", n_nodes=4, nic="IB-NDR", nics_per_node=8)
    tree = _tuned(topo, "all_reduce", "tree", "Simple")
    assert tree.bandwidth_gbps == pytest.approx(min(0.92 * 8 * 48, 8 * 36.0) / 2)
    forced = costmodel.cluster_collective("all_reduce", 2 * GIB,
                                          hardware.ClusterSpec(gpu="H100", n_nodes=4, nic="IB-NDR",
                                                               nics_per_node=8),
                                          algorithm="tree")
    auto = costmodel.cluster_collective("all_reduce", 2 * GIB,
                                        hardware.ClusterSpec(gpu="H100", n_nodes=4, nic="IB-NDR",
                                                             nics_per_node=8))
    # The old rules made forcing the tree 4.5x slower at 2 GiB; now well under 2x.
    assert forced.time_s / auto.time_s < 2.0


def test_nvls_tree_on_two_nodes_passes_the_nic_line_rate():
    # "Handle 2 node case of NVLSTree": interBw x 2. busbw = 8 channels x min(48 x .85 x 7/8 x 2,
    # 2 x 48, perChMaxNVLSTreeBw 57.7) = 461.6 GB/s, above the NICs' 8 x 50 = 400.
    est = costmodel.cluster_collective("all_reduce", 16 * GIB,
                                       hardware.ClusterSpec(gpu="H100", n_nodes=2, nic="IB-NDR",
                                                            nics_per_node=8))
    assert est.algorithm == "nvls_tree"
    assert est.busbw / 1e9 == pytest.approx(8 * 57.7, rel=0.01)
    assert est.busbw > 8 * 50e9
    # Exercise 5 of chapter 04: two nodes get within 25% of one NVLS server (the old rules
    # said no port count could); NVIDIA/nccl issue 1221 measured 430 GB/s (NCCL 2.19).
    one = costmodel.cluster_collective("all_reduce", 16 * GIB, hardware.ClusterSpec(gpu="H100"))
    assert est.time_s / one.time_s < 1.25


def test_nvls_on_one_node_and_nvls_tree_only_across_nodes():
    def picked(op, **cluster):
        return costmodel.cluster_collective(op, GIB, hardware.ClusterSpec(**cluster)).algorithm

    assert picked("all_reduce", gpu="H100") == "nvls"
    assert picked("all_reduce", gpu="A100") == "ring"
    assert picked("all_reduce", gpu="H200", gpus_per_node=4) == "ring"
    # NVLS all-gather is priced as algbw (no conversion, tuning.cc:375): the ring wins.
    assert picked("all_gather", gpu="H100") == "ring"
    with pytest.raises(ValueError, match="does not run all_reduce with algorithm 'nvls'"):
        costmodel.cluster_collective("all_reduce", GIB, hardware.ClusterSpec(gpu="A100"),
                                     algorithm="nvls")
    with pytest.raises(ValueError, match="does not run all_reduce with algorithm 'nvls'"):
        costmodel.cluster_collective("all_reduce", GIB,
                                     hardware.ClusterSpec(gpu="H100", n_nodes=2, nic="IB-NDR"),
                                     algorithm="nvls")


def test_pat_runs_all_gather_at_one_gpu_per_node():
    est = costmodel.cluster_collective("all_gather", 64 * 2**10,
                                       hardware.ClusterSpec(gpu="H100", n_nodes=16, gpus_per_node=1,
                                                            nic="IB-NDR", nics_per_node=1))
    assert est.algorithm == "pat"
    with pytest.raises(ValueError, match="algorithm 'pat'"):
        costmodel.cluster_collective("all_gather", GIB,
                                     hardware.ClusterSpec(gpu="H100", n_nodes=2, nic="IB-NDR"),
                                     algorithm="pat")


def test_the_flat_ring_crosses_each_nodes_network_twice_per_all_reduce():
    # One flat ring over all n ranks: each NIC carries 2(n-1)/n of a channel's share whatever
    # the node count, so ring busbw across nodes equals the channels' total (8 x 48), less the
    # ring's latency (2(n-1) steps: 1.9% at 16 nodes) and its pipeline fill (0.2%) at 16 GiB.
    for nodes in (2, 4, 16):
        est = costmodel.cluster_collective("all_reduce", 16 * GIB,
                                           hardware.ClusterSpec(gpu="H100", n_nodes=nodes,
                                                                nic="IB-NDR", nics_per_node=8),
                                           algorithm="ring")
        assert est.busbw / 1e9 == pytest.approx(8 * 48, rel=0.025)
        assert est.bottleneck == "network"


def test_small_messages_pick_a_low_latency_protocol():
    small = costmodel.cluster_collective("all_reduce", 64 * 2**10, hardware.ClusterSpec(gpu="H100"))
    large = costmodel.cluster_collective("all_reduce", GIB, hardware.ClusterSpec(gpu="H100"))
    assert small.protocol in ("LL", "LL128") and small.bottleneck == "latency"
    assert large.protocol == "Simple"
    assert small.time_s > costmodel.LAUNCH_OVERHEAD_S


def test_sharp_is_an_option():
    kwargs = dict(gpu="H100", n_nodes=16, nic="IB-NDR", nics_per_node=8)
    # With CollNet enabled NCCL also enables NVLS across nodes (NVLS + SHARP, tuning.cc:504).
    sharp = costmodel.cluster_collective("all_reduce", 2**20,
                                         hardware.ClusterSpec(sharp=True, **kwargs))
    assert sharp.algorithm in ("collnet_direct", "collnet_chain", "nvls")
    forced = costmodel.cluster_collective("all_reduce", 2**20,
                                          hardware.ClusterSpec(sharp=True, **kwargs),
                                          algorithm="collnet_chain")
    assert forced.algorithm == "collnet_chain" and forced.time_s >= sharp.time_s
    with pytest.raises(ValueError, match="collnet needs sharp=True"):
        costmodel.cluster_collective("all_reduce", 2**32, hardware.ClusterSpec(**kwargs),
                                     algorithm="collnet_chain")


def test_all_to_all_across_nodes_is_network_bound():
    est = costmodel.cluster_collective("all_to_all", GIB,
                                       hardware.ClusterSpec(gpu="H100", n_nodes=4, nic="IB-NDR",
                                                            nics_per_node=8))
    assert est.algorithm == "pairwise" and est.bottleneck == "network"
    # 24/32 of each GPU's buffer leaves the node over its channel share, 8 x 48 / 8 GB/s.
    assert est.time_s == pytest.approx(24 / 32 * GIB / 48e9, rel=0.02)


@pytest.mark.parametrize("kwargs, match", [
    (dict(op="broadcast"), "prices all_reduce"),
    (dict(n_nodes=2), "needs a network"),
    (dict(gpu="X1"), "Unknown GPU"),
    (dict(n_nodes=2, nic="IB-QDR"), "Unknown link"),
    (dict(algorithm="magic"), "Unknown algorithm"),
    (dict(protocol="LL64"), "Unknown protocol"),
    (dict(intra_node_link="PCIe4x16", intra_node_bytes_per_s=1e9), "not both"),
    (dict(op="all_to_all", algorithm="ring"), "grouped send/receive"),
    (dict(fabric="Myrinet", n_nodes=2, nic="IB-NDR"), "Unknown fabric"),
])
def test_bad_input_is_named(kwargs, match):
    call = {"op": "all_reduce", "algorithm": "auto", "protocol": "auto", "fabric": None}
    spec = {"gpu": "H100"}
    for key, value in kwargs.items():
        (call if key in call else spec)[key] = value
    with pytest.raises(ValueError, match=match):
        costmodel.cluster_collective(call.pop("op"), 2**20, hardware.ClusterSpec(**spec), **call)


def test_the_cluster_is_one_spec_not_keywords():
    # One cluster description: the keyword form (gpu=, n_nodes=, ...) is gone.
    with pytest.raises(TypeError):
        costmodel.cluster_collective("all_reduce", 2**20, gpu="H100")
    with pytest.raises(TypeError):
        costmodel.cluster_collective("all_reduce", 2**20)
    spec = hardware.ClusterSpec(gpu="H100", n_nodes=4, nic="IB-NDR", nics_per_node=4)
    assert costmodel.all_reduce_time(2**26, spec) == costmodel.cluster_collective(
        "all_reduce", 2**26, spec).time_s


def test_a_network_rate_with_a_nic_name_keeps_the_nics_fabric():
    # ClusterSpec: network_bytes_per_s overrides nic x nics_per_node, nic names the fabric.
    named = costmodel.cluster_collective("all_reduce", 2**30,
                                         hardware.ClusterSpec(gpu="H100", n_nodes=4,
                                                              nic="Ethernet-400G",
                                                              network_bytes_per_s=400e9))
    rate = costmodel.cluster_collective("all_reduce", 2**30,
                                        hardware.ClusterSpec(gpu="H100", n_nodes=4,
                                                             network_bytes_per_s=400e9))
    assert named.time_s == rate.time_s
    assert named.regime.fabric == rate.regime.fabric == "Ethernet"
    ib = costmodel.cluster_collective("all_reduce", 2**30,
                                      hardware.ClusterSpec(gpu="H100", n_nodes=4, nic="IB-NDR",
                                                           network_bytes_per_s=400e9))
    assert ib.time_s == rate.time_s and ib.regime.fabric == "InfiniBand"


def test_one_gpu_moves_nothing():
    est = costmodel.cluster_collective("all_reduce", 2**20,
                                       hardware.ClusterSpec(gpu="H100", gpus_per_node=1))
    assert est.time_s == 0 and math.isinf(est.busbw)


# --- Validation, by regime ------------------------------------------------------------------------

def test_launch_overhead_is_the_fit_on_the_set_sweep():
    assert costmodel.fit_launch_overhead() == pytest.approx(costmodel.LAUNCH_OVERHEAD_S,
                                                            abs=0.5e-6)


def test_both_set_parameters_are_the_joint_fit_on_the_set_sweep():
    overhead, fill = costmodel.fit_set_parameters()
    assert overhead == pytest.approx(costmodel.LAUNCH_OVERHEAD_S, abs=0.25e-6)
    assert fill == costmodel.PIPELINE_FILL_CHUNKS == _model.PIPELINE_FILL_CHUNKS
    assert fill > 0                      # the set rows ask for a fill: 0 chunk-times fits worse


# --- The pipeline's fill (enqueue.cc calcCollChunking, v2.30.7-1) --------------------------------

def test_chunks_are_nccls():
    topo = _topo("H100")
    # Simple: 4 MiB buffer / 8 steps x 4 chunk steps (ALLREDUCE_CHUNKSTEPS) = 2 MiB per ring
    # chunk, nRanks chunks per loop; LL: 512 x 8 lines x 16 B per step, halved; LL128: 120 x 640
    # x 8 B per step, 15 of every 16 elements.
    assert _nccl.chunking(topo, _tuned(topo, "all_reduce", "ring", "Simple"), GIB) == (
        12, 2 * MIB, 8)
    assert _nccl.chunking(topo, _tuned(topo, "all_reduce", "ring", "LL"), GIB)[1] == 32768
    assert _nccl.chunking(topo, _tuned(topo, "all_reduce", "ring", "LL128"), GIB)[1] == 576000
    # NVLS on Hopper: 16 CTAs, 8 heads, 128 KiB chunks, cut to 64 KiB below 64 x 128 x 128 KiB
    # = 1 GiB and to 32 KiB below 8 x 128 x 64 KiB = 64 MiB; 16 KiB below 2 x 128 x 32 KiB.
    nvls = _tuned(topo, "all_reduce", "nvls", "Simple")
    assert _nccl.chunking(topo, nvls, GIB) == (16, 128 * 1024, 8)
    assert _nccl.chunking(topo, nvls, GIB - 1)[1] == 65536
    assert _nccl.chunking(topo, nvls, 32 * MIB)[1] == 32768
    assert _nccl.chunking(topo, nvls, 4 * MIB)[1] == 16384


def test_the_fill_grows_with_the_size_until_a_loop_is_full():
    topo = _topo("H100")
    ring = _tuned(topo, "all_reduce", "ring", "Simple")
    fill = [_nccl.fill_time_us(topo, ring, size, 2.5) for size in (16 * MIB, 32 * MIB, GIB)]
    # One loop of 12 channels x 8 chunks of 2 MiB is 192 MiB: below it the fill is 2.5 chunk
    # times of size / 96 bytes each; above it, of 2 MiB each.
    assert fill[1] == pytest.approx(2 * fill[0])
    assert fill[0] == pytest.approx(2.5 * 16 * MIB / 8 / (1000 * ring.bandwidth_gbps))
    assert fill[2] == pytest.approx(2.5 * 12 * 2 * MIB / (1000 * ring.bandwidth_gbps))
    assert _nccl.fill_time_us(topo, ring, GIB, 0.0) == 0.0


def test_the_fill_never_changes_nccls_pick(monkeypatch):
    clusters = [dict(gpu="H100"), dict(gpu="A100"), dict(gpu="B200"),
                dict(gpu="H100", n_nodes=4, nic="IB-NDR", nics_per_node=8),
                dict(gpu="B200", n_nodes=4, nic="Ethernet-400G", nics_per_node=8)]
    sizes = [2**k for k in range(16, 35, 2)]
    picks = {}
    for fill in (costmodel.PIPELINE_FILL_CHUNKS, 0.0):
        monkeypatch.setattr(_model, "PIPELINE_FILL_CHUNKS", fill)
        picks[fill] = [(e.algorithm, e.protocol) for kw in clusters
                       for op in ("all_reduce", "all_gather") for size in sizes
                       for e in [costmodel.cluster_collective(op, size,
                                                              hardware.ClusterSpec(**kw))]]
    assert picks[costmodel.PIPELINE_FILL_CHUNKS] == picks[0.0]
    assert len(set(picks[0.0])) >= 5


def _mid_errors() -> dict[str, float]:
    table = costmodel.nccl_validation_table("test")
    by_regime = {str(e.regime): e.median_abs for e in costmodel.validation_by_regime(table)}
    return {"1-16 MiB": costmodel.median_abs_error(table, min_bytes=MIB, max_bytes=16 * MIB),
            "1 MiB-1 GiB": costmodel.median_abs_error(table, min_bytes=MIB,
                                                      max_bytes=GIB - 1),
            "1 node": by_regime["1 node, NVLink, all_reduce, 1 MiB - 1 GiB"],
            "2 nodes IB": by_regime["2 nodes, InfiniBand, all_reduce, 1 MiB - 1 GiB"],
            ">= 1 GiB": costmodel.median_abs_error(table, min_bytes=GIB)}


#: Median |error| over the test rows with the fill, as found (22.9%, 15.7%, 8.8%, 14.5%, 3.9%),
#: each asserted with a margin; without the fill they were 28.0%, 20.6%, 17.3%, 17.8%, 3.6%.
MID_SIZE_BOUNDS = {"1-16 MiB": 0.24, "1 MiB-1 GiB": 0.17, "1 node": 0.10, "2 nodes IB": 0.16,
                   ">= 1 GiB": 0.045}


def test_the_fill_brings_the_middle_sizes_closer(monkeypatch):
    found = _mid_errors()
    print({k: f"{100 * v:.1f}%" for k, v in found.items()})
    for name, bound in MID_SIZE_BOUNDS.items():
        assert found[name] < bound, (name, found[name])
    # Negative control: the same table without the fill (the model before it) fails the bounds
    # of the middle sizes.
    monkeypatch.setattr(_model, "PIPELINE_FILL_CHUNKS", 0.0)
    before = _mid_errors()
    for name in ("1-16 MiB", "1 MiB-1 GiB", "1 node", "2 nodes IB"):
        assert before[name] > MID_SIZE_BOUNDS[name], (name, before[name])


def test_set_rows_are_left_out_of_the_error_table():
    set_rows = {(r.system, r.size_bytes) for r in nccl_tests.rows("set")}
    assert set_rows
    counted = sum(e.rows for e in costmodel.validation_by_regime())
    assert counted == len(nccl_tests.rows("test"))
    assert not set_rows & {(r.system, r.size_bytes) for r in costmodel.nccl_validation_table("test")}


def test_large_single_node_all_reduce_is_validated_within_a_few_percent():
    errors = {e.regime: e for e in costmodel.validation_by_regime()}
    large = errors[costmodel.Regime("1 node", "NVLink", "all_reduce", ">= 1 GiB")]
    assert large.validated and large.sources >= 3
    assert large.median_abs < 0.05
    text = costmodel.format_regime_errors(list(errors.values()))
    assert str(large.regime) in text


def test_every_regime_reports_its_rows_and_range():
    for e in costmodel.validation_by_regime():
        assert e.rows >= 1 and e.lowest <= e.highest and e.fewest_nodes <= e.most_nodes
        assert e.validated == (e.rows >= costmodel.MIN_VALIDATION_ROWS
                               and e.median_abs <= costmodel.TOLERANCE)
        assert e.verdict().startswith("validated" if e.validated else "tested: off by")


def test_validated_means_within_the_tolerance():
    """No regime is validated above 15% median error (EFA's small messages: 388%), however
    many rows it has; a regime with enough rows but a larger error is only tested."""
    regimes = {str(e.regime): e for e in costmodel.validation_by_regime()}
    assert costmodel.TOLERANCE == 0.15
    assert all(e.median_abs <= costmodel.TOLERANCE for e in regimes.values() if e.validated)
    efa_small = regimes[">2 nodes, EFA, all_reduce, < 1 MiB"]
    assert efa_small.rows >= costmodel.MIN_VALIDATION_ROWS and not efa_small.validated
    assert efa_small.verdict().startswith("tested: off by +245.8%")
    # Negative control: a regime within the tolerance with enough rows is validated.
    assert regimes["1 node, NVLink, all_reduce, >= 1 GiB"].validated


def test_node_counts_beyond_the_rows_are_extrapolated():
    """Rows on 4-12 InfiniBand nodes validate 4 nodes, not 64: that estimate is extrapolated,
    with the same band (its regime's errors) but no validated flag."""
    summary = costmodel.regime_summaries()[costmodel.regime("all_reduce", 4 * GIB, 4,
                                                            "InfiniBand")]
    levels = {}
    for nodes in (summary.fewest_nodes, summary.most_nodes, summary.most_nodes + 1, 64):
        cluster = hardware.ClusterSpec(gpu="H100", n_nodes=nodes, nic="IB-NDR", nics_per_node=8)
        est = costmodel.cluster_collective("all_reduce", 4 * GIB, cluster)
        levels[nodes] = est.validation
        assert est.low_busbw == pytest.approx(est.busbw / (1 + summary.highest)
                                              * (1 - costmodel.BAND_MARGIN))
    assert levels == {summary.fewest_nodes: "validated", summary.most_nodes: "validated",
                      summary.most_nodes + 1: "extrapolated", 64: "extrapolated"}


def test_twenty_percent_short_at_large_sizes_on_a_validated_node_is_low():
    for gpu in ("H100", "H200"):
        est = costmodel.cluster_collective("all_reduce", 4 * GIB, hardware.ClusterSpec(gpu=gpu))
        assert est.validated
        assert 0.8 * est.busbw < est.low_busbw < est.busbw
    # Negative control: the old fixed 35% margin would have called the same run normal.
    assert 0.8 * est.busbw > est.busbw * (1 - 0.35)


def test_unvalidated_regimes_say_so():
    # One node of 72 GPUs: its regime's rows are 8-GPU nodes, so the estimate is extrapolated
    # (an NVL72 rack is its own regime, "1 NVLink domain", given as nvlink_domain_gpus=72).
    est = costmodel.cluster_collective("all_reduce", 4 * GIB,
                                       hardware.ClusterSpec(gpu="GB200", gpus_per_node=72))
    assert est.regime.nodes == "1 node" and est.validation == "extrapolated"
    known = {e.regime for e in costmodel.validation_by_regime() if e.validated}
    rack = costmodel.cluster_collective("all_to_all", 4 * GIB,
                                        hardware.ClusterSpec(gpu="H100", n_nodes=4,
                                                             nic="Ethernet-400G"),
                                        fabric="RoCE")
    assert rack.regime.fabric == "RoCE"
    assert rack.validated == (rack.regime in known)
    if not rack.validated:
        assert rack.low_busbw == pytest.approx(rack.busbw * (1 - costmodel.UNVALIDATED_BAND))


def test_estimates_name_the_nccl_release():
    est = costmodel.cluster_collective("all_reduce", GIB, hardware.ClusterSpec(gpu="H100"))
    assert est.nccl_release == costmodel.NCCL_RELEASE == _nccl.RELEASE == "2.30.7"


# --- The planner prices its data-parallel all-reduce with the same function ----------------------

def test_planner_uses_cluster_collective():
    hw = plan.cluster("H100", 256, storage_read_bytes_per_s=1e12)
    seconds = plan.dp_all_reduce_s(14e9, 8, 32, hw)
    spec = hardware.ClusterSpec(gpu="H100", n_nodes=32, nic="IB-NDR", nics_per_node=8)
    assert seconds == pytest.approx(costmodel.cluster_collective("all_reduce", 14e9, spec).time_s)


# --- Published rows that disagree with each other (issue 24, item 5) ----------------------------

def _row(system_start: str, size: int) -> nccl_tests.PublishedRow:
    (row,) = [r for r in nccl_tests.rows(None)
              if r.system.startswith(system_start) and r.size_bytes == size]
    return row


def test_rows_that_disagree_at_the_middle_sizes():
    found = costmodel.disagreements()
    print(costmodel.format_disagreements(found))
    pairs = {(d.kind, d.first.system, d.first.size_bytes, d.second.system, d.second.size_bytes)
             for d in found}
    # Within one sweep, twice the bytes (or more) in no more time: A100 1 MiB 101.9 us against
    # 2 MiB 101.4 us (nccl-tests); B200 8 MiB 116.1 us against 16 MiB 115.2 us
    # (all_reduce_bench.py); gj-aion's 4 nodes of H100, 1 MiB 316.9 us against 16 MiB 304.5 us.
    a100, b200 = "8x A100 (one node), NVLink3", "8x B200 (one node), NVLink5"
    gj4 = "4 nodes of 8x H100, IB 400G (gj-aion)"
    assert ("sweep", a100, MIB, a100, 2 * MIB) in pairs
    assert ("sweep", b200, 8 * MIB, b200, 16 * MIB) in pairs
    assert ("sweep", gj4, MIB, gj4, 16 * MIB) in pairs
    for d in found:
        if d.kind == "sweep":
            assert d.second.size_bytes >= 2 * d.first.size_bytes and d.second_s <= d.first_s
    # Across sources, the same 4 nodes of 8 H100 with 8 NDR NICs at 1 MiB, NCCL's choice:
    # qoofyk 24.73 GB/s, gj-aion 6.41 GB/s, 3.9x apart; gj-aion's own 8 nodes do 17.64.
    (cross,) = [d for d in found if d.kind == "sources"]
    assert {cross.first.busbw_gbps, cross.second.busbw_gbps} == {24.73, 6.41}
    assert cross.ratio == pytest.approx(24.73 / 6.41) and cross.ratio > 3.5
    assert _row("8 nodes of 8x H100, IB 400G (gj-aion)", MIB).busbw_gbps > 2.5 * 6.41
    # Negative control: a made-up sweep whose time grows with the size has no disagreement,
    # nor two rows of one configuration 10% apart; the same sweep at one constant time (busbw
    # proportional to the size) has two, and a twin 4x apart is caught.
    def sweep(busbw):
        return [nccl_tests.PublishedRow("made up", "all_reduce", "H100", 1, 8, None, 0, size,
                                        value, "auto", "test", "nccl-tests", "made up")
                for size, value in zip((MIB, 4 * MIB, 16 * MIB), busbw)]
    healthy = sweep((20.0, 60.0, 150.0))
    twin = healthy[0]._replace(system="twin", source="made up too", busbw_gbps=22.0)
    assert costmodel.disagreements(healthy + [twin]) == []
    flat = costmodel.disagreements(sweep((10.0, 40.0, 160.0)) + [twin._replace(busbw_gbps=80.0)])
    assert [d.kind for d in flat] == ["sweep", "sweep", "sources"]
    # The rows that disagree with their own sweep are test rows whose errors stay in the
    # 1-16 MiB median: without them it is lower, but still above 15% (issue 24's goal).
    table = costmodel.nccl_validation_table("test")
    odd = {(d.first.system, d.first.size_bytes) for d in found if d.kind == "sweep"}
    rest = [r for r in table if (r.system, r.size_bytes) not in odd]
    everything = costmodel.median_abs_error(table, min_bytes=MIB, max_bytes=16 * MIB)
    without = costmodel.median_abs_error(rest, min_bytes=MIB, max_bytes=16 * MIB)
    print(f"1-16 MiB median |error|: {100 * everything:.1f}% on all test rows, "
          f"{100 * without:.1f}% without the {len(odd)} rows their own sweep contradicts")
    assert len(odd) == 3 and without < everything and without > 0.15


def test_the_efa_sweep_times_its_benchmark_not_its_collective():
    # 4 nodes of 8x B200 on EFA (all_reduce_bench.py): a 32 KiB all-reduce "takes" longer than
    # a 1 GiB one, and 256 KiB to 4 MiB all lie within 357-430 us, 7x or more the same tool's
    # one-node B200 sweep (50.9 us at 1 MiB) and 4.6x nccl-tests on 4 nodes of H100 over IB
    # (82.2 us at 1 MiB): a floor of the benchmark (or the EFA plugin), which no row sets.
    efa = "4 nodes of 8x B200, 8x EFA 400G per node"
    time = {size: costmodel.published_time_s(_row(efa, size))
            for size in (32 * 2**10, 256 * 2**10, MIB, 4 * MIB, GIB)}
    assert time[32 * 2**10] > time[GIB]
    floor = [time[256 * 2**10], time[MIB], time[4 * MIB]]
    assert 350e-6 < min(floor) and max(floor) < 435e-6
    assert time[MIB] > 7 * costmodel.published_time_s(_row("8x B200 (one node)", MIB))
    assert time[MIB] > 4.5 * costmodel.published_time_s(
        _row("4 nodes of 8x H100 (HGX), 8x NDR 400G IB", MIB))
    # ... and the model (NCCL's latencies, no plugin latency) is the one that is fast there.
    est = costmodel.cluster_collective("all_reduce", MIB, validation._row_cluster(
        _row(efa, MIB)))
    assert est.time_s < time[MIB] / 2.5
