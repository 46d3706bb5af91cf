"""A small training job that checkpoints and resumes: kill it at any moment, start it again.

Run it as ``python -m clusterlab.train_demo --data DIR --checkpoints DIR --steps 40 --every 2
--out params.npz``. It trains the course's residual MLP (:mod:`clusterlab.models`) with Adam on
batches from a :class:`clusterlab.data.Loader`, adds input noise drawn from a JAX random key
(so the key is part of the state), and writes a checkpoint every ``--every`` steps with
:class:`clusterlab.checkpoint.Checkpoints`. Started again after a kill, it restores the newest
complete checkpoint (parameters, optimizer state, step, loader position, key) and continues; the
final parameters are then bit for bit those of a run that was never interrupted.

It prints one line per event, flushed at once, so a parent process can tell where a kill landed::

    resumed 6 3f2a...    (or "fresh 0": no checkpoint yet; then a digest of the parameters)
    started 6            (compiled; training begins at step 6)
    read 7               (reading the batch of step 7 begins ...)
    step 7               (... it is read; computing step 7 begins)
    saving 8             (a checkpoint write begins ...)
    saved 8 9b1c...      (... and is complete; the digest of the parameters saved)
    done 40 5e7d...      (the final parameters, also in --out)

Equal digests mean bit-identical parameters (:func:`digest`), so a parent can check that every
resume read exactly what an uninterrupted run saved at that step.

The final parameters go to ``--out`` as an ``.npz`` of the flattened leaves, written under a
temporary name and renamed, so a killed run never leaves a partial result.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from clusterlab import checkpoint, data, models
from clusterlab._checks import count as _check_count_arg

NOISE_SCALE = 0.05  # standard deviation of the input noise


def make_dataset(directory: str | os.PathLike, *, n_samples: int = 512, d_model: int = 32,
                 samples_per_shard: int = 128, seed: int = 0) -> data.DatasetInfo:
    """Write the regression task of :func:`clusterlab.models.synthetic_regression` as shards.

    Args:
        directory: where to write the dataset.
        n_samples: N, examples.
        d_model: D, input and output width.
        samples_per_shard: examples per shard file.
        seed: the data's random seed.

    Returns:
        The :class:`clusterlab.data.DatasetInfo`: fields ``x`` and ``y``, each f32[D] per sample.
    """
    x, y = models.synthetic_regression(jax.random.key(seed), n_samples=n_samples,
                                       d_model=d_model)  # x, y: f32[N, D]
    return data.write_shards(directory, {"x": np.asarray(x), "y": np.asarray(y)},
                             samples_per_shard=samples_per_shard)


def make_train_step(optimizer):
    """A jitted step ``(params, opt_state, rng, x, y) -> (params, opt_state, rng, loss)``.

    The key is split inside the step: one half is the next state's key, the other draws the
    input noise, so resuming with the stored key reproduces the same noise.
    """
    @jax.jit
    def step(params, opt_state, rng, x, y):
        rng, noise_key = jax.random.split(rng)
        x = x + NOISE_SCALE * jax.random.normal(noise_key, x.shape, x.dtype)  # x: f32[B, D]
        loss, grads = jax.value_and_grad(models.mse_loss)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, rng, loss

    return step


def initial_state(info: data.DatasetInfo, *, d_hidden: int, n_blocks: int, seed: int,
                  learning_rate: float, shapes_only: bool = False,
                  ) -> tuple[checkpoint.TrainState, object]:
    """The state before step 0 (or only its shapes, a restore target), and the optimizer."""
    d_model = info.fields["x"][0][0]
    optimizer = models.make_optimizer(learning_rate)

    def init(key):
        params = models.init_mlp(key, d_model=d_model, d_hidden=d_hidden, n_blocks=n_blocks)
        return params, optimizer.init(params)

    # One compiled program instead of dozens of small eager ones (faster restarts).
    key = jax.random.key(seed)
    params, opt_state = jax.eval_shape(init, key) if shapes_only else jax.jit(init)(key)
    state = checkpoint.TrainState(step=0, params=params, opt_state=opt_state,
                                  loader_position=0, rng=jax.random.key(seed + 1))
    return state, optimizer


def save_params(path: str | os.PathLike, params) -> None:
    """Write a pytree's leaves to ``path`` (.npz, ``leaf_0``, ``leaf_1``, ...) atomically."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **{f"leaf_{i}": np.asarray(leaf)
                       for i, leaf in enumerate(jax.tree.leaves(params))})
    os.replace(tmp, path)


def load_params(path: str | os.PathLike) -> list[np.ndarray]:
    """The leaves written by :func:`save_params`, in order."""
    with np.load(path) as f:
        return [f[f"leaf_{i}"] for i in range(len(f.files))]


def digest(params) -> str:
    """The first 16 hex digits of the SHA-256 of a pytree's leaves: equal bits, equal digest."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        leaf = np.asarray(leaf)
        h.update(f"{leaf.dtype}{leaf.shape}".encode())
        h.update(leaf.tobytes())
    return h.hexdigest()[:16]


def bitwise_equal(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> bool:
    """True when two lists of arrays have the same shapes, dtypes and bytes (bit for bit)."""
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes()
        for x, y in zip(a, b))


def run(data_dir: str | os.PathLike, checkpoint_dir: str | os.PathLike, *, steps: int,
        every: int, out: str | os.PathLike | None = None, batch_size: int = 32,
        d_hidden: int = 64, n_blocks: int = 2, seed: int = 0, learning_rate: float = 1e-2,
        keep: int = 3, prefetch: int = 2, workers: int = 1,
        read_bytes_per_s: float | None = None, log=print) -> checkpoint.TrainState:
    """Train to ``steps``, resuming from the newest checkpoint in ``checkpoint_dir``.

    Args:
        data_dir: a dataset from :func:`make_dataset`.
        checkpoint_dir: the run's checkpoints (created if missing).
        steps: train until this many steps are done.
        every: write a checkpoint after every ``every``-th step (and after the last).
        out: where to write the final parameters (:func:`save_params`), or None.
        batch_size, d_hidden, n_blocks, seed, learning_rate: the model and its training.
        keep: checkpoints to keep.
        prefetch, workers, read_bytes_per_s: the loader's settings.
        log: called with one event line at a time (see the module docstring).

    Returns:
        The final :class:`clusterlab.checkpoint.TrainState`.
    """
    source = data.ShardedSource(data_dir, read_bytes_per_s=read_bytes_per_s)
    with checkpoint.Checkpoints(checkpoint_dir, max_to_keep=keep) as ckpts:
        resume = ckpts.latest_step() is not None
        state, optimizer = initial_state(source.info, d_hidden=d_hidden, n_blocks=n_blocks,
                                         seed=seed, learning_rate=learning_rate,
                                         shapes_only=resume)
        if resume:
            state = ckpts.restore(state)
            log(f"resumed {state.step} {digest(state.params)}")
        else:
            log(f"fresh {state.step}")
        loader = data.Loader(source, batch_size=batch_size, seed=seed,
                             start_step=state.loader_position, prefetch=prefetch,
                             workers=workers)
        train_step = make_train_step(optimizer)
        params, opt_state, rng = state.params, state.opt_state, state.rng
        step = state.step
        if step < steps:  # compile before announcing the start
            train_step.lower(params, opt_state, rng,
                             *(jax.ShapeDtypeStruct((batch_size, *shape), jnp.dtype(dtype))
                               for shape, dtype in (source.info.fields["x"],
                                                    source.info.fields["y"]))).compile()
        log(f"started {step}")
        while step < steps:
            log(f"read {step + 1}")
            batch = next(loader)
            log(f"step {step + 1}")
            params, opt_state, rng, loss = train_step(params, opt_state, rng, batch["x"],
                                                      batch["y"])
            loss.block_until_ready()  # the step ends here, not when it is dispatched
            step += 1
            if step % every == 0 or step == steps:
                state = checkpoint.TrainState(step=step, params=params, opt_state=opt_state,
                                              loader_position=loader.position, rng=rng)
                log(f"saving {step}")
                ckpts.save(state)
                log(f"saved {step} {digest(params)}")
        state = checkpoint.TrainState(step=step, params=params, opt_state=opt_state,
                                      loader_position=loader.position, rng=rng)
    if out is not None:
        save_params(out, state.params)
    log(f"done {step} {digest(state.params)}")
    return state


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring and ``--help``."""
    parser = argparse.ArgumentParser(prog="python -m clusterlab.train_demo",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="dataset directory")
    parser.add_argument("--checkpoints", required=True, help="checkpoint directory")
    parser.add_argument("--steps", type=int, required=True, help="train until this step")
    parser.add_argument("--every", type=int, default=2, help="checkpoint interval in steps")
    parser.add_argument("--out", help="write the final parameters here (.npz)")
    parser.add_argument("--make-data", type=int, metavar="N_SAMPLES",
                        help="first write a dataset of N_SAMPLES if --data has none")
    parser.add_argument("--d-model", type=int, default=32,
                        help="input width of the dataset --make-data writes")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--d-hidden", type=int, default=64, help="the MLP's hidden width")
    parser.add_argument("--keep", type=int, default=3, help="checkpoints to keep")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--read-cap", type=float, help="read cap in bytes/s")
    parser.add_argument("--prefetch", type=int, default=2,
                        help="batches read ahead (0: each batch is read when asked for)")
    args = parser.parse_args(argv)
    if args.make_data and not (Path(args.data) / data.MANIFEST).exists():
        make_dataset(args.data, n_samples=args.make_data, d_model=args.d_model, seed=args.seed)
    run(args.data, args.checkpoints, steps=args.steps, every=args.every, out=args.out,
        batch_size=args.batch_size, d_hidden=args.d_hidden, keep=args.keep, seed=args.seed,
        prefetch=args.prefetch, read_bytes_per_s=args.read_cap,
        log=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())


# --- The kill test: SIGKILL the job at random moments, resume it, compare the bits -----------
#
# The job's event lines (see the module docstring) say which phase it is in. The parent aims
# each kill at a phase (a data read, a step, a checkpoint write), waits for a seeded random
# occurrence of it, waits a seeded random fraction of that phase's typical length, and sends
# SIGKILL; where the kill really landed is the child's last event line before it died.

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
        import queue
        import subprocess
        import threading

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
        import time

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
        import subprocess

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


def kill_test(work_dir: str | os.PathLike, *, kills: int = 21, seed: int = 0, steps: int = 80,
              every: int = 2, n_samples: int = 1024, d_model: int = 256, d_hidden: int = 2048,
              batch_size: int = 256, read_bytes_per_s: float = 12.8e6,
              delay_fraction: tuple[float, float] = (0.2, 0.6), max_skip_steps: int = 6,
              timeout_s: float = 300.0) -> KillReport:
    """SIGKILL ``python -m clusterlab.train_demo`` ``kills`` times, resume it each time, compare.

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
        KillTestError: when a run fails on its own (not by the test's SIGKILL), never starts,
            or finishes before its kill; the message carries that run's stdout and stderr.
    """
    import random
    import signal
    import sys
    import time

    _check_count_arg("kills", kills)
    if not 0 <= delay_fraction[0] <= delay_fraction[1]:
        raise ValueError(f"delay_fraction must be (low, high) with 0 <= low <= high, got "
                         f"{delay_fraction!r}.")
    start_s = time.perf_counter()
    work = Path(work_dir)
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if not (work / "data" / data.MANIFEST).exists():
        make_dataset(work / "data", n_samples=n_samples, d_model=d_model,
                     samples_per_shard=min(n_samples, 256))
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1",
           "JAX_COMPILATION_CACHE_DIR": str(work / "jit-cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}

    def command(name: str) -> list[str]:
        return [sys.executable, "-m", "clusterlab.train_demo", "--data", str(work / "data"),
                "--checkpoints", str(work / f"{name}-ckpt"), "--out", str(work / f"{name}.npz"),
                "--steps", str(steps), "--every", str(every), "--keep", "2",
                "--batch-size", str(batch_size), "--d-hidden", str(d_hidden),
                "--read-cap", str(read_bytes_per_s), "--prefetch", "0", "--seed", "0"]

    def failed(child: _Child, what: str) -> KillTestError:
        return KillTestError(f"{what} (exit code {child.proc.returncode}); its logs are kept "
                             f"in {logs}.\n{child.logs()}")

    reference = _Child(command("reference"), env, logs / "reference")
    if reference.finish(timeout_s) != 0:
        raise failed(reference, "the uninterrupted run failed")
    saved_digests = {int(step): d for step, d in reference.of_kind("saved")}
    lengths_s = _phase_lengths_s(reference.events)

    rng = random.Random(seed)
    order: list[str] = []
    while len(order) < kills:  # each phase in turn, in a seeded order per round
        order += rng.sample(PHASES, len(PHASES))
    ckpt_dir = work / "run-ckpt"
    records: list[dict] = []
    runs = 1
    for i, aimed in enumerate(order[:kills] + [None]):
        child = _Child(command("run"), env, logs / f"run{i:02d}")
        runs += 1
        if records:  # how this run began: the outcome of the previous kill
            begun = child.queue.get(timeout=timeout_s)
            if begun is None:
                child.finish(timeout_s)
                raise failed(child, f"run {i} ended before restoring")
            _, words = begun
            resumed_at = int(words[1]) if words[0] == "resumed" else None
            records[-1]["resumed_at"] = resumed_at
            records[-1]["resume_identical"] = (None if resumed_at is None
                                               else saved_digests.get(resumed_at) == words[2])
        if aimed is None:  # the last run finishes
            if child.finish(timeout_s) != 0:
                raise failed(child, "the final run failed")
            break
        kind = {v: k for k, v in _PHASE_STARTS.items()}[aimed]
        skip = rng.randint(0, max_skip_steps // (every if aimed == "checkpoint write" else 1))
        delay_s = rng.uniform(*delay_fraction) * lengths_s[aimed]
        started, seen = False, 0
        while True:
            item = child.queue.get(timeout=timeout_s)
            if item is None:
                child.finish(timeout_s)
                raise failed(child, f"run {i} ended before its kill (aimed at the {aimed} "
                                    f"after {skip} more); give the job more steps")
            line_s, words = item
            started = started or words[0] == "started"
            if started and words[0] == kind:
                if seen == skip:
                    break
                seen += 1
        time.sleep(max(0.0, line_s + delay_s - time.perf_counter()))
        child.proc.send_signal(signal.SIGKILL)
        if child.finish(timeout_s) != -signal.SIGKILL:
            raise failed(child, f"run {i} was not ended by the SIGKILL")
        last = child.events[-1][1]
        on_disk = [p.name for p in ckpt_dir.iterdir()] if ckpt_dir.exists() else []
        complete = [int(name) for name in on_disk if name.isdigit()]
        landed_in = _LANDED.get(last[0], last[0])
        records.append(dict(aimed_at=aimed, landed_in=landed_in, step=int(last[1]),
                            delay_s=time.perf_counter() - line_s,
                            partial_checkpoint=(landed_in == "checkpoint write" and any(
                                name.startswith(f"{last[1]}.") for name in on_disk)),
                            newest_complete=max(complete) if complete else None))

    final_identical = (child.of_kind("done") == reference.of_kind("done")
                       and bitwise_equal(load_params(work / "run.npz"),
                                         load_params(work / "reference.npz")))
    kill_records = tuple(KillRecord(**r) for r in records)
    corrupt = sum(k.resumed_at is not None and not k.resume_identical for k in kill_records)
    return KillReport(kills=kill_records, steps=steps, reference_saved=tuple(saved_digests),
                      corrupt_reads=corrupt, final_identical=final_identical, runs=runs,
                      elapsed_s=time.perf_counter() - start_s, log_dir=str(logs))
