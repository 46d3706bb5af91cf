"""The data-parallel step model and the two-level all-reduce, against hand-derived values."""

import pytest

from clusterlab import costmodel, hardware, plan

H100 = hardware.gpu("H100")


def test_step_splits_compute_and_exposed_communication():
    step = plan.data_parallel_step(3e9, 2**22, 256, H100, compute_efficiency=0.5,
                                   all_reduce_s=0.2, overlap=0.75)
    compute_s = 6 * 3e9 * 2**22 / (256 * 989e12 * 0.5)
    assert step.compute_s == pytest.approx(compute_s)
    assert step.communication_s == pytest.approx(0.05)
    assert step.step_s == pytest.approx(compute_s + 0.05)
    # MFU = achieved model FLOP/s over the peak of all devices
    assert step.mfu == pytest.approx(6 * 3e9 * 2**22 / (compute_s + 0.05) / (256 * 989e12))


def test_without_communication_mfu_is_the_compute_efficiency():
    step = plan.data_parallel_step(1e9, 1e6, 8, H100, compute_efficiency=0.4, all_reduce_s=0.0)
    assert step.mfu == pytest.approx(0.4)


@pytest.mark.parametrize("kwargs, match", [
    (dict(compute_efficiency=1.5, all_reduce_s=0.1), "at most 1"),
    (dict(compute_efficiency=0.0, all_reduce_s=0.1), "compute_efficiency must be a positive"),
    (dict(compute_efficiency=0.5, all_reduce_s=-1.0), "all_reduce_s must be a non-negative"),
    (dict(compute_efficiency=0.5, all_reduce_s=0.1, overlap=1.5), r"in \[0, 1\]"),
])
def test_impossible_step_inputs_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan.data_parallel_step(1e9, 1e6, 8, H100, **kwargs)


def test_hierarchical_all_reduce_adds_three_ring_phases():
    nbytes, g, nodes, intra, inter, a_in, a_out = 1e9, 8, 16, 450e9, 50e9, 2e-6, 5e-6
    expected = (2 * ((g - 1) * a_in + (g - 1) / g * nbytes / intra)       # RS + AG in node
                + 2 * (nodes - 1) * a_out + 2 * (nodes - 1) / nodes * (nbytes / g) / inter)
    got = costmodel.hierarchical_all_reduce_time(nbytes, g, nodes, intra, inter,
                                                 intra_latency=a_in, inter_latency=a_out)
    assert got == pytest.approx(expected)


def test_hierarchical_all_reduce_on_one_node_is_the_ring_inside():
    flat = costmodel.collective_time("all_reduce", 1e9, 8, 450e9)
    assert costmodel.hierarchical_all_reduce_time(1e9, 8, 1, 450e9, 50e9) == pytest.approx(flat)


def test_hierarchical_all_reduce_rejects_zero_nodes():
    with pytest.raises(ValueError, match="positive integer"):
        costmodel.hierarchical_all_reduce_time(1e9, 8, 0, 450e9, 50e9)
