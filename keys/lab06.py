"""Answer key of lab 06, sharded data parallelism (instructor-only: student copies leave keys/
out).

``lab06.4`` is the FSDP / ZeRO-3 assignment: the student's ``fsdp_step(flat_shard, x, y,
axis_name)`` runs inside ``shard_map`` over a ``"data"`` axis of p devices; device j holds the
j-th of p equal slices of every block's flat parameter (``sharded.flatten_blocks``' rows, laid
out f32[p, L, F/p]) and the j-th shard of the batch, and returns its slice after one step of
plain SGD (learning rate ``LEARNING_RATE`` = 0.1, so the reference is exact). The hidden tests
run it on 2, 4 and 8 devices, with widths, depths and batches the lab never shows, against one
device's SGD step on the whole batch, and read the compiled program: all-gathers and
reduce-scatters only (no all-reduce), two gathers per reduce-scatter, and the bytes of ZeRO-3's
formula, ``3 (p - 1)/p`` of the parameters' bytes per device
(:func:`clusterlab.analytic.costmodel.sharded_data_parallel_bytes_per_step`).
"""

from typing import NamedTuple

import jax
import numpy as np

from clusterlab.analytic import costmodel, memory
from clusterlab.course import grading
from clusterlab.device import hlo, models
from clusterlab.device.parallel import sharded

LEARNING_RATE = 0.1              # the lab's fsdp_step takes plain SGD steps of this size
_AXIS = "data"


def _stage3_bytes_on_16(ns):
    # the lab's fp32 parameters and Adam moments, sharded 16 ways, plus Adam's 4-byte counter
    return memory.training_memory_per_device(ns["n_params"], 16, 3, bytes_param=4, bytes_grad=0,
                                             optimizer_bytes_per_param=8) + 4


def _all_gathers(ns):
    # counted in the compiled stage-3 step the student cell builds (5 blocks, 2 devices)
    sdp = ns["sdp_2"]
    ops = hlo.executed_collectives(sdp.step, ns["flat_2"], ns["state_2"],
                                           *sdp.place_batch(*ns["batches"][0]))
    return hlo.summarize(ops)["all-gather"].n_ops


class _Case(NamedTuple):
    """One hidden case: p devices, an MLP of n_blocks blocks (D, H), a global batch."""

    devices: int
    n_blocks: int
    d_model: int
    d_hidden: int
    batch: int
    seed: int

    @property
    def flat_size(self) -> int:
        return 2 * self.d_model * self.d_hidden + self.d_hidden + self.d_model   # F

    @property
    def name(self) -> str:
        return (f"SGD step on {self.devices} devices, {self.n_blocks} block(s) of D = "
                f"{self.d_model}, H = {self.d_hidden}, batch {self.batch}")


# the lab shows D = 64, H = 256, 3 blocks, batch 64 on 8 devices; none of these
_CASES = (_Case(2, 2, 8, 16, 12, 601), _Case(4, 3, 4, 12, 8, 602), _Case(8, 2, 8, 16, 24, 603))


def _by_device(flat: np.ndarray, p: int) -> np.ndarray:
    """f32[L, F] -> f32[p, L, F/p]: row j holds device j's slice of every block."""
    n_blocks, size = flat.shape
    return np.asarray(flat).reshape(n_blocks, p, size // p).transpose(1, 0, 2)


def _inputs(case: _Case) -> tuple[list[dict], np.ndarray, np.ndarray, np.ndarray]:
    """The blocks, their slices f32[p, L, F/p], and the batch x, y: f32[B, D]."""
    blocks = models.init_mlp(jax.random.key(case.seed), d_model=case.d_model,
                             d_hidden=case.d_hidden, n_blocks=case.n_blocks)
    x, y = models.synthetic_regression(jax.random.key(case.seed + 1), n_samples=case.batch,
                                       d_model=case.d_model)
    flat, _ = sharded.flatten_blocks(blocks)
    return blocks, _by_device(np.asarray(flat), case.devices), np.asarray(x), np.asarray(y)


def _args(case: _Case) -> list[tuple[tuple[int, ...], str]]:
    """The global (shape, dtype) of each input, as the export asks for them."""
    slices = (case.devices, case.n_blocks, case.flat_size // case.devices)
    batch = (case.batch, case.d_model)
    return [(slices, "float32"), (batch, "float32"), (batch, "float32")]


def _require_zero3_traffic(test: str, program: grading.Program, args: list,
                           case: _Case) -> None:
    """Refuse unless the program runs all-gathers and reduce-scatters only, two gathers per
    reduce-scatter, sending ZeRO-3's 3 (p - 1)/p of the parameters' bytes per device."""
    ops = program.collective_ops(*args)
    counts = {kind: s.n_ops for kind, s in hlo.summarize(ops).items()}
    if set(counts) != {"all-gather", "reduce-scatter"}:
        raise grading.Refused(
            f"{test}: its program runs {counts}; ZeRO-3 runs all-gathers and reduce-scatters "
            "only. Hint: gather each block's slices with jax.lax.all_gather where the block "
            "runs and let its gradient come back reduce-scattered (the all-gather's backward, "
            "or jax.lax.psum_scatter); a psum of the whole gradient is plain data parallelism.")
    n_params = case.n_blocks * case.flat_size
    sent = sharded.sent_bytes_per_device(ops, case.devices)
    formula = costmodel.sharded_data_parallel_bytes_per_step(n_params, 4, case.devices, 3)
    if counts["all-gather"] != 2 * counts["reduce-scatter"] or not np.isclose(sent, formula):
        raise grading.Refused(
            f"{test}: its program runs {counts}, sending {sent:,.0f} B per device; ZeRO-3 "
            f"gathers the parameters forward and again backward and reduce-scatters their "
            f"gradient once: 3 (p - 1)/p x {4 * n_params:,} B = {formula:,.0f} B. Hint: gather "
            "inside a jax.checkpoint'ed block, so that the backward pass gathers again instead "
            "of keeping the whole parameters.")


def _check_fsdp_step(programs) -> None:
    for program, case in zip(programs, _CASES):
        blocks, slices, x, y = _inputs(case)
        gradient, _ = sharded.flatten_blocks(models.reference_gradients(blocks, x, y))
        expected = slices - LEARNING_RATE * _by_device(np.asarray(gradient), case.devices)
        updated = program(slices, x, y)                           # f32[p, L, F/p]
        grading.require_close(
            f"{case.name}: the updated slices", updated, expected,
            hint="return this device's slice, f32[1, L, F/p], minus LEARNING_RATE times its "
                 "gradient of the mean over the WHOLE batch: the reduce-scatter sums the p "
                 "devices' gradients of their own examples' means.")
        _require_zero3_traffic(f"{case.name}: its collectives", program, [slices, x, y], case)


KEY = {
    "lab06.1": grading.close(_stage3_bytes_on_16, name="bytes per device", rtol=1e-6,
                             hint="Which of parameters, gradients and Adam's moments does stage 3 "
                                  "shard, and over how many devices? The measured shards add "
                                  "Adam's counter."),
    "lab06.2": grading.close(
        costmodel.sharded_data_parallel_bytes_per_step(7e9, 2, 16, 3)
        - costmodel.sharded_data_parallel_bytes_per_step(7e9, 2, 16, 0),
        name="extra bytes",
        hint="Which collective does stage 3 add to plain data parallelism's, over which bytes, "
             "and what share of them does a ring of p GPUs send from each?"),
    "lab06.3": grading.equal(_all_gathers, name="all-gathers",
                             hint="Stage 3 gathers each block's parameters when it needs them: "
                                  "how often per step? The 3-block count above shows it."),
    "lab06.4": grading.code(
        _check_fsdp_step, name="FSDP step",
        hint="Gather each block's slices just before it runs (jax.lax.all_gather, tiled), "
             "differentiate this device's loss with respect to its slices, divide by p, and "
             "take one SGD step on the slices.",
        exports=[grading.Export(args=_args(case), n_devices=case.devices, wrap="shard_map",
                                axis=_AXIS) for case in _CASES]),
}
