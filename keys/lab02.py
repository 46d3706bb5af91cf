"""Answer key of lab 02, building all-reduce (instructor-only: student copies leave keys/ out)."""

import jax
import numpy as np

from clusterlab import collectives, costmodel, grading, hardware

_NVLINK_BYTES_PER_S = hardware.link("NVLink4").bytes_per_s


def _permutes_executed(ns):
    # the lab's ring all-reduce on its 4-device mesh, counted in the compiled program
    return len(collectives.executed_collectives(ns["ring_small"], ns["x_ring_small"]))


def _check_two_phase(function, ns):
    # a fresh input: 8 blocks of 1024 values, summed block-wise on every device
    fresh = jax.random.normal(jax.random.key(2026), (8 * 1024,))            # f32[8 * 1024]
    expected = np.tile(np.asarray(fresh).reshape(8, -1).sum(axis=0), 8)     # f32[8 * 1024]
    grading.require_close(function(fresh), expected, what="its result", rtol=1e-5, atol=1e-5)
    grading.require_collectives(function, fresh, includes=["collective-permute", "all-gather"],
                                excludes=["all-reduce"])


KEY = {
    "lab02.1": grading.equal(_permutes_executed, name="message count",
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
                                 "(tiled=True); pass the jitted function."),
}
