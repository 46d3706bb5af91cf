"""Answer key of lab 02, building all-reduce (instructor-only: student copies leave keys/ out)."""

import jax
import numpy as np

from clusterlab import costmodel, grading, hardware

_NVLINK_BYTES_PER_S = hardware.link("NVLink4").bytes_per_s


# The lab's ring all-reduce on its 4-device mesh runs 2 (p - 1) = 6 collective-permutes (read
# from the notebook's ring_small before grading left the submission's kernel; the count of
# collectives.ring_all_reduce's compiled program, asserted in tests/test_keys_review.py)
_PERMUTES_ON_4 = 2 * (4 - 1)


def _check_two_phase(programs):
    # a fresh input: 8 blocks of 1024 values, summed block-wise on every device
    (program,) = programs
    fresh = np.asarray(jax.random.normal(jax.random.key(2026), (8 * 1024,)))  # f32[8 * 1024]
    expected = np.tile(fresh.reshape(8, -1).sum(axis=0), 8)                  # f32[8 * 1024]
    grading.require_close("its result", program(fresh), expected)
    grading.require_collectives(program, fresh, includes=["collective-permute", "all-gather"],
                                excludes=["all-reduce"])


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
    "lab02.3": grading.code(_check_two_phase, name="two-phase all-reduce",
                            hint="Inside shard_map: reduce-scatter the block with "
                                 "collectives.ring_reduce_scatter, then all-gather the chunk "
                                 "(tiled=True); pass the jitted function.",
                            exports=[grading.Export(args=[((8 * 1024,), "float32")],
                                                    n_devices=8)]),
}
