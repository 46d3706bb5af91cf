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
"""

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
    blocks = models.init_mlp(jax.random.key(case.seed), d_model=case.d_model,
                             d_hidden=case.d_hidden, n_blocks=case.n_blocks)
    copies = models.stack_copies(_by_layer(blocks), case.devices)   # f32[p, L, ...] each
    x, y = models.synthetic_regression(jax.random.key(case.seed + 1), n_samples=case.batch_size,
                                       d_model=case.d_model)
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
                                axis=_AXIS) for case in _CASES]),
}
