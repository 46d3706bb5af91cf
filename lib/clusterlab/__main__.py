"""Command line: ``python -m clusterlab bench OP --devices N --min 4K --max 64M`` and
``python -m clusterlab plan --params 70e9 --tokens 2e12 --gpu H100 --gpus 1024``.

``bench`` prints an nccl-tests-style table for one collective on the devices JAX sees, or on
simulated CPU devices when there are not enough. ``plan`` prints the planner's ranking of
parallel layouts for a workload on a cluster (:mod:`clusterlab.plan`); it runs no JAX.
"""

from __future__ import annotations

import argparse
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
    return parser


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
    try:
        if args.command == "bench":
            _bench(args)
        elif args.command == "plan":
            _plan(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
