"""The launcher: start several JAX processes on this machine, joined as one job, and wait.

:func:`launch` starts ``N`` Python processes, each with ``M`` simulated CPU devices, on a free
port of the loopback address ``127.0.0.1``; it prefixes their output with the process id,
collects what each one reports (:func:`clusterlab.device.distributed.report`), and stops all of them
when one fails. :func:`run` does the same for a function ``"module:function"``. Inside each
process, :func:`clusterlab.device.distributed.init` joins the others; the two sides share only
:mod:`clusterlab.device._job` (the variables, exit codes and errors).

Command line: ``python -m clusterlab.device.launch --processes 2 --devices-per-process 4 SCRIPT
[ARGS]`` runs ``python SCRIPT ARGS`` (or ``-m MODULE ARGS``) in each process, with every output line
prefixed by the process id (``[0] ...``). The script calls
:func:`clusterlab.device.distributed.init` first; on a real cluster the same script runs under
``srun`` instead, unchanged. The exit code is 0 when every process succeeded, otherwise the first
failure's (124 after ``--timeout``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO

from clusterlab import _checks
from clusterlab.device._job import (ENV_COORDINATOR, ENV_DEVICES_PER_PROCESS,
                                    ENV_HEARTBEAT_TIMEOUT_S, ENV_INIT_TIMEOUT_S, ENV_NUM_PROCESSES,
                                    ENV_PROCESS_ID, ENV_RESULTS_DIR, EXIT_INIT_TIMEOUT, LOOPBACK,
                                    DistributedError, PortInUseError, check_port_free, free_port,
                                    resolve)

# The timeout's exit code, as GNU timeout's.
EXIT_TIMEOUT = 124

# gloo prints one such line per device when it connects; the launcher leaves them out. Devices
# connect from several threads at once, so two of these lines can arrive spliced together
# ("[Gloo] Rank [Gloo] Rank 1 is connected ..." then "0 is connected ..."): match any piece.
_NOISE = re.compile(r"\[Gloo\] Rank|is connected to \d+ peer ranks")


@dataclass
class LaunchResult:
    """What a multi-process run left behind.

    Attributes:
        returncode: 0 when every process succeeded; otherwise the first failing process's code
            (a negative code -N means it was killed by signal N), or 124 after ``timeout_s``.
        returncodes: each process's exit code, in process order (after any clean-up kill).
        outputs: each process's combined stdout and stderr (gloo's connection lines left out).
        results: what each process passed to :func:`clusterlab.device.distributed.report` (``None``
            where nothing).
        elapsed_s: wall time from the first start to the last exit.
        failure: a one-line account of what went wrong, or ``None``.
        stopped_after_failure_s: seconds from the first failure until every process had ended.
        pids: the processes' ids (all ended when :func:`launch` returns).
        command: the command each process ran.
    """

    returncode: int
    returncodes: list[int]
    outputs: list[str]
    results: list[Any]
    elapsed_s: float
    failure: str | None = None
    stopped_after_failure_s: float | None = None
    pids: list[int] = field(default_factory=list)
    command: list[str] = field(default_factory=list)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code == EXIT_INIT_TIMEOUT:
        return f"exited with code {code} (gave up waiting for the others to join)"
    return f"exited with code {code}"


# What a process prints when it fails *because* a peer did (a closed socket, a missed heartbeat).
_CONSEQUENCE = re.compile(r"Connection (closed|reset) by peer|heartbeat timeout|tasks have crashed|"
                          r"Terminating process because the JAX distributed service")


def _blame(exits: Sequence[tuple[float, int]], codes: Sequence[int],
           outputs: Sequence[str], window_s: float = 1.0) -> int:
    # Processes that fail together end within moments of each other, in an order the operating
    # system picks. Among the failures close to the first one, blame one whose output does not
    # say that a peer went away first.
    failed = [(t, r) for t, r in sorted(exits) if codes[r] != 0]
    if not failed:
        return next(r for r, c in enumerate(codes) if c)
    close = [r for t, r in failed if t - failed[0][0] <= window_s]
    causes = [r for r in close if not _CONSEQUENCE.search(outputs[r])]
    return causes[0] if causes else close[0]


def _pump(stream, rank: int, lines: list[str], echo: TextIO | None, lock: threading.Lock):
    for line in iter(stream.readline, ""):
        if _NOISE.search(line):
            continue
        lines.append(line)
        if echo is not None:
            with lock:
                echo.write(f"[{rank}] {line}" if line.endswith("\n") else f"[{rank}] {line}\n")
                echo.flush()
    stream.close()


def _stop(procs: Sequence[subprocess.Popen], wait_s: float = 2.0) -> None:
    # Each process leads its own process group: signalling the group also ends anything it
    # started. SIGTERM first (with SIGCONT, so that a stopped process receives it), then
    # SIGKILL for whatever is still there.
    for signals in ((signal.SIGTERM, signal.SIGCONT), (signal.SIGKILL,)):
        for proc in procs:
            for sig in signals:
                if proc.poll() is None:
                    try:
                        os.killpg(proc.pid, sig)
                    except ProcessLookupError:
                        pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.05)
    for proc in procs:
        proc.wait()


def launch(command: Sequence[str], *, processes: int, devices_per_process: int | Sequence[int] = 1,
           port: int | None = None, timeout_s: float = 300.0, grace_s: float = 5.0,
           heartbeat_timeout_s: int = 10, init_timeout_s: int = 30,
           env: Mapping[str, str] | None = None, echo: bool | TextIO = True) -> LaunchResult:
    """Start ``processes`` Python processes on this machine, joined over 127.0.0.1, and wait.

    Each runs ``python COMMAND...`` (a script and its arguments, or ``-m module ...``) with the
    variables :func:`clusterlab.device.distributed.init` reads, ``JAX_PLATFORMS=cpu`` and
    ``devices_per_process`` simulated CPU devices. When a process fails, the others get
    ``grace_s`` seconds to stop on their own (JAX's error is the useful one), then they are
    stopped; nothing is left running.

    Args:
        command: the arguments after ``python``.
        processes: how many processes (hosts) to start.
        devices_per_process: simulated devices in each process; a list gives each process its
            own count (to show the mismatch error; :func:`clusterlab.device.distributed.init`
            rejects unequal counts).
        port: the coordinator's port on 127.0.0.1; ``None`` picks a free one.
        timeout_s: stop everything after this many seconds (return code 124).
        grace_s: after the first failure, how long the others may take to stop by themselves.
        heartbeat_timeout_s: JAX declares a silent process dead after this long.
        init_timeout_s: how long the processes wait for each other at start-up.
        env: extra environment variables for every process.
        echo: print output lines as they come, prefixed ``[i]`` (True: to ``sys.stdout``; or a
            text stream; False: quiet).

    Returns:
        A :class:`LaunchResult`.

    Raises:
        PortInUseError: when ``port`` is taken (nothing is started then).
        ValueError: a count that is not a positive integer, ``devices_per_process`` listing
            a count per process for another number of processes, or an empty ``command``.
    """
    processes = _checks.count("processes", processes)
    counts = _device_counts(devices_per_process, processes)
    if not command:
        raise ValueError("launch needs a command: a script path (and its arguments) or "
                         "['-m', 'module', ...].")
    if port is None:
        port = free_port()
    else:
        check_port_free(port)
    echo_stream = sys.stdout if echo is True else (echo or None)
    results_dir = tempfile.mkdtemp(prefix="clusterlab-launch-")
    base_env = {**os.environ, **(env or {}),
                ENV_COORDINATOR: f"{LOOPBACK}:{port}", ENV_NUM_PROCESSES: str(processes),
                ENV_HEARTBEAT_TIMEOUT_S: str(heartbeat_timeout_s),
                ENV_INIT_TIMEOUT_S: str(init_timeout_s), ENV_RESULTS_DIR: results_dir,
                "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    for name in ("SLURM_PROCID", "SLURM_NTASKS"):  # the launcher's settings, not a job's
        base_env.pop(name, None)
    full_command = [sys.executable, *command]
    group = _Processes(processes, echo_stream)
    start = time.monotonic()
    try:
        group.start(full_command, base_env, counts)
        failure, failed_at, returncode = _watch(group, start, timeout_s=timeout_s,
                                                grace_s=grace_s)
    finally:
        group.stop()
    end = time.monotonic()
    codes = [p.returncode for p in group.procs]
    if failure is not None and returncode != EXIT_TIMEOUT:
        rank = _blame(group.exits, codes, group.texts())
        returncode, failure = codes[rank], f"process {rank} {_describe_exit(codes[rank])}"
    results = _collect_results(results_dir, processes)
    if failure is not None and echo_stream is not None:
        print(f"[launch] {failure}; all {processes} processes stopped "
              f"{end - failed_at:.1f} s later.", file=echo_stream, flush=True)
    return LaunchResult(returncode=returncode if failure else 0, returncodes=codes,
                        outputs=group.texts(), results=results,
                        elapsed_s=end - start, failure=failure,
                        stopped_after_failure_s=None if failed_at is None else end - failed_at,
                        pids=[p.pid for p in group.procs], command=full_command)


def _device_counts(devices_per_process: int | Sequence[int], processes: int) -> list[int]:
    """Each process's simulated device count, checked: one number for all, or one each."""
    if isinstance(devices_per_process, (list, tuple)):
        counts = [_checks.count("devices_per_process", c) for c in devices_per_process]
        if len(counts) != processes:
            raise ValueError(f"devices_per_process lists {len(counts)} counts for {processes} "
                             "processes; give one count per process, or a single number.")
        return counts
    return [_checks.count("devices_per_process", devices_per_process)] * processes


class _Processes:
    """The processes of one launch: their output lines, and the order in which they ended."""

    def __init__(self, processes: int, echo: TextIO | None):
        self.procs: list[subprocess.Popen] = []
        self.outputs: list[list[str]] = [[] for _ in range(processes)]
        self.exits: list[tuple[float, int]] = []  # (time, rank) in the order they ended
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._echo = echo

    def start(self, command: list[str], base_env: Mapping[str, str],
              counts: Sequence[int]) -> None:
        """Start one process per count, each leading its own process group."""
        for rank, count in enumerate(counts):
            proc_env = {**base_env, ENV_PROCESS_ID: str(rank),
                        ENV_DEVICES_PER_PROCESS: str(count)}
            proc = subprocess.Popen(command, env=proc_env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, process_group=0)
            self.procs.append(proc)
            pump_args = (proc.stdout, rank, self.outputs[rank], self._echo, self._lock)
            for target, args in ((_pump, pump_args), (self._wait_for, (rank, proc))):
                thread = threading.Thread(target=target, args=args, daemon=True)
                thread.start()
                self._threads.append(thread)

    def _wait_for(self, rank: int, proc: subprocess.Popen) -> None:
        proc.wait()
        with self._lock:
            self.exits.append((time.monotonic(), rank))

    def ended(self) -> list[tuple[float, int]]:
        """``(time, rank)`` of the processes ended so far, in the order they ended."""
        with self._lock:
            return list(self.exits)

    def stop(self) -> None:
        """End every process still running (and what it started), and its reading threads."""
        _stop(self.procs)
        for thread in self._threads:
            thread.join(timeout=5)

    def texts(self) -> list[str]:
        """Each process's output so far, as one string."""
        return ["".join(lines) for lines in self.outputs]


def _watch(group: _Processes, start: float, *, timeout_s: float,
           grace_s: float) -> tuple[str | None, float | None, int]:
    """Wait until every process ended, ``grace_s`` after the first failure, or the timeout.

    Returns:
        ``(failure, failed_at, returncode)``: what went wrong first (``None``: nothing), when,
        and the exit code it gave.
    """
    failure, failed_at, returncode = None, None, 0
    while True:
        ended = group.ended()
        now = time.monotonic()
        if failure is None:
            bad = [(t, r) for t, r in ended if group.procs[r].returncode != 0]
            if bad:  # the first process to fail is the one to blame
                failed_at, rank = bad[0]
                returncode = group.procs[rank].returncode
                failure = f"process {rank} {_describe_exit(returncode)}"
            elif now - start > timeout_s:
                return (f"the run took longer than timeout_s={timeout_s:g} s", now,
                        EXIT_TIMEOUT)
        if len(ended) == len(group.procs) or (failure is not None
                                               and now - failed_at > grace_s):
            return failure, failed_at, returncode
        time.sleep(0.02)


def _collect_results(results_dir: str, processes: int) -> list[Any]:
    """What each process reported (``None`` where nothing), the results directory removed."""
    results = []
    for rank in range(processes):
        path = Path(results_dir, f"{rank}.json")
        results.append(json.loads(path.read_text()) if path.exists() else None)
        path.unlink(missing_ok=True)
    os.rmdir(results_dir)
    return results


def run(target: str, *, processes: int, devices_per_process: int | Sequence[int] = 1,
        check: bool = True, echo: bool | TextIO = False, launch_options: Mapping | None = None,
        **kwargs: Any) -> LaunchResult:
    """Run ``module.function(**kwargs)`` in ``processes`` joined processes and gather results.

    Each process runs :func:`clusterlab.device.distributed.call`: it joins the others
    (:func:`clusterlab.device.distributed.init`), calls the function and reports its return value,
    found afterwards in ``LaunchResult.results[process_id]``.

    Args:
        target: ``"package.module:function"`` (importable in a fresh interpreter).
        processes: processes to start.
        devices_per_process: simulated CPU devices in each.
        check: raise :class:`clusterlab.device.distributed.DistributedError` (with the failing
            process's last lines) when the run fails.
        echo: print the processes' output as it comes.
        launch_options: further keyword arguments of :func:`launch` (``timeout_s``, ``grace_s``,
            ``port``, ...).
        **kwargs: JSON-serialisable keyword arguments of the function.

    Returns:
        The :class:`LaunchResult`.
    """
    resolve(target)  # fail here, not in N processes, when the target does not exist
    command = ["-m", "clusterlab.device.distributed", target, json.dumps(kwargs)]
    result = launch(command, processes=processes, devices_per_process=devices_per_process,
                    echo=echo, **dict(launch_options or {}))
    if check and result.returncode:
        tails = []
        for rank, text in enumerate(result.outputs):
            if result.returncodes[rank]:
                tail = "\n".join(text.strip().splitlines()[-8:])
                tails.append(f"--- process {rank} (last lines) ---\n{tail}")
        raise DistributedError(f"{target} failed: {result.failure}.\n" + "\n".join(tails))
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m clusterlab.device.launch",
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
        result = launch(command, processes=args.processes,
                        devices_per_process=args.devices_per_process, port=args.port,
                        timeout_s=args.timeout, grace_s=args.grace,
                        heartbeat_timeout_s=args.heartbeat_timeout)
    except (ValueError, PortInUseError) as error:
        print(f"[launch] error: {error}", file=sys.stderr)
        return 2
    if result.returncode == 0:
        print(f"[launch] all {args.processes} processes finished in {result.elapsed_s:.1f} s.")
    return 128 - result.returncode if result.returncode < 0 else result.returncode


if __name__ == "__main__":
    sys.exit(main())
