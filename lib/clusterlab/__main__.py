"""Command line: ``python -m clusterlab bench OP --devices N --min 4K --max 64M``,
``python -m clusterlab plan --params 70e9 --tokens 2e12 --gpu H100 --gpus 1024``,
``python -m clusterlab expect all_reduce --gpu H100 --nodes 4 --measured all_reduce.log``
and ``python -m clusterlab grade SUBMISSION.ipynb --key keys``.

``bench`` prints an nccl-tests-style table for one collective on the devices JAX sees, or on
simulated CPU devices when there are not enough. ``plan`` prints the planner's ranking of
parallel layouts for a workload on a cluster (:mod:`clusterlab.plan`); it runs no JAX.
``expect`` prints the bus bandwidth :func:`clusterlab.costmodel.cluster_collective` expects per
message size, and with ``--measured`` holds an nccl-tests output against it; it runs no JAX. ``grade`` runs submitted lab
notebooks and grades every exercise from the instructor's key (:mod:`clusterlab.grading`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from clusterlab import collectives


def _size(text: str) -> int:
    from clusterlab.bench import parse_size
    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m clusterlab",
                                     description="Tools of the course GPU Clusters, Hands-On.")
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser(
        "bench", help="time a collective over message sizes (nccl-tests style)",
        description="Time a collective over message sizes and print size, count, type, time, "
                    "algbw and busbw as nccl-tests does. Sizes use powers of 1024 (4K = 4096 B).")
    bench.add_argument("op", choices=collectives.RUNNABLE_OPS)
    bench.add_argument("--devices", type=int, default=8, help="devices to use (default 8)")
    bench.add_argument("--min", dest="smallest", type=_size, default=_size("4K"),
                       help="smallest message, e.g. 4K (default)")
    bench.add_argument("--max", dest="largest", type=_size, default=_size("16M"),
                       help="largest message, e.g. 64M (default 16M)")
    bench.add_argument("--factor", type=int, default=2, help="size step factor (default 2)")
    bench.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "int32"))
    bench.add_argument("--implementation", default="builtin",
                       choices=collectives.IMPLEMENTATIONS)
    bench.add_argument("--warmup", type=int, default=2)
    bench.add_argument("--repeats", type=int, default=5)
    _plan_parser(commands)
    _expect_parser(commands)
    _grade_parser(commands)
    return parser


def _grade_parser(commands) -> None:
    grade = commands.add_parser(
        "grade", help="run submitted lab notebooks and grade every exercise from the key",
        description="Run each submitted notebook in its own kernel (a failing cell does not stop "
                    "it), then judge every exercise of its lab from the instructor's key "
                    "(keys/labNN.py): one line per exercise (✓, or ✗ with the hint) and a "
                    "total. An exercise whose check call was deleted scores zero. Exits 1 when "
                    "any exercise fails, 2 when a submission cannot be graded.")
    grade.add_argument("submissions", nargs="+", metavar="SUBMISSION.ipynb",
                       help="notebooks named like the lab they answer (NN-*.ipynb)")
    grade.add_argument("--key", default="keys", help="folder of the keys labNN.py (keys)")
    grade.add_argument("--timeout", type=float, default=600,
                       help="longest run of one cell, seconds (600)")


EXPECT_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def _expect_parser(commands) -> None:
    expect = commands.add_parser(
        "expect", help="expected nccl-tests busbw for a cluster; judge a measured log",
        description="Print the bus bandwidth (nccl-tests' busbw, GB/s) that "
                    "clusterlab.costmodel.cluster_collective expects per message size, with a "
                    "low-high band and the algorithm NCCL would pick. With --measured, read an "
                    "nccl-tests *_perf output (its out-of-place busbw column) and give a "
                    "verdict per size: normal, low (with likely causes) or high (above line "
                    "rate: in-network reduction).")
    expect.add_argument("op", choices=EXPECT_OPS)
    expect.add_argument("--gpu", required=True, help="GPU name in clusterlab.hardware, e.g. H100")
    expect.add_argument("--nodes", type=int, required=True, help="nodes")
    expect.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (8)")
    expect.add_argument("--nic", default=None,
                        help="NIC link in clusterlab.hardware.LINKS (IB-NDR when --nodes > 1)")
    expect.add_argument("--nics-per-node", type=int, default=None,
                        help="NICs per node NCCL uses (one per GPU)")
    expect.add_argument("--sizes", default="1M,8M,64M,512M,4G",
                        help="increasing sizes, powers of 1024 (1M,8M,64M,512M,4G)")
    expect.add_argument("--measured", help="an nccl-tests *_perf output file to judge")
    expect.add_argument("--json", action="store_true", help="print JSON instead of a table")


_TAG = re.compile(r"\[\d+(?:,\d+)?\](?:<stdout>:)?")
_NUMBER = re.compile(r"^-?[\d_]+(?:\.\d*)?(?:e[-+]?\d+)?$|^N/A$", re.IGNORECASE)


def parse_nccl_tests(text: str) -> list[tuple[int, float]]:
    """``(size_bytes, out-of-place busbw in GB/s)`` for each data row of an nccl-tests output.

    Reads the table printed by any ``*_perf`` binary of nccl-tests: header lines start with
    ``#``; each data row is ``size count type [redop] [root] time algbw busbw #wrong`` for the
    out-of-place run, then the same four columns for the in-place run, so the out-of-place
    busbw is the sixth column from the end. Tags that mpirun adds (``[0]``, ``[1,0]<stdout>:``)
    and thousands separators (``1_048_576``) are removed; a table whose header names only
    ``size time algbw busbw`` columns (a trimmed copy) is read by the header's column.

    Args:
        text: the whole output.

    Returns:
        The rows in file order; empty when the text holds no nccl-tests table.
    """
    rows, header = [], None
    for raw in text.splitlines():
        line = _TAG.sub(" ", raw).strip()
        tokens = line.lstrip("#").split()
        if "busbw" in tokens and "size" in tokens:
            header = tokens
            continue
        if not tokens or line.startswith("#") or not tokens[0].replace("_", "").isdigit():
            continue
        if header is not None and len(tokens) == len(header):
            value = tokens[header.index("busbw")]
        elif len(tokens) >= 10:
            value = tokens[-6]
        else:
            continue
        try:
            rows.append((int(tokens[0].replace("_", "")), float(value)))
        except ValueError:
            continue
    return rows


def _low_causes(n_nodes: int) -> str:
    if n_nodes == 1:
        return ("NVLink/NVSwitch degraded (nvidia-smi nvlink --status, fabric manager), NVLS "
                "off (NCCL_NVLS_ENABLE=0), P2P disabled (NCCL_P2P_DISABLE/NCCL_P2P_LEVEL), "
                "PCIe switch sharing")
    return ("fewer NICs used than installed or a wrong HCA list (NCCL_IB_HCA; see the "
            "NCCL INFO NET/IB line), no GPUDirect RDMA (nvidia-peermem not loaded), NICs "
            "behind a shared PCIe switch or the CPU, NVLS/SHARP off (NCCL_NVLS_ENABLE, "
            "NCCL_COLLNET_ENABLE)")


def expect_rows(op: str, gpu: str, nodes: int, gpus_per_node: int, nic: str | None,
                nics_per_node: int | None, sizes: list[int],
                measured: dict[int, float] | None = None) -> list[dict]:
    """The rows of ``expect``: the JSON schema of ``--json``, one dict per size.

    Keys: size_bytes, expected_busbw_gbps, low_gbps, high_gbps, algorithm (with protocol),
    measured_busbw_gbps and verdict (both None without a measurement). Verdict ``normal``
    within the band, ``low`` below it (with likely causes), ``high`` above ``high_gbps``, the
    line rate of the links a ring would use (only in-network reduction gets there).
    """
    from clusterlab import costmodel

    if nodes > 1 and nic is None:
        nic = "IB-NDR"
    out = []
    for size in sizes:
        est = costmodel.cluster_collective(op, size, gpu=gpu, n_nodes=nodes,
                                           gpus_per_node=gpus_per_node, nic=nic,
                                           nics_per_node=nics_per_node)
        row = {"size_bytes": int(size), "expected_busbw_gbps": round(est.busbw / 1e9, 2),
               "low_gbps": round(est.low_busbw / 1e9, 2),
               "high_gbps": round(est.high_busbw / 1e9, 2),
               "algorithm": f"{est.algorithm}/{est.protocol}",
               "measured_busbw_gbps": None, "verdict": None}
        if measured is not None and size in measured:
            value = measured[size]
            row["measured_busbw_gbps"] = value
            if value < row["low_gbps"]:
                row["verdict"] = "low: " + _low_causes(nodes)
            elif value > row["high_gbps"]:
                row["verdict"] = ("high: above line rate, in-network reduction (NVLS, SHARP) or "
                                  "a tree on 2 nodes")
            else:
                row["verdict"] = "normal"
        out.append(row)
    return out


def _sizes(text: str) -> list[int]:
    from clusterlab.bench import parse_size

    sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    for before, after in zip(sizes, sizes[1:]):
        if after <= before:
            raise ValueError(f"--sizes must increase: {after} B comes after {before} B; write "
                             "them smallest first, e.g. --sizes 1M,16M,256M.")
    if not sizes:
        raise ValueError("--sizes is empty; give sizes such as --sizes 1M,16M,256M.")
    return sizes


def _expect(args: argparse.Namespace) -> None:
    from clusterlab import hardware

    for flag, value, lookup in (("--gpu", args.gpu, hardware.gpu),
                                ("--nic", args.nic, hardware.link)):
        if value is not None:
            try:
                lookup(value)
            except ValueError as error:
                raise ValueError(f"{flag} {value}: {error} Use one of these names.") from None
    if args.nodes < 1 or args.gpus_per_node < 1:
        raise ValueError("--nodes and --gpus-per-node must be positive integers.")
    measured = None
    if args.measured:
        try:
            with open(args.measured, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError as error:
            raise ValueError(f"Cannot read {args.measured}: {error.strerror}; give the path of "
                             "a file holding an nccl-tests output (e.g. all_reduce_perf ... > "
                             "log).") from None
        named = re.search(r"\b(all_reduce|all_gather|reduce_scatter|alltoall)_perf\b", text)
        if named and named.group(1).replace("alltoall", "all_to_all") != args.op:
            found = named.group(1).replace("alltoall", "all_to_all")
            raise ValueError(f"{args.measured} is an {named.group(1)}_perf output; judge it with "
                             f"'expect {found}', not '{args.op}'.")
        parsed = parse_nccl_tests(text)
        if not parsed:
            raise ValueError(f"{args.measured} holds no nccl-tests table (rows of size, count, "
                             "type, ..., time, algbw, busbw); give the output of an nccl-tests "
                             "*_perf binary.")
        measured = dict(parsed)
        sizes = sorted(measured)
    else:
        sizes = _sizes(args.sizes)
    rows = expect_rows(args.op, args.gpu, args.nodes, args.gpus_per_node, args.nic,
                       args.nics_per_node, sizes, measured)
    if args.json:
        print(json.dumps({"rows": rows}, indent=1))
        return
    net = ("" if args.nodes == 1 else
           f", {args.nics_per_node or args.gpus_per_node} x {args.nic or 'IB-NDR'} per node")
    print(f"# expected {args.op} on {args.nodes} x {args.gpus_per_node} {args.gpu}{net} "
          "(clusterlab.costmodel.cluster_collective); busbw in GB/s")
    print(f"#{'size (B)':>13} {'algorithm':>14} {'expected':>9} {'low':>8} {'high':>8} "
          f"{'measured':>9}  verdict")
    for row in rows:
        measured_text = ("" if row["measured_busbw_gbps"] is None
                         else f"{row['measured_busbw_gbps']:.2f}")
        print(f"{row['size_bytes']:>14} {row['algorithm']:>14} "
              f"{row['expected_busbw_gbps']:9.2f} {row['low_gbps']:8.2f} "
              f"{row['high_gbps']:8.2f} {measured_text:>9}  {row['verdict'] or ''}")


def _plan_parser(commands) -> None:
    plan = commands.add_parser(
        "plan", help="size a cluster for a training run and rank parallel layouts",
        description="Predict memory per GPU, step time (compute, tensor-parallel and "
                    "data-parallel all-reduce, pipeline bubble, storage), MFU and time to train "
                    "for a dense transformer, for every layout that fits; or, with --budget-days "
                    "and no --gpus, the smallest cluster that meets the budget. Memory "
                    "counts model states and activations.")
    plan.add_argument("--params", type=float, required=True, help="model parameters, e.g. 70e9")
    plan.add_argument("--tokens", type=float, help="training tokens, e.g. 2e12")
    plan.add_argument("--budget-days", type=float, help="wall-clock budget in days")
    plan.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence (4096)")
    plan.add_argument("--batch", type=int, default=1024,
                      help="global batch in sequences (1024)")
    plan.add_argument("--layers", type=int, help="transformer layers (default: from --params)")
    plan.add_argument("--d-model", type=int, help="model width (default: from --params)")
    plan.add_argument("--recompute", action="store_true", help="full activation recomputation")
    plan.add_argument("--bytes-per-token", type=float, default=4.0,
                      help="bytes read from storage per token (4)")
    plan.add_argument("--gpu", default="H100", help="GPU name in clusterlab.hardware (H100)")
    plan.add_argument("--gpus", type=int, help="GPUs in the cluster")
    plan.add_argument("--gpus-per-node", type=int, default=8)
    plan.add_argument("--node-link", help="node interconnect in clusterlab.hardware.LINKS "
                                          "(default: the GPU's NVLink)")
    plan.add_argument("--fabric", default="IB-NDR", help="fabric link per NIC (IB-NDR)")
    plan.add_argument("--nics-per-node", type=int, help="fabric NICs per node (one per GPU)")
    plan.add_argument("--storage-gb-s", type=float, default=20.0,
                      help="shared storage read throughput in GB/s (20)")
    plan.add_argument("--efficiency", type=float, default=0.6,
                      help="fraction of peak FLOP/s while computing (0.6)")
    plan.add_argument("--overlap", type=float, default=0.5,
                      help="hidden fraction of the data-parallel all-reduce (0.5)")
    plan.add_argument("--reserve", type=float, default=0.1,
                      help="fraction of GPU memory kept free for workspace (0.1)")
    plan.add_argument("--top", type=int, default=10, help="layouts to show (10)")


def _plan(args: argparse.Namespace) -> None:
    from clusterlab import plan

    workload = plan.Workload(
        args.params, args.seq_len, args.batch, n_tokens=args.tokens,
        time_budget_s=None if args.budget_days is None else args.budget_days * 86400,
        n_layers=args.layers, d_model=args.d_model, bytes_per_token=args.bytes_per_token,
        recompute=args.recompute)
    assumptions = plan.Assumptions(args.efficiency, args.overlap, args.reserve)
    if args.gpus is None:
        if args.budget_days is None or args.tokens is None:
            raise ValueError("Give --gpus, or --tokens and --budget-days to size the cluster.")
        design = plan.cluster(args.gpu, args.gpus_per_node,
                              storage_read_bytes_per_s=args.storage_gb_s * 1e9,
                              gpus_per_node=args.gpus_per_node, node_link=args.node_link,
                              fabric_link=args.fabric, nics_per_node=args.nics_per_node)
        sized = plan.gpus_needed(workload, design, assumptions)
        print(f"# {sized.hardware.n_gpus} GPUs needed (whole nodes, a power of two of them)")
        hardware = sized.hardware
    else:
        hardware = plan.cluster(args.gpu, args.gpus,
                                storage_read_bytes_per_s=args.storage_gb_s * 1e9,
                                gpus_per_node=args.gpus_per_node, node_link=args.node_link,
                                fabric_link=args.fabric, nics_per_node=args.nics_per_node)
    plans = plan.rank_layouts(workload, hardware, assumptions, limit=args.top)
    print(plan.describe_plan(plans[0]))
    print(f"# the {len(plans)} fastest layouts that fit; seconds per step")
    print(plan.format_plans(plans))


def _bench(args: argparse.Namespace) -> None:
    from clusterlab import bench, devices

    if args.largest < args.smallest:
        raise ValueError(f"--max ({args.largest} B) is smaller than --min ({args.smallest} B).")
    used = devices.setup(args.devices)
    mesh = devices.mesh((args.devices,), ("devices",), used)
    sizes = bench.message_sizes(args.smallest, args.largest, args.factor)
    rows = bench.sweep(args.op, sizes, mesh, "devices", implementation=args.implementation,
                       dtype=args.dtype, warmup=args.warmup, repeats=args.repeats)
    print(f"# {args.op} ({args.implementation}) on {args.devices} x {used[0].platform} "
          f"{used[0].device_kind}; time is the median of {args.repeats}, spread the IQR")
    print(bench.format_table(rows))
    ceiling = bench.memcpy_bandwidth()
    if used[0].platform == "cpu":
        print(f"# host memcpy: {64 * 2**20 / ceiling.median_s / 1e9:.2f} GB/s "
              "(the ceiling for simulated devices)")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "grade":
        from clusterlab import grading
        return grading.main(args.submissions, key_dir=args.key, timeout_s=args.timeout)
    try:
        if args.command == "bench":
            _bench(args)
        elif args.command == "plan":
            _plan(args)
        elif args.command == "expect":
            _expect(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
