"""Answer key of chapter 04c's exercises (instructor-only: student copies leave keys/ out).

Each expected value is computed here as the chapter's solution computes it.
"""

from clusterlab.analytic import fabric
from clusterlab.catalog import hardware
from clusterlab.course import expect, grading

GIB = 2**30


def _headroom_300m_kb() -> float:
    rate = hardware.link("IB-NDR").bytes_per_s
    return fabric.pfc_headroom_bytes(rate, cable_m=300, response_s=1e-6, mtu_bytes=9216) / 1e3


def _floors_gbps() -> tuple[float, float]:
    def floor(n_nodes: int) -> float:
        cluster = hardware.ClusterSpec.from_node("DGX H100", n_nodes=n_nodes)
        return expect.verdicts("all_reduce", [GIB], cluster)[0]["low_gbps"]

    return floor(2), floor(4)


KEY = {
    "ch04c.1": grading.close(
        _headroom_300m_kb(), rtol=1e-2, name="PFC headroom for 300 m, kB",
        hint="Call fabric.pfc_headroom_bytes with the 400 Gb/s port's bytes/s, cable_m=300, "
             "response_s=1e-6 and mtu_bytes=9216, then divide by 1e3."),
    "ch04c.2": grading.close(
        _floors_gbps(), rtol=1e-2, name="(floor on 2 nodes, floor on 4 nodes), GB/s",
        hint="Read low_gbps from expect.verdicts('all_reduce', [2**30], cluster) for "
             "ClusterSpec.from_node('DGX H100', n_nodes=2) and then n_nodes=4."),
}
