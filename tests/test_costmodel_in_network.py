"""The in-network (switch-reduced) all-reduce in the alpha-beta model (chapter 04)."""

import pytest

from clusterlab.analytic import costmodel


@pytest.mark.parametrize("n", [2, 3, 8, 64, 1000])
def test_in_network_sends_the_buffer_once_in_two_steps(n):
    steps, wire_bytes = costmodel.collective_steps_and_bytes("all_reduce", 1e9, n, "in_network")
    assert steps == 2
    assert wire_bytes == pytest.approx(1e9)


def test_in_network_moves_about_half_the_bytes_of_the_ring():
    ring_bytes = costmodel.collective_steps_and_bytes("all_reduce", 1e9, 64, "ring")[1]
    switch_bytes = costmodel.collective_steps_and_bytes("all_reduce", 1e9, 64, "in_network")[1]
    assert ring_bytes / switch_bytes == pytest.approx(2 * 63 / 64)


def test_in_network_time_is_latency_plus_one_buffer():
    seconds = costmodel.collective_time("all_reduce", 50e9, 8, 50e9, latency=1e-6,
                                        algorithm="in_network")
    assert seconds == pytest.approx(2e-6 + 1.0)


def test_in_network_is_only_an_all_reduce_algorithm():
    with pytest.raises(ValueError, match="Known algorithms for all_gather"):
        costmodel.collective_time("all_gather", 1e6, 8, 50e9, algorithm="in_network")
