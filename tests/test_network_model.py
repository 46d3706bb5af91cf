"""costmodel.cluster_collective: the one model of NCCL collectives across nodes, and its
validation against published nccl-tests rows (clusterlab.published.nccl_tests).

Errors asserted here are the ones reported in the model's docstrings and the issue note:
on the rows that only test the model (role "test"), median |error| 3.2% at >= 128 MiB and
25.7% at 1-16 MiB (goals: 15% and 35%). The worst rows: 8x B200 with NVLS, +28% from 128 MiB
up; 4 nodes of B200 on EFA below 16 MiB, +74% to +228% (EFA's latency is not NCCL's IB one).
"""

from __future__ import annotations

import math

import pytest

from clusterlab import costmodel, hardware, plan
from clusterlab.published import nccl_tests

MIB = 2**20


# --- The published data ------------------------------------------------------------------------

def test_every_row_names_its_source_and_a_known_configuration():
    for row in nccl_tests.rows():
        assert row.source.startswith("https://github.com/"), row
        assert row.role in ("set", "test")
        hardware.gpu(row.gpu)
        assert (row.nic is None) == (row.n_nodes == 1), row
        if row.nic is not None:
            hardware.link(row.nic)
        assert row.busbw_gbps > 0 and row.size_bytes > 0


def test_rows_are_split_into_set_and_test():
    set_rows, test_rows = nccl_tests.rows("set"), nccl_tests.rows("test")
    assert len(set_rows) == 23 and len(test_rows) == 94
    assert len(set_rows) + len(test_rows) == len(nccl_tests.ROWS)
    with pytest.raises(ValueError, match="role must be"):
        nccl_tests.rows("train")


def test_parameters_are_the_set_rows_arithmetic():
    # Each efficiency is one published number over a line rate, nothing fitted on test rows.
    by_system = {r.system: r for r in nccl_tests.rows("set")}
    ring = by_system["8x H100 (DGX/HGX), NVLink4, ring"].busbw_gbps
    nvls = by_system["8x H100 (DGX/HGX), NVLink4, NVLS"].busbw_gbps
    nic = by_system["2x1 H100, one NDR 400G NIC each, ring"].busbw_gbps
    assert costmodel.NVLINK_EFFICIENCY == pytest.approx(ring / 450)
    assert costmodel.NVLS_ALGBW_FRACTION == pytest.approx(nvls / (2 * 7 / 8) / 450)
    assert costmodel.NIC_EFFICIENCY == pytest.approx(nic / 50)


def test_launch_overhead_is_the_fit_on_the_set_sweep():
    assert costmodel.fit_launch_overhead() == pytest.approx(costmodel.LAUNCH_OVERHEAD_S,
                                                            abs=0.5e-6)


# --- Validation ----------------------------------------------------------------------------------

def test_validation_table_prints_one_line_per_row():
    table = costmodel.validation_table("set")
    text = costmodel.format_validation_table(table).splitlines()
    assert len(text) == len(table) + 1
    assert text[1].split()[-1] == f"{100 * table[0].error:+.1f}%"
    assert "8 GiB" in text[1] and "370.00" in text[1]


def test_median_error_on_large_messages():
    table = costmodel.validation_table("test")
    assert len(table) == 94
    assert costmodel.median_abs_error(table, min_bytes=128 * MIB) < 0.045    # 3.2% measured


def test_median_error_on_1_to_16_mib():
    table = costmodel.validation_table("test")
    error = costmodel.median_abs_error(table, min_bytes=MIB, max_bytes=16 * MIB)
    # 25.7%: within the 35% goal; the model expects more busbw than the B200 EFA cluster gets
    # (its latency is not NCCL's InfiniBand one) and than the A100 node at 1 and 16 MiB.
    assert 0.2 < error < 0.3


def test_multi_node_rows_at_large_sizes_within_five_percent():
    # NIC-bound rings: DGX A100 with 8 HDR (192 GB/s), A800 nodes with one HDR (24 GB/s),
    # H200 nodes with 16 EFA 200G (364.9), B200 nodes with 8 EFA 400G (>= 1 GiB).
    multi = [r for r, published in zip(costmodel.validation_table("test"),
                                       nccl_tests.rows("test"))
             if published.n_nodes > 1 and r.size_bytes >= 2**30 and r.model_algorithm == "ring"]
    assert len(multi) == 8
    assert max(abs(r.error) for r in multi) < 0.05


def test_band_holds_the_healthy_published_rows():
    outside = []
    for row in nccl_tests.rows("test"):
        est = costmodel.cluster_collective(
            row.op, row.size_bytes, gpu=row.gpu, n_nodes=row.n_nodes,
            gpus_per_node=row.gpus_per_node, nic=row.nic, nics_per_node=row.nics_per_node or None,
            intra_node_bytes_per_s=row.intra_node_link_bytes_per_s, algorithm=row.algorithm)
        if not est.low_busbw <= row.busbw_gbps * 1e9:
            outside.append(row)
    # Only the 4-node B200 EFA sweep below 1 MiB falls below the band (model far too fast).
    assert len(outside) == 5
    assert all("EFA" in r.system and r.size_bytes < MIB for r in outside)


def test_a_model_without_nic_parallelism_fails_the_validation():
    # Negative control: price the network as ONE NIC per node (the flat-ring mistake of the old
    # chapter 08) and the multi-node rows are off by far more than the tolerance above.
    row = next(r for r in nccl_tests.rows("test") if r.system.startswith("DGX A100"))
    wrong = costmodel.cluster_collective(row.op, row.size_bytes, gpu=row.gpu, n_nodes=2,
                                         nic=row.nic, nics_per_node=1, algorithm="ring")
    assert abs(wrong.busbw / 1e9 - row.busbw_gbps) / row.busbw_gbps > 0.8


# --- The model's shape ---------------------------------------------------------------------------

def test_ring_across_nodes_is_the_slower_of_nvlink_and_all_nics():
    # 8 NDR NICs (8 x 47 = 376 GB/s) vs NVLink (370): NVLink binds; one NIC: the network binds.
    big = 16 * 2**30
    eight = costmodel.cluster_collective("all_reduce", big, gpu="H100", n_nodes=4, nic="IB-NDR",
                                         nics_per_node=8, algorithm="ring", protocol="Simple")
    one = costmodel.cluster_collective("all_reduce", big, gpu="H100", n_nodes=4, nic="IB-NDR",
                                       nics_per_node=1, algorithm="ring", protocol="Simple")
    assert eight.bottleneck == "NVLink" and one.bottleneck == "network"
    assert eight.busbw == pytest.approx(370e9, rel=0.02)
    assert one.busbw == pytest.approx(47e9, rel=0.02)
    # pipelined, not summed: the time is one phase's, far below the sequential three-phase sum
    seq = costmodel.hierarchical_all_reduce_time(big, 8, 4, 370e9, 47e9)
    assert eight.time_s < 0.7 * seq


def test_pcie_caps_a_gpu_with_many_nics():
    # One H100 per node with 4 NDR NICs: 188 GB/s of NICs behind 63 GB/s of PCIe Gen5.
    est = costmodel.cluster_collective("all_reduce", 8 * 2**30, gpu="H100", n_nodes=2,
                                       gpus_per_node=1, nic="IB-NDR", nics_per_node=4,
                                       algorithm="ring")
    assert est.bottleneck == "PCIe"
    assert est.busbw == pytest.approx(costmodel.PCIE_EFFICIENCY * 63e9, rel=0.02)


def test_nvls_only_where_nccl_picks_it():
    assert costmodel.cluster_collective("all_reduce", 2**30, gpu="H100").algorithm == "nvls"
    assert costmodel.cluster_collective("all_reduce", 2**30, gpu="A100").algorithm == "ring"
    assert costmodel.cluster_collective("all_reduce", 2**30, gpu="H200",
                                        gpus_per_node=4).algorithm == "ring"
    assert costmodel.cluster_collective("all_gather", 2**30, gpu="H100").algorithm == "ring"
    # an NVL72 rack is one NVLink domain behind NVLink Switches: NVLS, as on an HGX B200
    assert costmodel.cluster_collective("all_reduce", 2**30, gpu="GB200",
                                        gpus_per_node=72).algorithm == "nvls"
    with pytest.raises(ValueError, match="cannot run all_reduce with algorithm 'nvls'"):
        costmodel.cluster_collective("all_reduce", 2**30, gpu="A100", algorithm="nvls")


def test_ll128_only_where_nccl_enables_it():
    # tuning.cc: "Enable LL128 by default only on Volta/Ampere+NVLink".
    protocols = {gpu: {costmodel.cluster_collective("all_reduce", 2**k, gpu=gpu).protocol
                       for k in range(12, 30)} for gpu in ("A100", "H100")}
    assert "LL128" in protocols["A100"] and "LL128" not in protocols["H100"]
    with pytest.raises(ValueError, match="No protocol 'LL128'"):
        costmodel.cluster_collective("all_reduce", 2**20, gpu="H100", protocol="LL128")


def test_small_messages_pick_a_low_latency_protocol():
    small = costmodel.cluster_collective("all_reduce", 64 * 2**10, gpu="H100")
    large = costmodel.cluster_collective("all_reduce", 2**30, gpu="H100")
    assert small.protocol == "LL" and small.bottleneck == "latency"
    assert large.protocol == "Simple"
    assert small.time_s > costmodel.LAUNCH_OVERHEAD_S


def test_sharp_is_an_option_and_helps_a_nic_bound_cluster():
    kwargs = dict(gpu="H100", n_nodes=16, nic="IB-NDR", nics_per_node=2)
    plain = costmodel.cluster_collective("all_reduce", 2**32, **kwargs)
    sharp = costmodel.cluster_collective("all_reduce", 2**32, sharp=True, **kwargs)
    assert sharp.algorithm == "collnet" and sharp.busbw > 1.5 * plain.busbw
    with pytest.raises(ValueError, match="collnet needs sharp=True"):
        costmodel.cluster_collective("all_reduce", 2**32, algorithm="collnet", **kwargs)


def test_all_to_all_across_nodes_is_network_bound():
    est = costmodel.cluster_collective("all_to_all", 2**30, gpu="H100", n_nodes=4,
                                       nic="IB-NDR", nics_per_node=8)
    assert est.algorithm == "pairwise" and est.bottleneck == "network"
    # 24/32 of each GPU's buffer leaves the node at 47 GB/s per GPU
    assert est.time_s == pytest.approx(24 / 32 * 2**30 / 47e9, rel=0.02)


@pytest.mark.parametrize("kwargs, match", [
    (dict(op="broadcast"), "prices all_reduce"),
    (dict(n_nodes=2), "need a network"),
    (dict(gpu="X1"), "Unknown GPU"),
    (dict(n_nodes=2, nic="IB-QDR"), "Unknown link"),
    (dict(algorithm="magic"), "Unknown algorithm"),
    (dict(protocol="LL64"), "Unknown protocol"),
    (dict(n_nodes=2, nic="IB-NDR", network_bytes_per_s=1e9), "not both"),
])
def test_bad_input_is_named(kwargs, match):
    args = dict(op="all_reduce", nbytes=2**20, gpu="H100") | kwargs
    op, nbytes = args.pop("op"), args.pop("nbytes")
    with pytest.raises(ValueError, match=match):
        costmodel.cluster_collective(op, nbytes, **args)


def test_one_gpu_moves_nothing():
    est = costmodel.cluster_collective("all_reduce", 2**20, gpu="H100", gpus_per_node=1)
    assert est.time_s == 0 and math.isinf(est.busbw)


# --- The planner prices its data-parallel all-reduce with the same function ----------------------

def test_planner_uses_cluster_collective():
    hw = plan.cluster("H100", 256, storage_read_bytes_per_s=1e12)
    seconds = plan.dp_all_reduce_s(14e9, 8, 32, hw)
    assert seconds == pytest.approx(costmodel.cluster_collective(
        "all_reduce", 14e9, gpu="H100", n_nodes=32, nic="IB-NDR", nics_per_node=8).time_s)


def test_chapter_08_comparison_from_the_one_model():
    # 7B parameters, BF16 gradients (14 GB): 256 H100 with 8x400G IB per node against 512 H100
    # with one 100GbE or two 200G NICs per node.
    a = costmodel.cluster_collective("all_reduce", 14e9, gpu="H100", n_nodes=32, nic="IB-NDR",
                                     nics_per_node=8)
    b1 = costmodel.cluster_collective("all_reduce", 14e9, gpu="H100", n_nodes=64,
                                      nic="Ethernet-100G", nics_per_node=1)
    b2 = costmodel.cluster_collective("all_reduce", 14e9, gpu="H100", n_nodes=64,
                                      nic="Ethernet-200G", nics_per_node=2)
    assert a.time_s == pytest.approx(0.0794, rel=0.01)
    assert b1.time_s == pytest.approx(2.386, rel=0.01)
    assert b2.time_s == pytest.approx(0.603, rel=0.01)
    assert a.bottleneck == "NVLink" and b1.bottleneck == b2.bottleneck == "network"
