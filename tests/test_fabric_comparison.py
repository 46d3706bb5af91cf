"""The course's fabric comparison (plan.FABRIC_JOB, plan.FABRIC_CLUSTERS): one model behind it."""

import math
from dataclasses import replace

import pytest

from clusterlab.analytic import costmodel, flops, plan
from clusterlab.catalog import hardware

JOB = plan.FABRIC_JOB
A, B, B2 = (plan.FABRIC_CLUSTERS[k] for k in ("A", "B", "B2"))


def test_step_is_data_parallel_step_with_cluster_collective():
    for cluster in (A, B, B2):
        all_reduce = costmodel.cluster_collective("all_reduce", 14e9, cluster).time_s
        expected = plan.data_parallel_step(7e9, 2**22, cluster.n_gpus, hardware.gpu("H100"),
                                           seq_len=4096, compute_efficiency=0.5,
                                           all_reduce_s=all_reduce)
        assert plan.fabric_step(JOB, cluster) == expected


def test_the_step_counts_the_course_mfu_flops():
    # One MFU definition (flops.transformer_flops_per_token, PaLM's 6N + 12 L s d) for every
    # FLOP count: the job's 7B model has default_shape's 33 layers of 4224.
    per_token = flops.transformer_flops_per_token(7e9, 33, 4096, 4224)
    assert JOB.flops_per_token == per_token
    step = plan.fabric_step(JOB, A)
    assert step.model_flops == pytest.approx(2**22 * per_token)
    assert step.compute_s == pytest.approx(2**22 * per_token / (256 * 989e12 * 0.5))
    # and the planner's compute for the same job on the same cluster is the same
    workload = plan.Workload(7e9, 4096, 1024, n_tokens=2e12)
    planned = plan.predict(workload, replace(A, storage_read_bytes_per_s=1e12),
                           plan.Layout(dp=256, zero_stage=1),
                           plan.Assumptions(compute_efficiency=0.5, overlap_grad_reduce=False))
    assert planned.compute_s == pytest.approx(step.compute_s, rel=1e-12)
    assert planned.dp_comm_s == step.communication_s


def test_configuration_and_outcome():
    assert all(isinstance(c, hardware.ClusterSpec) for c in (A, B, B2))
    assert (A.name, B.name, B2.name) == ("A", "B", "B2")
    assert (A.n_nodes, A.node_network_bytes_per_s) == (32, 400e9)
    assert (B.n_nodes, B.node_network_bytes_per_s) == (64, 12.5e9)
    assert B2.node_network_bytes_per_s == 50e9
    a, b, b2 = (plan.fabric_step(JOB, c) for c in (A, B, B2))
    # A's all-reduce is NVLink-bound, B's is its one NIC: B loses despite half the compute;
    # with 2 x 200G per node B wins.
    assert b.compute_s == pytest.approx(a.compute_s / 2)
    assert b.step_s > 1.8 * a.step_s                        # 3.14 s against 1.69 s
    assert b2.step_s < a.step_s


def test_overlap_hides_the_all_reduce_only_behind_the_backward_pass():
    # A's all-reduce (0.08 s) is shorter than its backward pass (2/3 of 1.62 s): half of it
    # hides. B's (2.34 s) is over four times its backward pass (2/3 of 0.81 s = 0.54 s):
    # however much the framework overlaps, at most the backward pass's time is hidden (review
    # W8.1).
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
    assert B.node_network_bytes_per_s < rate < B2.node_network_bytes_per_s


def test_network_to_match_is_inf_when_compute_alone_is_too_slow():
    target = plan.fabric_step(JOB, A).step_s
    smaller = replace(A, n_nodes=16, name="half of A")
    assert math.isinf(plan.network_to_match(JOB, smaller, target))


def test_a_larger_cluster_needs_less_network_to_tie():
    target = plan.fabric_step(JOB, A).step_s
    rates = [plan.network_to_match(JOB, replace(A, n_nodes=n // 8), target)
             for n in (512, 1024, 2048, 4096)]
    # NCCL's search quantizes the bandwidth a node's NICs give (channels x a speed step), so
    # the step time is a staircase in the network rate and the tie lands on a step: 38.4 GB/s
    # per node for 512 GPUs (a ring), 24 GB/s for 1024 and 19.2 GB/s for 2048 and 4096
    # (NVLS-tree). A larger cluster never needs more.
    assert rates == sorted(rates, reverse=True)
    assert rates[0] > 1.5 * rates[-1]
    assert rates == pytest.approx([38.4e9, 24.0e9, 19.2e9, 19.2e9], rel=1e-5)


@pytest.mark.parametrize("kwargs, match", [
    (dict(nic="Ethernet-42G"), "Ethernet-42G"),
    (dict(gpu="H900"), "H900"),
    (dict(nics_per_node=0), "nics_per_node"),
])
def test_bad_cluster_is_named(kwargs, match):
    # the fabric comparison's clusters are hardware.ClusterSpecs; a bad field names itself
    with pytest.raises(ValueError, match=match):
        replace(A, **kwargs)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="DataParallelJob"):
        plan.fabric_step(7e9, A)
    with pytest.raises(ValueError, match="ClusterSpec"):
        plan.fabric_step(JOB, "A")
    with pytest.raises(ValueError, match="tokens_per_step"):
        plan.DataParallelJob(7e9, 2e12, 0, 4096)
    with pytest.raises(ValueError, match="seq_len"):
        plan.DataParallelJob(7e9, 2e12, 2**22, 0)
