"""NVL72 racks in the NCCL model: an NVLink domain that spans hosts, priced as NCCL 2.30.7 does.

With MNNVL NCCL fuses the topology of a domain's hosts and counts one node per domain
(src/graph/topo.cc:1887-1890, src/init.cc:1285-1296), so its tuning model prices a rack as one
node of 72 GPUs with all of its hosts' NICs. The published rack rows
(:mod:`clusterlab.catalog.published.nccl_tests`: CoreWeave's GB200 rack, OCI's GB300 racks) test
it; their signed errors are printed, and the test states the tolerance each group meets.
"""

from __future__ import annotations

import dataclasses

import pytest

from clusterlab.analytic import costmodel
from clusterlab.catalog import hardware

GIB = 2**30


def _rack_rows() -> list[costmodel.ValidationRow]:
    return [r for r in costmodel.nccl_validation_table()
            if "NVLink domain" in r.regime.nodes]


def test_one_rack_is_priced_as_one_node_of_72_gpus():
    rack = hardware.ClusterSpec.from_rack("GB200 NVL72")
    node_of_72 = dataclasses.replace(rack, n_nodes=1, gpus_per_node=72, nics_per_node=72,
                                     nvlink_domain_gpus=None)
    for size in (2**20, GIB, 8 * GIB):
        in_rack = costmodel.cluster_collective("all_reduce", size, rack)
        alone = costmodel.cluster_collective("all_reduce", size, node_of_72)
        assert in_rack.time_s == pytest.approx(alone.time_s)
        assert in_rack.algorithm == "nvls"      # NVLink SHARP inside the domain
    assert in_rack.regime == costmodel.Regime("1 NVLink domain", "NVLink", "all_reduce",
                                              ">= 1 GiB")
    # The same 72 GPUs described as 18 hosts without their domain cross the NICs instead.
    hosts = dataclasses.replace(rack, nvlink_domain_gpus=None)
    over_nics = costmodel.cluster_collective("all_reduce", 8 * GIB, hosts)
    assert over_nics.busbw < in_rack.busbw / 4
    assert over_nics.regime.nodes == ">2 nodes"


def test_racks_across_a_network_run_nvls_tree_over_the_nics():
    two = hardware.ClusterSpec.from_rack("GB200 NVL72", n_racks=2)
    est = costmodel.cluster_collective("all_reduce", 8 * GIB, two)
    assert est.algorithm == "nvls_tree"
    assert est.regime.nodes == "2 NVLink domains" and est.regime.fabric == "InfiniBand"
    assert not est.validated                # no published 2-rack all-reduce rows yet
    ring = costmodel.cluster_collective("all_reduce", 8 * GIB, two, algorithm="ring")
    # A ring over 144 GPUs: NCCL's search caps its channels by one GPU's NVLink (721.8 GB/s
    # as NCCL counts 18 NVLink5 links), so busbw stays below it.
    assert ring.busbw / 1e9 < 721.8


def test_published_rack_rows_against_the_model():
    rows = _rack_rows()
    print("\n" + costmodel.format_validation_table(rows))
    assert {r.system.split(",")[0] for r in rows} >= {"GB200 NVL72", "OCI GB300"}
    inside = [r for r in rows if r.regime.nodes == "1 NVLink domain"]
    across = [r for r in rows if r.regime.nodes != "1 NVLink domain"]
    assert inside and across
    # Inside one rack at >= 1 GiB the model is within 35% of every published row.
    big = [r.error for r in inside if r.size_bytes >= GIB]
    print(f"inside one rack, >= 1 GiB: {len(big)} rows, signed errors "
          f"{min(big):+.1%}..{max(big):+.1%}")
    assert big and max(abs(e) for e in big) <= 0.35
    # Below 1 GiB it is not: the fill of NVLS's pipeline and all-to-all's latency are off by
    # up to about 60% either way (the rows at 512 MiB, 1 and 16 MiB).
    small = [r.error for r in inside if r.size_bytes < GIB]
    print(f"inside one rack, < 1 GiB: signed errors {min(small):+.1%}..{max(small):+.1%}")
    assert max(abs(e) for e in small) <= 0.60
    # Across racks (OCI's 2-rack all-to-all over RoCE) the course's all-to-all estimate is
    # about half the published busbw from 128 MiB: reported, not hidden.
    errors = sorted(r.error for r in across)
    print(f"across racks: signed errors {', '.join(f'{e:+.1%}' for e in errors)}")
    assert max(abs(e) for e in errors) <= 0.70
    assert all(r.error < -0.40 for r in across if r.size_bytes >= 128 * 2**20)
