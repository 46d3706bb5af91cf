"""Published nccl-tests (and nccl-tests-like) bus bandwidths, each row with its source.

Every row below was read in its source (URL and place given per row); none is estimated or
derived from another row. What a row is for (``role``):

* ``"set"``: the row sets a parameter of :func:`clusterlab.analytic.costmodel.cluster_collective`;
  the model is *fitted* to it, so its error proves nothing. The model takes its constants from
  NCCL's source (``tuning.cc``, ``enqueue.cc``); the two row-fitted constants are the launch
  overhead (``costmodel.LAUNCH_OVERHEAD_S``) and the pipeline's fill in chunk-times
  (``costmodel.PIPELINE_FILL_CHUNKS``), fitted together to the 8x H200 sweep at <= 16 MiB.
* ``"test"``: the row only tests the model; nothing is fitted on it.
* ``"unhealthy"``: a published log of a system that its own thread says is broken or
  misconfigured (it lost bandwidth). Never a test of the model; kept as a negative example
  for a diagnosis tool (``python -m clusterlab expect --measured``). These rows live in
  :data:`UNHEALTHY_ROWS`, not in :data:`ROWS`, so ``rows()`` (all healthy rows) and
  ``validation_table`` never see them; ask for them with ``rows("unhealthy")``.

Where a row comes from (``provenance``, one of :data:`PROVENANCES`):

* :data:`FULL_TABLE` (``"full table"``): a complete nccl-tests (or benchmark) output table, or
  a table of results, posted in the source; the value is read off it.
* :data:`OTHER_TOOL` (``"other tool"``): a benchmark of another tool that prints nccl-tests'
  columns (stas00's ``all_reduce_bench.py``, a torch loop), or a single measured figure whose
  tool the source does not name.
* :data:`MAINTAINER` (``"maintainer's statement"``): a sentence by an NCCL maintainer ("you
  should see 46-48GB/s per NIC"): a rule of thumb, not a measurement with a stated setup.
* :data:`USER_STATEMENT` (``"user's statement"``): a sentence in which a user summarizes
  their own nccl-tests runs ("busbw is about 365-370 GBps"), with no table posted.

``stated`` is the configuration as the source states it (a short quote or paraphrase);
``inferred`` is everything this file had to assume beyond it (``""``: nothing). ``fabric`` is
the network the row crosses: ``"NVLink"`` (one node), ``"InfiniBand"``, ``"RoCE"``, ``"EFA"``
or ``"Ethernet"``; ``nic`` is the catalogue key of its NIC (EFA and RoCE NICs are Ethernet
ports: ``"Ethernet-200G"``, ``"Ethernet-400G"``). :attr:`PublishedRow.regime` groups rows by
(nodes, fabric, op family), the unit in which the model's error is reported.

Units: ``size_bytes`` is nccl-tests' ``size`` column (bytes; "GiB" sizes are powers of 1024);
``busbw_gbps`` is the out-of-place ``busbw`` column in GB/s (1 GB = 1e9 bytes), per GPU and
direction, as nccl-tests defines it (``doc/PERFORMANCE.md``).

``tool`` is ``"nccl-tests"``, ``"all_reduce_bench.py"`` (stas00's PyTorch benchmark, which
prints the same algbw/busbw columns and which its author reports agrees closely with
nccl-tests) or ``"unstated"``. ``algorithm`` is what the source says ran or was forced
(``"auto"``: NCCL's own choice, not forced).
"""

from __future__ import annotations

from typing import NamedTuple

KIB = 2**10
MIB = 2**20
GIB = 2**30

FULL_TABLE = "full table"
OTHER_TOOL = "other tool"
MAINTAINER = "maintainer's statement"
USER_STATEMENT = "user's statement"
PROVENANCES = (FULL_TABLE, OTHER_TOOL, MAINTAINER, USER_STATEMENT)

FABRICS = ("NVLink", "InfiniBand", "RoCE", "EFA", "Ethernet")
ROLES = ("set", "test", "unhealthy")
NODE_CLASSES = ("1 node", "2 nodes", ">2 nodes")
#: Where an NVLink domain spans hosts (an NVL72 rack), its domains are counted instead.
DOMAIN_CLASSES = ("1 NVLink domain", "2 NVLink domains", ">2 NVLink domains")
OP_FAMILIES = ("all_reduce", "all_gather/reduce_scatter", "all_to_all")
_OP_FAMILY = {"all_reduce": "all_reduce", "all_gather": "all_gather/reduce_scatter",
              "reduce_scatter": "all_gather/reduce_scatter", "all_to_all": "all_to_all"}


def node_class(n_nodes: int) -> str:
    """``"1 node"``, ``"2 nodes"`` or ``">2 nodes"``."""
    return "1 node" if n_nodes == 1 else "2 nodes" if n_nodes == 2 else ">2 nodes"


def domain_class(n_domains: int) -> str:
    """``"1 NVLink domain"``, ``"2 NVLink domains"`` or ``">2 NVLink domains"``."""
    return DOMAIN_CLASSES[NODE_CLASSES.index(node_class(n_domains))]


def op_family(op: str) -> str:
    """``"all_reduce"``, ``"all_gather/reduce_scatter"`` or ``"all_to_all"``."""
    return _OP_FAMILY[op]


class PublishedRow(NamedTuple):
    """One published measurement and the configuration it was taken on."""

    system: str            # a short label of the configuration
    op: str                # all_reduce, all_gather, reduce_scatter, all_to_all
    gpu: str               # key in clusterlab.catalog.hardware.GPUS
    n_nodes: int
    gpus_per_node: int     # GPUs taking part in each node
    nic: str | None        # key in clusterlab.catalog.hardware.LINKS; None on one node
    nics_per_node: int     # NICs per node used by NCCL (0 on one node)
    size_bytes: int
    busbw_gbps: float      # out-of-place busbw, GB/s
    algorithm: str         # "auto" (NCCL's choice), or "ring"/"tree"/"nvls"/"nvls_tree" forced
    role: str              # "set", "test" or "unhealthy"
    tool: str              # "nccl-tests", "all_reduce_bench.py" or "unstated"
    source: str            # URL (and place in it)
    intra_node_link_bytes_per_s: float | None = None   # overrides the GPU's NVLink (A800)
    provenance: str = ""   # one of PROVENANCES
    fabric: str = ""       # one of FABRICS
    nccl_version: str | None = None   # as the source states it, else None
    stated: str = ""       # the configuration as the source states it
    inferred: str = ""     # what this file assumed beyond it ("" if nothing)
    nvlink_domain_gpus: int | None = None   # GPUs per NVLink domain spanning hosts (MNNVL)

    @property
    def n_nvlink_domains(self) -> int:
        """The row's NVLink domains: its hosts, or its multi-host domains (NVL72 racks)."""
        gpus = self.n_nodes * self.gpus_per_node
        return self.n_nodes if self.nvlink_domain_gpus is None else gpus // min(
            self.nvlink_domain_gpus, gpus)

    @property
    def regime(self) -> tuple[str, str, str]:
        """(nodes: "1 node" | "2 nodes" | ">2 nodes", fabric, op family); where an NVLink
        domain spans hosts, the domains are counted ("1 NVLink domain", ...), as NCCL counts
        its nodes."""
        if self.nvlink_domain_gpus is None:
            return node_class(self.n_nodes), self.fabric, op_family(self.op)
        return domain_class(self.n_nvlink_domains), self.fabric, op_family(self.op)


_STAS00 = "https://github.com/stas00/ml-engineering/blob/master/network/README.md"
_SIZES_32K_16G = [32 * KIB * 2**i for i in range(20)]   # 32 KiB, 64 KiB, ..., 16 GiB


def _sweep(system, gpu, n_nodes, nic, nics, busbw, *, role, tool, source, op="all_reduce",
           algorithm="auto", **meta):
    return [PublishedRow(system, op, gpu, n_nodes, 8, nic, nics, size, value, algorithm, role,
                         tool, source, **meta)
            for size, value in zip(_SIZES_32K_16G, busbw)]


def _table(system, op, gpu, n_nodes, gpus_per_node, nic, nics, sizes_busbw, *, source,
           role="test", tool="nccl-tests", algorithm="auto", **meta):
    """Rows read off one posted output table: ``sizes_busbw`` is ``[(size_bytes, busbw)]``."""
    return [PublishedRow(system, op, gpu, n_nodes, gpus_per_node, nic, nics, size, value,
                         algorithm, role, tool, source, **meta)
            for size, value in sizes_busbw]

_I212 = "https://github.com/NVIDIA/nccl-tests/issues/212"
_I290 = "https://github.com/NVIDIA/nccl-tests/issues/290"
_I1455 = "https://github.com/NVIDIA/nccl/issues/1455"
_I812 = "https://github.com/NVIDIA/nccl/issues/812"
_I412 = "https://github.com/NVIDIA/nccl/issues/412"

ROWS: list[PublishedRow] = [
    # S. Jeaugey (NCCL maintainer), nccl-tests issue 212, 2024-05-06: on 8 H100 "450GB/s is the
    # line rate. With the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of
    # 370GB/s, which you can observe as BusBw when running non-allreduce operations, or when
    # running with NCCL_ALGO=RING" and with NVLink SHARP "a peak busBw of ~480GB/s (algbw
    # ~275GB/s)"; "256M is too small to reach peak bandwidth" (so: large sizes, 8 GiB here).
    # These set the model's NVLink efficiencies until the NCCL 2.30.7 rewrite; now tests.
    PublishedRow("8x H100 (DGX/HGX), NVLink4, ring", "all_reduce", "H100", 1, 8, None, 0,
                 8 * GIB, 370.0, "ring", "test", "nccl-tests", _I212 + " (sjeaugey, 2024-05-06)",
                 provenance=MAINTAINER, fabric="NVLink",
                 stated="8 H100, NVLink line rate 450 GB/s; ~370 GB/s busbw with "
                        "NCCL_ALGO=RING or non-allreduce ops; 256M too small for peak",
                 inferred="message size (8 GiB), GPU count (8)"),
    PublishedRow("8x H100 (DGX/HGX), NVLink4, NVLS", "all_reduce", "H100", 1, 8, None, 0,
                 8 * GIB, 480.0, "nvls", "test", "nccl-tests", _I212 + " (sjeaugey, 2024-05-06)",
                 provenance=MAINTAINER, fabric="NVLink",
                 stated="On 8 GPUs, NVLink SHARP (default for allreduce): peak busBw ~480 GB/s "
                        "(algbw ~275 GB/s)",
                 inferred="message size (8 GiB)"),
    # D. Addison (NCCL team), nccl-tests issue 290, 2025-03-03: "For NDR @ 400Gbps you should
    # see 46-48GB/s per NIC" (middle: 47 GB/s). Recorded as a ring over 2 nodes of 1 H100 with
    # one NDR NIC each, where the NIC is the bottleneck: busbw = 47 GB/s.
    PublishedRow("2x1 H100, one NDR 400G NIC each, ring", "all_reduce", "H100", 2, 1,
                 "IB-NDR", 1, 8 * GIB, 47.0, "ring", "test", "nccl-tests",
                 _I290 + " (AddyLaddy, 2025-03-03)", provenance=MAINTAINER,
                 fabric="InfiniBand", stated="NDR 400 Gb/s, per NIC: 46-48 GB/s",
                 inferred="node count, GPUs per node, message size, algorithm, GPU (H100)"),
]

# Where NCCL switches a single node to NVLS. stas00, network/README.md section SHARP: a table
# of nccl-tests results on 8x H200 at 8 GiB (NCCL picks Ring at 4 GPUs and NVLS from 5 up;
# NCCL version not stated for this table) and 8x B200 (p6-b200.48xlarge, nccl=2.27.7, Ring up
# to 5 and NVLS from 6 up). They set where the old model switched to NVLS; now tests.
_H200_COUNT = [(4, 363.3, 363.3), (5, 414.2, 364.4), (6, 435.6, 365.1), (7, 460.0, 365.7),
               (8, 473.1, 365.6)]
_B200_COUNT = [(4, 673.2, 673.8), (5, 677.8, 677.8), (6, 778.2, 677.8), (7, 811.2, 680.5),
               (8, 838.0, 682.2)]
for _gpu, _counts, _version in (("H200", _H200_COUNT, None), ("B200", _B200_COUNT, "2.27.7")):
    for _n, _default, _ring in _counts:
        _meta = dict(provenance=FULL_TABLE, fabric="NVLink", nccl_version=_version,
                     stated=f"{_n} GPUs of one 8x {_gpu} node, 8GiB payload, nccl-tests",
                     inferred="")
        ROWS.append(PublishedRow(f"{_n}x {_gpu} of one HGX node, NCCL's choice", "all_reduce",
                                 _gpu, 1, _n, None, 0, 8 * GIB, _default, "auto", "test",
                                 "nccl-tests", _STAS00 + " (section SHARP)", **_meta))
        ROWS.append(PublishedRow(f"{_n}x {_gpu} of one HGX node, NVLS off (ring)",
                                 "all_reduce", _gpu, 1, _n, None, 0, 8 * GIB, _ring, "ring",
                                 "test", "nccl-tests", _STAS00 + " (section SHARP)",
                                 **{**_meta, "stated": _meta["stated"] + ", NCCL_NVLS_ENABLE=0"}))

# Small-message latency and the pipeline's fill (role "set"): the 8x H200 sweep below, sizes
# <= 16 MiB, sets the two fitted constants, costmodel.LAUNCH_OVERHEAD_S and
# costmodel.PIPELINE_FILL_CHUNKS; its sizes >= 32 MiB only test.
_H200_SWEEP = [1.44, 2.93, 5.73, 11.74, 23.94, 39.93, 64.53, 107.16, 155.53, 219.89, 275.84,
               346.51, 401.93, 436.15, 450.29, 463.58, 469.17, 473.10, 477.45, 482.26]
for _row in _sweep("8x H200 (one node), NVLink4, NCCL's choice", "H200", 1, None, 0,
                   _H200_SWEEP, role="test", tool="all_reduce_bench.py",
                   source=_STAS00 + " (section Real network throughput; torch 2.9.1, "
                                    "nccl 2.27.7)",
                   provenance=OTHER_TOOL, fabric="NVLink", nccl_version="2.27.7",
                   stated="8x H200 node, all_reduce_bench.py, torch 2.9.1, nccl 2.27.7",
                   inferred=""):
    ROWS.append(_row._replace(role="set" if _row.size_bytes <= 16 * MIB else "test"))

ROWS += [
    # stas00, network/README.md section SHARP: a table of nccl-tests results, 8x H200, 16 GiB,
    # "-b 16G -e 16G -g 8 -z 1" (NCCL version not stated for it).
    *[PublishedRow(system, op, "H200", 1, 8, None, 0, 16 * GIB, value, algo, "test",
                   "nccl-tests", _STAS00 + " (section SHARP)", provenance=FULL_TABLE,
                   fabric="NVLink", stated=stated, inferred="")
      for system, op, value, algo, stated in (
          ("8x H200, NVLS (default)", "all_reduce", 480.0, "auto",
           "8x H200 node, 16 GiB, NCCL_NVLS_ENABLE=1 (NVLS ran)"),
          ("8x H200, NCCL_NVLS_ENABLE=0", "all_reduce", 367.2, "ring",
           "8x H200 node, 16 GiB, NCCL_NVLS_ENABLE=0 (Ring ran)"),
          ("8x H200", "all_gather", 361.4, "auto", "8x H200 node, 16 GiB (Ring ran)"),
          ("8x H200", "reduce_scatter", 362.9, "auto", "8x H200 node, 16 GiB (Ring ran)"))],
    # NCCL issue 1455 (shh2000, a user, 2024-09-19), 8 H100 SXM, all_reduce_perf -b 2G -e 4G:
    # "when using ALGO=RING, busbw is about 365-370 GBps when gpus from 2 to 8"; with ALGO=NVLS
    # "Busbw increase from 370 to 420, 440, 460, and 480 GBps when gpus increase from 4 to 5,
    # 6, 7, and 8". Ring recorded at 8 GPUs (midpoint 367.5), NVLS at 5-8.
    PublishedRow("8x H100, NCCL_ALGO=RING", "all_reduce", "H100", 1, 8, None, 0, 4 * GIB,
                 367.5, "ring", "test", "nccl-tests", _I1455, provenance=USER_STATEMENT,
                 fabric="NVLink", stated="8 H100 SXM, all_reduce_perf -b 2G -e 4G, "
                 "ALGO=RING: busbw about 365-370 GBps from 2 to 8 GPUs",
                 inferred="size (4 GiB, the sweep's end), value (midpoint 367.5)"),
    *[PublishedRow(f"{n}x H100, NCCL_ALGO=NVLS", "all_reduce", "H100", 1, n, None, 0, 4 * GIB,
                   value, "nvls", "test", "nccl-tests", _I1455, provenance=USER_STATEMENT,
                   fabric="NVLink", stated="8 H100 SXM, all_reduce_perf -b 2G -e 4G, ALGO=NVLS: "
                   "busbw 420/440/460/480 GBps at 5/6/7/8 GPUs",
                   inferred="size (4 GiB, the sweep's end)")
      for n, value in ((5, 420.0), (6, 440.0), (7, 460.0), (8, 480.0))],
    # D. Addison, NCCL issue 812, 2023-03-31: "On an Nvidia DGX-A100 system we have 8x200Gbit/s
    # IB cards and we measure 192GB/s AllReduce BusBW" (scale-out, ring; node count not stated:
    # recorded as the ring over 2 nodes he recommends forcing to measure it).
    PublishedRow("DGX A100, 8x HDR 200G per node, ring", "all_reduce", "A100", 2, 8, "IB-HDR",
                 8, 8 * GIB, 192.0, "ring", "test", "nccl-tests", _I812 + " (AddyLaddy)",
                 provenance=MAINTAINER, fabric="InfiniBand",
                 stated="DGX-A100, 8x 200 Gbit/s IB cards, 192 GB/s AllReduce BusBW",
                 inferred="node count (2), message size (8 GiB), algorithm (ring)"),
    # S. Jeaugey, NCCL issue 412, 2023-04-24, 12 nodes of 8 A800 with one HDR 200G NIC each:
    # "looking at the BusBW at a size of 8G, you should get ~160GB/s intra-node and 24GB/s
    # inter-node". A800 = A100 with NVLink at 400 GB/s bidirectional, 200 GB/s per direction
    # (sjeaugey: 160 GB/s "is the NVLink intra-node bandwidth of your system").
    PublishedRow("8x A800, one node", "all_reduce", "A100", 1, 8, None, 0, 8 * GIB, 160.0,
                 "auto", "test", "nccl-tests", _I412 + " (sjeaugey, 2023-04-24)",
                 intra_node_link_bytes_per_s=200e9, provenance=MAINTAINER, fabric="NVLink",
                 stated="8 NVLink A800 per node; busbw at 8G: ~160 GB/s intra-node",
                 inferred="A800 NVLink as 200 GB/s per direction"),
    PublishedRow("12 nodes of 8x A800, one HDR 200G NIC each", "all_reduce", "A100", 12, 8,
                 "IB-HDR", 1, 8 * GIB, 24.0, "auto", "test", "nccl-tests",
                 _I412 + " (sjeaugey, 2023-04-24)", intra_node_link_bytes_per_s=200e9,
                 provenance=MAINTAINER, fabric="InfiniBand",
                 stated="12 nodes, 8 A800 and 1 HDR 200G IB card each (user); busbw at 8G: "
                        "24 GB/s inter-node (maintainer)",
                 inferred="A800 NVLink as 200 GB/s per direction"),
    # stas00, network/README.md footnote in "Understanding why inter-node network speed...":
    # 4 nodes of 8 H200 (p5en.48xlarge: 16x 200 Gb/s EFA v3 per node, README table "AWS EFA v3
    # (P5en/Trn2) 16 x 200"), 4 GiB, nccl 2.27.7, Ring chosen: 364.87 GB/s. Two figures in
    # prose; the tool is not named.
    *[PublishedRow(system, "all_reduce", "H200", 4, 8, "Ethernet-200G", 16, 4 * GIB, value,
                   algo, "test", "unstated", _STAS00 + " (footnote on p5en.48xlarge)",
                   provenance=OTHER_TOOL, fabric="EFA", nccl_version="2.27.7",
                   stated="4 nodes of 8x H200, p5en.48xlarge, EFA, 4GiB all-reduce over 32 "
                          "ranks, NCCL 2.27.7, AWS ofi tuner plugin" + extra,
                   inferred="NICs per node (16 x 200G, from the README's EFA table for P5en); "
                            "tool")
      for system, value, algo, extra in (
          ("4 nodes of 8x H200, 16x EFA 200G per node", 364.87, "auto", "; Ring selected"),
          ("4 nodes of 8x H200, 16x EFA 200G per node, NVLSTree forced", 310.07, "nvls_tree",
           "; NCCL_ALGO=allreduce:nvlstree"))],
]

# stas00, network/README.md section "Real network throughput": one A100 node (8 GPUs),
# nccl-tests all_reduce_perf -b 32k -e 16G -f 2 -g 8 -n 50 (the output table; NCCL version
# not stated).
_A100_SWEEP = [1.31, 2.45, 4.43, 7.47, 11.41, 18.00, 36.18, 72.33, 109.93, 106.16, 138.49,
               171.54, 176.92, 194.07, 222.72, 229.04, 231.41, 233.88, 234.61, 234.89]
ROWS += _sweep("8x A100 (one node), NVLink3", "A100", 1, None, 0, _A100_SWEEP, role="test",
               tool="nccl-tests", source=_STAS00 + " (section Real network throughput)",
               provenance=FULL_TABLE, fabric="NVLink",
               stated="single A100 node, all_reduce_perf -b 32k -e 16G -f 2 -g 8 -n 50",
               inferred="A100 model (80GB SXM, the catalogue's A100)")

# stas00, network/README.md section "Inter-node speed depends on intra-node speed": P6-B200,
# 8x B200 per node, NVLink5 inside, 8x 400 Gb/s EFA v4 per node; torch 2.9.1, nccl 2.27.7.
_B200_1 = [1.20, 2.17, 4.86, 9.54, 18.71, 36.06, 63.09, 76.48, 126.49, 254.96, 325.97, 400.60,
           568.38, 646.11, 688.99, 723.34, 734.97, 740.64, 839.07, 845.67]
_B200_4 = [0.01, 0.04, 0.45, 1.33, 2.84, 5.37, 10.38, 18.90, 35.12, 64.43, 91.19, 156.74,
           197.94, 229.09, 326.90, 361.99, 372.42, 377.34, 380.39, 381.80]
_B200_SOURCE = _STAS00 + " (section Inter-node speed depends on intra-node speed)"
_B200_STATED = ("P6-B200, 8x B200 per node, NVLink 5 inside, 8x 50GBps EFA v4 out; "
                "all_reduce_bench.py, torch 2.9.1+cu130, nccl 2.27.7")
ROWS += _sweep("8x B200 (one node), NVLink5", "B200", 1, None, 0, _B200_1, role="test",
               tool="all_reduce_bench.py", source=_B200_SOURCE, provenance=OTHER_TOOL,
               fabric="NVLink", nccl_version="2.27.7", stated="1 node; " + _B200_STATED)
ROWS += _sweep("4 nodes of 8x B200, 8x EFA 400G per node", "B200", 4, "Ethernet-400G", 8,
               _B200_4, role="test", tool="all_reduce_bench.py", source=_B200_SOURCE,
               provenance=OTHER_TOOL, fabric="EFA", nccl_version="2.27.7",
               stated="4 nodes; " + _B200_STATED)


# --- Multi-node InfiniBand and RoCE H100 (full tables and statements) ---------------------------
_I309 = "https://github.com/NVIDIA/nccl-tests/issues/309"
_I1221 = "https://github.com/NVIDIA/nccl/issues/1221"
_I2409 = "https://github.com/NVIDIA/nccl/issues/2409"

# nccl-tests issue 309 (qoofyk, 2025-05-20): "Dell HGX XE9680 with 8xH100 and 8x CX-7 IB 400Gbps",
# NCCL 2.26.2, all_reduce_perf -b 8 -e 16g -f 2 -g 1 on 16 ranks of 2 hosts (NCCL_IB_HCA lists
# the 8 HCAs). NVIDIA (kiskra-nvidia, 2025-05-21): "Your numbers look good to me!"
ROWS += _table("2 nodes of 8x H100 (HGX XE9680), 8x NDR 400G IB per node", "all_reduce", "H100",
               2, 8, "IB-NDR", 8,
               [(1 * MIB, 27.33), (16 * MIB, 169.67), (128 * MIB, 336.29), (1 * GIB, 448.90),
                (16 * GIB, 469.21)],
               source=_I309 + " (issue body)", provenance=FULL_TABLE, fabric="InfiniBand",
               nccl_version="2.26.2",
               stated="Dell HGX XE9680, 8xH100 and 8x CX-7 IB 400Gbps per host, 2 hosts x 8 "
                      "ranks, NCCL 2.26.2, -b 8 -e 16g -f 2 -g 1; NVIDIA: 'numbers look good'",
               inferred="")
# Same thread (qoofyk, 2025-05-23): "4 nodes on 32 GPU-NIC pairs ... max busbw can get 365.84";
# NCCL 2.26.2, run with NCCL_TOPO_FILE=vm_topo_mod.xml and the 8 HCAs. NVIDIA (2025-06-18):
# "That's a good number ... With 8 400 Gbps NICs your peak would be at 400 GB/s."
ROWS += _table("4 nodes of 8x H100 (HGX), 8x NDR 400G IB per node", "all_reduce", "H100", 4, 8,
               "IB-NDR", 8,
               [(1 * MIB, 24.73), (16 * MIB, 125.23), (128 * MIB, 262.48), (1 * GIB, 358.14),
                (16 * GIB, 365.84)],
               source=_I309 + " (comment of qoofyk, 2025-05-23)", provenance=FULL_TABLE,
               fabric="InfiniBand", nccl_version="2.26.2",
               stated="4 nodes, 32 GPU-NIC pairs, 8 HCAs in NCCL_IB_HCA, NCCL 2.26.2, "
                      "NCCL_TOPO_FILE=vm_topo_mod.xml; NVIDIA: 'a good number', '8 400 Gbps NICs'",
               inferred="that these 4 hosts (other names than the 2-host run, a topology file "
                        "for VMs) have the first post's CX-7 NDR IB NICs")
# Same thread (gj-aion, 2025-06-18), H100 80GB HBM3 nodes on "IB 400G network", NCCL version
# not stated, all_reduce_perf -b 1M -e 8G -f 2 -g 1 with 8 ranks per node. NVIDIA on the
# 8-node run: "That's possible, depending on your network."
for _n, _busbw in ((2, [21.08, 156.07, 335.25, 447.65, 466.73]),
                         (4, [6.41, 106.75, 246.41, 322.02, 324.52]),
                         (8, [17.64, 87.36, 227.97, 286.81, 320.70])):
    ROWS += _table(f"{_n} nodes of 8x H100, IB 400G (gj-aion)", "all_reduce", "H100", _n, 8,
                   "IB-NDR", 8,
                   list(zip((1 * MIB, 16 * MIB, 128 * MIB, 1 * GIB, 8 * GIB), _busbw)),
                   source=_I309 + " (comments of gj-aion, 2025-06-18)", provenance=FULL_TABLE,
                   fabric="InfiniBand",
                   stated=f"{_n} of an 8-node H100 cluster, 'IB 400G network', "
                          "-b 1M -e 8G -f 2 -g 1, 8 ranks per node, defaults",
                   inferred="NICs per node (8: not stated), NCCL version")
# ... and with NVIDIA's suggested NCCL_MIN_CTAS=24 NCCL_IB_QPS_PER_CONNECTION=2 (8 nodes, NCCL's
# choice; 2 nodes with NCCL_ALGO=Ring): "getting closer to the 400 GB/s IB limit".
for _n, _algo, _busbw in ((8, "auto", [16.26, 64.71, 189.36, 374.81, 391.37]),
                                (2, "ring", [12.53, 157.83, 316.24, 384.49, 392.69])):
    ROWS += _table(f"{_n} nodes of 8x H100, IB 400G, NCCL_MIN_CTAS=24 QPS=2"
                   + (", ring" if _algo == "ring" else ""), "all_reduce", "H100", _n, 8,
                   "IB-NDR", 8,
                   list(zip((1 * MIB, 16 * MIB, 128 * MIB, 1 * GIB, 8 * GIB), _busbw)),
                   source=_I309 + " (comment of gj-aion, 2025-06-18)", algorithm=_algo,
                   provenance=FULL_TABLE, fabric="InfiniBand",
                   stated=f"{_n} nodes of 8 H100, 'IB 400G network', NCCL_MIN_CTAS=24 "
                          "NCCL_IB_QPS_PER_CONNECTION=2" + (", NCCL_ALGO=Ring" if _algo == "ring"
                                                             else ""),
                   inferred="NICs per node (8: not stated), NCCL version; non-default "
                            "NCCL_MIN_CTAS the model does not represent")

# nccl-tests issue 290 (shahizat, 2025-03-03): one node of 8 H100 80GB HBM3, all_reduce_perf
# -g 8 -b 128M -e 4G -f 2; NVIDIA (AddyLaddy): "476GB/s looks to be in the expected range".
ROWS += _table("8x H100 (one node), NVLink4, NCCL's choice (nccl-tests#290)", "all_reduce",
               "H100", 1, 8, None, 0,
               [(128 * MIB, 382.99), (1 * GIB, 465.25), (4 * GIB, 473.60)],
               source=_I290 + " (issue body, single node)", provenance=FULL_TABLE,
               fabric="NVLink", stated="single node, 8x H100 80GB HBM3, -b 128M -e 4G -f 2 -g 8",
               inferred="")

# NCCL issue 1221 (qdbkppkbdq, 2024-03-13), NCCL 2.19.3, nodes of "GPU 8xH100, NIC: 8x400Gb
# RoCE", all_reduce_perf -b 4G -e 8G -g 1: "if I run all_reduce on single nodes or 2 nodes. when
# I set NCCL_NVLS_ENABLE=0 /1 . the bus BW will upgraded from 330GB to 430GB. but run it on nodes
# which is more than 2 ... same busbw 320GB" (4 nodes, -np 32).
_I1221_STATED = ("8xH100 and 8x 400Gb RoCE per node, NCCL 2.19.3, all_reduce_perf -b 4G -e 8G "
                 "-g 1; ")
ROWS += [
    *[PublishedRow(f"2 nodes of 8x H100, 8x 400G RoCE, NCCL_NVLS_ENABLE={flag}", "all_reduce",
                   "H100", 2, 8, "Ethernet-400G", 8, 8 * GIB, value, "auto", "test",
                   "nccl-tests", _I1221 + " (issue body)", provenance=USER_STATEMENT,
                   fabric="RoCE", nccl_version="2.19.3",
                   stated=_I1221_STATED + "'single nodes or 2 nodes': NCCL_NVLS_ENABLE=0/1 "
                                          "busbw 330GB -> 430GB",
                   inferred="node count (the sentence covers 1 and 2 nodes; recorded at 2), "
                            "size (8 GiB, the sweep's end)")
      for flag, value in ((0, 330.0), (1, 430.0))],
    *[PublishedRow(f"4 nodes of 8x H100, 8x 400G RoCE, NCCL_NVLS_ENABLE={flag}", "all_reduce",
                   "H100", 4, 8, "Ethernet-400G", 8, 8 * GIB, 320.0, "auto", "test",
                   "nccl-tests", _I1221 + " (issue body)", provenance=USER_STATEMENT,
                   fabric="RoCE", nccl_version="2.19.3",
                   stated=_I1221_STATED + "more than 2 nodes (-np 32): NCCL_NVLS_ENABLE=0/1 "
                                          "'same busbw 320GB'",
                   inferred="size (8 GiB, the sweep's end)")
      for flag in (0, 1)],
    # NCCL issue 2409 (Ndministrator, 2026-09-15), after fixing the platform (iommu=pt, ACS off)
    # and dropping NCCL_IB_SPLIT_DATA_ON_QPS=1: "all_reduce_perf 16 ranks x 8 rails 1 GiB busbw
    # ... 456 GB/s". 2 nodes x 8 H100 SXM, 8x ConnectX-7 400 Gb/s RoCEv2 per node, NCCL 2.31.2.
    PublishedRow("2 nodes of 8x H100, 8x 400G RoCE (fixed, nccl#2409)", "all_reduce", "H100", 2,
                 8, "Ethernet-400G", 8, 1 * GIB, 456.0, "auto", "test", "nccl-tests",
                 _I2409 + " (comment of 2026-09-15, 'Resolved')", provenance=USER_STATEMENT,
                 fabric="RoCE", nccl_version="2.31.2",
                 stated="2 x 8x H100 SXM, 8x CX-7 400 Gb/s RoCEv2 per node, NCCL 2.31.2, "
                        "16 ranks x 8 rails, 1 GiB, after iommu=pt + ACS off and "
                        "NCCL_IB_SPLIT_DATA_ON_QPS=0",
                 inferred=""),
]


# --- All-to-all and multi-node all-gather (full tables) ---------------------------------------
# OCI's GB300 quick start (oracle-quickstart/oci-gpu-quickstarts, nvidia/GB300/README-GB300.md at
# commit 2631bee), section "NCCL All-to-All": full alltoall_perf tables, -b 512K -e 16G -f 2 -g 1
# -n 50, NCCL 2.28.7+cuda13.0, on BM.GPU.GB300.4 hosts (4 GB300 each; the doc's hardware table:
# "RDMA (ROCe) NICs 8 x 400 Gbps"), launched with NCCL_MNNVL_ENABLE=1. A GB300 NVL72 rack is one
# NVLink domain of up to 18 such hosts; NCCL's multi-node NVLink (MNNVL) runs hosts of one rack
# over NVLink only. The rows give the hosts, and the GPUs of the run's NVLink domain
# (nvlink_domain_gpus: 8 or 64 in one rack, 64 per rack in the 2-rack run joined by RoCE).
_OCI_GB300 = ("https://github.com/oracle-quickstart/oci-gpu-quickstarts/blob/"
              "2631bee55a3a373b013bd62a0e56ce70d921ff3e/nvidia/GB300/README-GB300.md")
_OCI_GB300_STATED = ("OCI BM.GPU.GB300.4 (4x GB300 per host, 8x 400 Gb/s RoCE NICs per host), "
                     "alltoall_perf -b 512K -e 16G -f 2 -g 1 -n 50, NCCL 2.28.7, "
                     "NCCL_MNNVL_ENABLE=1")
_SIZES_5 = (1 * MIB, 16 * MIB, 128 * MIB, 1 * GIB)
ROWS += _table("OCI GB300, 1 host (4x GB300), all-to-all", "all_to_all", "GB300", 1, 4, None, 0,
               list(zip((*_SIZES_5, 16 * GIB), [46.92, 268.80, 459.81, 553.75, 627.69])),
               source=_OCI_GB300 + " (section NCCL All-to-All Single Node)",
               provenance=FULL_TABLE, fabric="NVLink", nccl_version="2.28.7",
               stated="1 host (4x GB300); " + _OCI_GB300_STATED, inferred="")
for _label, _hosts, _where, _busbw in (
        ("2 hosts of 4x GB300 in one NVL72 rack (MNNVL)", 2,
         "NCCL All to All Scale Performance 2 Hosts Single Rack",
         [52.76, 290.88, 515.87, 630.39, 685.06]),
        ("16 hosts of 4x GB300 in one NVL72 rack (MNNVL)", 16,
         "NCCL All to All Scale Performance 16 Hosts 1 Rack",
         [33.33, 130.27, 497.18, 651.23, 666.92])):
    ROWS += _table(f"OCI GB300, {_label}, all-to-all", "all_to_all", "GB300", _hosts, 4,
                   "Ethernet-400G", 8, list(zip((*_SIZES_5, 16 * GIB), _busbw)),
                   source=_OCI_GB300 + f" (section {_where})", provenance=FULL_TABLE,
                   fabric="NVLink", nccl_version="2.28.7", nvlink_domain_gpus=4 * _hosts,
                   stated=f"{_label}; " + _OCI_GB300_STATED,
                   inferred="that MNNVL joins the hosts of the run in one NVLink domain "
                            "(NCCL_MNNVL_ENABLE=1, one rack)")
ROWS += _table("OCI GB300, 32 hosts in 2 NVL72 racks, RoCE between racks, all-to-all",
               "all_to_all", "GB300", 32, 4, "Ethernet-400G", 8,
               list(zip((*_SIZES_5, 16 * GIB), [2.06, 22.05, 44.71, 47.68, 47.67])),
               source=_OCI_GB300 + " (section NCCL All to All Scale Performance 32 Hosts 2 "
                                   "Racks)",
               provenance=FULL_TABLE, fabric="RoCE", nccl_version="2.28.7",
               nvlink_domain_gpus=64,
               stated="32 hosts in 2 racks (128 ranks); " + _OCI_GB300_STATED,
               inferred="16 hosts (64 GPUs) of each rack in one NVLink domain (MNNVL); that "
                        "the racks talk over the RoCE NICs")

# CoreWeave's nccl-tests, pull request 43 (NavarrePratt, 2025-02-20, "feat(slurm): Add a GB200
# NVL72 example"), "Example output for a full nvl72 rack run": all_reduce_perf on 72 ranks (its
# device report trimmed to "#  Rank 71 ... on slurm-gb200-207-171 device 3"), the slurm script's
# 18 nodes x 4 tasks (slurm/nccl-test-distributed-gb200-nvl72-enroot.slurm: NCCL_MNNVL_ENABLE=1,
# NCCL_IB_HCA=ibp), out-of-place busbw from 512 MiB to 8 GiB. The PR's multi-rack table (144
# ranks) is not reproduced here: only its first lines could be read.
_CW43 = "https://github.com/coreweave/nccl-tests/pull/43"
ROWS += _table("GB200 NVL72, one full rack (18 hosts of 4, MNNVL), CoreWeave", "all_reduce",
               "GB200", 18, 4, "IB-NDR", 4,
               [(512 * MIB, 586.06), (1 * GIB, 681.17), (2 * GIB, 757.78), (4 * GIB, 839.16),
                (8 * GIB, 834.57)],
               source=_CW43 + " (description, 'Example output for a full nvl72 rack run')",
               provenance=FULL_TABLE, fabric="NVLink", nvlink_domain_gpus=72,
               stated="full NVL72 rack run, 72 ranks (last '# Rank 71' line kept), "
                      "all_reduce_perf 512M..8G",
               inferred="18 hosts x 4 GPUs and MNNVL from the PR's slurm script; NICs (4 x "
                        "400 Gb/s InfiniBand per tray, as the DGX GB200 user guide states: "
                        "unused inside one domain); NCCL version not stated")

# nccl#2169 (erfiboy, 2026-05-11, a question: alltoall busbw drops ~12-15% just above 512 MB),
# comment with "NCCL v2.30.4": one node of 4 H100 80GB HBM3, alltoall_perf -b 500M -e 524M -g 1
# -n 10 -w 1 (NCCL_ALGO=Ring NCCL_PROTO=Simple set), nccl-tests 2.17.8, nccl-library=23004. The
# sweep steps by 1 MiB (step: 1048576(bytes)), so its first size is 524288000 bytes (500 MiB),
# not a power of two; only that row (below the drop the thread asks about) is recorded.
_I2169 = "https://github.com/NVIDIA/nccl/issues/2169"
ROWS.append(PublishedRow("4x H100 (one node), NVLink4, all-to-all (nccl#2169)", "all_to_all",
                         "H100", 1, 4, None, 0, 500 * MIB, 334.90, "auto", "test", "nccl-tests",
                         _I2169 + " (comment of erfiboy, 'NCCL v2.30.4', first row)",
                         provenance=FULL_TABLE, fabric="NVLink", nccl_version="2.30.4",
                         stated="one node, 4x H100 80GB HBM3, alltoall_perf -b 500M -e 524M -g 1 "
                                "-n 10 -w 1, NCCL_ALGO=Ring NCCL_PROTO=Simple, NCCL 2.30.4; "
                                "first size of a 1 MiB-step sweep",
                         inferred=""))

# SkyPilot, examples/gcp_gpu_direct_tcpx/README.md, section "GPUDirect-RDMA on A3-ultragpu-8g
# (H200)": "a 2-node cluster with 16x H200 GPUs (8 per node)" on GKE, all_gather_perf -b 1K -e 8G
# -f 2, 16 ranks; the first table is SkyPilot's run (NCCL version not printed), the second "raw
# NCCL test pods from GCP documentation" (NCCL 2.26.6+cuda12.8). The README calls them matching
# "Google's official benchmarks". Neither states the NICs: a3-ultragpu-8g has 8 RDMA NICs
# (GPUDirect-RDMA, RoCE) of 400 Gb/s, from Google's machine description, not this source.
_SKYPILOT = ("https://github.com/skypilot-org/skypilot/blob/master/examples/gcp_gpu_direct_tcpx/"
             "README.md")
for _label, _where, _version, _busbw in (
        ("SkyPilot run", "section GPUDirect-RDMA on A3-ultragpu-8g (H200), SkyPilot run", None,
         [16.82, 135.41, 251.88, 322.23, 325.72]),
        ("GCP test pods", "section Comparing with raw NCCL test pods from GCP documentation",
         "2.26.6", [17.97, 133.76, 254.87, 321.93, 325.52])):
    ROWS += _table(f"2 nodes of 8x H200 (GCP a3-ultragpu-8g), GPUDirect-RDMA, {_label}",
                   "all_gather", "H200", 2, 8, "Ethernet-400G", 8,
                   list(zip((*_SIZES_5, 8 * GIB), _busbw)), source=_SKYPILOT + f" ({_where})",
                   provenance=FULL_TABLE, fabric="RoCE", nccl_version=_version,
                   stated="GKE a3-ultragpu-8g, 2 nodes x 8 H200, GPUDirect-RDMA, all_gather_perf "
                          "-b 1K -e 8G -f 2, 16 ranks"
                          + (", NCCL 2.26.6" if _version else ""),
                   inferred="NICs (8 x 400 Gb/s RoCE per node: not stated in the source)")

# Google Cloud docs, "Run NCCL on custom GKE clusters that use A4X Max", section "Test on two
# nodes" (page last updated 2026-04-06): output of all_gather_perf (the command shown says
# "-t alltoall", the output's header "Collective test starting: all_gather_perf"; its count column
# is all-gather's), 2 nodes x 4 GB300, nccl-library=22809 (2.28.9), -b 4K -e 16G -f 2, "If Pods
# are scheduled on nodes in distinct NVLink domains, this test represents cross-domain RDMA
# throughput, as shown in the provided output." "The output is similar to the following".
_GCP_A4X_MAX = "https://docs.cloud.google.com/ai-hypercomputer/docs/nccl/test-gke-custom-a4x-max"
ROWS += _table("2 nodes of 4x GB300 (GCP A4X Max), distinct NVLink domains, RDMA",
               "all_gather", "GB300", 2, 4, "Ethernet-400G", 8,
               list(zip((*_SIZES_5, 16 * GIB), [14.38, 77.37, 297.79, 337.55, 357.13])),
               source=_GCP_A4X_MAX + " (section Test on two nodes)", provenance=FULL_TABLE,
               fabric="RoCE", nccl_version="2.28.9",
               stated="GKE A4X Max, 2 nodes x 4 GB300 in distinct NVLink domains ('cross-domain "
                      "RDMA throughput'), all_gather_perf 4K..16G -f 2, nccl-library=22809; "
                      "'output is similar to the following'",
               inferred="NICs (8 x 400 Gb/s RoCE per node, as OCI states for GB300 hosts: not "
                        "stated in the source); the NCCL version from nccl-library=22809")

# --- Rows from systems their own thread calls broken (role "unhealthy") -----------------------
# Never tests of the model: published logs of systems that lost bandwidth, for a diagnosis tool.
_UNHEALTHY_2409 = ("2 x 8x H100 SXM, 8x CX-7 400 Gb/s RoCEv2 per node, NCCL 2.31.2; as filed "
                   "(later found: PCIe ACS redirection with IOMMU translated, and "
                   "NCCL_IB_SPLIT_DATA_ON_QPS=1)")
UNHEALTHY_ROWS: list[PublishedRow] = [
    # nccl-tests issue 290 (shahizat, 2025-03-03/04): 2 nodes of 8 H100, NDR 400G IB with CX-7
    # NICs (8 HCAs in UCX_NET_DEVICES / NCCL_IB_HCA), "observed some performance degradation";
    # NCCL's choice, then NCCL_ALGO=RING (+ IB env vars). NVIDIA: "For NDR @ 400Gbps you should
    # see 46-48GB/s per NIC"; the ring gets 89.9 GB/s for 8 NICs. The thread ends unresolved.
    *[row for algo, values, where in (
        ("auto", [119.65, 159.72, 149.85, 155.57], "issue body"),
        ("ring", [63.50, 99.88, 87.84, 89.90], "comment of shahizat, 2025-03-04"))
      for row in _table(f"2 nodes of 8x H100, NDR 400G IB, degraded, {algo}", "all_reduce",
                        "H100", 2, 8, "IB-NDR", 8,
                        list(zip((16 * MIB, 128 * MIB, 1 * GIB, 8 * GIB), values)),
                        source=_I290 + f" ({where})", role="unhealthy", algorithm=algo,
                        provenance=FULL_TABLE, fabric="InfiniBand",
                        stated="2 H100 nodes, NDR IB, Quantum-2 switches, CX-7 NICs; 'performance "
                               "degradation'" + ("; NCCL_ALGO=RING" if algo == "ring" else ""),
                        inferred="NICs per node (8, from the 8 HCAs listed); that it is "
                                 "unhealthy (the maintainer's 46-48 GB/s per NIC)")],
    # NCCL issue 2409 (2026-09-14), the summary table as filed, and after the platform fix alone.
    *[PublishedRow(f"2 nodes of 8x H100, 8x 400G RoCE, as filed (nccl#2409) {op}", op, "H100", 2,
                   8, "Ethernet-400G", 8, size, value, "auto", "unhealthy", "nccl-tests",
                   _I2409 + " (issue body, Summary)", provenance=USER_STATEMENT, fabric="RoCE",
                   nccl_version="2.31.2", stated=_UNHEALTHY_2409, inferred="")
      for op, size, value in (("all_reduce", 1 * GIB, 216.5), ("all_reduce", 8 * GIB, 231.0),
                              ("all_gather", 256 * MIB, 101.0),
                              ("reduce_scatter", 256 * MIB, 100.0),
                              ("all_to_all", 256 * MIB, 25.0))],
    PublishedRow("2 nodes of 8x H100, 8x 400G RoCE, platform fixed, SPLIT_DATA_ON_QPS=1",
                 "all_reduce", "H100", 2, 8, "Ethernet-400G", 8, 1 * GIB, 358.0, "auto",
                 "unhealthy", "nccl-tests", _I2409 + " (comment of 2026-09-15, 'Resolved')",
                 provenance=USER_STATEMENT, fabric="RoCE", nccl_version="2.31.2",
                 stated="as filed but iommu=pt and ACS cleared; NCCL_IB_SPLIT_DATA_ON_QPS=1 still "
                        "set, which the thread then finds halves RoCE bandwidth",
                 inferred=""),
]


def rows(role: str | None = None) -> list[PublishedRow]:
    """The published rows of one role.

    Args:
        role: ``"set"``, ``"test"``, ``"unhealthy"``, or None: all healthy rows (``"set"`` and
            ``"test"``, i.e. :data:`ROWS`; unhealthy rows only when asked for by name).
    """
    if role not in (None, *ROLES):
        raise ValueError(f"role must be 'set', 'test', 'unhealthy' or None, got {role!r}.")
    if role == "unhealthy":
        return list(UNHEALTHY_ROWS)
    return [row for row in ROWS if role is None or row.role == role]


def rows_in(regime: tuple[str | None, str | None, str | None] | None = None, *,
            nodes: str | None = None, fabric: str | None = None, op: str | None = None,
            provenance: str | tuple[str, ...] | None = None,
            role: str | None = None) -> list[PublishedRow]:
    """The rows of :func:`rows` (``role``) in one regime and of given provenances.

    Args:
        regime: ``(nodes, fabric, op family)`` as :attr:`PublishedRow.regime` gives it; any
            element may be None (any).
        nodes, fabric, op: the same three one by one (``op`` is an op family:
            ``"all_reduce"``, ``"all_gather/reduce_scatter"``, ``"all_to_all"``).
        provenance: one of :data:`PROVENANCES` or a tuple of them; None: any.
        role: as :func:`rows`.
    """
    want = list(regime) if regime is not None else [None, None, None]
    if len(want) != 3:
        raise ValueError(f"regime must be (nodes, fabric, op family), got {regime!r}.")
    for i, value in enumerate((nodes, fabric, op)):
        if value is not None:
            want[i] = value
    for value, allowed, name in zip(want, (NODE_CLASSES + DOMAIN_CLASSES, FABRICS, OP_FAMILIES),
                                    ("nodes", "fabric", "op family")):
        if value is not None and value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}.")
    provenances = (provenance,) if isinstance(provenance, str) else provenance
    if provenances is not None and not set(provenances) <= set(PROVENANCES):
        raise ValueError(f"provenance must be in {PROVENANCES}, got {provenance!r}.")
    return [row for row in rows(role)
            if all(w is None or w == r for w, r in zip(want, row.regime))
            and (provenances is None or row.provenance in provenances)]


def regimes(role: str | None = None) -> dict[tuple[str, str, str], int]:
    """How many rows (of ``role``) each regime has, in a stable order."""
    counts: dict[tuple[str, str, str], int] = {}
    for row in rows(role):
        counts[row.regime] = counts.get(row.regime, 0) + 1
    return dict(sorted(counts.items()))


def uncovered_regimes(role: str | None = None) -> list[tuple[str, str, str]]:
    """The regimes that exist (NVLink on one node or one NVLink domain; every scale-out fabric
    on 2 and >2 of them) and have no row of ``role`` (None: no healthy row), in a stable
    order."""
    covered = set(regimes(role))
    possible = []
    for classes in (NODE_CLASSES, DOMAIN_CLASSES):
        possible += [(classes[0], "NVLink", family) for family in OP_FAMILIES]
        possible += [(nodes, fabric, family) for nodes in classes[1:]
                     for fabric in FABRICS[1:] for family in OP_FAMILIES]
    return [regime for regime in possible if regime not in covered]
