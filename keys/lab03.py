"""Answer key of lab 03, data parallelism (instructor-only: student copies leave keys/ out).

``lab03.4`` is the data-parallel gradient assignment: the student's ``data_parallel_grads``
runs inside ``shard_map`` over a ``"data"`` axis, the blocks passed as p stacked copies of the
layer-stacked arrays (f32[p, L, ...]) and the global batch f32[B, D] split along its first axis.
The hidden tests run it on 2, 4 and 8 devices with widths, depths and batches the lab never
shows, against one device's ``jax.grad`` of the mean loss on the whole batch
(:func:`clusterlab.device.models.reference_gradients` of :func:`clusterlab.device.models.mse_loss`), where a
sum for the mean (p times too large), a missing all-reduce (each device's own slice) and a
division by p too many show; and read the compiled program's collectives: all-reduces only,
one per gradient leaf or fewer where XLA's combiner merges them (1 to 4 accepted), carrying the
gradient's bytes in all (4 bytes x parameters), so a program that all-gathers the batch and
computes the whole batch on every device is refused.

``lab03.5`` is bucketed data parallelism with gradient accumulation: ``bucketed_accumulated_grads``
takes the same copies of the blocks and this device's A micro-batches f32[A, b, D] (the global
f32[p A, b, D] split along its first axis). The hidden tests run it on 2, 4 and 8 devices with
models, micro-batch counts and sizes the lab never shows, against one device's ``jax.grad`` of
the mean loss on all p A b examples, and read its program compiled with XLA's all-reduce combiner
off (:data:`clusterlab.device.hlo.SEPARATE_ALL_REDUCES`), loop trips counted: all-reduces only,
one per bucket of ``BUCKET_BYTES`` of the flat gradient (sizes from
:func:`clusterlab.analytic.costmodel.gradient_buckets`), issued once per step, after the last
micro-batch. One fused all-reduce, one per gradient array, or a reduction per micro-batch shows
there; a sum for the mean, or a micro-batch left out of the accumulation, shows in the gradients.
Its source locations must name no file of ``clusterlab.device.collectives`` or
``clusterlab.device.parallel``: the library's bucketing is what the student builds.
"""

import re

from collections.abc import Callable
from typing import NamedTuple

import jax
import numpy as np

from clusterlab.analytic import costmodel
from clusterlab.catalog import hardware
from clusterlab.course import grading
from clusterlab.device import hlo, models
from clusterlab.device.parallel import pipeline

_LEAVES = ("w1", "b1", "w2", "b2")     # the order of the stacked arrays the assignment takes
_AXIS = "data"


def _bf16_bytes_on_16(ns):
    return costmodel.data_parallel_bytes_per_step(ns["n_params"], 2, 16)


def _all_reduces(ns):
    # counted in the compiled program of the step the student's cell builds
    return hlo.summarize(ns["step_collectives"](ns["dp_1_5mib"]))["all-reduce"].n_ops


class _Case(NamedTuple):
    """One hidden case: p devices, n_blocks blocks of D x H, a global batch of batch_size."""

    devices: int
    n_blocks: int
    d_model: int
    d_hidden: int
    batch_size: int
    seed: int

    @property
    def name(self) -> str:
        return (f"{self.devices} devices, {self.n_blocks} block(s) of D = {self.d_model}, "
                f"H = {self.d_hidden}, batch {self.batch_size}")


# the lab shows 8 devices, 4 blocks of D = 256, H = 512, a batch of 128; none of these
_CASES = (_Case(2, 2, 8, 12, 12, 301), _Case(4, 3, 6, 10, 8, 302), _Case(8, 1, 8, 16, 24, 303))


def _by_layer(blocks: list[dict]) -> dict[str, np.ndarray]:
    """The blocks' arrays stacked along a leading layer axis, f32[L, ...] each."""
    return {k: np.asarray(v[0]) for k, v in pipeline.stack_stages(blocks, 1).items()}


def _inputs(case: _Case) -> tuple[list[dict], list[np.ndarray], np.ndarray, np.ndarray]:
    """The blocks, their p copies stacked by layer f32[p, L, ...], and the batch x, y f32[B, D]."""
    blocks = models.init_mlp(jax.random.key(grading.hidden_seed(case.seed)), d_model=case.d_model,
                             d_hidden=case.d_hidden, n_blocks=case.n_blocks)
    copies = models.stack_copies(_by_layer(blocks), case.devices)   # f32[p, L, ...] each
    x, y = models.synthetic_regression(jax.random.key(grading.hidden_seed(case.seed + 1)),
                                       n_samples=case.batch_size, d_model=case.d_model)
    return blocks, [copies[k] for k in _LEAVES], np.asarray(x), np.asarray(y)


def _args(case: _Case) -> list[tuple[tuple[int, ...], str]]:
    """The global (shape, dtype) of each input, as the export asks for them."""
    p, n, d, h, b = case.devices, case.n_blocks, case.d_model, case.d_hidden, case.batch_size
    shapes = [(p, n, d, h), (p, n, h), (p, n, h, d), (p, n, d), (b, d), (b, d)]
    return [(shape, "float32") for shape in shapes]


def _require_all_reduces(test: str, program: grading.Program, args: list,
                         gradient_bytes: int) -> None:
    """Refuse unless the program runs all-reduces only, 1 to 4 of them (one per leaf, or
    combined), carrying ``gradient_bytes`` in all."""
    ops = program.collective_ops(*args)
    found = sorted({(op.kind, op.bytes) for op in ops})
    total = sum(op.bytes for op in ops)
    if ({op.kind for op in ops} != {"all-reduce"} or not 1 <= len(ops) <= len(_LEAVES)
            or total != gradient_bytes):
        raise grading.Refused(
            f"{test}: its program runs {len(ops)} collectives {found}, {total} B in all; data "
            f"parallelism all-reduces the gradient once ({gradient_bytes} B, one all-reduce per "
            "gradient array or fewer) and nothing else. Hint: compute the gradient of this "
            "device's slice with jax.grad and combine it with one pmean or psum; keep the batch "
            "where it is (no all_gather).")


def _check_grads(programs) -> None:
    for program, case in zip(programs, _CASES):
        blocks, copies, x, y = _inputs(case)
        args = [*copies, x, y]
        grads = program(*args)                                       # 4 x f32[p, L, ...]
        expected = models.stack_copies(_by_layer(models.reference_gradients(blocks, x, y)),
                                       case.devices)                 # f32[p, L, ...] each
        grading.require_close(
            f"gradients on {case.name}", dict(zip(_LEAVES, grads)), expected,
            hint="the loss is the mean over the whole batch: each device's mean over its B/p "
                 "examples, averaged over the p devices (a psum of those means is p times too "
                 "large, no all-reduce leaves each device its own slice's gradient).")
        _require_all_reduces(f"{case.name}: its collectives", program, args,
                             4 * models.param_count(blocks))


# ---- lab03.5: bucketed data parallelism with gradient accumulation -----------------------------

BUCKET_BYTES = 4096     # the lab's given bucket size (its skeleton cell defines the same)
# a source location in the library modules that already bucket (JAX keeps file names in the
# exported StableHLO's locations)
_LIBRARY_LOCATION = re.compile(r'"[^"]*clusterlab/device/(?:collectives\.py|parallel/)[^"]*"')


class _AccumulationCase(NamedTuple):
    """One hidden case of lab03.5: p devices, A micro-batches of b examples on each."""

    devices: int
    n_blocks: int
    d_model: int
    d_hidden: int
    microbatches: int
    microbatch_size: int
    seed: int

    @property
    def name(self) -> str:
        return (f"{self.devices} devices, {self.n_blocks} block(s) of D = {self.d_model}, "
                f"H = {self.d_hidden}, {self.microbatches} micro-batches of "
                f"{self.microbatch_size}")

    def as_case(self) -> _Case:
        """The same model and the whole global batch, as :func:`_inputs` builds them."""
        return _Case(self.devices, self.n_blocks, self.d_model, self.d_hidden,
                     self.devices * self.microbatches * self.microbatch_size, self.seed)


# the lab shows 4 devices, 2 blocks of D = 32, H = 64, 2 micro-batches of 8 (33,536 B in 9
# buckets); these cut 9,696 B into 3 buckets, 8,192 B into exactly 2, 7,936 B into 2
_ACCUMULATION_CASES = (_AccumulationCase(2, 3, 16, 24, 3, 4, 311),
                       _AccumulationCase(4, 4, 12, 20, 2, 3, 312),
                       _AccumulationCase(8, 1, 24, 40, 4, 2, 313))


def _accumulation_args(case: _AccumulationCase) -> list[tuple[tuple[int, ...], str]]:
    p, n, d, h = case.devices, case.n_blocks, case.d_model, case.d_hidden
    micro = (p * case.microbatches, case.microbatch_size, d)
    shapes = [(p, n, d, h), (p, n, h), (p, n, h, d), (p, n, d), micro, micro]
    return [(shape, "float32") for shape in shapes]


def _require_buckets(test: str, compiled: Callable[..., object], placed: list,
                     gradient_bytes: int) -> None:
    """Refuse unless ``compiled`` (the program jitted with the combiner off, already run on
    ``placed``: JAX reuses that compilation) runs all-reduces only, one per bucket:
    gradient_buckets(gradient_bytes, BUCKET_BYTES) in sizes, once per step."""
    ops = hlo.executed_collectives(compiled, *placed)
    found = sorted(op.bytes for op in ops if op.kind == "all-reduce")
    expected = sorted(costmodel.gradient_buckets(gradient_bytes, BUCKET_BYTES))
    if {op.kind for op in ops} != {"all-reduce"} or found != expected:
        raise grading.Refused(
            f"{test}: its program, XLA's combiner off, runs {len(ops)} collectives "
            f"{sorted({(op.kind, op.bytes) for op in ops})}; the {gradient_bytes} B gradient in "
            f"buckets of {BUCKET_BYTES} B is {len(expected)} all-reduces of "
            f"{sorted(set(expected))} B, once per step. Hint: flatten the accumulated gradient, "
            "cut it into BUCKET_BYTES pieces (the last holds the rest), one pmean each, after "
            "the last micro-batch.")


def _require_own_bucketing(test: str, program: grading.Program) -> None:
    library = sorted(set(_LIBRARY_LOCATION.findall(program.exported.mlir_module())))
    if library:
        raise grading.Refused(f"{test}: its program runs code of {library[0]}. Hint: write the "
                              "buckets yourself with jax.numpy and jax.lax.pmean.")


def _check_accumulation(programs) -> None:
    for program, case in zip(programs, _ACCUMULATION_CASES):
        blocks, copies, x, y = _inputs(case.as_case())
        shape = (case.devices * case.microbatches, case.microbatch_size, case.d_model)
        args = [*copies, x.reshape(shape), y.reshape(shape)]
        expected = models.stack_copies(_by_layer(models.reference_gradients(blocks, x, y)),
                                       case.devices)                 # f32[p, L, ...] each
        # one compilation serves both tests: the combiner off changes which all-reduces run,
        # not the sums they compute
        compiled = jax.jit(program.exported.call, compiler_options=hlo.SEPARATE_ALL_REDUCES)
        placed = program.place(*args)
        grads = jax.tree_util.tree_map(np.asarray, compiled(*placed))
        grading.require_close(
            f"gradients on {case.name}", dict(zip(_LEAVES, grads)), expected,
            hint="the loss is the mean over all p x A micro-batches: add the A micro-batches' "
                 "gradients, divide by A, then average over the devices (pmean, not psum).")
        _require_buckets(f"{case.name}: its buckets", compiled, placed,
                         4 * models.param_count(blocks))
        _require_own_bucketing(f"{case.name}: written by hand", program)


# the library's per-device data-parallel gradient, with or without buckets
_GRADIENTS = "clusterlab.device.parallel.data._local_gradients"

KEY = {
    "lab03.1": grading.close(_bf16_bytes_on_16, name="bytes sent",
                             hint="Start from the gradient's size in bf16; what share of it does "
                                  "a ring all-reduce send from each of p devices?"),
    "lab03.2": grading.equal(_all_reduces, name="all-reduce count",
                             hint="How many buckets does the gradient fill, and what else does "
                                  "the step all-reduce? The bucket table above shows the rule."),
    "lab03.3": grading.close(
        costmodel.collective_time("all_reduce", 1e9 * 2, 8, hardware.link("NVLink4").bytes_per_s),
        name="all-reduce time",
        hint="Which bytes does a ring all-reduce put on each GPU's link, and at what speed? "
             "Answer in seconds."),
    "lab03.4": grading.code(
        _check_grads, name="data-parallel gradient",
        hint="jax.grad of models.mse_loss on this device's slice, then one collective that "
             "turns the p devices' gradients into the whole batch's mean-loss gradient.",
        exports=[grading.Export(args=_args(case), n_devices=case.devices, wrap="shard_map",
                                axis=_AXIS) for case in _CASES],
        references=[_GRADIENTS]),
    "lab03.5": grading.code(
        _check_accumulation, name="bucketed, accumulated gradient",
        hint="Accumulate the A micro-batches' gradients on the device, then reduce the flat "
             "gradient bucket by bucket, one pmean per BUCKET_BYTES.",
        exports=[grading.Export(args=_accumulation_args(case), n_devices=case.devices,
                                wrap="shard_map", axis=_AXIS)
                 for case in _ACCUMULATION_CASES],
        references=[_GRADIENTS]),
}
