"""Published nccl-tests (and nccl-tests-like) bus bandwidths, each row with its source.

Every row below was read in its source (URL given per group); none is estimated or derived
from another row. ``role`` says what a row is for:

* ``"set"``: the row sets a parameter of :func:`clusterlab.costmodel.cluster_collective`
  (an efficiency, a latency, where NCCL switches to NVLS); the model is *fitted* to it, so its
  error proves nothing.
* ``"test"``: the row only tests the model; nothing is fitted on it.

Units: ``size_bytes`` is nccl-tests' ``size`` column (bytes; "GiB" sizes are powers of 1024);
``busbw_gbps`` is the out-of-place ``busbw`` column in GB/s (1 GB = 1e9 bytes), per GPU and
direction, as nccl-tests defines it (``doc/PERFORMANCE.md``).

``tool`` is ``"nccl-tests"`` or ``"all_reduce_bench.py"`` (stas00's PyTorch benchmark, which
prints the same algbw/busbw columns and which its author reports agrees closely with
nccl-tests). ``algorithm`` is what the source says ran or was forced (``"auto"``: NCCL's own
choice, not stated).
"""

from __future__ import annotations

from typing import NamedTuple

KIB = 2**10
MIB = 2**20
GIB = 2**30


class PublishedRow(NamedTuple):
    """One published measurement and the configuration it was taken on."""

    system: str            # a short label of the configuration
    op: str                # all_reduce, all_gather, reduce_scatter
    gpu: str               # key in clusterlab.hardware.GPUS
    n_nodes: int
    gpus_per_node: int     # GPUs taking part in each node
    nic: str | None        # key in clusterlab.hardware.LINKS; None on one node
    nics_per_node: int     # NICs per node used by NCCL (0 on one node)
    size_bytes: int
    busbw_gbps: float      # out-of-place busbw, GB/s
    algorithm: str         # "auto" (NCCL's choice), or "ring"/"nvls"/"nvls_tree" as forced
    role: str              # "set" or "test"
    tool: str              # "nccl-tests" or "all_reduce_bench.py"
    source: str            # URL (and place in it)
    intra_node_link_bytes_per_s: float | None = None   # overrides the GPU's NVLink (A800)


_STAS00 = "https://github.com/stas00/ml-engineering/blob/master/network/README.md"
_SIZES_32K_16G = [32 * KIB * 2**i for i in range(20)]   # 32 KiB, 64 KiB, ..., 16 GiB


def _sweep(system, gpu, n_nodes, nic, nics, busbw, *, role, tool, source, op="all_reduce",
           algorithm="auto"):
    return [PublishedRow(system, op, gpu, n_nodes, 8, nic, nics, size, value, algorithm, role,
                         tool, source)
            for size, value in zip(_SIZES_32K_16G, busbw)]


ROWS: list[PublishedRow] = [
    # --- Parameters (role "set") ---------------------------------------------------------------
    # S. Jeaugey (NCCL maintainer), nccl-tests issue 212, 2024-05-06: on 8 H100 "450GB/s is the
    # line rate. With the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of
    # 370GB/s, which you can observe as BusBw when running non-allreduce operations, or when
    # running with NCCL_ALGO=RING" and with NVLink SHARP "a peak busBw of ~480GB/s (algbw
    # ~275GB/s)"; "256M is too small to reach peak bandwidth" (so: large sizes, 8 GiB here).
    PublishedRow("8x H100 (DGX/HGX), NVLink4, ring", "all_reduce", "H100", 1, 8, None, 0,
                 8 * GIB, 370.0, "ring", "set", "nccl-tests",
                 "https://github.com/NVIDIA/nccl-tests/issues/212"),
    PublishedRow("8x H100 (DGX/HGX), NVLink4, NVLS", "all_reduce", "H100", 1, 8, None, 0,
                 8 * GIB, 480.0, "nvls", "set", "nccl-tests",
                 "https://github.com/NVIDIA/nccl-tests/issues/212"),
    # D. Addison (NCCL team), nccl-tests issue 290, 2025-03-03: "For NDR @ 400Gbps you should
    # see 46-48GB/s per NIC" (middle: 47 GB/s). Recorded as a ring over 2 nodes of 8 H100 with
    # one NDR NIC each, where the NIC is the bottleneck: busbw = 47 GB/s.
    PublishedRow("2x1 H100, one NDR 400G NIC each, ring", "all_reduce", "H100", 2, 1,
                 "IB-NDR", 1, 8 * GIB, 47.0, "ring", "set", "nccl-tests",
                 "https://github.com/NVIDIA/nccl-tests/issues/290"),
]

# Where NCCL switches a single node to NVLS (role "set": it decides the algorithm).
# stas00, network/README.md section SHARP: 8x H200 at 8 GiB, NCCL picks Ring at 4 GPUs and
# NVLS from 5 up; 8x B200 (p6-b200.48xlarge, nccl 2.27.7) Ring up to 5 and NVLS from 6 up.
_H200_COUNT = [(4, 363.3, 363.3), (5, 414.2, 364.4), (6, 435.6, 365.1), (7, 460.0, 365.7),
               (8, 473.1, 365.6)]
_B200_COUNT = [(4, 673.2, 673.8), (5, 677.8, 677.8), (6, 778.2, 677.8), (7, 811.2, 680.5),
               (8, 838.0, 682.2)]
for _gpu, _table in (("H200", _H200_COUNT), ("B200", _B200_COUNT)):
    for _n, _default, _ring in _table:
        ROWS.append(PublishedRow(f"{_n}x {_gpu} of one HGX node, NCCL's choice", "all_reduce",
                                 _gpu, 1, _n, None, 0, 8 * GIB, _default, "auto", "set",
                                 "nccl-tests", _STAS00 + " (section SHARP)"))
        ROWS.append(PublishedRow(f"{_n}x {_gpu} of one HGX node, NVLS off (ring)",
                                 "all_reduce", _gpu, 1, _n, None, 0, 8 * GIB, _ring, "ring",
                                 "test", "nccl-tests", _STAS00 + " (section SHARP)"))

# Small-message latency (role "set"): the 8x H200 sweep below, sizes <= 16 MiB, sets the one
# fitted constant, costmodel.LAUNCH_OVERHEAD_S; its sizes >= 32 MiB only test.
_H200_SWEEP = [1.44, 2.93, 5.73, 11.74, 23.94, 39.93, 64.53, 107.16, 155.53, 219.89, 275.84,
               346.51, 401.93, 436.15, 450.29, 463.58, 469.17, 473.10, 477.45, 482.26]
for _row in _sweep("8x H200 (one node), NVLink4, NCCL's choice", "H200", 1, None, 0,
                   _H200_SWEEP, role="test", tool="all_reduce_bench.py",
                   source=_STAS00 + " (section Real network throughput; torch 2.9.1, "
                                    "nccl 2.27.7)"):
    ROWS.append(_row._replace(role="set" if _row.size_bytes <= 16 * MIB else "test"))

ROWS += [
    # stas00, network/README.md section SHARP: 8x H200, 16 GiB, nccl-tests -g 8.
    PublishedRow("8x H200, NVLS (default)", "all_reduce", "H200", 1, 8, None, 0, 16 * GIB,
                 480.0, "auto", "test", "nccl-tests", _STAS00 + " (section SHARP)"),
    PublishedRow("8x H200, NCCL_NVLS_ENABLE=0", "all_reduce", "H200", 1, 8, None, 0,
                 16 * GIB, 367.2, "ring", "test", "nccl-tests", _STAS00 + " (section SHARP)"),
    PublishedRow("8x H200", "all_gather", "H200", 1, 8, None, 0, 16 * GIB, 361.4, "auto",
                 "test", "nccl-tests", _STAS00 + " (section SHARP)"),
    PublishedRow("8x H200", "reduce_scatter", "H200", 1, 8, None, 0, 16 * GIB, 362.9, "auto",
                 "test", "nccl-tests", _STAS00 + " (section SHARP)"),
    # NCCL issue 1455 (shh2000, 2024-09-19), 8 H100 SXM, all_reduce_perf -b 2G -e 4G:
    # "when using ALGO=RING, busbw is about 365-370 GBps when gpus from 2 to 8"; with ALGO=NVLS
    # "Busbw increase from 370 to 420, 440, 460, and 480 GBps when gpus increase from 4 to 5,
    # 6, 7, and 8". Ring recorded at 8 GPUs (midpoint 367.5), NVLS at 5-8.
    PublishedRow("8x H100, NCCL_ALGO=RING", "all_reduce", "H100", 1, 8, None, 0, 4 * GIB,
                 367.5, "ring", "test", "nccl-tests", "https://github.com/NVIDIA/nccl/issues/1455"),
    *[PublishedRow(f"{n}x H100, NCCL_ALGO=NVLS", "all_reduce", "H100", 1, n, None, 0, 4 * GIB,
                   value, "nvls", "test", "nccl-tests",
                   "https://github.com/NVIDIA/nccl/issues/1455")
      for n, value in ((5, 420.0), (6, 440.0), (7, 460.0), (8, 480.0))],
    # D. Addison, NCCL issue 812, 2023-03-31: "On an Nvidia DGX-A100 system we have 8x200Gbit/s
    # IB cards and we measure 192GB/s AllReduce BusBW" (scale-out, ring; node count not stated:
    # recorded as the ring over 2 nodes he recommends forcing to measure it).
    PublishedRow("DGX A100, 8x HDR 200G per node, ring", "all_reduce", "A100", 2, 8, "IB-HDR",
                 8, 8 * GIB, 192.0, "ring", "test", "nccl-tests",
                 "https://github.com/NVIDIA/nccl/issues/812"),
    # S. Jeaugey, NCCL issue 412, 2023-04-24, 12 nodes of 8 A800 with one HDR 200G NIC each:
    # "looking at the BusBW at a size of 8G, you should get ~160GB/s intra-node and 24GB/s
    # inter-node". A800 = A100 with NVLink at 400 GB/s bidirectional, 200 GB/s per direction
    # (sjeaugey: 160 GB/s "is the NVLink intra-node bandwidth of your system").
    PublishedRow("8x A800, one node", "all_reduce", "A100", 1, 8, None, 0, 8 * GIB, 160.0,
                 "auto", "test", "nccl-tests", "https://github.com/NVIDIA/nccl/issues/412",
                 intra_node_link_bytes_per_s=200e9),
    PublishedRow("12 nodes of 8x A800, one HDR 200G NIC each", "all_reduce", "A100", 12, 8,
                 "IB-HDR", 1, 8 * GIB, 24.0, "auto", "test", "nccl-tests",
                 "https://github.com/NVIDIA/nccl/issues/412", intra_node_link_bytes_per_s=200e9),
    # stas00, network/README.md footnote in "Understanding why inter-node network speed...":
    # 4 nodes of 8 H200 (p5en.48xlarge: 16x 200 Gb/s EFA v3 per node, README table "AWS EFA v3
    # (P5en/Trn2) 16 x 200"), 4 GiB, nccl 2.27.7, Ring chosen: 364.87 GB/s.
    PublishedRow("4 nodes of 8x H200, 16x EFA 200G per node", "all_reduce", "H200", 4, 8,
                 "Ethernet-200G", 16, 4 * GIB, 364.87, "auto", "test", "nccl-tests",
                 _STAS00 + " (footnote on p5en.48xlarge)"),
    PublishedRow("4 nodes of 8x H200, 16x EFA 200G per node, NVLSTree forced", "all_reduce",
                 "H200", 4, 8, "Ethernet-200G", 16, 4 * GIB, 310.07, "nvls_tree", "test",
                 "nccl-tests", _STAS00 + " (footnote on p5en.48xlarge)"),
]

# stas00, network/README.md section "Real network throughput": one A100 node (8 GPUs),
# nccl-tests all_reduce_perf -b 32k -e 16G -f 2 -g 8 -n 50.
_A100_SWEEP = [1.31, 2.45, 4.43, 7.47, 11.41, 18.00, 36.18, 72.33, 109.93, 106.16, 138.49,
               171.54, 176.92, 194.07, 222.72, 229.04, 231.41, 233.88, 234.61, 234.89]
ROWS += _sweep("8x A100 (one node), NVLink3", "A100", 1, None, 0, _A100_SWEEP, role="test",
               tool="nccl-tests", source=_STAS00 + " (section Real network throughput)")

# stas00, network/README.md section "Inter-node speed depends on intra-node speed": P6-B200,
# 8x B200 per node, NVLink5 inside, 8x 400 Gb/s EFA v4 per node; torch 2.9.1, nccl 2.27.7.
_B200_1 = [1.20, 2.17, 4.86, 9.54, 18.71, 36.06, 63.09, 76.48, 126.49, 254.96, 325.97, 400.60,
           568.38, 646.11, 688.99, 723.34, 734.97, 740.64, 839.07, 845.67]
_B200_4 = [0.01, 0.04, 0.45, 1.33, 2.84, 5.37, 10.38, 18.90, 35.12, 64.43, 91.19, 156.74,
           197.94, 229.09, 326.90, 361.99, 372.42, 377.34, 380.39, 381.80]
_B200_SOURCE = _STAS00 + " (section Inter-node speed depends on intra-node speed)"
ROWS += _sweep("8x B200 (one node), NVLink5", "B200", 1, None, 0, _B200_1, role="test",
               tool="all_reduce_bench.py", source=_B200_SOURCE)
ROWS += _sweep("4 nodes of 8x B200, 8x EFA 400G per node", "B200", 4, "Ethernet-400G", 8,
               _B200_4, role="test", tool="all_reduce_bench.py", source=_B200_SOURCE)


def rows(role: str | None = None) -> list[PublishedRow]:
    """The published rows, all or only those of one role (``"set"`` or ``"test"``)."""
    if role not in (None, "set", "test"):
        raise ValueError(f"role must be 'set', 'test' or None, got {role!r}.")
    return [row for row in ROWS if role is None or row.role == role]
