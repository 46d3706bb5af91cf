"""Training checkpoints that survive a kill at any moment, with orbax.

A checkpoint holds everything a run needs to continue as if it had never stopped: the
parameters, the optimizer state, the step, the data loader's position and the random key.
:class:`Checkpoints` keeps them with ``orbax-checkpoint``'s ``CheckpointManager``, which writes
each one into a temporary directory (``<step>.orbax-checkpoint-tmp``) and renames it to
``<step>`` only when every file is written. A rename is atomic, so a directory named after a
step is always complete, and a kill during a write leaves only a temporary directory that is
never read (and is removed the next time that step is written). The last ``max_to_keep``
checkpoints are kept; older ones are deleted after a newer one is complete.

Restoring takes a *target*: a :class:`TrainState` of arrays or ``jax.ShapeDtypeStruct`` s whose
shardings say where each array should land. A checkpoint saved sharded over 8 devices restores
onto 4 or 1 that way (orbax reads each new shard's slice from the stored array). Before reading,
the stored shapes and dtypes are checked against the target, so a checkpoint of another model is
refused with a clear error instead of being read into the wrong arrays.

References:
    orbax-checkpoint. https://orbax.readthedocs.io/en/latest/guides/checkpoint/api_refactor.html
    Young, "A first order approximation to the optimum checkpoint interval", CACM 1974
    (how often to write one: :func:`clusterlab.analytic.reliability.young_interval_s`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from clusterlab._checks import count as _check_count

__all__ = ["TrainState", "CheckpointError", "Checkpoints", "abstract", "directory_bytes"]


@dataclass(frozen=True)
class TrainState:
    """Everything a training run needs to resume bit for bit."""

    step: int               # steps completed
    params: Any             # pytree of arrays
    opt_state: Any          # pytree of arrays (an optax state)
    loader_position: int   # batches the data loader has delivered
    rng: jax.Array          # a typed key (jax.random.key) or raw uint32 key data


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read or does not fit the target; nothing on disk was changed."""


def abstract(tree: Any, shardings: Any = None) -> Any:
    """``jax.ShapeDtypeStruct`` s of a pytree's arrays, optionally with new shardings.

    Args:
        tree: a pytree of arrays (or of ShapeDtypeStructs).
        shardings: None (keep each array's own sharding, if it has one), one
            ``jax.sharding.Sharding`` for every leaf, or a pytree of them matching ``tree``.

    Returns:
        The pytree of ShapeDtypeStructs, a restore target.
    """
    leaves, treedef = jax.tree.flatten(tree)
    if shardings is None:
        targets = [getattr(x, "sharding", None) for x in leaves]
    elif isinstance(shardings, jax.sharding.Sharding):
        targets = [shardings] * len(leaves)
    else:
        targets = treedef.flatten_up_to(shardings)
    return treedef.unflatten([jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s)
                              for x, s in zip(leaves, targets)])


def directory_bytes(path: str | os.PathLike) -> int:
    """Bytes of all files under ``path`` (a checkpoint's size on disk)."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def _key_data(rng: jax.Array) -> jax.Array:
    if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(rng)
    return rng


def _flat(tree: Any) -> dict[str, Any]:
    """``{"params/0/w1": leaf, ...}``: orbax stores named tuples as dicts, so compare names."""
    def name(entry) -> str:
        for attr in ("key", "idx", "name"):
            if hasattr(entry, attr):
                return str(getattr(entry, attr))
        return str(entry)
    return {"/".join(name(e) for e in path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _describe(leaf) -> str:
    return f"{jnp.dtype(leaf.dtype).name}{list(leaf.shape)}"


class Checkpoints:
    """The checkpoints of one training run, in one directory.

    Args:
        directory: where the checkpoints live, one subdirectory per step.
        max_to_keep: how many of the newest checkpoints to keep (>= 1).
        create: create ``directory`` if it does not exist; with False a missing directory is
            an error (use it when you only mean to restore).

    Raises:
        FileNotFoundError: when ``create`` is False and the directory does not exist.
    """

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3,
                 create: bool = True):
        import orbax.checkpoint as ocp  # slow to import; only checkpointing code needs it

        _check_count("max_to_keep", max_to_keep)
        self.directory = Path(directory).absolute()
        if not self.directory.is_dir():
            if not create:
                raise FileNotFoundError(
                    f"No checkpoint directory {self.directory.name!r} here. Check the path, or "
                    "pass create=True to start a new run there.")
            if self.directory.exists():
                raise FileExistsError(f"{self.directory.name!r} exists and is not a directory.")
        self.max_to_keep = max_to_keep
        self._ocp = ocp
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=create,
                                               enable_async_checkpointing=False)
        # Naming the items' handlers lets the manager read metadata before any restore.
        self._manager = ocp.CheckpointManager(
            self.directory, options=options,
            item_handlers={"state": ocp.StandardCheckpointHandler(),
                           "meta": ocp.JsonCheckpointHandler()})

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints on disk, oldest first."""
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None when there is none."""
        steps = self.steps()
        return steps[-1] if steps else None

    def step_bytes(self, step: int) -> int:
        """Size on disk of the checkpoint of ``step`` in bytes."""
        if step not in self.steps():
            raise CheckpointError(f"There is no complete checkpoint of step {step}; the "
                                  f"complete ones are {self.steps()}.")
        return directory_bytes(self.directory / str(step))

    def save(self, state: TrainState) -> None:
        """Write ``state`` as the checkpoint of ``state.step`` and wait until it is complete.

        Raises:
            ValueError: when a checkpoint of a later or the same step already exists (resume
                from the latest one instead of overwriting history).
        """
        ocp = self._ocp
        step = _check_count("state.step", state.step, minimum=0)
        latest = self.latest_step()
        if latest is not None and step <= latest:
            raise ValueError(f"Cannot save step {step}: a checkpoint of step {latest} already "
                             "exists. Restore it and continue from there.")
        arrays = {"params": state.params, "opt_state": state.opt_state,
                  "rng": _key_data(state.rng)}
        meta = {"step": step,
                "loader_position": _check_count("state.loader_position",
                                                state.loader_position, minimum=0)}
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)), force=True)
        self._manager.wait_until_finished()

    def _check_fits(self, step: int, target_arrays: dict) -> None:
        try:
            stored = self._manager.item_metadata(step)["state"]
            stored = getattr(stored, "tree", stored)
        except Exception as err:  # orbax raises many kinds; all mean "unreadable"
            raise self._unreadable(step, err) from None
        if stored is None:
            raise self._unreadable(step, "its metadata is missing")
        flat_target, flat_stored = _flat(target_arrays), _flat(stored)
        problems = []
        for key in sorted(set(flat_target) | set(flat_stored)):
            t, s = flat_target.get(key), flat_stored.get(key)
            if t is None:
                problems.append(f"{key}: in the checkpoint, not in the target")
            elif s is None:
                problems.append(f"{key}: in the target, not in the checkpoint")
            elif tuple(s.shape) != tuple(t.shape) or jnp.dtype(s.dtype) != jnp.dtype(t.dtype):
                problems.append(f"{key}: checkpoint {_describe(s)}, target {_describe(t)}")
        if problems:
            shown = "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else "")
            raise CheckpointError(
                f"The checkpoint of step {step} does not fit this model ({len(problems)} "
                f"mismatch(es): {shown}). It was saved by a model of another shape; restore it "
                "with a matching model, or start this one in a new directory. Nothing was "
                "changed on disk.")

    def _unreadable(self, step: int, err: object) -> CheckpointError:
        others = [s for s in self.steps() if s != step]
        detail = (f"{type(err).__name__}: {err}" if isinstance(err, BaseException)
                  else str(err))
        return CheckpointError(
            f"The checkpoint of step {step} cannot be read ({detail[:300]}). It is left on "
            f"disk untouched for inspection. Other complete checkpoints: {others or 'none'}; "
            "restore one with restore(target, step=...).")

    def restore(self, target: TrainState, *, step: int | None = None) -> TrainState:
        """Read a checkpoint into arrays shaped, typed and sharded like ``target``.

        Args:
            target: a :class:`TrainState` whose ``params``, ``opt_state`` and ``rng`` are arrays
                or ShapeDtypeStructs (see :func:`abstract`); their shardings decide the devices
                the restored arrays land on. ``step`` and ``loader_position`` are ignored.
            step: which checkpoint; None for the newest complete one.

        Returns:
            The restored :class:`TrainState`.

        Raises:
            CheckpointError: when there is no checkpoint (or not that step), when it does not fit
                the target, or when its files cannot be read. Nothing is deleted.
        """
        ocp = self._ocp
        steps = self.steps()
        if step is None:
            if not steps:
                raise CheckpointError(
                    "There is no complete checkpoint in this directory (temporary directories "
                    "of interrupted writes do not count). Start from fresh parameters.")
            step = steps[-1]
        elif step not in steps:
            raise CheckpointError(f"There is no complete checkpoint of step {step}; the "
                                  f"complete ones are {steps}.")
        typed_key = jnp.issubdtype(target.rng.dtype, jax.dtypes.prng_key)
        rng_target = (jax.eval_shape(jax.random.key_data, target.rng) if typed_key
                      else target.rng)
        arrays = abstract({"params": target.params, "opt_state": target.opt_state,
                           "rng": rng_target})
        self._check_fits(step, arrays)
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(arrays), meta=ocp.args.JsonRestore()))
            meta = restored["meta"]
            state = restored["state"]
            rng = state["rng"]
            if typed_key:
                rng = jax.random.wrap_key_data(rng, impl=jax.random.key_impl(target.rng))
            result = TrainState(step=int(meta["step"]), params=state["params"],
                                opt_state=state["opt_state"],
                                loader_position=int(meta["loader_position"]), rng=rng)
        except CheckpointError:
            raise
        except Exception as err:  # orbax and tensorstore raise many kinds
            raise self._unreadable(step, err) from None
        if result.step != step:
            raise self._unreadable(step, f"its metadata says step {result.step}")
        return result

    def close(self) -> None:
        """Finish pending work and release the manager."""
        self._manager.close()

    def __enter__(self) -> "Checkpoints":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:  # no machine paths in lab outputs
        return f"Checkpoints(steps={self.steps()}, max_to_keep={self.max_to_keep})"
