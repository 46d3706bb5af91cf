"""Answer key of lab 05, pipeline parallelism (instructor-only: student copies leave keys/ out).

``lab05.3`` and ``lab05.4`` are the GPipe assignment: the student's ``gpipe_forward`` and
``gpipe_grads`` run inside ``shard_map`` over a ``"stage"`` axis, every input split along its
leading axis over the stages (the stage parameters as f32[p, L/p, ...], the micro-batches as p
stacked copies f32[p, m, b, D]). The hidden tests run them on 2, 4 and 8 stages with widths,
micro-batch counts and sizes the lab never shows, against the single-device MLP
(:func:`clusterlab.device.models.mlp_forward`, ``jax.grad`` of :func:`clusterlab.device.models.mse_loss`),
and read the compiled program's collectives: only ``collective-permute``s, one micro-batch
(b x D x 4 bytes) each, one per tick of the lock-step schedule (m + p - 1 ticks each way; the
last tick's send carries nothing and may be compiled away).

``lab05.4`` asks for the backward schedule written by hand, and the grader holds that rule from
the exported program: no collective-permute may come from autodiff. JAX (0.10.2 here) names
every lowered operation after its transformation stack, and ``jax.export`` keeps those names as
source locations; ``jax.grad`` through the forward ticks lowers their sends under ``jvp(...)``
and the backward's under ``transpose(jvp(...))`` (the scan bodies as functions whose call sites
carry the names). The backward ticks' own ``jax.vjp`` of a stage's blocks, which the exercise
asks for, differentiates no send and passes. The collective count alone cannot tell them apart:
autodiff transposes each forward ppermute into one backward ppermute, 2(m + p - 1) in all.
"""

import re
from typing import NamedTuple

import jax
import numpy as np

from clusterlab.analytic import schedule
from clusterlab.course import grading
from clusterlab.device import models
from clusterlab.device.parallel import pipeline

# the smallest m whose 8-stage schedule idles at most 1/8 of its slots (counted, not the formula)
_SMALLEST_M = next(m for m in range(1, 200)
                   if schedule.make_schedule(8, m).idle_fraction <= 1 / 8 + 1e-12)
_LEAVES = ("w1", "b1", "w2", "b2")     # the order of the stage arrays the assignment takes
_AXIS = "stage"
# a source location naming an autodiff transformation (JAX's name stack): "jvp(...)/while",
# "transpose(jvp(...))/while/body/closed_call"
_AUTODIFF = re.compile(r'"[^"]*\b(?:jvp|transpose)\(')
_LOC_ALIAS = re.compile(r"^#(loc\d+) = (.*)$")
_LOC_REF = re.compile(r"#(loc\d+)")
_FUNCTION = re.compile(r"^\s*func\.func (?:public |private )?@([\w.$-]+)\(")
_CALL = re.compile(r"\bfunc\.call @([\w.$-]+)\(")
_LINE_LOC = re.compile(r"loc\((.*)\)\s*$")


def _autodiff_sends(text: str) -> tuple[int, int]:
    """(collective-permutes in the StableHLO ``text``, how many of them autodiff derived).

    A send is derived when its own location, or a call site on some path from ``main`` to the
    function holding it, names ``jvp(`` or ``transpose(``.
    """
    aliases = {m.group(1): m.group(2) for m in map(_LOC_ALIAS.match, text.splitlines()) if m}

    def derived(line: str) -> bool:
        found = _LINE_LOC.search(line)
        location = found.group(1) if found else ""
        for _ in range(64):                          # expand the aliases, nested at most 64 deep
            expanded = _LOC_REF.sub(lambda m: aliases.get(m.group(1), ""), location)
            if expanded == location:
                break
            location = expanded
        return bool(_AUTODIFF.search(location))

    function, calls, sends = "", [], []              # calls: (caller, callee, derived)
    for line in text.splitlines():
        header = _FUNCTION.match(line)
        if header:
            function = header.group(1)
        elif _CALL.search(line):
            calls.append((function, _CALL.search(line).group(1), derived(line)))
        elif "stablehlo.collective_permute" in line:
            sends.append((function, derived(line)))
    under_autodiff = {callee for _, callee, flag in calls if flag}
    while True:                                       # callees of derived functions are derived
        more = {callee for caller, callee, _ in calls if caller in under_autodiff}
        if more <= under_autodiff:
            break
        under_autodiff |= more
    return len(sends), sum(flag or f in under_autodiff for f, flag in sends)


def _require_hand_written_backward(test: str, program: grading.Program) -> None:
    """Refuse a program whose sends autodiff derived (or that carries no locations)."""
    text = program.exported.mlir_module()
    if 'loc("' not in text:
        raise grading.Refused(f"{test}: its program carries no source locations, which the "
                              "grader reads to see how the gradients were derived; export it "
                              "as check.answer does.")
    sends, derived = _autodiff_sends(text)
    if derived:
        raise grading.Refused(
            f"{test}: {derived} of the {sends} collective-permutes in its program come from "
            "JAX's autodiff (jax.grad or jax.vjp through the ticks that send). Hint: run the "
            "backward ticks yourself: jax.vjp of one stage's blocks only, and your own "
            "ppermute of the input's gradient to stage s - 1.")


class _Case(NamedTuple):
    """One hidden case: p stages of n_blocks / p blocks each, m micro-batches of b examples."""

    stages: int
    n_blocks: int
    microbatches: int
    microbatch_size: int
    d_model: int
    d_hidden: int
    seed: int

    @property
    def name(self) -> str:
        return (f"{self.stages} stages of {self.n_blocks // self.stages} block(s), "
                f"{self.microbatches} micro-batches of {self.microbatch_size}")


# the lab shows D = 16, H = 32, 8 blocks, micro-batches of 8 on 4 stages; none of these
_CASES = (_Case(2, 4, 3, 4, 8, 12, 501), _Case(4, 4, 5, 2, 8, 12, 502),
          _Case(8, 8, 2, 3, 6, 10, 503))


def _inputs(case: _Case) -> tuple[list[dict], list[np.ndarray], np.ndarray, np.ndarray]:
    """The blocks, their stage arrays f32[p, L/p, ...], and x, y as f32[p, m, b, D] copies."""
    blocks = models.init_mlp(jax.random.key(grading.hidden_seed(case.seed)), d_model=case.d_model,
                             d_hidden=case.d_hidden, n_blocks=case.n_blocks)
    stacked = pipeline.stack_stages(blocks, case.stages)
    x, y = models.synthetic_regression(jax.random.key(grading.hidden_seed(case.seed + 1)),
                                       n_samples=case.microbatches * case.microbatch_size,
                                       d_model=case.d_model)
    shape = (case.microbatches, case.microbatch_size, case.d_model)
    copies = [np.asarray(models.stack_copies(np.asarray(a).reshape(shape), case.stages))
              for a in (x, y)]
    return blocks, [np.asarray(stacked[k]) for k in _LEAVES], *copies


def _args(case: _Case, with_targets: bool) -> list[tuple[tuple[int, ...], str]]:
    """The global (shape, dtype) of each input, as the export asks for them."""
    p, per_stage, d, h = case.stages, case.n_blocks // case.stages, case.d_model, case.d_hidden
    micro = (p, case.microbatches, case.microbatch_size, d)
    shapes = [(p, per_stage, d, h), (p, per_stage, h), (p, per_stage, h, d), (p, per_stage, d),
              micro, *([micro] if with_targets else [])]
    return [(shape, "float32") for shape in shapes]


def _require_sends(test: str, program: grading.Program, args: list, case: _Case,
                   directions: int) -> None:
    """Refuse unless the program runs only collective-permutes of one micro-batch, one per tick
    of ``directions`` lock-step passes of m + p - 1 ticks (the last tick's send may go)."""
    ops = program.collective_ops(*args)
    micro_bytes = case.microbatch_size * case.d_model * 4
    ticks = case.microbatches + case.stages - 1
    allowed = {directions * (ticks - 1), directions * ticks}
    found = sorted({(op.kind, op.bytes) for op in ops})
    if found != [("collective-permute", micro_bytes)] or len(ops) not in allowed:
        raise grading.Refused(
            f"{test}: its program runs {len(ops)} collectives {found}; the schedule sends "
            f"{directions} x (m + p - 1) = {directions * ticks} collective-permutes of one "
            f"micro-batch ({micro_bytes} B) and nothing else. Hint: one jax.lax.ppermute per "
            "tick, to the next stage forward" + (" and to the previous one backward"
                                                 if directions == 2 else "")
            + "; no psum or all_gather.")


def _check_forward(programs) -> None:
    for program, case in zip(programs, _CASES):
        blocks, stage_arrays, x, _ = _inputs(case)
        args = [*stage_arrays, x]
        out = program(*args)                                     # f32[p, m, b, D]
        expected = np.asarray(models.mlp_forward(blocks, x[0].reshape(-1, case.d_model)))
        grading.require_close(
            f"forward on {case.name}: the last stage's outputs", out[-1],
            expected.reshape(x[0].shape),
            hint="stage 0 feeds micro-batch t at tick t, every stage sends its output to stage "
                 "s + 1, and the last stage stores micro-batch t - (p - 1).")
        _require_sends(f"forward on {case.name}: its messages", program, args, case, 1)


def _check_grads(programs) -> None:
    for program, case in zip(programs, _CASES):
        blocks, stage_arrays, x, y = _inputs(case)
        args = [*stage_arrays, x, y]
        grads = program(*args)                               # 4 x f32[p, L/p, ...]
        expected = pipeline.stack_stages(models.reference_gradients(
            blocks, x[0].reshape(-1, case.d_model), y[0].reshape(-1, case.d_model)),
            case.stages)
        grading.require_close(
            f"gradients on {case.name}", dict(zip(_LEAVES, grads)), expected,
            hint="each stage pairs the gradient it receives from stage s + 1 with the input it "
                 "stashed for the same micro-batch, sends its input's gradient to stage s - 1, "
                 "and adds its micro-batches' parameter gradients; the loss is the mean over "
                 "all m micro-batches.")
        _require_sends(f"gradients on {case.name}: its messages", program, args, case, 2)
        # last: a submission refused here had the right gradients and sends
        _require_hand_written_backward(f"gradients on {case.name}: the backward schedule",
                                       program)


def _exports(*, grads: bool) -> list[grading.Export]:
    # one export per hidden case: the stage count sets the devices
    return [grading.Export(args=_args(case, grads), n_devices=case.stages, wrap="shard_map",
                           axis=_AXIS) for case in _CASES]


# the library's pipeline schedule executor (forward ticks, then backward ticks)
_SCHEDULE_EXECUTOR = "clusterlab.device.parallel.pipeline._local_grads"

KEY = {
    "lab05.1": grading.equal(_SMALLEST_M, name="micro-batches",
                             hint="Write the bubble's share of the step in terms of p and m, and "
                                  "find the first m for which it is at most 1/8."),
    "lab05.2": grading.close(schedule.make_schedule(8, 32, "gpipe").stash_slots()[0]
                             / schedule.make_schedule(8, 32, "1f1b").stash_slots()[0],
                             name="ratio",
                             hint="How many micro-batches' inputs does stage 0 hold at its peak "
                                  "under each schedule? The bytes per micro-batch cancel."),
    "lab05.3": grading.code(
        _check_forward, name="GPipe forward",
        hint="Run m + p - 1 ticks; in each, every stage runs its blocks on its input and "
             "ppermutes the result to the next stage.",
        exports=_exports(grads=False),
        references=[_SCHEDULE_EXECUTOR]),
    "lab05.4": grading.code(
        _check_grads, name="GPipe gradients",
        hint="Forward ticks stash each micro-batch's input; backward ticks recompute the stage "
             "with jax.vjp and ppermute the input's gradient to the previous stage.",
        exports=_exports(grads=True),
        references=[_SCHEDULE_EXECUTOR]),
}
