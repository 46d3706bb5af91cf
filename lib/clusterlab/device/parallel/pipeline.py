"""Pipeline parallelism: consecutive blocks on consecutive devices, micro-batches flowing through.

The residual MLP of :mod:`clusterlab.device.models` is cut into ``p`` stages of ``n_blocks / p``
blocks, stage ``s`` on device ``s`` of a ``"stage"`` mesh axis. The batch is cut into ``m``
micro-batches. A *schedule* (:mod:`clusterlab.analytic.schedule`, pure NumPy: GPipe,
1F1B and interleaved 1F1B) says, for every time slot and stage, whether the stage runs the
forward or backward pass of a micro-batch, or idles.

:func:`make_pipeline_parallel`'s step executes a schedule in one ``jax.shard_map`` program: a
``lax.scan`` over the time slots in which every device looks up its own action, runs it, and
then passes activations forward and gradients backward with one ``ppermute`` each. Each stage
stashes the *input* of every micro-batch it has received and not yet run backward, and
recomputes its forward pass in the backward slot (GPipe's re-materialization), so its
activation memory is the stash: ``slots * (B/m) * D * 4`` bytes, with ``slots`` the most
micro-batches the schedule keeps in flight on a stage.

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

from clusterlab import _checks
from clusterlab.device import devices, models
from clusterlab.device.parallel._common import (Params, Strategy, automatic_programs, axes_size,
                                                check_divisible, opt_state_initializer,
                                                opt_state_specs, optimizer_or_adam, varying)
from clusterlab.analytic.schedule import (BACKWARD, FORWARD, Schedule, ScheduleName,
                                          check_executable, make_schedule)

__all__ = ["make_pipeline_parallel", "shard_stages", "stack_stages", "stage_forward", "stash_bytes",
           "unstack_stages"]

_BLOCKS_MESSAGE = (
    "Pipeline parallelism gives every stage the same number of blocks: n_blocks = {size} does "
    "not divide by {parts} stages. Use a multiple of {parts} blocks, or a stage count that "
    "divides {size}.")
_MICROBATCH_MESSAGE = (
    "The batch of {size} examples does not split into {parts} equal micro-batches. Use a batch "
    "that is a multiple of {parts}, or a number of micro-batches that divides {size}.")


def stack_stages(params: Sequence[dict], stages: int) -> dict:
    """Stack a list of MLP blocks into per-stage arrays: each leaf f32[p, n_blocks/p, ...].

    Args:
        params: from :func:`clusterlab.device.models.init_mlp`.
        stages: p; must divide the number of blocks.
    """
    stages = _checks.count("stages", stages)
    check_divisible(len(params), stages, _BLOCKS_MESSAGE)
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


def _shift(n_devices: int, direction: int) -> list[tuple[int, int]]:
    return [(s, s + direction) for s in range(n_devices) if 0 <= s + direction < n_devices]


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
        check_divisible(x.shape[0], m, _MICROBATCH_MESSAGE)
        xs = x.reshape(m, x.shape[0] // m, *x.shape[1:])  # xs: f32[m, B/m, D]
        ys = y.reshape(m, y.shape[0] // m, *y.shape[1:])
        me = jax.lax.axis_index(axis_name)
        zeros_mb = varying(jnp.zeros_like(xs[0]), axis_name)  # f32[B/m, D]

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
        carry = jax.tree.map(lambda a: varying(a, axis_name), carry)  # per stage, not replicated
        (_, _, grads, loss), _ = jax.lax.scan(slot, carry, jnp.arange(schedule.slots))
        return jax.tree.map(lambda g: g[None], grads), loss[None]  # back to f32[1, L/p, ...]

    return local_grads


def _check_mesh(mesh: Mesh, axis_name: str, schedule: Schedule) -> None:
    check_executable(schedule)
    if axes_size(mesh, axis_name) != schedule.stages:
        raise ValueError(f"The schedule has {schedule.stages} stages but mesh axis {axis_name!r} "
                         f"has {mesh.shape[axis_name]} devices; they must be equal.")


def _stage_specs(tree: Params, axis_name: str) -> Params:
    return jax.tree.map(lambda _: P(axis_name), tree)  # every leaf split over the stages


def _manual_programs(mesh: Mesh, axis_name: str, schedule: Schedule,
                     optimizer: optax.GradientTransformation) -> tuple[Callable, Callable]:
    """The ``shard_map`` step that executes ``schedule``, and the gradients it computes.

    Each stage runs its slots of the schedule, then updates its own blocks with ``optimizer``.
    The gradients show what Adam would hide: a wrong factor (micro-batch losses summed instead
    of averaged) or a micro-batch whose gradient went missing.
    """
    _check_mesh(mesh, axis_name, schedule)
    local_grads = _local_grads(axis_name, schedule)

    def local_step(params, opt_state, x, y):
        # params: leaves f32[1, L/p, ...], this stage's blocks; x, y: f32[B, D] (whole batch)
        grads, loss = local_grads(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def step(params, opt_state, x, y):
        specs = _stage_specs(params, axis_name)
        state_specs = opt_state_specs(optimizer, params, specs)
        # check_vma=True (the default): JAX checks that what out_specs calls replicated (Adam's
        # step count) is the same on every stage.
        params, opt_state, losses = jax.shard_map(
            local_step, mesh=mesh, in_specs=(specs, state_specs, P(), P()),
            out_specs=(specs, state_specs, P(axis_name)))(params, opt_state, x, y)
        return params, opt_state, losses[-1]  # the last stage computed the loss

    def grads(params, x, y):
        specs = _stage_specs(params, axis_name)
        stacked_grads, _ = jax.shard_map(
            local_grads, mesh=mesh, in_specs=(specs, P(), P()),
            out_specs=(specs, P(axis_name)))(params, x, y)
        return stacked_grads

    return jax.jit(step), jax.jit(grads)


def _stacked_forward(stacked: Params, x: jax.Array) -> jax.Array:
    # stacked: leaves f32[p, L/p, ...] -> f32[L, ...], the blocks in order; x: f32[B, D]
    flat = jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), stacked)
    x, _ = jax.lax.scan(lambda h, block: (models.mlp_block(block, h), None), x, flat)
    return x


def _stacked_loss(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    """The single-device loss over the stacked blocks, for the compiler's form.

    The compiler does not pipeline: it moves the blocks' weights to where the whole batch is
    computed (count its collectives).
    """
    return models.mse_loss(params, x, y, forward=_stacked_forward)


def _schedule_of(schedule: Schedule | ScheduleName, stages: int,
                 microbatches: int | None) -> Schedule:
    if isinstance(schedule, Schedule):
        if microbatches not in (None, schedule.microbatches):
            raise ValueError(f"microbatches={microbatches} contradicts the schedule's "
                             f"{schedule.microbatches}; pass one or the other.")
        return schedule
    if microbatches is None:
        raise ValueError(f"The {schedule!r} schedule needs microbatches (m); pass "
                         f"microbatches=..., or a Schedule from make_schedule.")
    return make_schedule(stages, _checks.count("microbatches", microbatches), schedule)


def make_pipeline_parallel(params: Sequence[dict], mesh: Mesh,
                           optimizer: optax.GradientTransformation | None = None, *,
                           axis_name: str, automatic: bool = False,
                           schedule: Schedule | ScheduleName = "gpipe",
                           microbatches: int | None = None) -> Strategy:
    """Pipeline parallelism of the residual MLP over ``axis_name``, one stage per device.

    Args:
        params: the unsharded blocks of :func:`clusterlab.device.models.init_mlp`; their number must
            divide by the stages (the size of ``axis_name``).
        mesh: the mesh.
        optimizer: an element-wise ``optax`` optimizer (each stage updates its own blocks);
            default :func:`clusterlab.device.models.make_optimizer`.
        axis_name: the pipeline axis.
        automatic: the single-device step under ``jax.jit``, the stacked blocks split over the
            stages; no schedule, the compiler places the communication.
        schedule: ``"gpipe"`` or ``"1f1b"`` (with ``microbatches``), or a :class:`Schedule`
            from :func:`make_schedule` or any table of the same shape (a broken one, to see the
            check against one device catch it). Hand-written step only.
        microbatches: m, for a schedule given by name; B must divide by it.

    Returns:
        A :class:`~clusterlab.device.parallel.Strategy` named ``"pipeline/<schedule>"`` (or
        ``"pipeline/jit"``): ``shard`` stacks the blocks into stages and puts stage ``s`` on
        device ``s``; the batch is replicated; the loss f32[] is the mean squared error over the
        whole batch, as :func:`clusterlab.device.models.mse_loss`.

    Raises:
        ValueError: when the blocks do not split into the stages, the schedule's stages differ
            from the axis's devices, or it is interleaved (not executable).
    """
    stages = axes_size(mesh, axis_name)
    check_divisible(len(params), stages, _BLOCKS_MESSAGE)
    optimizer = optimizer_or_adam(optimizer)
    if automatic:
        if microbatches is not None or schedule != "gpipe":
            raise ValueError("automatic=True runs no schedule; leave schedule and microbatches "
                             "out, or use automatic=False.")
        name, m = "pipeline/jit", 1
        step, grads = automatic_programs(_stacked_loss, optimizer, mesh, params=P(axis_name),
                                         batch=P())
    else:
        table = _schedule_of(schedule, stages, microbatches)
        name, m = f"pipeline/{table.name}", table.microbatches
        step, grads = _manual_programs(mesh, axis_name, table, optimizer)
    replicated = NamedSharding(mesh, P())

    def place_batch(x, y):
        check_divisible(x.shape[0], m, _MICROBATCH_MESSAGE)
        return jax.device_put((x, y), replicated)  # f32[B, D], the whole batch on every stage

    return Strategy(
        name, mesh, (axis_name,), automatic, shard=lambda prm: shard_stages(prm, mesh, axis_name),
        unshard=lambda stacked: unstack_stages(jax.device_get(stacked)),
        init_opt_state=lambda stacked: opt_state_initializer(
            optimizer, mesh, opt_state_specs(optimizer, stacked,
                                             _stage_specs(stacked, axis_name)))(stacked),
        place_batch=place_batch, step=step, loss_value=np.asarray,
        grads=lambda stacked, x, y: unstack_stages(jax.device_get(grads(stacked, x, y))))


def shard_stages(params: Sequence[dict], mesh: Mesh, axis_name: str) -> dict:
    """Stack the blocks into stages (:func:`stack_stages`) and put stage ``s`` on device ``s``."""
    stacked = stack_stages(params, axes_size(mesh, axis_name))
    return jax.tree.map(lambda a: devices.shard(a, mesh, P(axis_name)), stacked)

def stash_bytes(schedule: Schedule, batch: int, d_model: int, *,
                bytes_per_element: int = 4) -> int:
    """Bytes of the activation stash of one stage in :func:`make_pipeline_parallel`'s step.

    ``stash_slots * (batch / m) * d_model * bytes_per_element``: the stashed inputs, one
    micro-batch each. (The gradients waiting, ``stash_slots()[1]`` micro-batches, are extra.)
    """
    check_divisible(batch, schedule.microbatches, _MICROBATCH_MESSAGE)
    slots, _ = schedule.stash_slots()
    return slots * (batch // schedule.microbatches) * d_model * bytes_per_element
