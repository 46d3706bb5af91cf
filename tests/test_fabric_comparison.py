"""The course's fabric comparison (plan.FABRIC_JOB, plan.FABRIC_CLUSTERS): one model behind it."""

import math

import pytest

from clusterlab import costmodel, hardware, plan

JOB = plan.FABRIC_JOB
A, B, B2 = (plan.FABRIC_CLUSTERS[k] for k in ("A", "B", "B2"))


def test_step_is_data_parallel_step_with_cluster_collective():
    for cluster in (A, B, B2):
        all_reduce = costmodel.cluster_collective(
            "all_reduce", 14e9, gpu="H100", n_nodes=cluster.n_nodes, nic=cluster.nic,
            nics_per_node=cluster.nics_per_node).time_s
        expected = plan.data_parallel_step(7e9, 2**22, cluster.n_gpus, hardware.gpu("H100"),
                                           compute_efficiency=0.5, all_reduce_s=all_reduce)
        assert plan.fabric_step(JOB, cluster) == expected


def test_configuration_and_outcome():
    assert (A.n_nodes, A.network_bytes_per_s) == (32, 400e9)
    assert (B.n_nodes, B.network_bytes_per_s) == (64, 12.5e9)
    assert B2.network_bytes_per_s == 50e9
    a, b, b2 = (plan.fabric_step(JOB, c) for c in (A, B, B2))
    # A's all-reduce is NVLink-bound, B's is its one NIC: B loses despite half the compute;
    # with 2 x 200G per node B wins.
    assert b.compute_s == pytest.approx(a.compute_s / 2)
    assert b.step_s > 2 * a.step_s
    assert b2.step_s < a.step_s


def test_overlap_hides_the_all_reduce():
    full = plan.fabric_step(JOB, B)
    half = plan.fabric_step(JOB, B, overlap=0.5)
    assert half.communication_s == pytest.approx(full.communication_s / 2)
    assert half.compute_s == full.compute_s


def test_network_to_match_is_the_tie():
    target = plan.fabric_step(JOB, A).step_s
    rate = plan.network_to_match(JOB, B, target)
    assert plan.fabric_step(JOB, B, network_bytes_per_s=rate).step_s <= target
    assert plan.fabric_step(JOB, B, network_bytes_per_s=rate * 0.999).step_s > target
    # B's own 12.5 GB/s is far below the tie, B2's 50 GB/s above it.
    assert B.network_bytes_per_s < rate < B2.network_bytes_per_s


def test_network_to_match_is_inf_when_compute_alone_is_too_slow():
    target = plan.fabric_step(JOB, A).step_s
    smaller = plan.FabricCluster("half of A", "H100", 128, "IB-NDR", 8)
    assert math.isinf(plan.network_to_match(JOB, smaller, target))


def test_a_larger_cluster_needs_less_network_to_tie():
    target = plan.fabric_step(JOB, A).step_s
    rates = [plan.network_to_match(JOB, plan.FabricCluster("x", "H100", n, "IB-NDR", 8), target)
             for n in (512, 1024, 4096)]
    assert rates[0] > rates[1] > rates[2]


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_gpus=100), "whole nodes"),
    (dict(nic="Ethernet-42G"), "Ethernet-42G"),
    (dict(gpu="H900"), "H900"),
    (dict(nics_per_node=0), "nics_per_node"),
])
def test_bad_cluster_is_named(kwargs, match):
    fields = dict(name="x", gpu="H100", n_gpus=256, nic="IB-NDR", nics_per_node=8) | kwargs
    with pytest.raises(ValueError, match=match):
        plan.FabricCluster(**fields)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="DataParallelJob"):
        plan.fabric_step(7e9, A)
    with pytest.raises(ValueError, match="tokens_per_step"):
        plan.DataParallelJob(7e9, 2e12, 0)
