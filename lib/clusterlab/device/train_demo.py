"""A small training job that checkpoints and resumes: kill it at any moment, start it again.

Run it as ``python -m clusterlab.device.train_demo --data DIR --checkpoints DIR --steps 40 --every 2
--out params.npz``. It trains the course's residual MLP (:mod:`clusterlab.device.models`) with Adam
on batches from a :class:`clusterlab.device.dataloader.Loader`, adds input noise drawn from a JAX
random key (so the key is part of the state), and writes a checkpoint every ``--every`` steps with
:class:`clusterlab.device.checkpoint.Checkpoints`. Started again after a kill, it restores the
newest complete checkpoint (parameters, optimizer state, step, loader position, key) and continues;
the final parameters are then bit for bit those of a run that was never interrupted.

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

:func:`clusterlab.device.killtest.kill_test` is the harness that kills this job and checks the bits.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from clusterlab.device import checkpoint, dataloader, models

NOISE_SCALE = 0.05  # standard deviation of the input noise


def make_dataset(directory: str | os.PathLike, *, n_samples: int = 512, d_model: int = 32,
                 samples_per_shard: int = 128, seed: int = 0) -> dataloader.DatasetInfo:
    """Write the regression task of :func:`clusterlab.device.models.synthetic_regression` as shards.

    Args:
        directory: where to write the dataset.
        n_samples: N, examples.
        d_model: D, input and output width.
        samples_per_shard: examples per shard file.
        seed: the data's random seed.

    Returns:
        The :class:`clusterlab.device.dataloader.DatasetInfo`: fields ``x`` and ``y``, each f32[D]
        per sample.
    """
    x, y = models.synthetic_regression(jax.random.key(seed), n_samples=n_samples,
                                       d_model=d_model)  # x, y: f32[N, D]
    return dataloader.write_shards(directory, {"x": np.asarray(x), "y": np.asarray(y)},
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


def initial_state(info: dataloader.DatasetInfo, *, d_hidden: int, n_blocks: int, seed: int,
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
        The final :class:`clusterlab.device.checkpoint.TrainState`.
    """
    source = dataloader.ShardedSource(data_dir, read_bytes_per_s=read_bytes_per_s)
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
        loader = dataloader.Loader(source, batch_size=batch_size, seed=seed,
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
    parser = argparse.ArgumentParser(prog="python -m clusterlab.device.train_demo",
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
    if args.make_data and not (Path(args.data) / dataloader.MANIFEST).exists():
        make_dataset(args.data, n_samples=args.make_data, d_model=args.d_model, seed=args.seed)
    run(args.data, args.checkpoints, steps=args.steps, every=args.every, out=args.out,
        batch_size=args.batch_size, d_hidden=args.d_hidden, keep=args.keep, seed=args.seed,
        prefetch=args.prefetch, read_bytes_per_s=args.read_cap,
        log=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
