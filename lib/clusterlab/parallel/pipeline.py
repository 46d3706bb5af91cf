"""Pipeline parallelism: consecutive blocks on consecutive devices, micro-batches flowing through.

The residual MLP of :mod:`clusterlab.models` is cut into ``p`` stages of ``n_blocks / p`` blocks,
stage ``s`` on device ``s`` of a ``"stage"`` mesh axis. The batch is cut into ``m``
micro-batches. A *schedule* says, for every time slot and stage, whether the stage runs the
forward (F) or backward (B) pass of a micro-batch, or idles. :func:`make_schedule` builds them
from each stage's order of work and the data dependencies (F of a micro-batch on stage ``s``
after F on ``s-1``; B on ``s`` after B on ``s+1``):

* GPipe: every stage runs all m forwards, then all m backwards (Huang et al. 2019);
* 1F1B: after at most ``p - s - 1`` warm-up forwards, stage ``s`` alternates one forward and one
  backward (PipeDream-Flush; Narayanan et al. 2021);
* interleaved 1F1B: each device holds v model chunks (virtual stages ``c p + s``), runs
  micro-batches in groups of p chunk by chunk, and alternates as 1F1B after its warm-up
  (Narayanan et al. 2021, Section 2.2.2). A chunk's pass takes ``1/v`` of a slot; the schedule's
  slots are those shorter ones. :func:`make_train_step` runs GPipe and 1F1B; the interleaved
  schedule is for counting (its idle fraction) and drawing.

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

from dataclasses import dataclass
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from clusterlab import _checks, costmodel, devices, models

IDLE, FORWARD, BACKWARD = 0, 1, 2


@dataclass(frozen=True)
class Schedule:
    """Who does what in each time slot of one pipelined training step.

    Attributes:
        name: ``"gpipe"``, ``"1f1b"`` or ``"interleaved"``.
        stages: p.
        microbatches: m.
        kind: i32[T, p]: ``IDLE`` (0), ``FORWARD`` (1) or ``BACKWARD`` (2) per slot and stage.
        microbatch: i32[T, p]: the micro-batch worked on, -1 when idle.
        chunk: i32[T, p]: the model chunk worked on (0 to v-1), -1 when idle.
        virtual_stages: v, model chunks per device; each slot lasts ``1/v`` of a stage's pass.
    """

    name: str
    stages: int
    microbatches: int
    kind: np.ndarray
    microbatch: np.ndarray
    chunk: np.ndarray
    virtual_stages: int = 1

    @property
    def slots(self) -> int:
        """T, the time slots of one step (each ``1/v`` of a stage's pass of a micro-batch)."""
        return int(self.kind.shape[0])

    @property
    def idle_fraction(self) -> float:
        """Idle slots over all slots (stages x time): the bubble, counted from the schedule."""
        return float(np.mean(self.kind == IDLE))

    def held_microbatches(self) -> np.ndarray:
        """i32[T, p]: micro-batches each stage holds activations of during each slot.

        A stage holds a micro-batch from its forward slot up to and including its backward slot.
        Interleaved, each count is one chunk's activations (``1/v`` of a micro-batch's).
        """
        forwards = np.cumsum(self.kind == FORWARD, axis=0)
        backwards_before = np.vstack([np.zeros((1, self.stages), int),
                                      np.cumsum(self.kind == BACKWARD, axis=0)[:-1]])
        return forwards - backwards_before

    def stash_slots(self) -> tuple[int, int]:
        """Buffer entries the executor needs: (stashed inputs, gradients waiting), per stage.

        An input is stashed from the slot after its sender's forward (stage 0: its own forward
        slot) until the stage's backward; a gradient waits from the slot after the next stage's
        backward until this stage's backward. Micro-batches run in order, so ``i % slots``
        indexes each buffer without collisions.
        """
        _check_executable(self)
        kind = self.kind
        p = self.stages
        done_b = np.cumsum(kind == BACKWARD, axis=0)
        before_b = np.vstack([np.zeros((1, p), int), done_b[:-1]])
        sent_f = np.cumsum(kind == FORWARD, axis=0)
        arrived = np.hstack([sent_f[:, :1], np.vstack([np.zeros((1, p - 1), int),
                                                       sent_f[:-1, :-1]])])
        grads_in = np.hstack([np.vstack([np.zeros((1, p - 1), int), done_b[:-1, 1:]]),
                              np.zeros((self.slots, 1), int)])
        return int(np.max(arrived - before_b)), max(int(np.max(grads_in - before_b)), 1)

    def lockstep_time_s(self, forward_s: float, backward_s: float) -> float:
        """Seconds of one step when every slot lasts as long as its slowest stage's work.

        That is how :func:`make_train_step` runs (all devices meet at each slot's ``ppermute``).
        With ``backward_s == forward_s`` it is ``2 (m + p - 1)`` slots; GPipe's slots hold only
        forwards or only backwards, so it costs ``(m + p - 1)(forward_s + backward_s)``, while
        1F1B's steady state mixes them and each mixed slot costs ``backward_s``.

        Args:
            forward_s: one stage's forward pass of one micro-batch (all its chunks), seconds.
            backward_s: one stage's backward pass (with any recomputation), seconds.
        """
        cost = np.array([0.0, _checks.positive("forward_s", forward_s),
                         _checks.positive("backward_s", backward_s)]) / self.virtual_stages
        return float(np.sum(np.max(cost[self.kind], axis=1)))

    def render(self) -> str:
        """A text picture: one row per stage, ``F3``/``B3`` per slot (``F3.1`` for chunk 1 when
        interleaved), blanks when idle."""
        rows = []
        for s in range(self.stages):
            cells = ["  " if k == IDLE else f"{'F' if k == FORWARD else 'B'}{i}"
                     + (f".{c}" if self.virtual_stages > 1 else "")
                     for k, i, c in zip(self.kind[:, s], self.microbatch[:, s], self.chunk[:, s])]
            width = max(len(c) for c in cells)
            rows.append(f"stage {s}: " + " ".join(c.ljust(width) for c in cells))
        return "\n".join(rows)


def _stage_order(schedule: str, stage: int, stages: int, microbatches: int,
                 virtual_stages: int) -> list[tuple[int, int, int]]:
    """One stage's work in order: ``(kind, micro-batch, chunk)`` triples."""
    p, m, v = stages, microbatches, virtual_stages
    if schedule == "gpipe":
        return [(FORWARD, i, 0) for i in range(m)] + [(BACKWARD, i, 0) for i in range(m)]
    if schedule == "1f1b":
        warmup = min(p - 1 - stage, m)
        forwards = [(FORWARD, i, 0) for i in range(m)]
        backwards = [(BACKWARD, i, 0) for i in range(m)]
    else:
        # Megatron-LM's order: the k-th chunk pass takes micro-batches in groups of p, chunk by
        # chunk (backwards from the last chunk); the warm-up lets every chunk of the first group
        # start before the first backward arrives.
        warmup = min(2 * (p - 1 - stage) + (v - 1) * p, m * v)
        forwards = [(FORWARD, k // (p * v) * p + k % p, k % (p * v) // p) for k in range(m * v)]
        backwards = [(BACKWARD, i, v - 1 - c) for _, i, c in forwards]
    order = forwards[:warmup]
    for k in range(len(forwards) - warmup):
        order += [forwards[warmup + k], backwards[k]]
    return order + backwards[len(forwards) - warmup:]


def make_schedule(stages: int, microbatches: int, schedule: str = "gpipe", *,
                  virtual_stages: int = 1) -> Schedule:
    """Build a GPipe, 1F1B or interleaved 1F1B schedule: each stage runs its next work once it can.

    Every piece of work (one chunk's pass of one micro-batch) takes one slot. Chunk ``c`` of
    device ``s`` is virtual stage ``j = c p + s`` of ``p v``; a forward on ``j`` can run the slot
    after the forward of the same micro-batch on ``j - 1``, a backward after the backward on
    ``j + 1`` (on the last virtual stage, after its own forward).

    Args:
        stages: p, at least 1.
        microbatches: m, at least 1; a multiple of p when interleaved with v > 1.
        schedule: ``"gpipe"``, ``"1f1b"`` or ``"interleaved"``.
        virtual_stages: v, model chunks per device (``"interleaved"`` only).

    Returns:
        The :class:`Schedule`: ``2 (v m + p - 1)`` slots of ``1/v`` of a pass each, each stage
        busy in ``2 v m`` of them.

    References:
        Huang et al. 2019, Figure 2; Narayanan et al. 2021, Figures 3 and 4.
    """
    p, m, v = costmodel.check_pipeline(stages, microbatches, schedule,
                                       virtual_stages=virtual_stages)
    orders = [_stage_order(schedule, s, p, m, v) for s in range(p)]
    done: dict[tuple[int, int, int], int] = {}  # (kind, microbatch, virtual stage) -> slot
    position = [0] * p
    rows = []  # per slot, per stage: (kind, microbatch, chunk)
    while any(position[s] < len(orders[s]) for s in range(p)):
        slot = len(rows)
        row = [(IDLE, -1, -1)] * p
        for s in range(p):
            if position[s] == len(orders[s]):
                continue
            kind, i, c = orders[s][position[s]]
            j = c * p + s
            if kind == FORWARD:
                ready = j == 0 or done.get((FORWARD, i, j - 1), slot) < slot
            else:
                ready = (done.get((FORWARD, i, j), slot) < slot
                         and (j == p * v - 1 or done.get((BACKWARD, i, j + 1), slot) < slot))
            if ready:
                row[s] = (kind, i, c)
        for s, (kind, i, c) in enumerate(row):
            if kind != IDLE:
                done[(kind, i, c * p + s)] = slot
                position[s] += 1
        rows.append(row)
        if len(rows) > 4 * (v * m + p):  # cannot happen for these orders; guards a future edit
            raise RuntimeError("The schedule does not finish; its stage orders deadlock.")
    table = np.array(rows, np.int32).reshape(len(rows), p, 3)  # i32[T, p, (kind, mb, chunk)]
    return Schedule(schedule, p, m, table[..., 0], table[..., 1], table[..., 2], v)


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


def _check_executable(schedule: Schedule) -> None:
    if schedule.virtual_stages > 1:
        raise ValueError(f"The executor runs one model chunk per device; this {schedule.name!r} "
                         f"schedule has {schedule.virtual_stages} virtual stages. Run 'gpipe' or "
                         "'1f1b' (the interleaved schedule is for counting and drawing).")


def _check_mesh(mesh: Mesh, axis_name: str, schedule: Schedule) -> None:
    _check_executable(schedule)
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
