"""The multi-host example under a real SLURM: munged, slurmctld and slurmd on this machine.

A session fixture starts the three daemons as the user running the tests, with the configuration
of ``tests/slurm/slurm.conf.in`` filled in under a temporary directory (state, spool, logs, pid
files, munge's key and socket) and free ports, waits until ``sinfo`` shows the node idle, and
stops them afterwards, checking that nothing of the cluster is left running. The tests submit
with ``srun`` exactly as on a cluster: ``clusterlab.device.distributed.init`` reads SLURM's variables.

``tests/system_deps.sh`` (run by ``make test``) installs ``slurm-wlm`` and ``munge`` or stops with
the command to run; without them these tests fail with that command, they never skip.
"""

from __future__ import annotations

import getpass
import json
import os
import random
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from clusterlab.device import distributed
from conftest import ROOT

SLURM_DIR = Path(__file__).with_name("slurm")
MULTIHOST = "clusterlab.course.examples.multihost"
DAEMONS = {"munged": "/usr/sbin/munged", "slurmctld": "/usr/sbin/slurmctld",
           "slurmd": "/usr/sbin/slurmd"}
CLIENTS = ("srun", "sinfo", "squeue", "scancel", "scontrol")
# The node offers this many CPUs (SlurmdParameters=config_overrides), whatever the machine has.
NODE_CPUS = 8
# How long a cancelled or broken job may take to end: KillWait (5 s) between SIGTERM and
# SIGKILL, plus margins for a loaded 2-core machine.
END_WITHIN_S = 30.0


def _missing_tools() -> list[str]:
    missing = [path for path in DAEMONS.values() if not os.access(path, os.X_OK)]
    return missing + [name for name in CLIENTS if shutil.which(name) is None]


@dataclass
class Job:
    """An ``srun`` running in the background, its output lines timestamped as they come."""

    name: str
    proc: subprocess.Popen
    lines: list[tuple[float, str]] = field(default_factory=list)
    reader: threading.Thread | None = None

    def read(self) -> None:
        for line in iter(self.proc.stdout.readline, ""):
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_for_lines(self, pattern: str, count: int, timeout_s: float) -> float:
        """Wait until ``count`` lines match ``pattern``; return when the last of them came."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            hits = [t for t, line in list(self.lines) if re.search(pattern, line)]
            if len(hits) >= count:
                return hits[count - 1]
            if self.proc.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"job {self.name}: {count} lines matching {pattern!r} did not come "
                             f"within {timeout_s:g} s; output:\n{self.output}")

    def wait(self, timeout_s: float) -> int:
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"job {self.name}: srun still running after {timeout_s:g} s; "
                                 f"output:\n{self.output}") from None
        self.reader.join(timeout=10)
        return self.proc.returncode

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)


@dataclass
class SlurmCluster:
    """A running one-node SLURM: the environment its clients need, and where its files are."""

    node: str
    directory: Path
    env: dict[str, str]

    def run(self, args: list[str], timeout_s: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(args, env=self.env, capture_output=True, text=True,
                              timeout=timeout_s)

    def srun(self, name: str, tasks: int, command: list[str], *,
             devices_per_process: int = 1, free_port: bool = True) -> Job:
        """Start ``srun -n tasks python COMMAND`` (the test's own Python) in the background.

        ``free_port=False`` leaves the coordinator on the port JAX derives from the job id
        (:func:`clusterlab.device.distributed.slurm_port`), as on a cluster.
        """
        env = {**self.env, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1",
               distributed.ENV_DEVICES_PER_PROCESS: str(devices_per_process),
               distributed.ENV_HEARTBEAT_TIMEOUT_S: "10", distributed.ENV_INIT_TIMEOUT_S: "120"}
        if free_port:
            env[distributed.ENV_PORT] = str(distributed.free_port())
        proc = subprocess.Popen(
            ["srun", f"--ntasks={tasks}", f"--job-name={name}", sys.executable, *command],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        job = Job(name, proc)
        job.reader = threading.Thread(target=job.read, daemon=True)
        job.reader.start()
        return job

    def job_state(self, name: str) -> tuple[str, str]:
        """``(job id, state)`` of the job called ``name`` (ended jobs stay listed 300 s)."""
        done = self.run(["squeue", "--noheader", "--states=all", f"--name={name}",
                         "--format=%i %T"])
        rows = done.stdout.split()
        assert done.returncode == 0 and len(rows) == 2, done.stdout + done.stderr
        return rows[0], rows[1]

    def wait_job_ended(self, name: str, timeout_s: float = END_WITHIN_S) -> tuple[str, str]:
        """Wait until the job has left every active state; return ``(job id, state)``."""
        deadline = time.monotonic() + timeout_s
        while True:
            job_id, state = self.job_state(name)
            if state not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"):
                return job_id, state
            if time.monotonic() > deadline:
                raise AssertionError(f"job {name} is still {state} after {timeout_s:g} s")
            time.sleep(0.2)


def _processes() -> dict[int, tuple[str, str]]:
    """Every live process: pid -> (command line, environment), NUL-separated as in /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                continue
            found[int(entry.name)] = ((entry / "cmdline").read_bytes().decode(errors="replace"),
                                      (entry / "environ").read_bytes().decode(errors="replace"))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def job_processes(name: str, job_id: str) -> list[str]:
    """What is left of a job: its tasks (by ``SLURM_JOB_NAME``) and its step daemons."""
    left = []
    for pid, (cmdline, environ) in _processes().items():
        if (f"\0SLURM_JOB_NAME={name}\0" in f"\0{environ}"
                or cmdline.startswith(f"slurmstepd: [{job_id}.")):
            left.append(f"{pid}: {cmdline.replace(chr(0), ' ')[:120]}")
    return left


def wait_no_strays(name: str, job_id: str, timeout_s: float = END_WITHIN_S) -> float:
    """Seconds until no process of the job is left; fails listing them after ``timeout_s``."""
    start = time.monotonic()
    while left := job_processes(name, job_id):
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"job {name} ({job_id}) left processes running after "
                                 f"{timeout_s:g} s:\n" + "\n".join(left))
        time.sleep(0.1)
    return time.monotonic() - start


def _start(name: str, args: list[str], directory: Path, env: dict[str, str]) -> subprocess.Popen:
    log = open(directory / f"{name}.out", "w")  # closed by the child's exit; read on failure
    return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in reversed(procs):  # slurmd, then slurmctld, then munged
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _log_tails(directory: Path) -> str:
    tails = []
    for log in sorted(directory.glob("*.out")) + sorted(directory.glob("*.log")):
        tails.append(f"--- {log.name} ---\n" + "\n".join(log.read_text().splitlines()[-15:]))
    return "\n".join(tails)


@pytest.fixture(scope="session")
def slurm() -> SlurmCluster:
    """munged, slurmctld and slurmd on this machine, stopped (and checked gone) after."""
    missing = _missing_tools()
    if missing:
        pytest.fail(f"SLURM is not installed here (no {', '.join(missing)}): run "
                    "tests/system_deps.sh, or 'sudo apt-get install -y slurm-wlm munge'.")
    # Not pytest's tmp_path: munged wants its socket's directory and every one above it
    # searchable by everyone, and pytest's are private.
    directory = Path(tempfile.mkdtemp(prefix="clusterlab-slurm-"))
    directory.chmod(0o755)
    for sub in ("munge", "slurmctld", "slurmd"):
        (directory / sub).mkdir(mode=0o700)
    (directory / "socket").mkdir(mode=0o755)
    key = directory / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    munge_socket = directory / "socket" / "munge.socket"
    node = socket.gethostname().split(".")[0]
    template = string.Template((SLURM_DIR / "slurm.conf.in").read_text())
    conf = directory / "slurm.conf"
    conf.write_text(template.substitute(
        node=node, user=getpass.getuser(), slurmctld_port=distributed.free_port(),
        slurmd_port=distributed.free_port(), munge_socket=munge_socket, state_dir=directory,
        cpus=NODE_CPUS,
        # Job ids, and so the coordinator ports JAX derives from them, differ from those of
        # another test cluster that may run on this machine at the same time.
        first_job_id=random.randrange(1000, 1_000_000)))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for name in ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS", distributed.ENV_COORDINATOR):
        env.pop(name, None)  # a job's or the launcher's settings would win over srun's
    procs: list[subprocess.Popen] = []
    start = time.monotonic()
    try:
        procs.append(_start("munged", [
            DAEMONS["munged"], "--foreground", f"--key-file={key}", f"--socket={munge_socket}",
            f"--pid-file={directory}/munge/munged.pid", f"--log-file={directory}/munge/munged.log",
            f"--seed-file={directory}/munge/munged.seed"], directory, env))
        deadline = time.monotonic() + 20
        while not munge_socket.exists():
            assert procs[0].poll() is None and time.monotonic() < deadline, (
                "munged did not start:\n" + _log_tails(directory))
            time.sleep(0.05)
        procs.append(_start("slurmctld", [DAEMONS["slurmctld"], "-D"], directory, env))
        procs.append(_start("slurmd", [DAEMONS["slurmd"], "-D", "-N", node], directory, env))
        deadline = time.monotonic() + 60
        while True:
            state = subprocess.run(["sinfo", "--noheader", "--format=%T", f"--nodes={node}"],
                                   env=env, capture_output=True, text=True).stdout.strip()
            if state == "idle":
                break
            assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, (
                f"the SLURM node is {state!r}, not idle:\n" + _log_tails(directory))
            time.sleep(0.2)
        print(f"\nSLURM up in {time.monotonic() - start:.1f} s (node {node}, {directory})")
        yield SlurmCluster(node, directory, env)
        subprocess.run(["scancel", f"--user={getpass.getuser()}"], env=env, timeout=30)
    finally:
        _stop(procs)
    left = [f"{pid}: {cmdline.replace(chr(0), ' ')[:120]}"
            for pid, (cmdline, environ) in _processes().items()
            if str(directory) in cmdline or f"SLURM_CONF={conf}" in environ]
    assert not left, "processes of the test cluster left running:\n" + "\n".join(left)
    shutil.rmtree(directory)


# --- the multi-host example under srun -------------------------------------------------------


# Two shapes: the smallest (one device per process, the coordinator's port from the job id) and
# the largest (four processes of two devices each: a 2-D mesh whose rows are processes); the
# shapes between them (4x1, 2x2) exercised nothing these two do not, for 18 s of the suite.
@pytest.mark.parametrize("tasks,devices_per_process", [(2, 1), (4, 2)])
def test_srun_runs_the_multihost_example(slurm, tasks, devices_per_process):
    name = f"multihost-{tasks}x{devices_per_process}"
    start = time.monotonic()
    # One run finds its coordinator as on a cluster, on the port derived from the job id (above
    # the kernel's ephemeral ports, so free here); the others on a port known to be free.
    job = slurm.srun(name, tasks, ["-m", MULTIHOST], devices_per_process=devices_per_process,
                     free_port=(tasks, devices_per_process) != (2, 1))
    returncode = job.wait(timeout_s=300)
    elapsed_s = time.monotonic() - start
    assert returncode == 0, job.output
    n_devices = tasks * devices_per_process
    for rank in range(tasks):
        assert (f"process {rank} of {tasks} (slurm): mesh ({tasks}, {devices_per_process}) "
                f"(hosts, devices), {devices_per_process} local device(s), all-reduces equal "
                "numpy's") in job.output, job.output
    step = re.search(rf"process 0 of {tasks} \(slurm\): data-parallel step over {n_devices} "
                     r"device\(s\) equals one device's \(parameters within (\S+), gradients "
                     r"within (\S+) of the largest; summed instead of averaged: (\S+)\)",
                     job.output)
    assert step, job.output
    assert float(step[1]) < 1e-5 and float(step[2]) < 1e-5
    # The negative control: summing over n devices instead of averaging is off by n - 1.
    assert abs(float(step[3]) - (n_devices - 1)) < 0.01
    job_id, state = slurm.wait_job_ended(name)
    assert state == "COMPLETED"
    strays_s = wait_no_strays(name, job_id)
    print(f"\nsrun -n {tasks}, {devices_per_process} device(s) each: {elapsed_s:.1f} s, "
          f"job {job_id} {state}, no process left after {strays_s:.1f} s")


def test_a_step_that_differs_fails_the_job(slurm):
    # The negative control of the example's verdict: with a tolerance of zero not even float32
    # rounding passes, so process 0 must say so and exit non-zero, and srun fail the job.
    name = "differs"
    job = slurm.srun(name, 2, ["-c", f"import sys; from {MULTIHOST} import main; import "
                               f"{MULTIHOST} as m; m.TRAIN_TOLERANCE = 0.0; sys.exit(main())"])
    assert job.wait(timeout_s=300) != 0, job.output
    assert "process 0 of 2 (slurm): data-parallel step over 2 device(s) DIFFERS from one " \
        "device's" in job.output, job.output
    job_id, state = slurm.wait_job_ended(name)
    assert state == "FAILED"
    wait_no_strays(name, job_id)


# --- ending jobs -----------------------------------------------------------------------------


def _assert_strays_are_seen(name: str, job_id: str) -> None:
    # The positive control of the stray check: while the job runs, it sees both tasks and the
    # step's slurmstepd.
    running = job_processes(name, job_id)
    assert sum("slurmstepd" in line for line in running) >= 1, running
    assert sum("clusterlab.device.distributed" in line for line in running) >= 2, running


def _loop_args(**options) -> list[str]:
    return ["-m", "clusterlab.device.distributed", f"{MULTIHOST}:fail", json.dumps(options)]


def test_scancel_ends_a_running_job_with_no_strays(slurm):
    name = "scancel-me"
    # at_step beyond steps: a plain all-reduce loop that would run for minutes.
    job = slurm.srun(name, 2, _loop_args(at_step=10**6, steps=10**6), devices_per_process=2)
    job.wait_for_lines(r"^process \d: all-reduce loop running", 2, timeout_s=180)
    job_id, state = slurm.job_state(name)
    assert state == "RUNNING"
    _assert_strays_are_seen(name, job_id)
    start = time.monotonic()
    done = slurm.run(["scancel", job_id])
    assert done.returncode == 0, done.stderr
    job.wait(timeout_s=END_WITHIN_S)
    srun_s = time.monotonic() - start
    assert job.proc.returncode != 0
    _, state = slurm.wait_job_ended(name)
    assert state == "CANCELLED"
    strays_s = wait_no_strays(name, job_id)
    ended_s = time.monotonic() - start
    assert ended_s < END_WITHIN_S
    print(f"\nscancel: srun returned after {srun_s:.1f} s, job {job_id} {state}, no process "
          f"left {ended_s:.1f} s after scancel")


def _assert_the_job_ends(slurm, job: Job, killed_at: float, how: str) -> None:
    """Task 1 was SIGKILLed at ``killed_at``: the job fails in bounded time, nothing left."""
    returncode = job.wait(timeout_s=END_WITHIN_S + 60)
    srun_s = time.monotonic() - killed_at
    assert returncode != 0, job.output
    assert re.search(r"task 1: Killed", job.output), job.output
    # Task 0 ended by itself, before SLURM had to stop it, by whichever noticed first: its next
    # all-reduce failing on the closed socket (clusterlab.device.distributed's fail-fast hook exits 1),
    # or JAX's coordination service missing task 1's heartbeats (it aborts the process). Both
    # were seen in CI runs; SLURM's own stop would read "task 0: Killed" or "Terminated".
    gloo_failed = ("Gloo all-reduce failed" in job.output
                   and re.search(r"task 0: Exited with exit code 1", job.output))
    coordinator_aborted = ("JAX distributed service detected fatal errors" in job.output
                           and re.search(r"task 0: Aborted", job.output))
    assert gloo_failed or coordinator_aborted, job.output
    job_id, state = slurm.wait_job_ended(job.name)
    assert state == "FAILED"
    strays_s = wait_no_strays(job.name, job_id)
    ended_s = time.monotonic() - killed_at
    assert ended_s < END_WITHIN_S
    print(f"\nSIGKILL of task 1 ({how}): srun returned {returncode} after {srun_s:.1f} s, job "
          f"{job_id} {state}, no process left {ended_s:.1f} s after the kill ({strays_s:.1f} s "
          "after srun)")


def test_a_task_that_kills_itself_mid_run_ends_the_job_with_no_strays(slurm):
    # Task 1 sends itself SIGKILL at step 3 of the all-reduce loop (as the OOM killer would).
    job = slurm.srun("kill-itself", 2, _loop_args(mode="kill", process=1, at_step=3),
                     devices_per_process=2)
    killed_at = job.wait_for_lines(r"process 1: failing on purpose at step 3 \(kill\)", 1,
                                   timeout_s=180)
    _assert_the_job_ends(slurm, job, killed_at, "by itself at step 3")


def test_a_task_killed_from_outside_ends_the_job_with_no_strays(slurm):
    name = "kill-from-outside"
    job = slurm.srun(name, 2, _loop_args(at_step=10**6, steps=10**6), devices_per_process=2)
    job.wait_for_lines(r"^process \d: all-reduce loop running", 2, timeout_s=180)
    job_id, _ = slurm.job_state(name)
    _assert_strays_are_seen(name, job_id)
    # scontrol listpids: PID JOBID STEPID LOCALID GLOBALID, one row per process of the job.
    done = slurm.run(["scontrol", "listpids", job_id])
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    task_1 = [int(row[0]) for row in rows if len(row) == 5 and row[4] == "1"]
    assert done.returncode == 0 and len(task_1) == 1, done.stdout + done.stderr
    killed_at = time.monotonic()
    os.kill(task_1[0], signal.SIGKILL)
    _assert_the_job_ends(slurm, job, killed_at, "from outside, in the loop")
