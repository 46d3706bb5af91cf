"""Answer key of lab 02, building all-reduce (instructor-only: student copies leave keys/ out).

``lab02.3`` and ``lab02.4`` are the ring assignment: the student's ``ring_reduce_scatter(block,
axis_name)`` and ``ring_all_gather(chunk, axis_name)`` run inside ``shard_map``, built only from
``jax.lax.ppermute``, ``axis_index``, ``axis_size`` and ``jax.numpy``. Device i ends the
reduce-scatter with chunk i of the sum (as ``jax.lax.psum_scatter(..., tiled=True)``) and starts
the all-gather with chunk i. The hidden tests run them on 2, 4 and 8 devices with block sizes the
lab never shows, against NumPy, and read the compiled program: exactly p - 1
``collective-permute``s of one chunk (block bytes / p) each, and nothing else. Their inputs are
drawn afresh each grading run (:func:`clusterlab.course.grading.hidden_seed`), and the library's
own ring functions refuse a submission's calls while it is graded (``references``).
"""

from typing import NamedTuple

import jax
import numpy as np

from clusterlab.analytic import costmodel
from clusterlab.catalog import hardware
from clusterlab.course import grading

_NVLINK_BYTES_PER_S = hardware.link("NVLink4").bytes_per_s
_AXIS = "ring"   # not the lab's "data": the functions must use the axis_name they are given


# The lab's ring all-reduce on its 4-device mesh runs 2 (p - 1) = 6 collective-permutes (read
# from the notebook's ring_small before grading left the submission's kernel; the count of
# collectives.ring_all_reduce's compiled program, asserted in tests/test_keys_review.py)
_PERMUTES_ON_4 = 2 * (4 - 1)


class _Case(NamedTuple):
    """One hidden case: p devices on a ring, a block of n values on each."""

    devices: int
    block: int          # values per device, a multiple of p
    seed: int           # mixed with the grading run's own seed (grading.hidden_seed)

    @property
    def chunk(self) -> int:
        return self.block // self.devices


# the lab shows blocks of 4 on 4 devices and of 1024 on 8; none of these
_CASES = (_Case(2, 10, 201), _Case(4, 36, 202), _Case(8, 88, 203))


def _case_name(phase: str, case: _Case, size: int) -> str:
    return f"{phase} on {case.devices} devices, {size} values each"


def _require_ring(test: str, program: grading.Program, x: np.ndarray, case: _Case,
                  phase_hint: str) -> None:
    """Refuse unless the program runs exactly p - 1 collective-permutes of one chunk (the block's
    bytes / p) and nothing else."""
    ops = program.collective_ops(x)
    chunk_bytes = case.chunk * 4
    found = sorted({(op.kind, op.bytes) for op in ops})
    if found != [("collective-permute", chunk_bytes)] or len(ops) != case.devices - 1:
        raise grading.Refused(
            f"{test}: its program runs {len(ops)} collectives {found}; the ring runs p - 1 = "
            f"{case.devices - 1} collective-permutes of one chunk ({chunk_bytes} B) and nothing "
            f"else. Hint: {phase_hint}; no psum, psum_scatter or all_gather.")


def _check_reduce_scatter(programs) -> None:
    for program, case in zip(programs, _CASES):
        test = _case_name("reduce-scatter", case, case.block)
        x = np.asarray(jax.random.normal(jax.random.key(grading.hidden_seed(case.seed)),
                                         (case.devices * case.block,)))   # f32[p * n]
        # device i ends with chunk i of the sum, so the chunks in device order are the sum
        expected = x.reshape(case.devices, case.block).sum(axis=0)        # f32[n]
        grading.require_close(
            f"{test}: its result", program(x), expected,
            hint="device i must end with chunk i summed over all devices (as "
                 "jax.lax.psum_scatter(..., tiled=True)); start with chunk i - 1, send it to "
                 "i + 1, and at step s add your own chunk i - 1 - s to what you receive.")
        _require_ring(f"{test}: its messages", program, x, case,
                      "p - 1 steps, one jax.lax.ppermute of one chunk each")


def _check_all_gather(programs) -> None:
    for program, case in zip(programs, _CASES):
        test = _case_name("all-gather", case, case.chunk)
        x = np.asarray(jax.random.normal(jax.random.key(grading.hidden_seed(case.seed)),
                                         (case.devices * case.chunk,)))   # f32[p * n/p]
        expected = np.tile(x, case.devices)           # every device: all p chunks in order
        grading.require_close(
            f"{test}: its result", program(x), expected,
            hint="device i holds chunk i; pass the chunk you received last on to i + 1 at every "
                 "step and store the one you receive at step s as chunk i - s.")
        _require_ring(f"{test}: its messages", program, x, case,
                      "p - 1 steps, one jax.lax.ppermute of one chunk each")


def _exports(phase: str) -> list[grading.Export]:
    # one export per hidden case: the global input, split over the devices of the ring
    size = {"reduce-scatter": lambda c: c.block, "all-gather": lambda c: c.chunk}[phase]
    return [grading.Export(args=[((c.devices * size(c),), "float32")], n_devices=c.devices,
                           wrap="shard_map", axis=_AXIS) for c in _CASES]


KEY = {
    "lab02.1": grading.equal(_PERMUTES_ON_4, name="message count",
                             hint="The ring all-reduce runs two phases; count the steps of each "
                                  "on p = 4 devices and the ppermutes per step."),
    "lab02.2": grading.close(
        costmodel.crossover_bytes(
            costmodel.collective_alpha_beta("all_reduce", 16, _NVLINK_BYTES_PER_S, 10e-6, "ring"),
            costmodel.collective_alpha_beta("all_reduce", 16, _NVLINK_BYTES_PER_S, 10e-6,
                                            "recursive_doubling")),
        name="crossover",
        hint="Write both algorithms' times as steps x alpha + bytes x beta, with beta = 1 / the "
             "link's bytes per second, set them equal and solve for n."),
    "lab02.3": grading.code(
        _check_reduce_scatter, name="ring reduce-scatter",
        hint="Split the block into p chunks; p - 1 times, ppermute a partial sum to the right "
             "and add your own share of the chunk it belongs to.",
        exports=_exports("reduce-scatter"),
        references=["clusterlab.device.collectives.ring_reduce_scatter"]),
    "lab02.4": grading.code(
        _check_all_gather, name="ring all-gather",
        hint="p - 1 times, ppermute the chunk you received last to the right and store it "
             "where it belongs.",
        exports=_exports("all-gather"),
        references=["clusterlab.device.collectives.ring_all_gather"]),
}
