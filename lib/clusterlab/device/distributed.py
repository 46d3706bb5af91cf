"""Several JAX processes: a cluster on one machine, and the same code on a real one.

A real cluster is several hosts with several devices each; JAX runs one process per host (the
*multi-controller* model) and joins them with :func:`jax.distributed.initialize`. On CPUs the
processes exchange collective data over TCP with gloo. There are two halves:

* **Outside** the processes, :mod:`clusterlab.device.launch`: :func:`launch` starts ``N`` Python
  processes on this machine, each with ``M`` simulated CPU devices, on a free port of the
  loopback address ``127.0.0.1``; it prefixes their output with the process id, collects what
  each one :func:`report` s, and stops all of them when one fails. :func:`run` does the same for
  a function ``"module:function"``. ``python -m clusterlab.device.launch`` is its command line.
* **Inside** each process, this module: :func:`init` reads where it stands (the launcher's
  variables, a SLURM job's, or explicit arguments), joins the others, and :func:`host_mesh` lays all
  devices out as a ``(hosts, devices per host)`` mesh. Nothing else in a training script changes
  between a laptop and a cluster: only the environment does.

Fault handling, so that a failure never leaves a job hanging: JAX's coordination service stops
every process whose peer stops sending heartbeats (``heartbeat_timeout_s``); a gloo collective
fails at once when its peer's socket closes; :func:`init` makes an uncaught exception end the
process at once (instead of waiting in JAX's shutdown barrier); and the launcher stops the rest
``grace_s`` seconds after the first process fails. An error that every process raises together
(different device counts) is printed by each, and none exits until all have: process 0 hosts the
coordination service, and its exit ends the others at once.

Under SLURM (``srun``; ``tests/test_slurm.py`` runs it under a real one) a killed task ends the
job the same way, at once. ``scancel`` and a job's time limit send SIGTERM first, and JAX's
distributed runtime catches it as a preemption notice (a training loop can answer with a
checkpoint, :func:`jax.experimental.multihost_utils.reached_preemption_sync_point`): the
processes keep running until SLURM's SIGKILL, ``KillWait`` seconds later (30 by default).

References:
    JAX, "Multi-host and multi-process environments",
    https://docs.jax.dev/en/latest/multi_process.html
    SLURM ``srun`` output environment variables, https://slurm.schedmd.com/srun.html
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
from jax._src import distributed as jax_distributed
from jax._src import xla_bridge
from jax._src.lib import _jax

from clusterlab import _checks
from clusterlab.device import devices as cl_devices
# What the launcher and the processes share: public here, since _job is private.
from clusterlab.device._job import (  # noqa: F401
    ENV_COORDINATOR, ENV_DEVICES_PER_PROCESS, ENV_HEARTBEAT_TIMEOUT_S, ENV_INIT_TIMEOUT_S,
    ENV_NUM_PROCESSES, ENV_PORT, ENV_PROCESS_ID, ENV_RESULTS_DIR, EXIT_INIT_TIMEOUT, LOOPBACK,
    DistributedError, PortInUseError, check_port_free, free_port, resolve)


class DeviceCountMismatchError(DistributedError):
    """The processes do not all have the same number of devices."""


# --------------------------------------------------------------------------------------------
# Where a process stands: the launcher's variables, SLURM's, or explicit arguments.


@dataclass(frozen=True)
class ClusterEnv:
    """How one process joins the others.

    Attributes:
        coordinator_address: ``host:port`` of process 0's coordination service.
        num_processes: processes in the job (hosts, on a cluster with one process per host).
        process_id: this process's index, ``0 <= process_id < num_processes``.
        devices_per_process: simulated CPU devices to create here; ``None`` leaves the count to
            JAX (all local accelerators on a GPU host).
        source: where the settings came from: ``"clusterlab.device.launch"``, ``"slurm"``,
            ``"explicit"`` or ``"single"`` (one process, nothing to join).
    """

    coordinator_address: str | None
    num_processes: int
    process_id: int
    devices_per_process: int | None
    source: str

    @property
    def is_loopback(self) -> bool:
        """Whether every process runs on this machine (coordinator on 127.0.0.1)."""
        return (self.coordinator_address or "").rsplit(":", 1)[0] == LOOPBACK


def first_slurm_host(nodelist: str) -> str:
    """The first host name of a SLURM node list, e.g. ``"gpu[003-010,012],login1"`` -> ``"gpu003"``.

    Process 0 of a SLURM step runs on the first node of ``SLURM_STEP_NODELIST``, so that node
    hosts the coordinator.

    Raises:
        ValueError: for an empty list.
    """
    text = nodelist.strip()
    if not text:
        raise ValueError("The SLURM node list is empty; is SLURM_STEP_NODELIST set by srun?")
    match = re.match(r"^([^,\[]+)(\[([^\],\-]+))?", text)
    if not match:
        raise ValueError(f"Cannot read the first host of the SLURM node list {nodelist!r}.")
    return match.group(1) + (match.group(3) or "")


def slurm_port(job_id: str | int) -> int:
    """The coordinator port JAX derives from a SLURM job id: one of the top 4096 ports."""
    return int(job_id) % 2**12 + (65535 - 2**12 + 1)


def _int_env(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise ValueError(f"Environment variable {name} must be a whole number, got "
                         f"{environ[name]!r}.") from None


def detect_environment(*, coordinator_address: str | None = None,
                       num_processes: int | None = None, process_id: int | None = None,
                       devices_per_process: int | None = None,
                       environ: Mapping[str, str] | None = None) -> ClusterEnv:
    """Find out how this process joins the others, without starting anything.

    Explicit arguments win; then the variables of :func:`launch`; then a SLURM step's
    (``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_STEP_NODELIST``, the port from
    ``CLUSTERLAB_PORT`` or the job id); with none of them the process runs alone.

    Args:
        coordinator_address: ``host:port`` of process 0.
        num_processes: processes in the job.
        process_id: this process's index.
        devices_per_process: simulated CPU devices per process (``None``: JAX's default).
        environ: the environment to read (default ``os.environ``).

    Returns:
        A :class:`ClusterEnv`.

    Raises:
        ValueError: when the settings are incomplete or inconsistent; the message names them.
    """
    env = os.environ if environ is None else environ
    explicit = (coordinator_address, num_processes, process_id)
    if any(v is not None for v in explicit):
        if any(v is None for v in explicit):
            raise ValueError("Explicit settings need all three of coordinator_address, "
                             "num_processes and process_id; got "
                             f"{coordinator_address!r}, {num_processes!r}, {process_id!r}.")
        source = "explicit"
    elif ENV_COORDINATOR in env:
        coordinator_address = env[ENV_COORDINATOR]
        num_processes = _int_env(env, ENV_NUM_PROCESSES)
        process_id = _int_env(env, ENV_PROCESS_ID)
        source = "clusterlab.device.launch"
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
        port = _int_env(env, ENV_PORT) if ENV_PORT in env else slurm_port(env.get("SLURM_JOB_ID",
                                                                                    "0"))
        coordinator_address = f"{first_slurm_host(nodelist)}:{port}"
        num_processes = _int_env(env, "SLURM_NTASKS")
        process_id = _int_env(env, "SLURM_PROCID")
        source = "slurm"
    else:
        coordinator_address, num_processes, process_id, source = None, 1, 0, "single"
    if devices_per_process is None and ENV_DEVICES_PER_PROCESS in env:
        devices_per_process = _int_env(env, ENV_DEVICES_PER_PROCESS)
    num_processes = _checks.count("num_processes", num_processes)
    process_id = _checks.count("process_id", process_id, minimum=0)
    if process_id >= num_processes:
        raise ValueError(f"process_id must be below num_processes: got process {process_id} of "
                         f"{num_processes}. Number processes 0, 1, ..., {num_processes - 1}.")
    if devices_per_process is not None:
        devices_per_process = _checks.count("devices_per_process", devices_per_process)
    if coordinator_address is not None and not re.fullmatch(r"[^:\s]+:\d+",
                                                            coordinator_address):
        raise ValueError(f"The coordinator address must be host:port, got "
                         f"{coordinator_address!r}.")
    return ClusterEnv(coordinator_address, num_processes, process_id, devices_per_process, source)


# --------------------------------------------------------------------------------------------
# Inside a process.

_STATE: dict[str, Any] = {}


def _use_loopback_gloo() -> None:
    # gloo's TCP transport otherwise binds to the address the host name resolves to; on this
    # machine all processes are local, so keep every socket on the loopback interface. JAX has
    # no public switch for this: re-register the CPU backend with gloo told the host name.
    def make_client():
        collectives = _jax.make_gloo_tcp_collectives(
            distributed_client=jax_distributed.global_state.client, hostname=LOOPBACK)
        return xla_bridge.make_cpu_client(collectives=collectives)

    xla_bridge.register_backend_factory("cpu", make_client, priority=0, fail_quietly=False)


def _fail_fast_excepthook(kind, value, tb) -> None:
    # Print the error and end now: a normal exit would wait in JAX's shutdown barrier for the
    # other processes, which may themselves wait for this one inside a collective. An error this
    # process already printed (see _say_before_anyone_exits) is not printed twice.
    if not getattr(value, "already_printed", False):
        traceback.print_exception(kind, value, tb)
    rank = _STATE.get("process_id", "?")
    print(f"clusterlab.device.distributed: process {rank} failed; ending it now so that the others "
          "stop too.", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)


def init(*, coordinator_address: str | None = None, num_processes: int | None = None,
         process_id: int | None = None, devices_per_process: int | None = None,
         heartbeat_timeout_s: int | None = None, init_timeout_s: int | None = None,
         shutdown_timeout_s: int = 10, fail_fast: bool = True,
         environ: Mapping[str, str] | None = None) -> ClusterEnv:
    """Join the other processes of this job: call it first, before any JAX operation.

    Reads the settings with :func:`detect_environment`, sets the number of simulated CPU devices
    and gloo for CPU collectives, and calls :func:`jax.distributed.initialize` (not at all for a
    single process). Calling it again returns the same settings.

    Args:
        coordinator_address, num_processes, process_id, devices_per_process: explicit settings;
            see :func:`detect_environment`.
        heartbeat_timeout_s: a process that sends no heartbeat for this long is declared dead and
            every other process stops (JAX's default is 100 s; the launcher passes 10 s).
        init_timeout_s: how long to wait for all processes to join (default 30 s with the
            launcher, 300 s on a cluster). A process that gives up prints which settings to check
            and exits with code :data:`EXIT_INIT_TIMEOUT`.
        shutdown_timeout_s: how long a finishing process waits for the others at the end.
        fail_fast: make an uncaught exception end this process at once, so its peers' next
            collective fails instead of waiting for it.
        environ: the environment to read (default ``os.environ``).

    Returns:
        The :class:`ClusterEnv` this process joined with.

    Raises:
        DistributedError: when JAX already ran an operation in this process.
        PortInUseError: when process 0 cannot listen on the coordinator's loopback port.
        DeviceCountMismatchError: when the processes do not all have the same device count.
    """
    if "env" in _STATE:
        return _STATE["env"]
    env_map = os.environ if environ is None else environ
    cluster = detect_environment(coordinator_address=coordinator_address,
                                 num_processes=num_processes, process_id=process_id,
                                 devices_per_process=devices_per_process, environ=env_map)
    if xla_bridge.backends_are_initialized():
        raise DistributedError(
            "clusterlab.device.distributed.init() must run before any JAX operation in the process: "
            "JAX has already created its devices. Call it at the top of the script.")
    if heartbeat_timeout_s is None:
        heartbeat_timeout_s = (_int_env(env_map, ENV_HEARTBEAT_TIMEOUT_S)
                               if ENV_HEARTBEAT_TIMEOUT_S in env_map else 100)
    if init_timeout_s is None:
        init_timeout_s = (_int_env(env_map, ENV_INIT_TIMEOUT_S) if ENV_INIT_TIMEOUT_S in env_map
                          else (30 if cluster.is_loopback else 300))
    heartbeat_timeout_s = _checks.count("heartbeat_timeout_s", heartbeat_timeout_s)
    init_timeout_s = _checks.count("init_timeout_s", init_timeout_s)
    _STATE.update(process_id=cluster.process_id, num_processes=cluster.num_processes,
                  init_timeout_s=init_timeout_s)
    if cluster.devices_per_process is not None:
        jax.config.update("jax_num_cpu_devices", cluster.devices_per_process)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if cluster.num_processes > 1:
        _join(cluster, heartbeat_timeout_s, init_timeout_s, shutdown_timeout_s)
        if fail_fast:
            sys.excepthook = _fail_fast_excepthook
        _check_device_counts()
    _STATE["env"] = cluster
    return cluster


def _join(cluster: ClusterEnv, heartbeat_timeout_s: int, init_timeout_s: int,
          shutdown_timeout_s: int) -> None:
    bind_address = None
    if cluster.is_loopback:
        port = int(cluster.coordinator_address.rsplit(":", 1)[1])
        if cluster.process_id == 0:
            check_port_free(port)
        bind_address = cluster.coordinator_address  # listen on 127.0.0.1 only
        _use_loopback_gloo()

    def give_up():
        # JAX would abort with a C++ stack trace; say what to check instead, and exit.
        print(f"clusterlab.device.distributed: process {cluster.process_id} of "
              f"{cluster.num_processes} waited {init_timeout_s} s for all processes to join the "
              f"coordinator at {cluster.coordinator_address} ({cluster.source}), and some never "
              "came. Check that all of them were started with the same coordinator address and "
              "process count, and that none failed at start-up.", file=sys.stderr, flush=True)
        os._exit(EXIT_INIT_TIMEOUT)

    watchdog = threading.Timer(init_timeout_s, give_up)
    watchdog.daemon = True
    watchdog.start()
    try:
        jax.distributed.initialize(
            coordinator_address=cluster.coordinator_address,
            num_processes=cluster.num_processes, process_id=cluster.process_id,
            coordinator_bind_address=bind_address,
            initialization_timeout=init_timeout_s + 5,  # the watchdog speaks first
            heartbeat_timeout_seconds=heartbeat_timeout_s,
            shutdown_timeout_seconds=shutdown_timeout_s)
        jax.devices()  # the global topology exchange also waits for every process
    finally:
        watchdog.cancel()


def devices_by_process() -> dict[int, list]:
    """All devices of the job, grouped by the process that owns them, each group sorted by id."""
    groups: dict[int, list] = {}
    for device in sorted(jax.devices(), key=lambda d: (d.process_index, d.id)):
        groups.setdefault(device.process_index, []).append(device)
    return groups


def _say_before_anyone_exits(error: DistributedError, barrier_id: str) -> None:
    # For an error that every process raises at the same point (they all see the same global
    # topology): print it here, then wait until every process has printed it too. Process 0
    # hosts JAX's coordination service; when it exits, the others' error poll ends them at
    # once (SIGABRT, a C++ stack trace), and under load that came before they had printed
    # anything, or even before they had read the topology. Seen on a loaded 2-core machine.
    print(f"clusterlab.device.distributed: process {_STATE.get('process_id', '?')} of "
          f"{_STATE.get('num_processes', '?')}: {type(error).__name__}: {error}",
          file=sys.stderr, flush=True)
    error.already_printed = True
    client = jax_distributed.global_state.client
    if client is None:
        return
    try:
        client.wait_at_barrier(barrier_id, 1000 * _STATE.get("init_timeout_s", 30))
    except Exception:  # a peer that never comes: the error is raised all the same
        pass


def _check_device_counts() -> None:
    counts = {p: len(ds) for p, ds in devices_by_process().items()}
    if len(set(counts.values())) > 1:
        listing = ", ".join(f"process {p}: {c}" for p, c in sorted(counts.items()))
        error = DeviceCountMismatchError(
            f"The processes have different numbers of devices ({listing}). A (hosts, devices) "
            "mesh needs the same count everywhere: start every process with the same "
            "devices_per_process (on GPUs, the same number of visible GPUs per host).")
        _say_before_anyone_exits(error, "clusterlab_device_count_mismatch")
        raise error


def host_mesh(axis_names: Sequence[str] = ("hosts", "devices")):
    """A 2-D mesh ``(processes, devices per process)`` over every device of the job.

    Row ``h`` holds the devices of process ``h``, so a collective over the second axis stays
    inside one process (one host: NVLink on a GPU server) and one over the first axis crosses
    processes (the network).

    Args:
        axis_names: the names of the two axes, across hosts first.

    Returns:
        A :class:`jax.sharding.Mesh` of shape ``(jax.process_count(), local devices)``.
    """
    if len(axis_names) != 2:
        raise ValueError(f"host_mesh needs two axis names (across hosts, within a host), got "
                         f"{tuple(axis_names)}.")
    groups = devices_by_process()
    counts = {len(ds) for ds in groups.values()}
    if len(counts) > 1:
        _check_device_counts()
    ordered = [d for p in sorted(groups) for d in groups[p]]
    return cl_devices.mesh((len(groups), counts.pop()), axis_names, ordered)


def report(value: Any) -> None:
    """Hand a JSON-serialisable result from this process back to :func:`launch`.

    Without the launcher (a plain ``python`` or ``srun`` run) it prints the value instead.
    """
    directory = os.environ.get(ENV_RESULTS_DIR)
    text = json.dumps(value)
    if directory:
        rank = os.environ.get(ENV_PROCESS_ID, "0")
        Path(directory, f"{rank}.json").write_text(text)
    else:
        print(f"result: {text}")


def call(target: str, kwargs: Mapping[str, Any] | None = None) -> Any:
    """Inside a process: :func:`init`, then ``module.function(**kwargs)``, then :func:`report`.

    Args:
        target: ``"package.module:function"``, importable in every process.
        kwargs: JSON-serialisable keyword arguments.

    Returns:
        What the function returned (also reported).
    """
    function = resolve(target)
    init()
    value = function(**dict(kwargs or {}))
    report(value)
    return value


def _main(argv: Sequence[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: python -m clusterlab.device.distributed package.module:function [JSON kwargs]",
              file=sys.stderr)
        return 2
    # Use the imported module, not this __main__ copy, so that init() state is shared with
    # the functions that call clusterlab.device.distributed themselves.
    from clusterlab.device import distributed
    distributed.call(argv[0], json.loads(argv[1]) if len(argv) == 2 else {})
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
