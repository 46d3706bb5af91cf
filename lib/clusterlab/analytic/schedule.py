"""Pipeline schedules: who runs which micro-batch's forward or backward pass in each time slot.

Pure NumPy (no JAX), so that the book's figures (:mod:`clusterlab.course.plotting`) and the
analytical chapters can count and draw schedules without the device code;
:mod:`clusterlab.device.parallel.pipeline` executes them.

The residual MLP is cut into ``p`` stages and the batch into ``m`` micro-batches. A *schedule*
says, for every time slot and stage, whether the stage runs the forward (F) or backward (B) pass
of a micro-batch, or idles. :func:`make_schedule` builds them from each stage's order of work
and the data dependencies (F of a micro-batch on stage ``s`` after F on ``s-1``; B on ``s``
after B on ``s+1``):

* GPipe: every stage runs all m forwards, then all m backwards (Huang et al. 2019);
* 1F1B: after at most ``p - s - 1`` warm-up forwards, stage ``s`` alternates one forward and one
  backward (PipeDream-Flush; Narayanan et al. 2021);
* interleaved 1F1B: each device holds v model chunks (virtual stages ``c p + s``), runs
  micro-batches in groups of p chunk by chunk, and alternates as 1F1B after its warm-up
  (Narayanan et al. 2021, Section 2.2.2). A chunk's pass takes ``1/v`` of a slot; the schedule's
  slots are those shorter ones. The executor runs GPipe and 1F1B; the interleaved schedule is
  for counting (its idle fraction) and drawing.

References:
    Huang et al., "GPipe: Efficient Training of Giant Neural Networks using Pipeline
    Parallelism", NeurIPS 2019. https://arxiv.org/abs/1811.06965
    Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
    Megatron-LM", SC 2021, Section 2.2. https://arxiv.org/abs/2104.04473
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from clusterlab import _checks
from clusterlab.analytic import costmodel

ScheduleName = Literal["gpipe", "1f1b", "interleaved"]

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
        check_executable(self)
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

        That is how :mod:`clusterlab.device.parallel.pipeline` runs it (all devices meet at each
        slot's ``ppermute``). With ``backward_s == forward_s`` it is ``2 (m + p - 1)`` slots;
        GPipe's slots hold only forwards or only backwards, so it costs ``(m + p - 1)(forward_s +
        backward_s)``, while 1F1B's steady state mixes them and each mixed slot costs
        ``backward_s``.

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


def _stage_order(schedule: ScheduleName, stage: int, stages: int, microbatches: int,
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


def make_schedule(stages: int, microbatches: int, schedule: ScheduleName = "gpipe", *,
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


def check_executable(schedule: Schedule) -> None:
    """Raise a ValueError unless the executor can run ``schedule`` (one model chunk per device).

    Args:
        schedule: from :func:`make_schedule`.

    Raises:
        ValueError: for an interleaved schedule with more than one virtual stage.
    """
    if schedule.virtual_stages > 1:
        raise ValueError(f"The executor runs one model chunk per device; this {schedule.name!r} "
                         f"schedule has {schedule.virtual_stages} virtual stages. Run 'gpipe' or "
                         "'1f1b' (the interleaved schedule is for counting and drawing).")
