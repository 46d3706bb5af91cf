"""clusterlab.device.distributed, clusterlab.device.launch and the two-level cost model.

The multi-process tests start real JAX processes joined over 127.0.0.1 (2 x 2 devices and 4 x 1)
and check values, training against one device, and that failures end every process in bounded
time. Only loopback addresses are used.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from clusterlab.analytic import costmodel
from clusterlab.device import collectives, distributed, launch
from conftest import DEVICES, ROOT, devices, run_python

MULTIHOST = "clusterlab.course.examples.multihost"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _session_members(sid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # fields[3]: session id
            members.append(int(entry.name))
    return members


# --- settings and pure functions (no processes) ---------------------------------------------


def test_detect_environment_from_launcher_variables():
    env = distributed.detect_environment(environ={
        distributed.ENV_COORDINATOR: "127.0.0.1:4321", distributed.ENV_NUM_PROCESSES: "4",
        distributed.ENV_PROCESS_ID: "2", distributed.ENV_DEVICES_PER_PROCESS: "3"})
    assert env == distributed.ClusterEnv("127.0.0.1:4321", 4, 2, 3, "clusterlab.device.launch")
    assert env.is_loopback


def test_detect_environment_from_slurm():
    env = distributed.detect_environment(environ={
        "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "4097",
        "SLURM_STEP_NODELIST": "gpu[003-010,012],login1"})
    assert env.coordinator_address == f"gpu003:{distributed.slurm_port(4097)}"
    assert (env.num_processes, env.process_id, env.source) == (8, 5, "slurm")
    assert not env.is_loopback
    with_port = distributed.detect_environment(environ={
        "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "node7",
        distributed.ENV_PORT: "12345"})
    assert with_port.coordinator_address == "node7:12345"


def test_slurm_host_list_and_port():
    assert distributed.first_slurm_host("node001") == "node001"
    assert distributed.first_slurm_host("node001,host2") == "node001"
    assert distributed.first_slurm_host("node[001-0015],host2") == "node001"
    assert distributed.first_slurm_host("node[007,009-015]") == "node007"
    with pytest.raises(ValueError, match="empty"):
        distributed.first_slurm_host(" ")
    assert distributed.slurm_port(0) == 65535 - 4095
    assert distributed.slurm_port(4096 + 7) == 65535 - 4095 + 7


def test_detect_environment_explicit_single_and_errors():
    assert distributed.detect_environment(environ={}).source == "single"
    explicit = distributed.detect_environment(coordinator_address="127.0.0.1:5000",
                                              num_processes=2, process_id=1, environ={})
    assert (explicit.num_processes, explicit.process_id, explicit.source) == (2, 1, "explicit")
    with pytest.raises(ValueError, match="all three"):
        distributed.detect_environment(num_processes=2, environ={})
    with pytest.raises(ValueError, match="below num_processes"):
        distributed.detect_environment(coordinator_address="127.0.0.1:5000", num_processes=2,
                                       process_id=2, environ={})
    with pytest.raises(ValueError, match="host:port"):
        distributed.detect_environment(coordinator_address="127.0.0.1", num_processes=2,
                                       process_id=0, environ={})
    with pytest.raises(ValueError, match="whole number"):
        distributed.detect_environment(environ={"SLURM_PROCID": "x", "SLURM_NTASKS": "2",
                                                "SLURM_STEP_NODELIST": "a"})


def test_init_after_jax_started_is_a_clear_error():
    # conftest already created JAX's devices in this process
    with pytest.raises(distributed.DistributedError, match="before any JAX operation"):
        distributed.init(coordinator_address="127.0.0.1:5000", num_processes=2, process_id=0)


def test_port_in_use_is_refused_before_anything_starts():
    with socket.socket() as busy:
        busy.bind((distributed.LOOPBACK, 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(distributed.PortInUseError, match=f"Port {port} on 127.0.0.1"):
            launch.launch(["-c", "pass"], processes=2, port=port, echo=False)
    assert 1024 <= distributed.free_port() <= 65535


def test_launch_validates_its_arguments():
    with pytest.raises(ValueError, match="one count per process"):
        launch.launch(["-c", "pass"], processes=2, devices_per_process=[1, 2, 3])
    with pytest.raises(ValueError, match="needs a command"):
        launch.launch([], processes=2)
    with pytest.raises(ValueError, match="no function"):
        launch.run(f"{MULTIHOST}:nothing_here", processes=2)


def test_launcher_command_line_split():
    split = launch._split
    assert split(["--processes", "2", "-m", "pkg.mod", "--x", "1"]) == (
        ["--processes", "2"], ["-m", "pkg.mod", "--x", "1"])
    assert split(["--processes", "2", "--port", "9", "run.py", "-v"]) == (
        ["--processes", "2", "--port", "9"], ["run.py", "-v"])
    assert split(["--processes", "2", "--", "-c", "pass"]) == (["--processes", "2"],
                                                               ["-c", "pass"])


def test_the_launcher_has_one_path_and_starts_without_jax():
    # launch.run, launch.launch (labs and scripts call them there) are launch's own, and the
    # in-process half does not offer them under a second name.
    for name in ("launch", "run", "LaunchResult"):
        assert getattr(launch, name).__module__ == "clusterlab.device.launch"
        assert not hasattr(distributed, name), name
    # The launcher (outside the processes) never imports JAX or the in-process half.
    code = ("import sys, clusterlab.device.launch; "
            "print(sorted(m for m in ('jax', 'clusterlab.device.distributed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_hierarchical_all_reduce_equals_psum():
    mesh = devices.mesh((2, 4), ("hosts", "devices"), DEVICES)
    x = jax.numpy.arange(8 * 12, dtype=jax.numpy.float32)  # 12 elements per device

    def both(body):
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=jax.P(("hosts", "devices")),
                                     out_specs=jax.P(("hosts", "devices")), check_vma=False))

    flat = both(lambda b: jax.lax.psum(b, ("hosts", "devices")))(x)
    two_level = both(lambda b: collectives.hierarchical_all_reduce(
        b, intra_axis="devices", inter_axis="hosts"))(x)
    np.testing.assert_allclose(np.asarray(two_level), np.asarray(flat))
    with pytest.raises(ValueError, match="multiple of 4"):
        both(lambda b: collectives.hierarchical_all_reduce(
            b[:3], intra_axis="devices", inter_axis="hosts"))(x)


def test_fit_two_level_recovers_the_links():
    truth = costmodel.TwoLevelModel(4, 2, intra_bandwidth=100e9, intra_latency=2e-6,
                                    inter_bandwidth=10e9, inter_latency=8e-6)
    sizes = np.array([2.0**k for k in range(10, 27, 2)])
    fit = costmodel.fit_two_level(sizes, truth.intra_all_reduce_s(sizes), sizes,
                                  truth.inter_all_reduce_s(sizes), devices_per_host=4, n_hosts=2)
    for name in ("intra_bandwidth", "intra_latency", "inter_bandwidth", "inter_latency"):
        assert getattr(fit, name) == pytest.approx(getattr(truth, name), rel=1e-6)
    nbytes = 2.0**24
    assert fit.hierarchical_all_reduce_s(nbytes) == pytest.approx(
        costmodel.hierarchical_all_reduce_time(nbytes, 4, 2, 100e9, 10e9, intra_latency=2e-6,
                                               inter_latency=8e-6))
    # Only 1/4 of the buffer crosses the slow links: the two-level all-reduce wins big.
    assert fit.hierarchical_all_reduce_s(nbytes) < 0.5 * fit.flat_all_reduce_s(nbytes)
    with pytest.raises(ValueError, match="at least 2 devices per host"):
        costmodel.fit_two_level(sizes, sizes, sizes, sizes, devices_per_host=1, n_hosts=2)


def test_link_from_fit_inverts_the_ring_line():
    line = costmodel.collective_alpha_beta("all_reduce", 8, bandwidth=5e9, latency=3e-6)
    bandwidth, latency = costmodel.link_from_fit(line, "all_reduce", 8)
    assert (bandwidth, latency) == (pytest.approx(5e9), pytest.approx(3e-6))
    with pytest.raises(ValueError, match="moves nothing"):
        costmodel.link_from_fit(line, "all_reduce", 1)


# --- several processes -------------------------------------------------------------------------


def test_launcher_2x2_prefixes_output_and_checks_collectives():
    done = subprocess.run(
        [sys.executable, "-m", "clusterlab.device.launch", "--processes", "2",
         "--devices-per-process", "2", "-m", MULTIHOST],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for rank in (0, 1):
        assert any(line.startswith(f"[{rank}] process {rank} of 2 (clusterlab.device.launch): mesh "
                                   "(2, 2) (hosts, devices), 2 local device(s), all-reduces "
                                   "equal numpy's") for line in lines), done.stdout
    assert any(line.startswith("[0] devices: 4 CPU devices over 2 processes on 2 simulated "
                               "devices each") for line in lines), done.stdout
    assert "Gloo" not in done.stdout


def test_collectives_4x1_give_the_right_values():
    result = launch.run(f"{MULTIHOST}:collectives_check", processes=4,
                             devices_per_process=1)
    assert result.returncode == 0 and len(result.results) == 4
    for rank, value in enumerate(result.results):
        assert value["process"] == rank and value["ok"] and value["mesh_shape"] == [4, 1]
        assert value["tables"]["within a process (devices)"] == [[1], [2], [3], [4]]
        assert value["tables"]["across processes (hosts)"] == [[10]] * 4
        assert value["tables"]["whole mesh (hierarchical)"] == [[10]] * 4
    assert not any(_alive(pid) for pid in result.pids)


def test_training_across_processes_equals_one_device():
    result = launch.run(f"{MULTIHOST}:train_check", processes=2, devices_per_process=2,
                             steps=3)
    first, second = result.results
    assert first["mesh_shape"] == [2, 2]
    assert first["losses"] == second["losses"]  # every process holds the same replicated loss
    assert first["max_abs_diff"] < 1e-5
    assert first["grad_rel_diff"] < 1e-5
    assert 2.5 < first["grad_rel_diff_summed"] < 3.5  # summed over 4 devices: 4 x, off by 3 x
    np.testing.assert_allclose(first["losses"], first["reference_losses"], rtol=1e-5)
    assert first["losses"][-1] < first["losses"][0]


def test_a_killed_process_stops_the_job_in_bounded_time_with_no_strays():
    start = time.monotonic()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "clusterlab.device.launch", "--processes", "2",
         "--devices-per-process", "2", "--timeout", "100", "-m", "clusterlab.device.distributed",
         f"{MULTIHOST}:fail", json.dumps({"mode": "kill", "at_step": 2})],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        out, _ = launcher.communicate(timeout=100)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    elapsed_s = time.monotonic() - start
    assert launcher.returncode == 128 + signal.SIGKILL, out
    assert "[1] process 1: failing on purpose at step 2 (kill)" in out
    assert "[launch] process 1 was killed by SIGKILL" in out
    assert "Gloo all-reduce failed" in out  # process 0's own, clear error
    stopped_s = float(out.split("processes stopped ")[1].split(" s later")[0])
    assert stopped_s < 10  # within the grace period; JAX's error usually comes at once
    assert elapsed_s < 90
    time.sleep(0.2)
    assert _session_members(launcher.pid) == []  # no process of the job is left


def test_a_failing_process_is_reported_with_its_error():
    with pytest.raises(distributed.DistributedError,
                       match=r"(?s)process 1 exited with code 1.*failure on purpose"):
        launch.run(f"{MULTIHOST}:fail", processes=2, devices_per_process=1, mode="raise")


def test_a_hung_process_is_caught_by_the_heartbeat():
    result = launch.run(f"{MULTIHOST}:fail", processes=2, devices_per_process=1,
                             check=False, mode="hang",
                             launch_options={"heartbeat_timeout_s": 2, "timeout_s": 60})
    # Process 1 stops (SIGSTOP) with its sockets open; JAX declares it dead after the
    # heartbeat timeout and ends process 0, then the launcher ends process 1.
    assert result.returncode != 0 and result.failure.startswith("process 0")
    assert "heartbeat" in result.outputs[0]
    assert result.elapsed_s < 55  # well before the launcher's own timeout
    assert not any(_alive(pid) for pid in result.pids)


def test_a_missing_process_times_out_with_a_clear_error():
    done = run_python("-m", "clusterlab.device.distributed", f"{MULTIHOST}:collectives_check",
                      timeout=60, extra_env={
                          distributed.ENV_COORDINATOR: f"127.0.0.1:{distributed.free_port()}",
                          distributed.ENV_NUM_PROCESSES: "2", distributed.ENV_PROCESS_ID: "0",
                          distributed.ENV_INIT_TIMEOUT_S: "3", "JAX_PLATFORMS": "cpu"})
    assert done.returncode == distributed.EXIT_INIT_TIMEOUT, done.stderr[-2000:]
    assert "process 0 of 2 waited 3 s for all processes to join" in done.stderr


def test_a_device_count_mismatch_is_a_clear_error():
    # Every process says it, with the fix, once: process 0 (the coordination service's host)
    # waits until all have printed it before it exits, which would end the others at once.
    result = launch.run(f"{MULTIHOST}:collectives_check", processes=2,
                             devices_per_process=[2, 1], check=False)
    assert result.returncode == 1, result.failure
    for rank, output in enumerate(result.outputs):
        line = (f"clusterlab.device.distributed: process {rank} of 2: DeviceCountMismatchError: The "
                "processes have different numbers of devices (process 0: 2, process 1: 1). A "
                "(hosts, devices) mesh needs the same count everywhere: start every process "
                "with the same devices_per_process")
        assert output.count(line) == 1, output
