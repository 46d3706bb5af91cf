"""Command line: ``python -m clusterlab bench OP --devices N --min 4K --max 64M``.

Prints an nccl-tests-style table for one collective on the devices JAX sees, or on simulated
CPU devices when there are not enough.
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
    return parser


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
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
