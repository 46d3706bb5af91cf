"""Command line: start several JAX processes on this machine, joined as a cluster.

``python -m clusterlab.launch --processes 2 --devices-per-process 4 SCRIPT [ARGS]`` runs
``python SCRIPT ARGS`` (or ``-m MODULE ARGS``) in each process, with every output line prefixed
by the process id (``[0] ...``). The script calls :func:`clusterlab.distributed.init` first; on a
real cluster the same script runs under ``srun`` instead, unchanged. The exit code is 0 when every
process succeeded, otherwise the first failure's (124 after ``--timeout``).
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Sequence

from clusterlab import distributed


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m clusterlab.launch",
        description="Run a script in several JAX processes on this machine, joined over "
                    "127.0.0.1 with jax.distributed (CPU collectives over gloo).")
    parser.add_argument("--processes", type=int, required=True, help="processes (hosts) to start")
    parser.add_argument("--devices-per-process", type=int, default=1,
                        help="simulated CPU devices in each process (default 1)")
    parser.add_argument("--port", type=int, default=None,
                        help="coordinator port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="stop everything after this many seconds (default 300)")
    parser.add_argument("--grace", type=float, default=5.0,
                        help="seconds the others may take to stop after one fails (default 5)")
    parser.add_argument("--heartbeat-timeout", type=int, default=10,
                        help="seconds of silence after which JAX declares a process dead")
    parser.add_argument("command", nargs="*", metavar="SCRIPT [ARGS] | -m MODULE [ARGS]",
                        help="what each process runs with python")
    return parser


_WITH_VALUE = ("--processes", "--devices-per-process", "--port", "--timeout", "--grace",
               "--heartbeat-timeout")


def _split(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    # The launcher's options come first; the command starts at "-m", "--", or the first word
    # that is neither an option nor an option's value (argparse alone would eat "-m").
    argv = list(argv)
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return argv[:i], argv[i + 1:]
        if word == "-m" or not word.startswith("-"):
            return argv[:i], argv[i:]
        i += 2 if word in _WITH_VALUE else 1
    return argv, []


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, launch, and return the exit code."""
    own, command = _split(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(own)
    if not command:
        _parser().error("give a SCRIPT (and its arguments) or -m MODULE to run")
    # A SIGTERM to the launcher (a scheduler's kill) stops the processes it started too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        result = distributed.launch(command, processes=args.processes,
                                    devices_per_process=args.devices_per_process, port=args.port,
                                    timeout_s=args.timeout, grace_s=args.grace,
                                    heartbeat_timeout_s=args.heartbeat_timeout)
    except (ValueError, distributed.PortInUseError) as error:
        print(f"[launch] error: {error}", file=sys.stderr)
        return 2
    if result.returncode == 0:
        print(f"[launch] all {args.processes} processes finished in {result.elapsed_s:.1f} s.")
    return 128 - result.returncode if result.returncode < 0 else result.returncode


if __name__ == "__main__":
    sys.exit(main())
