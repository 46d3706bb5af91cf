"""The kill test: SIGKILL a training job at random moments, resume it, get the same bits.

``python -m clusterlab.train_demo`` trains a small MLP and checkpoints every 2 steps. The test
starts it, waits until it trains, kills it with SIGKILL after a seeded random delay (most of a
run's time after the start is spent writing checkpoints, so many kills land inside a write),
and starts it again, over and over; then lets the last run finish. Meanwhile an uninterrupted
run of the same job runs in parallel as the reference. Checked:

* every resume restored a checkpoint whose parameters are bit for bit those the uninterrupted
  run saved at that step (digests of the parameters), never a partial one;
* no resume went back behind a checkpoint that was reported complete;
* the final parameters equal the uninterrupted run's bit for bit.

It prints the number of kills (and how many landed inside a checkpoint write) and resumes.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from clusterlab import train_demo

from conftest import ROOT

STEPS = 40
EVERY = 2
N_KILLS = 8
SEED = 20261129
MAX_DELAY_S = 0.7  # kill at a uniform random time in [0, MAX_DELAY_S] after training starts
                   # (in the very first run: after its first checkpoint)


def _command(data_dir: Path, checkpoint_dir: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "clusterlab.train_demo", "--data", str(data_dir),
            "--checkpoints", str(checkpoint_dir), "--steps", str(STEPS), "--every", str(EVERY),
            "--out", str(out), "--keep", "2"]


def _env(tmp_path: Path) -> dict[str, str]:
    # CPU (bit-exact and the same in every run); a compilation cache shared by all restarts.
    return {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1",
            "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jit-cache"),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


class _Run:
    """A child process whose stdout lines are collected by a thread as they come."""

    def __init__(self, command: list[str], env: dict[str, str], stderr_path: Path):
        self._stderr = open(stderr_path, "w+")  # a file: a full pipe would block the child
        self.proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True)
        self.lines: list[str] = []
        self.started = threading.Event()
        self.saved = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.strip())
            if line.startswith(("started", "done")):
                self.started.set()
            if line.startswith(("saved", "done")):
                self.saved.set()
        self.started.set()
        self.saved.set()

    def finish(self, timeout_s: float = 120) -> str:
        self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=10)
        self._stderr.seek(0)
        text = self._stderr.read()
        self._stderr.close()
        return text

    def events(self, kind: str) -> list[list[str]]:
        return [line.split()[1:] for line in self.lines if line.split()[:1] == [kind]]


def test_kill_and_resume_is_bit_identical(tmp_path):
    start_s = time.perf_counter()
    data_dir = tmp_path / "data"
    train_demo.make_dataset(data_dir, n_samples=512)
    env = _env(tmp_path)
    reference = _Run(_command(data_dir, tmp_path / "ref-ckpt", tmp_path / "ref.npz"), env,
                     tmp_path / "ref.stderr")

    rng = random.Random(SEED)
    checkpoint_dir, out = tmp_path / "ckpt", tmp_path / "out.npz"
    runs: list[_Run] = []
    kills = kills_in_write = partial_dirs_seen = 0
    while True:
        run = _Run(_command(data_dir, checkpoint_dir, out), env,
                   tmp_path / f"run{len(runs)}.stderr")
        runs.append(run)
        if kills == N_KILLS:  # the last run finishes
            stderr = run.finish()
            assert run.proc.returncode == 0, stderr[-2000:]
            break
        assert run.started.wait(timeout=120), "the training script did not start"
        if not checkpoint_dir.exists() or not any(p.name.isdigit()
                                                  for p in checkpoint_dir.iterdir()):
            run.saved.wait(timeout=120)  # the first run: kill it only once there is a checkpoint
        time.sleep(rng.uniform(0.0, MAX_DELAY_S))
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGKILL)
        stderr = run.finish()
        if run.proc.returncode == 0:  # finished before the kill: start over the count
            continue
        assert run.proc.returncode == -signal.SIGKILL, stderr[-2000:]
        kills += 1
        last = run.lines[-1].split()[0] if run.lines else ""
        kills_in_write += last == "saving"
        partial_dirs_seen += any("orbax-checkpoint-tmp" in p.name
                                 for p in checkpoint_dir.iterdir())

    stderr = reference.finish()
    assert reference.proc.returncode == 0, stderr[-2000:]
    reference_digests = {int(step): digest for step, digest in reference.events("saved")}

    # Every resume read what the uninterrupted run saved at that step, and never went back
    # behind a checkpoint that a killed run had reported complete.
    resumes = 0
    last_complete = None
    for run in runs:
        for step, digest in run.events("resumed"):
            resumes += 1
            assert digest == reference_digests[int(step)], f"resume at step {step} differs"
            assert last_complete is None or int(step) >= last_complete
        saved = [int(step) for step, _ in run.events("saved")]
        if saved:
            last_complete = max(saved)
    assert all(len(r.events("resumed")) + len(r.events("fresh")) == 1 for r in runs)
    assert resumes == len(runs) - 1  # every run after the first resumed from a checkpoint

    # The final parameters are bit for bit those of the uninterrupted run.
    assert runs[-1].events("done") == reference.events("done")
    assert int(reference.events("done")[0][0]) == STEPS
    assert train_demo.bitwise_equal(train_demo.load_params(out),
                                    train_demo.load_params(tmp_path / "ref.npz"))
    elapsed_s = time.perf_counter() - start_s
    print(f"\nkill test: {kills} kills ({kills_in_write} during a checkpoint write, "
          f"{partial_dirs_seen} left a partial checkpoint directory), {resumes} resumes, "
          f"{len(runs)} runs, final parameters bit-identical, {elapsed_s:.1f} s")
    assert kills == N_KILLS
    assert kills_in_write >= 1, "no kill landed inside a checkpoint write; raise N_KILLS"
