"""The kill test: SIGKILL a training job at random moments, resume it, compare the bits.

:func:`kill_test` drives ``python -m clusterlab.device.train_demo`` (the job, whose event lines say
which phase it is in). The parent aims each kill at a phase (a data read, a step, a checkpoint
write), waits for a seeded random occurrence of it, waits a seeded random fraction of that
phase's typical length, and sends SIGKILL; where the kill really landed is the child's last event
line before it died. The harness lives beside the job it drives but apart from it: the job never
imports it.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clusterlab._checks import count as _check_count_arg
from clusterlab.device import dataloader, train_demo

PHASES = ("data read", "step", "checkpoint write")
_PHASE_STARTS = {"read": "data read", "step": "step", "saving": "checkpoint write"}
_LANDED = {**_PHASE_STARTS, "fresh": "start-up", "resumed": "start-up", "started": "start-up",
           "saved": "after a write"}


class KillTestError(RuntimeError):
    """A run of the kill test failed on its own (not by our SIGKILL), or never got going."""


@dataclass(frozen=True)
class KillRecord:
    """One SIGKILL and the run that followed it."""

    aimed_at: str                   # the phase the kill was aimed at (one of PHASES)
    landed_in: str                  # the phase the job was in when it died (its last event)
    step: int                       # the step of that last event
    delay_s: float                  # seconds from the start of the aimed phase to the kill
    partial_checkpoint: bool        # killed in a write, it left that step half-written on disk
    newest_complete: int | None     # the newest complete checkpoint on disk after the kill
    resumed_at: int | None          # where the next run resumed (None: it started fresh)
    resume_identical: bool | None   # its parameters' digest equals the uninterrupted run's


@dataclass(frozen=True)
class KillReport:
    """What :func:`kill_test` found; every field is evidence for the lab and the test."""

    kills: tuple[KillRecord, ...]
    steps: int                      # the job's length in steps
    reference_saved: tuple[int, ...]  # steps the uninterrupted run checkpointed
    corrupt_reads: int              # resumes whose parameters differ from the reference's
    final_identical: bool           # final parameters bit-identical to the uninterrupted run
    runs: int                       # processes started, the reference included
    elapsed_s: float                # wall time of the whole test
    log_dir: str                    # each run's stdout and stderr, kept

    def landed(self) -> dict[str, int]:
        """Kills per phase they landed in, the requested phases first."""
        counts = {phase: 0 for phase in PHASES}
        for kill in self.kills:
            counts[kill.landed_in] = counts.get(kill.landed_in, 0) + 1
        return counts

    @property
    def resumes(self) -> int:
        """Runs that resumed from a checkpoint (the others started fresh)."""
        return sum(k.resumed_at is not None for k in self.kills)

    @property
    def identical_resumes(self) -> int:
        """Resumes whose parameters were bit for bit the uninterrupted run's at that step."""
        return sum(bool(k.resume_identical) for k in self.kills)

    @property
    def half_written_skipped(self) -> int:
        """Kills that left a half-written checkpoint, after which the next run resumed from
        an older, complete one."""
        return sum(k.partial_checkpoint and k.landed_in == "checkpoint write"
                   and (k.resumed_at is None or k.resumed_at < k.step) for k in self.kills)

    @property
    def resumed_newest(self) -> bool:
        """Every run resumed from the newest complete checkpoint on disk (or fresh if none)."""
        return all(k.resumed_at == k.newest_complete for k in self.kills)

    def summary(self) -> str:
        """One line: kills per phase, resumes, identical digests, corrupt reads, time."""
        phases = ", ".join(f"{n} in {phase}" for phase, n in self.landed().items() if n)
        return (f"{len(self.kills)} SIGKILLs ({phases}); {self.resumes} resumes, "
                f"{self.identical_resumes} bit-identical to the uninterrupted run, "
                f"{self.corrupt_reads} corrupt reads; {self.half_written_skipped} half-written "
                f"checkpoint{'' if self.half_written_skipped == 1 else 's'} skipped; final "
                f"parameters {'bit-identical' if self.final_identical else 'DIFFERENT'}; "
                f"{self.runs} runs in {self.elapsed_s:.0f} s")


class _Child:
    """A training process whose event lines are timestamped and kept, with its stderr."""

    def __init__(self, command: list[str], env: dict[str, str], log_stem: Path):
        self.out_path = log_stem.with_suffix(".out")
        self.err_path = log_stem.with_suffix(".err")
        self._err = open(self.err_path, "w")  # a file: a full pipe would block the child
        self.proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                     stderr=self._err, text=True)
        self.events: list[tuple[float, list[str]]] = []  # (time.perf_counter(), words)
        self.queue: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with open(self.out_path, "w") as out:
            for line in self.proc.stdout:
                now_s = time.perf_counter()
                out.write(line)
                words = line.split()
                if words:
                    self.events.append((now_s, words))
                    self.queue.put((now_s, words))
        self.queue.put(None)  # end of output

    def finish(self, timeout_s: float) -> int:
        """Wait for the process and its output; returns the exit code."""
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
            self._reader.join(timeout=10)
            self._err.close()
            raise KillTestError(f"a training run took longer than {timeout_s:.0f} s and was "
                                f"stopped.\n{self.logs()}") from None
        self._reader.join(timeout=30)
        self._err.close()
        return code

    def of_kind(self, kind: str) -> list[list[str]]:
        return [words[1:] for _, words in self.events if words[0] == kind]

    def logs(self, lines: int = 15) -> str:
        """The tails of its stdout and stderr, for an error message."""
        def tail(path: Path) -> str:
            text = path.read_text() if path.exists() else ""
            return "\n".join(text.splitlines()[-lines:]) or "(empty)"
        return (f"--- stdout ({self.out_path.name}), last lines:\n{tail(self.out_path)}\n"
                f"--- stderr ({self.err_path.name}), last lines:\n{tail(self.err_path)}")


def _phase_lengths_s(events: list[tuple[float, list[str]]]) -> dict[str, float]:
    """Median seconds from each phase's start line to the next event line."""
    lengths: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for (t0, words), (t1, _) in zip(events, events[1:]):
        if words[0] in _PHASE_STARTS:
            lengths[_PHASE_STARTS[words[0]]].append(t1 - t0)
    missing = [phase for phase, seen in lengths.items() if not seen]
    if missing:
        raise KillTestError(f"the uninterrupted run showed no {missing}; give it more steps.")
    return {phase: float(np.median(seen)) for phase, seen in lengths.items()}


@dataclass(frozen=True)
class _Job:
    """How every run of one kill test is started: the same job, in one of two directories."""

    work: Path
    steps: int
    every: int
    batch_size: int
    d_hidden: int
    read_bytes_per_s: float
    timeout_s: float

    @property
    def logs(self) -> Path:
        return self.work / "logs"

    def start(self, name: str, log_name: str) -> _Child:
        """Start the job with checkpoints in ``work/{name}-ckpt``, logs as ``logs/{log_name}``."""
        work = self.work
        command = [sys.executable, "-m", "clusterlab.device.train_demo", "--data", str(work / "data"),
                   "--checkpoints", str(work / f"{name}-ckpt"), "--out", str(work / f"{name}.npz"),
                   "--steps", str(self.steps), "--every", str(self.every), "--keep", "2",
                   "--batch-size", str(self.batch_size), "--d-hidden", str(self.d_hidden),
                   "--read-cap", str(self.read_bytes_per_s), "--prefetch", "0", "--seed", "0"]
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1",
               "JAX_COMPILATION_CACHE_DIR": str(work / "jit-cache"),
               "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
        return _Child(command, env, self.logs / log_name)

    def failed(self, child: _Child, what: str) -> KillTestError:
        """The error for a run that went wrong, with its exit code and the tails of its logs."""
        return KillTestError(f"{what} (exit code {child.proc.returncode}); its logs are kept "
                             f"in {self.logs}.\n{child.logs()}")

    def next_event(self, child: _Child, what: str) -> tuple[float, list[str]]:
        """The child's next event line, timestamped; ``what`` names what ending early means."""
        item = child.queue.get(timeout=self.timeout_s)
        if item is None:
            child.finish(self.timeout_s)
            raise self.failed(child, what)
        return item


def kill_test(work_dir: str | os.PathLike, *, kills: int = 21, seed: int = 0, steps: int = 80,
              every: int = 2, n_samples: int = 1024, d_model: int = 256, d_hidden: int = 2048,
              batch_size: int = 256, read_bytes_per_s: float = 12.8e6,
              delay_fraction: tuple[float, float] = (0.2, 0.6), max_skip_steps: int = 6,
              timeout_s: float = 300.0) -> KillReport:
    """SIGKILL ``python -m clusterlab.device.train_demo`` ``kills`` times, resume it each time,
    compare.

    First an uninterrupted run gives the reference: the digest of the parameters at every
    checkpoint, the final parameters, and how long each phase takes. Then the same job runs in
    a second checkpoint directory and is killed ``kills`` times: each kill is aimed at a phase
    (data read, step, checkpoint write, in a seeded random order that visits each in turn), at
    a seeded random occurrence of it (letting 0 to ``max_skip_steps`` steps' worth of them
    pass, so that the kills spread over the whole job), a seeded random fraction
    (``delay_fraction``) of that phase's typical length after it began. The job is restarted
    after every kill; the last run finishes. The loader reads each batch when asked
    (``prefetch=0``) through a read cap, so a data read is a phase of its own.

    Args:
        work_dir: an empty or new directory for the dataset, checkpoints and logs.
        kills: SIGKILLs to send (at least 1).
        seed: seed of the kill plan (which phase, which occurrence, how long after it began).
        steps, every: the job's length and checkpoint interval, in steps.
        n_samples, d_model, d_hidden, batch_size: the dataset and the model.
        read_bytes_per_s: the loader's read cap.
        delay_fraction: the range of the kill's delay, as a fraction of the phase's length.
        max_skip_steps: steps to let pass before the aimed phase, at most (a checkpoint
            write occurs once in ``every`` steps, so at most ``max_skip_steps // every`` of
            them pass).
        timeout_s: the longest any one run may take.

    Returns:
        The :class:`KillReport`. Logs of every run stay in ``work_dir/logs``.

    Raises:
        ValueError: ``kills`` is not a positive integer, or ``delay_fraction`` is not
            ``(low, high)`` with ``0 <= low <= high``.
        KillTestError: when a run fails on its own (not by the test's SIGKILL), never starts,
            or finishes before its kill; the message carries that run's stdout and stderr.
    """
    _check_count_arg("kills", kills)
    if not 0 <= delay_fraction[0] <= delay_fraction[1]:
        raise ValueError(f"delay_fraction must be (low, high) with 0 <= low <= high, got "
                         f"{delay_fraction!r}.")
    start_s = time.perf_counter()
    job = _Job(Path(work_dir), steps=steps, every=every, batch_size=batch_size,
               d_hidden=d_hidden, read_bytes_per_s=read_bytes_per_s, timeout_s=timeout_s)
    _prepare(job, n_samples=n_samples, d_model=d_model)
    reference = job.start("reference", "reference")
    if reference.finish(timeout_s) != 0:
        raise job.failed(reference, "the uninterrupted run failed")
    saved_digests = {int(step): d for step, d in reference.of_kind("saved")}
    lengths_s = _phase_lengths_s(reference.events)

    rng = random.Random(seed)
    records: list[dict] = []
    for i, aimed in enumerate(_kill_order(rng, kills) + [None]):
        child = job.start("run", f"run{i:02d}")
        if records:  # how this run began: the outcome of the previous kill
            records[-1].update(_how_it_resumed(job, child, i, saved_digests))
        if aimed is None:  # the last run finishes
            if child.finish(timeout_s) != 0:
                raise job.failed(child, "the final run failed")
            break
        # The plan draws the occurrence, then the delay: the seeded kills depend on this order.
        skip = rng.randint(0, max_skip_steps // (every if aimed == "checkpoint write" else 1))
        delay_s = rng.uniform(*delay_fraction) * lengths_s[aimed]
        records.append(_kill_once(job, child, i, aimed=aimed, skip=skip, delay_s=delay_s))

    run_params, reference_params = (train_demo.load_params(job.work / f"{name}.npz")
                                    for name in ("run", "reference"))
    final_identical = (child.of_kind("done") == reference.of_kind("done")
                       and train_demo.bitwise_equal(run_params, reference_params))
    kill_records = tuple(KillRecord(**r) for r in records)
    corrupt = sum(k.resumed_at is not None and not k.resume_identical for k in kill_records)
    return KillReport(kills=kill_records, steps=steps, reference_saved=tuple(saved_digests),
                      corrupt_reads=corrupt, final_identical=final_identical,
                      runs=len(records) + 2, elapsed_s=time.perf_counter() - start_s,
                      log_dir=str(job.logs))


def _prepare(job: _Job, *, n_samples: int, d_model: int) -> None:
    """Make the log directory, and the dataset unless ``work/data`` already holds one."""
    job.logs.mkdir(parents=True, exist_ok=True)
    if not (job.work / "data" / dataloader.MANIFEST).exists():
        train_demo.make_dataset(job.work / "data", n_samples=n_samples, d_model=d_model,
                                samples_per_shard=min(n_samples, 256))


def _kill_order(rng: random.Random, kills: int) -> list[str]:
    """The phase each kill aims at: every phase in turn, in a seeded order per round."""
    order: list[str] = []
    while len(order) < kills:
        order += rng.sample(PHASES, len(PHASES))
    return order[:kills]


def _how_it_resumed(job: _Job, child: _Child, i: int,
                    saved_digests: dict[int, str]) -> dict[str, object]:
    """Where run ``i`` resumed (its first line) and whether it read the reference's bits."""
    _, words = job.next_event(child, f"run {i} ended before restoring")
    resumed_at = int(words[1]) if words[0] == "resumed" else None
    return dict(resumed_at=resumed_at,
                resume_identical=(None if resumed_at is None
                                  else saved_digests.get(resumed_at) == words[2]))


def _kill_once(job: _Job, child: _Child, i: int, *, aimed: str, skip: int,
               delay_s: float) -> dict[str, object]:
    """Kill run ``i`` ``delay_s`` into the ``skip``-th next ``aimed`` phase; where it landed."""
    kind = {v: k for k, v in _PHASE_STARTS.items()}[aimed]
    started, seen = False, 0
    while True:
        line_s, words = job.next_event(child, f"run {i} ended before its kill (aimed at the "
                                              f"{aimed} after {skip} more); give the job more "
                                              f"steps")
        started = started or words[0] == "started"
        if started and words[0] == kind:
            if seen == skip:
                break
            seen += 1
    time.sleep(max(0.0, line_s + delay_s - time.perf_counter()))
    child.proc.send_signal(signal.SIGKILL)
    if child.finish(job.timeout_s) != -signal.SIGKILL:
        raise job.failed(child, f"run {i} was not ended by the SIGKILL")
    return _where_it_landed(job, child.events[-1][1], aimed=aimed,
                            delay_s=time.perf_counter() - line_s)


def _where_it_landed(job: _Job, last: list[str], *, aimed: str,
                     delay_s: float) -> dict[str, object]:
    """The record of a kill from the child's last event line and the checkpoints on disk."""
    ckpt_dir = job.work / "run-ckpt"
    on_disk = [p.name for p in ckpt_dir.iterdir()] if ckpt_dir.exists() else []
    complete = [int(name) for name in on_disk if name.isdigit()]
    landed_in = _LANDED.get(last[0], last[0])
    return dict(aimed_at=aimed, landed_in=landed_in, step=int(last[1]), delay_s=delay_s,
                partial_checkpoint=(landed_in == "checkpoint write" and any(
                    name.startswith(f"{last[1]}.") for name in on_disk)),
                newest_complete=max(complete) if complete else None)
