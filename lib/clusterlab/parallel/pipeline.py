"""Pipeline parallelism: consecutive blocks on consecutive devices, micro-batches flowing through.

The residual MLP of :mod:`clusterlab.models` is cut into ``p`` stages of ``n_blocks / p`` blocks,
stage ``s`` on device ``s`` of a ``"stage"`` mesh axis. The batch is cut into ``m``
micro-batches. A *schedule* (:mod:`clusterlab.schedule`, pure NumPy, re-exported here: GPipe,
1F1B and interleaved 1F1B) says, for every time slot and stage, whether the stage runs the
forward or backward pass of a micro-batch, or idles.

:func:`make_train_step` executes a schedule in one ``jax.shard_map`` program: a ``lax.scan``
over the time slots in which every device looks up its own action, runs it, and then passes
activations forward and gradients backward with one ``ppermute`` each. Each stage stashes the
*input* of every micro-batch it has received and not yet run backward, and recomputes its
forward pass in the backward slot (GPipe's re-materialization), so its activation memory is the
stash: ``slots * (B/m) * D * 4`` bytes, with ``slots`` the most micro-batches the schedule keeps
in flight on a stage.

All devices run the same program and meet at every ``ppermute``, so a slot lasts as long as the
slowest stage's work in it (a lock-step executor). Real pipelines send point to point without a
global meeting; the schedule's idle fraction is the same.

References:
    Huang et al., "GPipe: Efficient Training of Giant Neural Networks using Pipeline
    Parallelism", NeurIPS 2019. https://arxiv.org/abs/1811.06965
    Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
    Megatron-LM", SC 2021, Section 2.2. https://arxiv.org/abs/2104.04473
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from clusterlab import _checks, devices, models
from clusterlab.schedule import (  # noqa: F401  (re-exported: the schedules this module runs)
    BACKWARD, FORWARD, IDLE, Schedule, ScheduleName, check_executable, make_schedule)

def check_divisible(*, n_blocks: int, stages: int, batch: int, microbatches: int) -> None:
    """Raise a ValueError unless the blocks split into stages and the batch into micro-batches."""
    if n_blocks % stages:
        raise ValueError(
            f"Pipeline parallelism gives every stage the same number of blocks: n_blocks = "
            f"{n_blocks} does not divide by {stages} stages. Use a multiple of {stages} blocks, or "
            f"a stage count that divides {n_blocks}.")
    if batch % microbatches:
        raise ValueError(
            f"The batch of {batch} examples does not split into {microbatches} equal "
            f"micro-batches. Use a batch that is a multiple of {microbatches}, or a number of "
            f"micro-batches that divides {batch}.")


def stack_stages(params: Sequence[dict], stages: int) -> dict:
    """Stack a list of MLP blocks into per-stage arrays: each leaf f32[p, n_blocks/p, ...].

    Args:
        params: from :func:`clusterlab.models.init_mlp`.
        stages: p; must divide the number of blocks.
    """
    stages = _checks.count("stages", stages)
    if len(params) % stages:
        check_divisible(n_blocks=len(params), stages=stages, batch=1, microbatches=1)
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *params)  # leaf: f32[L, ...]
    return jax.tree.map(lambda a: a.reshape(stages, a.shape[0] // stages, *a.shape[1:]), stacked)


def unstack_stages(stacked: dict) -> list[dict]:
    """The inverse of :func:`stack_stages`: a list of blocks, to compare with the reference."""
    flat = jax.tree.map(lambda a: np.asarray(a).reshape(-1, *a.shape[2:]), stacked)
    n_blocks = next(iter(flat.values())).shape[0]
    return [{name: leaf[j] for name, leaf in flat.items()} for j in range(n_blocks)]


def stage_forward(stage_params: dict, x: jax.Array) -> jax.Array:
    """One stage: its blocks in order.

    Args:
        stage_params: leaves f32[n_blocks/p, ...], this stage's blocks.
        x: f32[b, D], one micro-batch.

    Returns:
        f32[b, D].
    """
    x, _ = jax.lax.scan(lambda h, block: (models.mlp_block(block, h), None), x, stage_params)
    return x


def _shift(p: int, direction: int) -> list[tuple[int, int]]:
    return [(s, s + direction) for s in range(p) if 0 <= s + direction < p]


def _varying(x: jax.Array, axis_name: str) -> jax.Array:
    """``x`` typed as varying over the stages (a scan's carry must keep one type)."""
    if axis_name in jax.typeof(x).manual_axis_type.varying:
        return x
    return jax.lax.pcast(x, axis_name, to="varying")


def _local_grads(axis_name: str, schedule: Schedule) -> Callable:
    """``(params, x, y) -> (grads, loss)`` of one stage, running ``schedule`` (inside shard_map).

    ``params``: leaves f32[1, L/p, ...], this stage's blocks; ``x``, ``y``: f32[B, D], the whole
    batch on every stage. Returns this stage's gradients (f32[1, L/p, ...]) and f32[1], the loss
    (complete on the last stage only).
    """
    p, m = schedule.stages, schedule.microbatches
    stash_slots, grad_slots = schedule.stash_slots()
    kind_table = jnp.asarray(schedule.kind)  # i32[T, p]
    mb_table = jnp.asarray(schedule.microbatch)  # i32[T, p]

    def local_grads(params, x, y):
        stage_params = jax.tree.map(lambda a: a[0], params)
        check_divisible(n_blocks=1, stages=1, batch=x.shape[0], microbatches=m)
        xs = x.reshape(m, x.shape[0] // m, *x.shape[1:])  # xs: f32[m, B/m, D]
        ys = y.reshape(m, y.shape[0] // m, *y.shape[1:])
        me = jax.lax.axis_index(axis_name)
        zeros_mb = _varying(jnp.zeros_like(xs[0]), axis_name)  # f32[B/m, D]

        def forward(carry, i):
            stash, inbox, grads, loss = carry
            x_in = jnp.where(me == 0, xs[i], stash[i % stash_slots])
            stash = stash.at[i % stash_slots].set(x_in)  # stage 0 stashes its own input
            return (stash, inbox, grads, loss), stage_forward(stage_params, x_in), zeros_mb

        def backward_middle(carry, i):
            stash, inbox, grads, loss = carry
            _, vjp = jax.vjp(stage_forward, stage_params, stash[i % stash_slots])
            d_params, d_x = vjp(inbox[i % grad_slots])  # recompute, then backward
            grads = jax.tree.map(jnp.add, grads, d_params)
            return (stash, inbox, grads, loss), zeros_mb, d_x

        def backward_last(carry, i):
            stash, inbox, grads, loss = carry

            def micro_loss(sp, x_in):  # mean over this micro-batch, 1/m of the batch mean
                return jnp.mean((stage_forward(sp, x_in) - ys[i]) ** 2) / m

            loss_i, (d_params, d_x) = jax.value_and_grad(micro_loss, argnums=(0, 1))(
                stage_params, stash[i % stash_slots])
            grads = jax.tree.map(jnp.add, grads, d_params)
            return (stash, inbox, grads, loss + loss_i), zeros_mb, d_x

        def idle(carry, i):
            return carry, zeros_mb, zeros_mb

        def slot(carry, t):
            kind, i = kind_table[t, me], mb_table[t, me]
            branch = jnp.where((kind == BACKWARD) & (me == p - 1), 3, kind)
            carry, send_forward, send_backward = jax.lax.switch(
                branch, [idle, forward, backward_middle, backward_last], carry, jnp.maximum(i, 0))
            stash, inbox, grads, loss = carry
            if p > 1:
                # got_forward: f32[B/m, D] from stage s-1; got_backward: from stage s+1
                got_forward = jax.lax.ppermute(send_forward, axis_name, _shift(p, +1))
                got_backward = jax.lax.ppermute(send_backward, axis_name, _shift(p, -1))
                prev = jnp.maximum(me - 1, 0)
                nxt = jnp.minimum(me + 1, p - 1)
                arrives = (me > 0) & (kind_table[t, prev] == FORWARD)
                j = mb_table[t, prev] % stash_slots
                stash = stash.at[j].set(jnp.where(arrives, got_forward, stash[j]))
                arrives = (me < p - 1) & (kind_table[t, nxt] == BACKWARD)
                j = mb_table[t, nxt] % grad_slots
                inbox = inbox.at[j].set(jnp.where(arrives, got_backward, inbox[j]))
            return (stash, inbox, grads, loss), None

        carry = (jnp.zeros((stash_slots, *xs.shape[1:]), xs.dtype),  # stash: f32[slots, B/m, D]
                 jnp.zeros((grad_slots, *xs.shape[1:]), xs.dtype),  # inbox: f32[g, B/m, D]
                 jax.tree.map(jnp.zeros_like, stage_params), jnp.zeros((), jnp.float32))
        carry = jax.tree.map(lambda a: _varying(a, axis_name), carry)  # per stage, not replicated
        (_, _, grads, loss), _ = jax.lax.scan(slot, carry, jnp.arange(schedule.slots))
        return jax.tree.map(lambda g: g[None], grads), loss[None]  # back to f32[1, L/p, ...]

    return local_grads


def _check_mesh(mesh: Mesh, axis_name: str, schedule: Schedule) -> None:
    check_executable(schedule)
    if mesh.shape[axis_name] != schedule.stages:
        raise ValueError(f"The schedule has {schedule.stages} stages but mesh axis {axis_name!r} "
                         f"has {mesh.shape[axis_name]} devices; they must be equal.")


def make_grad_fn(mesh: Mesh, axis_name: str, schedule: Schedule) -> Callable:
    """The loss and gradients of one pipelined step, to check against one device.

    Gradients show what Adam would hide: a wrong factor (micro-batch losses summed instead of
    averaged) or a micro-batch whose gradient went missing.

    Args:
        mesh: the mesh; ``axis_name`` has ``schedule.stages`` devices.
        axis_name: the pipeline axis.
        schedule: from :func:`make_schedule`, or any table of the same shape (a broken one, to
            see the check against one device catch it).

    Returns:
        ``grads(stacked_params, x, y) -> (loss, stacked_grads)``: params from
        :func:`shard_stages`, ``x``, ``y`` f32[B, D], ``loss`` f32[] (the last stage's),
        ``stacked_grads`` shaped and sharded like the params (:func:`unstack_stages` them to
        compare with ``jax.grad`` of :func:`clusterlab.models.mse_loss`).
    """
    _check_mesh(mesh, axis_name, schedule)
    local_grads = _local_grads(axis_name, schedule)

    def grads(params, x, y):
        specs = jax.tree.map(lambda _: P(axis_name), params)
        stacked_grads, losses = jax.shard_map(
            local_grads, mesh=mesh, in_specs=(specs, P(), P()),
            out_specs=(specs, P(axis_name)))(params, x, y)
        return losses[-1], stacked_grads  # the last stage computed the loss

    return jax.jit(grads)


def make_train_step(mesh: Mesh, axis_name: str, schedule: Schedule, *,
                    optimizer: optax.GradientTransformation) -> Callable:
    """A jitted pipeline-parallel training step that executes ``schedule`` with ``shard_map``.

    Each stage runs its slots of the schedule (:func:`make_grad_fn`'s gradients), then updates
    its own blocks with ``optimizer``.

    Args:
        mesh: the mesh; ``axis_name`` has ``schedule.stages`` devices.
        axis_name: the pipeline axis.
        schedule: from :func:`make_schedule`.
        optimizer: an element-wise ``optax`` optimizer (each stage updates its own blocks).

    Returns:
        ``step(stacked_params, opt_state, x, y) -> (stacked_params, opt_state, loss)``: params
        and optimizer state from :func:`shard_stages` and :func:`init_opt_state`, ``x``, ``y``
        f32[B, D], ``loss`` f32[] (the mean squared error over the whole batch, as
        :func:`clusterlab.models.mse_loss`).
    """
    _check_mesh(mesh, axis_name, schedule)
    local_grads = _local_grads(axis_name, schedule)

    def local_step(params, opt_state, x, y):
        # params: leaves f32[1, L/p, ...], this stage's blocks; x, y: f32[B, D] (whole batch)
        grads, loss = local_grads(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def step(params, opt_state, x, y):
        specs = jax.tree.map(lambda _: P(axis_name), params)
        state_specs = _opt_state_specs(optimizer, params, axis_name)
        # check_vma=True (the default): JAX checks that what out_specs calls replicated (Adam's
        # step count) is the same on every stage.
        params, opt_state, losses = jax.shard_map(
            local_step, mesh=mesh, in_specs=(specs, state_specs, P(), P()),
            out_specs=(specs, state_specs, P(axis_name)))(params, opt_state, x, y)
        return params, opt_state, losses[-1]  # the last stage computed the loss

    return jax.jit(step)


def _opt_state_specs(optimizer: optax.GradientTransformation, params: dict,
                     axis_name: str) -> object:
    state_shapes = jax.eval_shape(optimizer.init, params)
    specs = jax.tree.map(lambda _: P(axis_name), params)
    return optax.tree_map_params(optimizer, lambda _, spec: spec, state_shapes, specs,
                                 transform_non_params=lambda _: P(),
                                 is_leaf=lambda v: isinstance(v, P))


def shard_stages(params: Sequence[dict], mesh: Mesh, axis_name: str) -> dict:
    """Stack the blocks into stages (:func:`stack_stages`) and put stage ``s`` on device ``s``."""
    stacked = stack_stages(params, mesh.shape[axis_name])
    return jax.tree.map(lambda a: devices.shard(a, mesh, P(axis_name)), stacked)


def init_opt_state(optimizer: optax.GradientTransformation, stacked_params: dict) -> object:
    """The optimizer state of the stage-sharded parameters, sharded like them."""
    return jax.jit(optimizer.init)(stacked_params)


def make_auto_train_step(mesh: Mesh, axis_name: str, *,
                         optimizer: optax.GradientTransformation) -> Callable:
    """The same model left to the compiler: stacked blocks sharded over stages, plain ``jit``.

    The single-device step runs over the stacked parameters, whose block axis is split across
    the ``axis_name`` devices with ``NamedSharding``. The compiler does not pipeline: it moves
    the blocks' weights to where the whole batch is computed (count its collectives).

    Returns:
        ``step(stacked_params, opt_state, x, y) -> (stacked_params, opt_state, loss)``.
    """
    def forward(stacked, x):
        flat = jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), stacked)  # f32[L, ...]
        x, _ = jax.lax.scan(lambda h, block: (models.mlp_block(block, h), None), x, flat)
        return x

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(models.mse_loss)(params, x, y, forward=forward)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    split = NamedSharding(mesh, P(axis_name))
    replicated = NamedSharding(mesh, P())
    return jax.jit(step, in_shardings=(split, None, replicated, replicated),
                   out_shardings=(split, None, replicated))


def train(params: Sequence[dict], batches: Sequence[tuple[jax.Array, jax.Array]], mesh: Mesh,
          axis_name: str, *, microbatches: int, schedule: str = "gpipe",
          optimizer: optax.GradientTransformation | None = None,
          automatic: bool = False) -> tuple[list[dict], np.ndarray]:
    """Train the MLP pipelined: the counterpart of :func:`clusterlab.models.reference_train`.

    Args:
        params: from :func:`clusterlab.models.init_mlp`; the number of blocks must divide by the
            stages (the size of ``axis_name``).
        batches: ``(x, y)`` pairs, f32[B, D] each; B must divide by ``microbatches``.
        mesh: the mesh.
        axis_name: the pipeline axis.
        microbatches: m.
        schedule: ``"gpipe"`` or ``"1f1b"``.
        optimizer: default :func:`clusterlab.models.make_optimizer`.
        automatic: run :func:`make_auto_train_step` instead (no schedule).

    Returns:
        ``(params, losses)``: the trained blocks as a list (NumPy arrays), and f32[n_steps].
    """
    stages = mesh.shape[axis_name]
    batches = list(batches)
    if not batches:
        raise ValueError("train got no batches; pass at least one (x, y) pair.")
    check_divisible(n_blocks=len(params), stages=stages, batch=batches[0][0].shape[0],
                    microbatches=_checks.count("microbatches", microbatches))
    optimizer = models.make_optimizer() if optimizer is None else optimizer
    if automatic:
        step = make_auto_train_step(mesh, axis_name, optimizer=optimizer)
    else:
        step = make_train_step(mesh, axis_name, make_schedule(stages, microbatches, schedule),
                               optimizer=optimizer)
    stacked = shard_stages(params, mesh, axis_name)
    opt_state = init_opt_state(optimizer, stacked)
    stacked, _, losses = models.run_steps(step, stacked, opt_state, batches)
    return unstack_stages(jax.device_get(stacked)), losses


def stash_bytes(schedule: Schedule, batch: int, d_model: int, *,
                bytes_per_element: int = 4) -> int:
    """Bytes of the activation stash of one stage in :func:`make_train_step`.

    ``stash_slots * (batch / m) * d_model * bytes_per_element``: the stashed inputs, one
    micro-batch each. (The gradients waiting, ``stash_slots()[1]`` micro-batches, are extra.)
    """
    check_divisible(n_blocks=1, stages=1, batch=batch, microbatches=schedule.microbatches)
    slots, _ = schedule.stash_slots()
    return slots * (batch // schedule.microbatches) * d_model * bytes_per_element
