"""Is this nccl-tests result normal? Read a run, and judge it against NCCL's own model.

``python -m clusterlab expect`` is this module on the command line. It reads what nccl-tests
prints (the text table of any ``*_perf`` binary, or its ``-J``/``--output_file`` JSON), asks
:func:`clusterlab.analytic.costmodel.cluster_collective` (NCCL 2.30.7's tuning model) what busbw it
expects at each measured size, and gives one verdict per size:

* ``normal``: at or above the band's floor, at or below the line rate;
* ``low``: below the floor, with the likely causes for that configuration;
* ``high``: above the line rate of the links a ring uses (or the expectation, where that is
  higher) by more than ``costmodel.BAND_MARGIN``: in-network reduction or a 2-node tree.

The floor is not a fixed margin: it is the model's own measured error in the size's regime
(nodes, fabric, op family, size class; :func:`clusterlab.analytic.costmodel.validation_by_regime`).
In a regime with at least ``costmodel.MIN_VALIDATION_ROWS`` published test rows the floor is
``expected / (1 + largest over-prediction of a healthy row) * (1 - BAND_MARGIN)``: a run that
falls below it is slower than every healthy published run was, relative to the model. Elsewhere
the expectation is unvalidated: the floor is ``(1 - UNVALIDATED_BAND) * expected`` and every
verdict says so (``"low (expectation unvalidated: no published rows for ...)"``). The
expectation is *validated* only where the regime's median |error| is within
``costmodel.TOLERANCE`` (15%) and the run's node count lies within the rows'; otherwise each
verdict says it is only tested (with the median error) or extrapolated (with the rows' span).
A band catches a loss only when the regime's errors are narrow enough
(:func:`clusterlab.analytic.costmodel.smallest_caught_loss`); where it cannot catch a loss of
``LOSS_TO_CATCH`` (40%), a normal verdict says so (``"normal (band -11..+65%: cannot detect a
40% loss here, only one over 46%)"``).

Units: sizes in bytes as nccl-tests' ``size`` column counts them; busbw in GB/s (1e9 bytes/s),
out-of-place, per GPU and direction, as nccl-tests prints it.

References:
    NVIDIA nccl-tests v2.19.6: ``src/util.cu`` (the text table, ``writeBenchmarkLine*``, and the
    JSON writer, ``JSON_FILE_VERSION`` 1-3: ``results[i].size``,
    ``results[i].out_of_place.bus_bw``, ``args``, ``config.devices``, ``nccl_version``) and
    ``doc/PERFORMANCE.md`` (busbw). https://github.com/NVIDIA/nccl-tests
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass

from clusterlab.analytic import costmodel
from clusterlab.catalog import hardware

#: The collectives ``expect`` judges, and the nccl-tests binary that measures each.
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
PERF_BINARIES = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf",
                 "reduce_scatter": "reduce_scatter_perf", "all_to_all": "alltoall_perf"}
_OP_OF_BINARY = {binary: op for op, binary in PERF_BINARIES.items()}
#: The NIC ``expect`` prices between nodes when ``--nic`` names none: one 400 Gb/s NDR
#: InfiniBand port per GPU, as in the catalog's DGX H100, H200 and B200 servers.
DEFAULT_NIC = "IB-NDR"
#: The loss of bandwidth every verdict should catch; a normal verdict in a regime whose band
#: cannot (``costmodel.smallest_caught_loss``) says so.
LOSS_TO_CATCH = 0.40
_BINARY = re.compile(r"\b(all_reduce|all_gather|reduce_scatter|alltoall)_perf(?:_mpi)?\b")
_TAG = re.compile(r"\[\d+(?:,\d+)?\](?:<stdout>:)?")
_RANK = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+"
                   r"\d+\s+\[[^\]]*\]\s+(.+?)\s*$")


@dataclass(frozen=True)
class Measurement:
    """What one nccl-tests output holds.

    Attributes:
        rows: ``(size_bytes, out-of-place busbw in GB/s)`` per size, sizes increasing (the
            median where a size appears several times, as with ``-N`` repeats).
        op: the collective its binary name says (``"all_to_all"`` for ``alltoall_perf``), or
            None when the output names no binary (a trimmed table).
        ranks: ranks of its device report (``#  Rank  0 Group 0 Pid ... on HOST device
            ...``), or None when it lists none. nccl-tests lists ranks 0 to n-1; where the
            report lists only some of them (a trimmed log that keeps the last ``# Rank`` line)
            this is the highest rank listed + 1, a lower bound (``report_complete`` False).
        hosts: distinct host names among the listed ranks (None without a device report); a
            lower bound where the report is not complete.
        devices: the distinct device names reported (e.g. ``"NVIDIA H100 80GB HBM3"``).
        nccl_version: the NCCL library version it ran (``"2.27.3"``), or None.
        format: ``"text"`` or ``"json"``.
    """

    rows: tuple[tuple[int, float], ...]
    op: str | None = None
    ranks: int | None = None
    hosts: int | None = None
    devices: tuple[str, ...] = ()
    nccl_version: str | None = None
    format: str = "text"
    report_complete: bool = True


def parse_nccl_tests(text: str) -> list[tuple[int, float]]:
    """``(size_bytes, out-of-place busbw in GB/s)`` for each data row of an nccl-tests output.

    Reads the table printed by any ``*_perf`` binary of nccl-tests: header lines start with
    ``#``; each data row is ``size count type redop root time algbw busbw #wrong`` for the
    out-of-place run, then the same columns for the in-place run. The out-of-place busbw is
    the column of the header's first ``busbw`` (which also reads ``-I 1`` per-iteration
    tables, older tables without ``root``, and trimmed copies whose header names only ``size
    time algbw busbw``); without a header it is the sixth column from the end. Tags that
    mpirun adds (``[0]``, ``[1,0]<stdout>:``) and thousands separators (``1_048_576``) are
    removed; rows of size 0 and ``N/A`` or ``nan`` values are skipped.

    Args:
        text: the whole output.

    Returns:
        The rows in file order; empty when the text holds no nccl-tests table.
    """
    rows, busbw_at = [], None
    for raw in text.splitlines():
        line = _TAG.sub(" ", raw).strip()
        tokens = line.lstrip("#").split()
        if "busbw" in tokens and "size" in tokens:
            busbw_at = tokens.index("busbw") - tokens.index("size")
            continue
        if not tokens or line.startswith("#") or not tokens[0].replace("_", "").isdigit():
            continue
        if busbw_at is not None and len(tokens) > busbw_at:
            value = tokens[busbw_at]
        elif busbw_at is None and len(tokens) >= 10:
            value = tokens[-6]
        else:
            continue
        try:
            size, busbw = int(tokens[0].replace("_", "")), float(value)
        except ValueError:
            continue
        if size > 0 and busbw == busbw:
            rows.append((size, busbw))
    return rows


def _json_document(text: str, name: str) -> dict:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{name} is not complete JSON ({error.msg} at line {error.lineno}); "
                         "nccl-tests closes its -J file when the run ends, so a run that "
                         "stopped early leaves it open: rerun it, or give its text output."
                         ) from None
    if not isinstance(document, dict) or not isinstance(document.get("results"), list):
        raise ValueError(f"{name} is JSON but holds no 'results' list; give the file that "
                         "nccl-tests writes with -J/--output_file FILE.json (or its text output).")
    return document


def parse_nccl_tests_json(text: str) -> list[tuple[int, float]]:
    """``(size_bytes, out-of-place busbw in GB/s)`` per result of an nccl-tests JSON output.

    nccl-tests writes (``-J FILE.json``, ``JSON_FILE_VERSION`` 1 to 3) one object with
    ``results``: a list of ``{"size", "count", "type", "redop", "root", "out_of_place":
    {"time", "alg_bw", "bus_bw", "nwrong"}, "in_place": {...}, ...}``; ``out_of_place`` is null
    in trace-replay runs, and a NaN is the string ``"nan"``. Such results are skipped.

    Args:
        text: the whole file.

    Returns:
        The rows in file order.

    Raises:
        ValueError: the text is not JSON, or holds no ``results`` list.
    """
    rows = []
    for result in _json_document(text, "The text")["results"]:
        if not isinstance(result, dict):
            continue
        out_of_place = result.get("out_of_place")
        if not isinstance(out_of_place, dict):
            continue
        try:
            size, busbw = int(result["size"]), float(out_of_place["bus_bw"])
        except (KeyError, TypeError, ValueError):
            continue
        if size > 0 and busbw == busbw:
            rows.append((size, busbw))
    return rows


def _nccl_version(code: int) -> str:
    """NCCL_VERSION_CODE to text: 22703 -> ``"2.27.3"`` (codes below 10000: 2.8 and older)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def read_measurement(text: str, *, name: str = "the log") -> Measurement:
    """Read an nccl-tests output, text or JSON (a text starting with ``{`` is JSON).

    Args:
        text: the whole output.
        name: how error messages call it (a file name).

    Returns:
        A :class:`Measurement`.

    Raises:
        ValueError: no table or results, outputs of several binaries in one file, or broken
            JSON; the message names the fix.
    """
    if text.lstrip().startswith("{"):
        document = _json_document(text, name)
        parsed = parse_nccl_tests_json(text)
        args = document.get("args") or []
        binaries = {m.group(1) for arg in args[:1] if isinstance(arg, str)
                    for m in [_BINARY.search(arg)] if m}
        config = document.get("config") if isinstance(document.get("config"), dict) else {}
        devices = [d for d in config.get("devices") or [] if isinstance(d, dict)]
        ranks = {d["rank"] for d in devices if isinstance(d.get("rank"), int)} or None
        hosts = {d.get("hostname") for d in devices} if devices else None
        names = tuple(sorted({str(d.get("device_info", "")).strip() for d in devices} - {""}))
        code = document.get("nccl_version")
        version = _nccl_version(code) if isinstance(code, int) and code > 0 else None
        kind = "json"
        if not parsed:
            raise ValueError(f"{name} is nccl-tests JSON with no out-of-place results; give "
                             "the -J file of a run that finished at least one size.")
    else:
        parsed = parse_nccl_tests(text)
        # nccl-tests names its binary in "# Collective test starting: NAME"; a log without that
        # line (an older or trimmed one) is taken by the first binary name it mentions.
        binaries = {m.group(1) for line in re.findall(r"Collective test starting:\s*(\S+)", text)
                    for m in [_BINARY.search(line)] if m}
        first = _BINARY.search(text)
        if not binaries and first:
            binaries = {first.group(1)}
        found = [m for m in (_RANK.search(_TAG.sub(" ", line).strip())
                             for line in text.splitlines()) if m]
        ranks = {int(m.group(1)) for m in found} if found else None
        hosts = {m.group(2) for m in found} if found else None
        names = tuple(sorted({m.group(3) for m in found}))
        code = re.search(r"nccl-library=(\d+)", text)
        named = re.search(r"NCCL version (\d+\.\d+\.\d+)", text)
        version = (_nccl_version(int(code.group(1))) if code
                   else named.group(1) if named else None)
        kind = "text"
        if not parsed:
            raise ValueError(f"{name} holds no nccl-tests table (rows of size, count, type, "
                             "..., time, algbw, busbw); give the output of an nccl-tests *_perf "
                             "binary (text, or its -J JSON file).")
    if len(binaries) > 1:
        listed = " and ".join(f"{b}_perf" for b in sorted(binaries))
        raise ValueError(f"{name} holds outputs of {listed}; give one collective's output per "
                         "file.")
    by_size: dict[int, list[float]] = {}
    for size, busbw in parsed:
        by_size.setdefault(size, []).append(busbw)
    rows = tuple((size, float(statistics.median(values)))
                 for size, values in sorted(by_size.items()))
    op = _OP_OF_BINARY[f"{binaries.pop()}_perf"] if binaries else None
    # nccl-tests lists every rank, 0 to n-1; a report missing some (a trimmed log) still says
    # that at least highest + 1 ranks ran.
    complete = ranks is None or ranks == set(range(len(ranks)))
    rank_count = None if ranks is None else max(ranks) + 1
    return Measurement(rows, op, rank_count, None if hosts is None else len(hosts), names,
                       version, kind, complete)


def check_measurement(measurement: Measurement, op: str, cluster: hardware.ClusterSpec, *,
                      name: str = "the log") -> None:
    """Refuse to judge a run against a cluster it did not run on.

    Checks what the output itself states: the collective (its binary's name), the rank and host
    count of its device report, and the GPU model.

    Args:
        measurement: the run (:func:`read_measurement`).
        op: the collective it is judged as.
        cluster: the cluster it is judged against.
        name: what to call the output in messages.

    Raises:
        ValueError: a mismatch; the message names the option that fixes it.
    """
    nodes, gpus_per_node, gpu = cluster.n_nodes, cluster.gpus_per_node, cluster.gpu.name
    if measurement.op is not None and measurement.op != op:
        raise ValueError(f"{name} is an {PERF_BINARIES[measurement.op]} output; judge it with "
                         f"'expect {measurement.op}', not '{op}'.")
    if not measurement.report_complete:
        _check_partial_report(measurement, cluster, name)
    elif measurement.ranks is not None and measurement.ranks != nodes * gpus_per_node:
        hosts = measurement.hosts or 1
        hint = (f"--nodes {hosts} --gpus-per-node {measurement.ranks // hosts}"
                if measurement.ranks % hosts == 0 else "--nodes and --gpus-per-node")
        raise ValueError(f"{name} ran on {measurement.ranks} ranks on {hosts} host(s), not "
                         f"{nodes} x {gpus_per_node}; give {hint}.")
    elif measurement.hosts is not None and measurement.hosts != nodes and nodes > 1:
        raise ValueError(f"{name} ran on {measurement.hosts} host(s), not {nodes}; give "
                         f"--nodes {measurement.hosts}.")
    logged = {known for device in measurement.devices for known in hardware.GPUS
              if re.search(rf"(?<![A-Za-z0-9]){known}(?![0-9])", device)}
    if logged and gpu not in logged:
        raise ValueError(f"{name} ran on {', '.join(measurement.devices)}; give --gpu "
                         f"{sorted(logged)[0]}, not {gpu}.")


def _check_partial_report(measurement: Measurement, cluster: hardware.ClusterSpec,
                          name: str) -> None:
    """A device report with some ``# Rank`` lines cut gives lower bounds only: the highest rank
    listed + 1, and the hosts named."""
    nodes, gpus_per_node = cluster.n_nodes, cluster.gpus_per_node
    trimmed = ("its '# Rank' lines were trimmed, so it cannot say how many ranks ran: give the "
               "run's own --nodes and --gpus-per-node")
    if measurement.ranks is not None and measurement.ranks > nodes * gpus_per_node:
        raise ValueError(f"{name} lists rank {measurement.ranks - 1}, so it ran on at least "
                         f"{measurement.ranks} ranks, more than {nodes} x {gpus_per_node}; "
                         f"{trimmed}.")
    if measurement.hosts is not None and measurement.hosts > nodes:
        raise ValueError(f"{name} names {measurement.hosts} hosts, more than {nodes} node(s); "
                         f"{trimmed}.")


#: The network transports (NCCL's net plugin) ``expect --transport`` names. NCCL 2.30.7's tuning
#: model prices NET/IB, GPUDirect RDMA over InfiniBand or RoCE verbs: its network latencies are
#: tuning.cc's, with no plugin latency (``latencyInter = 0``). The others move data another way.
TRANSPORTS = {
    "ib": "NCCL's NET/IB (InfiniBand or RoCE verbs, GPUDirect RDMA)",
    "efa": "AWS EFA through the aws-ofi-nccl plugin (NET/OFI over SRD)",
    "tcpxo": "GCP's GPUDirect-TCPXO (the FasTrak net plugin: TCP, payloads through the NICs' "
             "DMA into GPU memory)",
    "socket": "NCCL's NET/Socket (TCP sockets through host memory, no RDMA)",
}
#: The fabric whose published rows judge a transport other than NET/IB (None: no model of it
#: and no rows).
_TRANSPORT_FABRIC = {"efa": "EFA", "tcpxo": None, "socket": "Ethernet"}


def check_transport(transport: str, op: str, sizes, cluster: hardware.ClusterSpec) -> None:
    """Refuse to judge a transport that NCCL's tuning model does not price, where no published
    rows of that transport validate it.

    ``ib`` is what the model prices. Another transport is judged only in regimes where published
    rows of it hold the model's error (EFA: ``clusterlab.catalog.published.nccl_tests`` rows of
    fabric EFA); elsewhere a healthy run would be called low on a model that does not apply.

    Args:
        transport: a key of :data:`TRANSPORTS` (``--transport``).
        op: the collective.
        sizes: the sizes to judge, bytes.
        cluster: the cluster.

    Raises:
        ValueError: an unknown transport, or one whose regime has too few published rows for
            some size; the message names what is missing.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"Unknown transport {transport!r}; use one of {', '.join(TRANSPORTS)}.")
    if transport == "ib" or cluster.n_nodes == 1:
        return
    unpriced = (f"--transport {transport} is {TRANSPORTS[transport]}; NCCL "
                f"{costmodel.NCCL_RELEASE}'s tuning model prices {TRANSPORTS['ib']}, not this "
                "transport's per-message costs")
    fabric = _TRANSPORT_FABRIC[transport]
    if fabric is None:
        raise ValueError(f"{unpriced}, and no published nccl-tests rows of it are in "
                         "clusterlab.catalog.published.nccl_tests: expect cannot judge it. "
                         "Missing: a model of its latency and bandwidth, or published rows of "
                         "this configuration (add them with their source).")
    errors = costmodel.regime_errors()
    for size in sizes:
        where = costmodel.regime(op, size, cluster.n_nodes, fabric)
        rows = len(errors.get(where, ()))
        if rows < costmodel.MIN_VALIDATION_ROWS:
            raise ValueError(f"{unpriced}; it is judged only against published rows of it, "
                             f"and {where} has {rows} (needs {costmodel.MIN_VALIDATION_ROWS}). "
                             "Missing: published nccl-tests rows of this configuration on "
                             f"{fabric} (add them with their source).")


def low_causes(op: str, nbytes: int, *, nodes: int, fabric: str, algorithm: str,
               multi_host_domain: bool = False) -> str:
    """The usual reasons a busbw is low in this configuration, most likely first
    (``multi_host_domain``: the NVLink domain spans hosts, NCCL's MNNVL)."""
    causes = []
    if multi_host_domain:
        causes.append("MNNVL off or failing (NCCL_MNNVL_ENABLE; NCCL 2.30.7 warns 'MNNVL ... "
                      "is available but not working': check the IMEX channels, "
                      "/dev/nvidia-caps-imex-channels, and nvidia-imex-ctl -N), so the hosts "
                      "talk over the NICs")
    if nbytes < 2**20:
        causes.append("latency-bound size: launch overhead (try nccl-tests -G 1, CUDA graphs), "
                      "CPU/NUMA binding of the ranks, NCCL_PROTO without LL/LL128")
    if nodes == 1 and fabric == "PCIe":
        causes.append("P2P through the CPU or disabled (NCCL_P2P_LEVEL, NCCL_P2P_DISABLE; "
                      "PCIe ACS on the switches: lspci -vvv | grep ACSCtl), IOMMU translation "
                      "(iommu=pt)")
    elif nodes == 1:
        causes.append("NVLink/NVSwitch degraded (nvidia-smi nvlink --status, fabric manager "
                      "running), P2P disabled (NCCL_P2P_DISABLE/NCCL_P2P_LEVEL), fewer channels "
                      "(NCCL_MAX_NCHANNELS, NCCL_MIN_CTAS)")
    else:
        causes.append("fewer NICs used than installed or a wrong HCA list (NCCL_IB_HCA; see the "
                      "NCCL INFO NET/IB lines), no GPUDirect RDMA (nvidia-peermem or dma-buf; "
                      "no 'GDRDMA' in NCCL INFO), NICs behind a shared PCIe switch or the CPU, "
                      "PCIe ACS redirection or IOMMU translation on the NICs' path (iommu=pt, "
                      "ACS off)")
        if fabric == "RoCE":
            causes.append("RoCE: wrong GID index or traffic class (NCCL_IB_GID_INDEX, "
                          "NCCL_IB_TC), no PFC/ECN on the switches, NCCL_IB_SPLIT_DATA_ON_QPS=1")
        elif fabric == "EFA":
            causes.append("EFA: the aws-ofi-nccl plugin not loaded (no NET/OFI in NCCL INFO), "
                          "FI_PROVIDER not efa")
        elif fabric == "Ethernet":
            causes.append("Ethernet: NCCL on sockets (NET/Socket in NCCL INFO, no RDMA), "
                          "NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD too low")
    if algorithm in ("nvls", "nvls_tree"):
        causes.append("NVLS off (NCCL_NVLS_ENABLE=0, or no multicast: nvidia-smi -q fabric "
                      "state; NCCL INFO lists no NVLS)")
    if algorithm.startswith("collnet") or (algorithm == "nvls" and nodes > 1):
        causes.append("SHARP off (NCCL_COLLNET_ENABLE=1 not set, or the SHARP plugin "
                      "(nccl-rdma-sharp-plugins' libnccl-net.so) not loaded: NCCL INFO lists no "
                      "CollNet), or the SHARP aggregation manager (sharp_am) not running on "
                      "the subnet manager's host")
    if op == "all_to_all":
        causes.append("all-to-all is priced by the course's estimate, not NCCL's model: rail "
                      "alignment (NCCL_PXN_DISABLE) and the NICs' share per GPU")
    return "; ".join(causes)


def _unvalidated(where: costmodel.Regime, rows: int) -> str:
    if rows == 0:
        return f"expectation unvalidated: no published rows for {where}"
    return (f"expectation unvalidated: only {rows} published row{'s' if rows > 1 else ''} for "
            f"{where} (needs {costmodel.MIN_VALIDATION_ROWS})")


def verdict(measured_gbps: float, estimate: costmodel.CollectiveEstimate, *,
            regime_rows: int) -> tuple[str, str]:
    """``(status, verdict)`` of one measured busbw against one :class:`CollectiveEstimate`.

    ``status`` is ``"normal"``, ``"low"`` (below ``estimate.low_busbw``) or ``"high"`` (above
    ``estimate.high_busbw``, the line rate or the expectation where that is higher, by more
    than ``costmodel.BAND_MARGIN``, the run-to-run noise the floor allows too); ``verdict`` is
    the text ``expect`` prints: ``"normal"``, ``"low: CAUSES"`` or ``"high: REASON"``, with
    ``" (expectation unvalidated: ...)"`` after the status where the regime is unvalidated.
    """
    low, high = estimate.low_busbw / 1e9, estimate.high_busbw / 1e9
    if measured_gbps < round(low, 2):
        status = "low"
        # Hosts of one NVLink domain cross no network: their causes are one node's.
        inside = estimate.regime.fabric in ("NVLink", "PCIe")
        detail = low_causes(estimate.op, int(estimate.nbytes),
                            nodes=1 if inside else estimate.n_nodes,
                            fabric=estimate.regime.fabric, algorithm=estimate.algorithm,
                            multi_host_domain="NVLink domain" in estimate.regime.nodes)
    elif measured_gbps > round(high * (1 + costmodel.BAND_MARGIN), 2):
        status = "high"
        detail = "above line rate, in-network reduction (NVLS, SHARP) or a tree on 2 nodes"
        if estimate.n_nodes > 1 and estimate.regime.fabric not in ("NVLink", "PCIe"):
            detail += ("; or hosts in one NVLink domain (an NVL72 rack: give --nvlink-domain "
                       "72)")
    else:
        status, detail = "normal", ""
    return status, _head(status, estimate, regime_rows) + (f": {detail}" if detail else "")


def _head(status: str, estimate: costmodel.CollectiveEstimate, regime_rows: int) -> str:
    """The status, with what the band cannot tell: an expectation that its regime's rows do not
    validate (too few rows, an error above ``costmodel.TOLERANCE``, a node count beyond the
    rows), or (for a normal verdict) a band too wide to catch a loss of ``LOSS_TO_CATCH``."""
    if regime_rows < costmodel.MIN_VALIDATION_ROWS:
        return f"{status} ({_unvalidated(estimate.regime, regime_rows)})"
    notes = [] if estimate.validated else [_not_validated(estimate)]
    errors = costmodel.regime_errors()[estimate.regime]
    caught = costmodel.smallest_caught_loss(errors)
    if status == "normal" and caught > LOSS_TO_CATCH:
        notes.append(f"band {100 * min(errors):+.0f}..{100 * max(errors):+.0f}%: cannot detect "
                     f"a {100 * LOSS_TO_CATCH:.0f}% loss here, only one over {100 * caught:.0f}%")
    return status + (f" ({'; '.join(notes)})" if notes else "")


def _not_validated(estimate: costmodel.CollectiveEstimate) -> str:
    """Why an expectation in a regime with enough rows is still not validated."""
    summary = costmodel.regime_summaries()[estimate.regime]
    if estimate.validation == "extrapolated":
        return f"extrapolated: the published rows span {summary.row_span()}"
    return (f"tested, not validated: median error {100 * summary.median_abs:.0f}% "
            f"(tolerance {100 * costmodel.TOLERANCE:.0f}%)")


def _regime_info(where: costmodel.Regime, validation: str) -> dict:
    """A regime's rows and errors, with ``validation``, the level of the estimates in it."""
    errors = costmodel.regime_errors().get(where, ())
    has_band = len(errors) >= costmodel.MIN_VALIDATION_ROWS
    summary = costmodel.regime_summaries().get(where)
    return {"regime": str(where), "rows": len(errors), "validation": validation,
            "validated": validation == "validated",
            "row_span": None if summary is None else summary.row_span(),
            "median_abs_error": round(statistics.median(abs(e) for e in errors), 4)
            if errors else None,
            "lowest_error": round(min(errors), 4) if errors else None,
            "highest_error": round(max(errors), 4) if errors else None,
            "smallest_caught_loss": (round(costmodel.smallest_caught_loss(errors), 4)
                                     if has_band else None)}


def cluster_from_options(gpu: hardware.GPU | str, nodes: int, gpus_per_node: int = 8, *,
            nic: str | None = None, nics_per_node: int | None = None,
            node_link: str | None = None, sharp: bool = False,
            nvlink_domain: int | None = None) -> hardware.ClusterSpec:
    """The cluster ``expect`` prices, from its options; ``nic`` is :data:`DEFAULT_NIC` between
    nodes when none is named.

    Args:
        gpu: a name in :data:`clusterlab.catalog.hardware.GPUS` (``--gpu``).
        nodes, gpus_per_node: ``--nodes``, ``--gpus-per-node``.
        nic, nics_per_node: ``--nic``, ``--nics-per-node`` (default one NIC per GPU).
        node_link: ``--node-link``: a link in ``hardware.LINKS`` replacing the GPU's NVLink.
        sharp: ``--sharp``: the InfiniBand switches reduce (NCCL CollNet, and NVLS across
            nodes).
        nvlink_domain: ``--nvlink-domain``: GPUs per NVLink domain where it spans hosts (72:
            an NVL72 rack); None: the node's.

    Returns:
        The :class:`~clusterlab.catalog.hardware.ClusterSpec`.
    """
    if nodes > 1 and nic is None:
        nic = DEFAULT_NIC
    return hardware.ClusterSpec(gpu=gpu, n_nodes=nodes, gpus_per_node=gpus_per_node, nic=nic,
                                nics_per_node=nics_per_node, intra_node_link=node_link,
                                sharp=sharp, nvlink_domain_gpus=nvlink_domain)


def verdicts(op: str, sizes, cluster: hardware.ClusterSpec, *, fabric: str | None = None,
             algorithm: str = "auto", measured: dict[int, float] | None = None) -> list[dict]:
    """The rows of ``expect``, one dict per size (the ``rows`` of ``expect --json``).

    Args:
        op: one of :data:`OPS`.
        sizes: message sizes in bytes (nccl-tests' ``size`` column).
        cluster: the cluster (:func:`cluster_from_options` builds it from ``expect``'s options).
        fabric: the network's kind, one of ``costmodel.FABRICS`` (default: by the NIC's name,
            NVLink or PCIe on one node); it picks the regime whose error sets the band.
        algorithm: ``"auto"`` (NCCL's choice) or the algorithm the run forced (``NCCL_ALGO``),
            one of ``costmodel.CLUSTER_ALGORITHMS``.
        measured: out-of-place busbw in GB/s per size, or None for expectations only.

    Returns:
        Per size: ``size_bytes``; ``expected_busbw_gbps``; ``low_gbps`` (the band's floor:
        ``CollectiveEstimate.low_busbw``); ``high_gbps`` (line rate); ``algorithm``
        (``algorithm/protocol``); ``regime`` (its text), ``validation`` (one of
        ``costmodel.VALIDATION_LEVELS``), ``validated`` (``validation == "validated"``),
        ``regime_rows``
        (published test rows in that regime) and ``smallest_caught_loss`` (the smallest loss
        the band always flags; None where unvalidated); ``measured_busbw_gbps``, ``status``
        (``normal``, ``low``, ``high``), ``verdict`` (the text: ``verdict_head``, then ``": "``
        and ``detail`` where there is one), ``verdict_head`` (the status, with the unvalidated
        note, or the loss a normal verdict cannot rule out, where there is one) and
        ``detail`` (low: the likely causes; high: the reason; normal: None), these five None
        without a measurement at that size. All busbw in GB/s.
    """
    if op not in OPS:
        raise ValueError(f"expect judges {', '.join(OPS)}, got {op!r}.")
    out = []
    for size in sizes:
        est = costmodel.cluster_collective(op, size, cluster, algorithm=algorithm,
                                           fabric=fabric)
        info = _regime_info(est.regime, est.validation)
        row = {"size_bytes": int(size), "expected_busbw_gbps": round(est.busbw / 1e9, 2),
               "low_gbps": round(est.low_busbw / 1e9, 2),
               "high_gbps": round(est.high_busbw / 1e9, 2),
               "algorithm": f"{est.algorithm}/{est.protocol}",
               "regime": info["regime"], "validation": est.validation,
               "validated": est.validated, "regime_rows": info["rows"],
               "smallest_caught_loss": info["smallest_caught_loss"],
               "measured_busbw_gbps": None, "status": None, "verdict": None,
               "verdict_head": None, "detail": None}
        if measured is not None and size in measured:
            row["measured_busbw_gbps"] = measured[size]
            row["status"], row["verdict"] = verdict(measured[size], est,
                                                    regime_rows=info["rows"])
            head = _head(row["status"], est, info["rows"])
            row["verdict_head"] = head
            row["detail"] = row["verdict"][len(head) + 2:] or None
        out.append(row)
    return out


def regimes(rows: list[dict]) -> list[dict]:
    """The distinct regimes of :func:`verdicts`' rows, in size order: ``regime``, ``rows``,
    ``validation`` and ``validated`` (as in the rows), ``row_span`` (where its published rows
    were measured, ``"4-12 nodes of up to 8 GPUs"``; None without rows), ``median_abs_error``, ``lowest_error``
    and ``highest_error`` (the model's error over that regime's published test rows,
    ``(model - published) / published``; None without rows) and ``smallest_caught_loss``
    (:func:`clusterlab.analytic.costmodel.smallest_caught_loss`; None with too few rows for a
    band)."""
    seen: dict[str, dict] = {}
    for row in rows:
        if row["regime"] not in seen:
            seen[row["regime"]] = _regime_info(costmodel.Regime(*row["regime"].split(", ")),
                                               row["validation"])
    return list(seen.values())


def band_text(info: dict) -> str:
    """One line on how a regime sets the band's floor (``expect``'s header)."""
    if info["smallest_caught_loss"] is None:
        rows = info["rows"]
        count = "no published rows" if rows == 0 else f"only {rows} published row(s)"
        return (f"{info['regime']}: UNVALIDATED ({count}); floor = "
                f"{1 - costmodel.UNVALIDATED_BAND:.2f} x expected")
    caught = info["smallest_caught_loss"]
    reach = (f"catches any loss over {100 * caught:.0f}%" if caught <= LOSS_TO_CATCH else
             f"cannot detect a {100 * LOSS_TO_CATCH:.0f}% loss, only one over "
             f"{100 * caught:.0f}%")
    level = {"validated": "VALIDATED", "tested": "TESTED, NOT VALIDATED",
             "extrapolated": f"EXTRAPOLATED (rows on {info['row_span']})"
             }[info["validation"]]
    return (f"{info['regime']}: {level}: {info['rows']} published rows, model error "
            f"{100 * info['lowest_error']:+.1f}..{100 * info['highest_error']:+.1f}% (median "
            f"|error| {100 * info['median_abs_error']:.1f}%, tolerance "
            f"{100 * costmodel.TOLERANCE:.0f}%); floor = expected / "
            f"{1 + info['highest_error']:.3f} x {1 - costmodel.BAND_MARGIN:.2f}; {reach}")


def format_table(rows: list[dict]) -> str:
    """The fixed-width table ``expect`` prints below its header; the causes of low (or the
    reason for high) verdicts follow it once each, as numbered notes."""
    lines = [f"#{'size (B)':>13} {'algorithm':>16} {'expected':>9} {'low':>8} {'high':>8} "
             f"{'measured':>9}  verdict"]
    notes: dict[str, int] = {}
    for row in rows:
        measured = ("" if row["measured_busbw_gbps"] is None
                    else f"{row['measured_busbw_gbps']:.2f}")
        said = row["verdict_head"] or ""
        if row["detail"]:
            said += f" [{notes.setdefault(row['detail'], len(notes) + 1)}]"
        lines.append(f"{row['size_bytes']:>14} {row['algorithm']:>16} "
                     f"{row['expected_busbw_gbps']:9.2f} {row['low_gbps']:8.2f} "
                     f"{row['high_gbps']:8.2f} {measured:>9}  {said}")
    for detail, number in notes.items():
        kind = "above line rate" if detail.startswith("above line rate") else "likely causes"
        text = detail if kind == "above line rate" else f"{kind}: {detail}"
        lines.append(f"# [{number}] {text}")
    return "\n".join(lines)


def report(rows: list[dict], op: str, cluster: hardware.ClusterSpec, *,
           algorithm: str = "auto", transport: str = "ib",
           measurement: Measurement | None = None, as_json: bool = False) -> str:
    """What ``expect`` prints: a header and :func:`format_table`, or the ``--json`` document.

    The JSON document (``expect --json``) holds ``nccl_release`` (the NCCL release whose tuning
    model priced the rows), ``configuration`` (op, gpu, nodes, gpus_per_node, nic,
    nics_per_node, nvlink_domain_gpus, sharp, transport, algorithm), ``regimes``
    (:func:`regimes`), ``measured`` (None, or the run's ``format``, ``op``, ``nccl_version``,
    ``ranks``, ``hosts``, ``report_complete`` and ``devices`` as :class:`Measurement` reads
    them) and ``rows`` (:func:`verdicts`).
    """
    found = regimes(rows)
    nodes, gpus_per_node, gpu = cluster.n_nodes, cluster.gpus_per_node, cluster.gpu.name
    if as_json:
        measured = None if measurement is None else {
            "format": measurement.format, "op": measurement.op,
            "nccl_version": measurement.nccl_version, "ranks": measurement.ranks,
            "hosts": measurement.hosts, "report_complete": measurement.report_complete,
            "devices": list(measurement.devices)}
        return json.dumps({"nccl_release": costmodel.NCCL_RELEASE,
                           "configuration": {"op": op, "gpu": gpu, "nodes": nodes,
                                             "gpus_per_node": gpus_per_node, "nic": cluster.nic,
                                             "nics_per_node": cluster.nics_per_node,
                                             "nvlink_domain_gpus":
                                                 cluster.gpus_per_nvlink_domain,
                                             "sharp": cluster.sharp, "transport": transport,
                                             "algorithm": algorithm},
                           "regimes": found, "measured": measured, "rows": rows}, indent=1)
    net = ("" if nodes == 1
           else f", {cluster.nics_per_node or gpus_per_node} x {cluster.nic} per node"
           + (f", NVLink domains of {cluster.gpus_per_nvlink_domain} GPUs"
              if cluster.gpus_per_nvlink_domain > gpus_per_node else "")
           + (", SHARP" if cluster.sharp else "")
           + ("" if transport == "ib" else f", transport {transport}"))
    forced = "" if algorithm == "auto" else f", NCCL_ALGO={algorithm}"
    lines = [f"# expected {op} on {nodes} x {gpus_per_node} {gpu}{net}{forced} as NCCL "
             f"{costmodel.NCCL_RELEASE} runs it "
             "(clusterlab.analytic.costmodel.cluster_collective); busbw in GB/s"]
    if measurement is not None and measurement.nccl_version:
        lines.append(f"# measured with NCCL {measurement.nccl_version}")
    if measurement is not None and not measurement.report_complete:
        lines.append(f"# its device report was trimmed: it lists ranks up to "
                     f"{measurement.ranks - 1}; the run's size is taken from --nodes and "
                     "--gpus-per-node")
    lines.append("# band per regime (model error over published nccl-tests rows):")
    lines += [f"#   {band_text(info)}" for info in found]
    lines.append(format_table(rows))
    return "\n".join(lines)
