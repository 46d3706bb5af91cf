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


def test_overlap_hides_the_all_reduce_only_behind_the_backward_pass():
    # A's all-reduce (0.08 s) is shorter than its backward pass (2/3 of 1.39 s): half of it
    # hides. B's (2.39 s) is five times its backward pass (2/3 of 0.70 s = 0.46 s): however
    # much the framework overlaps, at most the backward pass's time is hidden (review W8.1).
    for cluster in (A, B):
        full = plan.fabric_step(JOB, cluster)
        half = plan.fabric_step(JOB, cluster, overlap=0.5)
        everything = plan.fabric_step(JOB, cluster, overlap=1.0)
        backward_s = plan.BACKWARD_FRACTION * full.compute_s
        assert half.compute_s == full.compute_s
        assert half.communication_s == pytest.approx(
            full.communication_s - min(full.communication_s / 2, backward_s))
        assert everything.communication_s == pytest.approx(
            max(0.0, full.communication_s - backward_s))
    a, b = plan.fabric_step(JOB, A, overlap=0.5), plan.fabric_step(JOB, B, overlap=1.0)
    assert a.communication_s == pytest.approx(plan.fabric_step(JOB, A).communication_s / 2)
    assert b.step_s > 1.5 * plan.fabric_step(JOB, A, overlap=1.0).step_s   # B cannot tie A


def test_fabric_step_carries_the_estimate_and_its_validation():
    for cluster in (A, B):
        step = plan.fabric_step(JOB, cluster)
        assert step.all_reduce.nccl_release == costmodel.NCCL_RELEASE
        assert step.all_reduce.time_s == step.communication_s
        assert step.validated is step.all_reduce.validated
    # B crosses 100 GbE, a regime with no published rows: unvalidated.
    assert plan.fabric_step(JOB, B).validated is False
    # A sweep of the network rate keeps the NIC's fabric for the regime.
    swept = plan.fabric_step(JOB, B, network_bytes_per_s=50e9)
    assert swept.all_reduce.regime.fabric == "Ethernet"


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
             for n in (512, 1024, 2048, 4096)]
    # NCCL's search quantizes the bandwidth a node's NICs give (channels x a speed step), so
    # the step time is a staircase in the network rate and the tie lands on a step: 38.4 GB/s
    # per node (8 NICs x 2 channels of 2.4 GB/s) for 512 and 1024 GPUs, 24 GB/s (8 x 3.0) for
    # 2048 and 4096. A larger cluster never needs more.
    assert rates == sorted(rates, reverse=True)
    assert rates[0] > 1.5 * rates[-1]
    assert rates[0] == pytest.approx(38.4e9, rel=1e-5)
    assert rates[-1] == pytest.approx(24.0e9, rel=1e-5)


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
