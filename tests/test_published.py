"""clusterlab.catalog.published.nccl_tests: every published row says where it comes from and what set it."""

from __future__ import annotations

import re

import pytest

from clusterlab.catalog import hardware
from clusterlab.catalog.published import nccl_tests

MIB = 2**20
ALL_ROWS = nccl_tests.rows() + nccl_tests.rows("unhealthy")


def _label(row):
    return f"{row.system} {row.op} {row.size_bytes}"


@pytest.mark.parametrize("row", ALL_ROWS, ids=_label)
def test_row_has_a_url_source_provenance_and_stated_configuration(row):
    assert re.match(r"https://\S+", row.source), row
    assert row.provenance in nccl_tests.PROVENANCES, row
    assert row.stated.strip(), row
    assert isinstance(row.inferred, str)
    assert row.nccl_version is None or re.fullmatch(r"2\.\d+(\.\d+)?", row.nccl_version), row
    assert row.role in nccl_tests.ROLES
    assert row.tool in ("nccl-tests", "all_reduce_bench.py", "unstated")
    assert row.busbw_gbps > 0 and row.size_bytes > 0
    hardware.gpu(row.gpu)
    assert row.op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


@pytest.mark.parametrize("row", ALL_ROWS, ids=_label)
def test_fabric_agrees_with_nodes_and_nic(row):
    assert row.fabric in nccl_tests.FABRICS, row
    if row.n_nodes == 1:
        assert row.fabric == "NVLink" and row.nic is None and row.nics_per_node == 0, row
        return
    # Hosts of one NVLink domain (an NVL72 rack) cross NVLink only; their NICs stay idle.
    assert (row.fabric == "NVLink") == (row.n_nvlink_domains == 1), row
    assert row.nic is not None and row.nics_per_node >= 1, row
    hardware.link(row.nic)
    if row.fabric == "NVLink":
        return
    if row.fabric == "InfiniBand":
        assert row.nic.startswith("IB-"), row
    else:   # RoCE, EFA and plain Ethernet run on Ethernet ports
        assert row.nic.startswith("Ethernet-"), row


@pytest.mark.parametrize("row", ALL_ROWS, ids=_label)
def test_sizes_are_powers_of_two(row):
    # Every source is an nccl-tests -f 2 sweep (or a torch benchmark doubling the payload), or a
    # single size given as a power of two ("8G", "16GiB"). One exception: nccl#2169's alltoall
    # table steps by 1 MiB from -b 500M (step: 1048576(bytes)); its row is 500 MiB as printed.
    if row.source.startswith("https://github.com/NVIDIA/nccl/issues/2169"):
        assert row.size_bytes == 500 * MIB, row
        return
    assert row.size_bytes & (row.size_bytes - 1) == 0, row


def test_no_duplicate_rows():
    keys = [(r.source.split(" ")[0], r.system, r.op, r.gpu, r.n_nodes, r.gpus_per_node,
             r.size_bytes, r.algorithm) for r in ALL_ROWS]
    duplicates = {k for k in keys if keys.count(k) > 1}
    assert not duplicates


def test_regime_covers_every_row():
    for row in ALL_ROWS:
        nodes, fabric, family = row.regime
        assert fabric in nccl_tests.FABRICS
        assert family in nccl_tests.OP_FAMILIES
        if row.nvlink_domain_gpus is None:
            assert nodes == {1: "1 node", 2: "2 nodes"}.get(row.n_nodes, ">2 nodes")
        else:       # a domain spanning hosts: NCCL counts domains as its nodes
            domains = row.n_nodes * row.gpus_per_node // row.nvlink_domain_gpus
            assert nodes == {1: "1 NVLink domain", 2: "2 NVLink domains"}.get(
                domains, ">2 NVLink domains")
    assert sum(nccl_tests.regimes().values()) == len(nccl_tests.rows())


def test_only_the_launch_overhead_sweep_sets_a_parameter():
    set_rows = nccl_tests.rows("set")
    assert set_rows
    assert {r.system for r in set_rows} == {"8x H200 (one node), NVLink4, NCCL's choice"}
    assert all(r.size_bytes <= 16 * MIB for r in set_rows)
    same_sweep = [r for r in nccl_tests.rows() if r.system == set_rows[0].system]
    assert all(r.role == "test" for r in same_sweep if r.size_bytes > 16 * MIB)


def test_old_efficiency_rows_are_maintainers_statements_that_only_test():
    by_system = {r.system: r for r in nccl_tests.rows()}
    for system in ("8x H100 (DGX/HGX), NVLink4, ring", "8x H100 (DGX/HGX), NVLink4, NVLS",
                   "2x1 H100, one NDR 400G NIC each, ring"):
        assert by_system[system].role == "test"
        assert by_system[system].provenance == nccl_tests.MAINTAINER
    counts = [r for r in nccl_tests.rows() if "of one HGX node" in r.system]
    assert len(counts) == 20
    assert all(r.role == "test" and r.provenance == nccl_tests.FULL_TABLE for r in counts)


def test_roles_and_filters():
    healthy = nccl_tests.rows()
    assert len(nccl_tests.rows("set")) + len(nccl_tests.rows("test")) == len(healthy)
    assert healthy == nccl_tests.ROWS
    assert all(r.role == "unhealthy" for r in nccl_tests.rows("unhealthy"))
    assert not any(r.role == "unhealthy" for r in healthy)
    with pytest.raises(ValueError, match="role must be"):
        nccl_tests.rows("train")
    one_node = nccl_tests.rows_in(("1 node", None, None))
    assert one_node and all(r.n_nodes == 1 for r in one_node)
    assert nccl_tests.rows_in(nodes="1 node") == one_node
    tables = nccl_tests.rows_in(provenance=nccl_tests.FULL_TABLE)
    assert tables and all(r.provenance == nccl_tests.FULL_TABLE for r in tables)
    statements = nccl_tests.rows_in(op="all_reduce",
                                    provenance=(nccl_tests.MAINTAINER,
                                                nccl_tests.USER_STATEMENT))
    assert statements and all(r.op == "all_reduce" for r in statements)
    with pytest.raises(ValueError, match="fabric"):
        nccl_tests.rows_in(fabric="Myrinet")
    with pytest.raises(ValueError, match="provenance"):
        nccl_tests.rows_in(provenance="hearsay")


def test_existing_fields_keep_their_meaning():
    row = nccl_tests.rows()[0]
    assert row[:13] == (row.system, row.op, row.gpu, row.n_nodes, row.gpus_per_node, row.nic,
                        row.nics_per_node, row.size_bytes, row.busbw_gbps, row.algorithm,
                        row.role, row.tool, row.source)
    assert nccl_tests.PublishedRow._fields[13] == "intra_node_link_bytes_per_s"


def test_multi_node_infiniband_hopper_tables_and_unhealthy_examples():
    tables = {r.system for r in nccl_tests.rows_in(fabric="InfiniBand",
                                                    provenance=nccl_tests.FULL_TABLE)
              if r.gpu in ("H100", "H200") and r.n_nodes > 1}
    assert len(tables) >= 4
    assert {r.regime[0] for r in nccl_tests.rows_in(fabric="InfiniBand") if r.gpu == "H100"} \
        >= {"2 nodes", ">2 nodes"}
    unhealthy = nccl_tests.rows("unhealthy")
    assert unhealthy and all(r.role == "unhealthy" for r in unhealthy)
    assert not set(unhealthy) & set(nccl_tests.rows())


def test_uncovered_regimes_are_the_complement_of_the_covered_ones():
    covered = set(nccl_tests.regimes())
    uncovered = nccl_tests.uncovered_regimes()
    assert not covered & set(uncovered)
    assert ("1 node", "NVLink", "all_reduce") not in uncovered
    assert all(nodes != "1 node" or fabric == "NVLink" for nodes, fabric, _ in uncovered)


def test_all_to_all_and_multi_node_all_gather_tables():
    a2a = nccl_tests.rows_in(op="all_to_all", provenance=nccl_tests.FULL_TABLE)
    assert len({r.source.split(" ")[0] for r in a2a}) >= 2
    assert {r.regime[0] for r in a2a} >= {"1 node", "1 NVLink domain", "2 NVLink domains"}
    gather = [r for r in nccl_tests.rows_in(op="all_gather/reduce_scatter",
                                            provenance=nccl_tests.FULL_TABLE)
              if r.n_nodes > 1]
    assert gather and all(r.fabric != "NVLink" for r in gather)
    assert all(r.role == "test" for r in a2a + gather)
