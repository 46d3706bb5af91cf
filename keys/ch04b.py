"""Answer key of chapter 04b's exercises (instructor-only: student copies leave keys/ out).

Each expected value is computed here as the chapter's solution computes it. Exercise 1's
algorithm names and NCCL setting are prose: only its port count is keyed.
"""

from clusterlab.analytic import costmodel
from clusterlab.catalog import hardware
from clusterlab.course import grading

GRADIENT_BYTES = 7e9 * 2      # the 7B model's bf16 gradients


def _fewest_ports() -> int:
    one_node = costmodel.cluster_collective("all_reduce", GRADIENT_BYTES,
                                            hardware.ClusterSpec(gpu="H100", n_nodes=1))

    def two_servers_s(ports: int) -> float:
        return costmodel.cluster_collective(
            "all_reduce", GRADIENT_BYTES, hardware.ClusterSpec(
                gpu="H100", n_nodes=2, nic="IB-NDR", nics_per_node=ports)).time_s

    return next(k for k in range(1, 33) if two_servers_s(k) <= 1.25 * one_node.time_s)


def _protocol_bounds() -> tuple[tuple[int, int], ...]:
    bounds = []
    for n_nodes in (2, 4, 16):
        cluster = hardware.ClusterSpec(gpu="H100", gpus_per_node=8, nic="IB-NDR",
                                       nics_per_node=8, n_nodes=n_nodes)
        picks = [(2**k, costmodel.cluster_collective("all_reduce", 2**k, cluster).protocol)
                 for k in range(12, 33)]
        bounds.append((next(size for size, protocol in picks if protocol == "Simple"),
                       max(size for size, protocol in picks if protocol == "LL")))
    return tuple(bounds)


def _forced_slowdowns() -> tuple[float, float]:
    four_servers = hardware.ClusterSpec(gpu="H100", n_nodes=4, gpus_per_node=8, nic="IB-NDR",
                                        nics_per_node=8)

    def slowdown(size: int) -> float:
        chosen = costmodel.cluster_collective("all_reduce", size, four_servers)
        forced = costmodel.cluster_collective("all_reduce", size, four_servers,
                                              algorithm="ring", protocol="Simple")
        return forced.time_s / chosen.time_s

    return slowdown(25 * 2**20), slowdown(64 * 2**10)


KEY = {
    "ch04b.1": grading.equal(
        _fewest_ports(), name="fewest ports per server within 25% of one server",
        hint="Price the 16-GPU all-reduce with nics_per_node = 1, 2, 3, ... (the model's own "
             "algorithm) and stop at the first within 1.25 times the one-server time."),
    "ch04b.2": grading.equal(
        _protocol_bounds(),
        name="((smallest Simple size, largest LL size) in bytes, for 2, 4 and 16 servers)",
        hint="Run costmodel.cluster_collective for 2**12 ... 2**32 bytes on each cluster and "
             "read each estimate's protocol; give one pair per cluster, in that order."),
    "ch04b.3": grading.close(
        _forced_slowdowns(), rtol=1e-2,
        name="(times slower: the 25 MiB bucket, the 64 KiB call)",
        hint="Divide the time with algorithm='ring', protocol='Simple' forced by the time of "
             "the model's own choice, for each size on the 4-server cluster."),
}
