"""clusterlab.analytic.fabric.pfc_headroom_bytes: the buffer a PFC pause must absorb.

The expected values are worked by hand from the formula's parts (frames, cable both ways,
reaction), so a change to any part fails a test.
"""

import pytest

from clusterlab.analytic import fabric

RATE_400G = 50e9  # 400 Gb/s in bytes/s


def test_cable_alone_is_the_round_trip_bandwidth_delay_product():
    # 100 m of fibre: 500 ns each way, 1 us round trip, 50 kB at 50 GB/s; frames of 1 B.
    got = fabric.pfc_headroom_bytes(RATE_400G, 100, 0.0, 1)
    assert got == pytest.approx(50e3 + 2, rel=1e-12)


def test_each_part_adds_its_bytes():
    base = fabric.pfc_headroom_bytes(RATE_400G, 100, 1e-6, 4200)
    # 1 us of reaction adds 50 kB; two 4,200 B frames add 8,400 B.
    assert base == pytest.approx(50e3 + 50e3 + 8400, rel=1e-12)
    longer = fabric.pfc_headroom_bytes(RATE_400G, 200, 1e-6, 4200)
    assert longer - base == pytest.approx(50e3, rel=1e-9)  # 100 m more: 1 us more round trip
    faster = fabric.pfc_headroom_bytes(2 * RATE_400G, 100, 1e-6, 4200)
    assert faster - 8400 == pytest.approx(2 * (base - 8400), rel=1e-12)


@pytest.mark.parametrize("args, name", [((0, 100, 1e-6, 4200), "link_bytes_per_s"),
                                        ((RATE_400G, -1, 1e-6, 4200), "cable_m"),
                                        ((RATE_400G, 100, -1e-6, 4200), "response_s"),
                                        ((RATE_400G, 100, 1e-6, 0), "mtu_bytes"),
                                        ((RATE_400G, "far", 1e-6, 4200), "cable_m")])
def test_bad_input_names_the_argument(args, name):
    with pytest.raises(ValueError, match=name):
        fabric.pfc_headroom_bytes(*args)
