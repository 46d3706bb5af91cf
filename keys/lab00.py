"""Answer key of lab 00, devices and meshes (instructor-only: student copies leave keys/ out)."""

import jax
import numpy as np

from clusterlab.course import grading


# The lab's y is f32[16, 12] on P("model", "data") over its (model 4, data 2) mesh: blocks of
# (16 / 4, 12 / 2); its w is f32[8] on P("model"), so each block is held by the 2 devices along
# "data". Both were read from the notebook's namespace before grading left the submission's
# kernel; they follow from the lab's fixed shapes and mesh.
_BLOCK_SHAPE = (16 // 4, 12 // 2)
_HOLDERS_OF_W0 = 2


def _check_global_max(programs):
    # a fresh input: jnp.max on one device compiles to no collective, while a shard_map over
    # the lab's 8-device mesh must combine the blocks' maxima with an all-reduce (pmax)
    (program,) = programs
    key = jax.random.key(grading.hidden_seed(2026))
    data = np.asarray(3.0 * jax.random.normal(key, (64,)) + 1.0)  # f32[64]
    grading.require_close("its result", program(data), np.max(data, keepdims=True), rtol=0.0)
    grading.require_collectives(program, data, includes=["all-reduce"])
    # jnp.max of an array constrained to P("data") also compiles to an all-reduce: the exercise
    # asks for the per-block maximum written by hand, so the program must hold a shard_map
    # (its manual computation in the exported StableHLO)
    if "manual_computation" not in program.exported.mlir_module():
        raise grading.Refused("it computes the maximum without a shard_map: write the per-block "
                              "maximum inside jax.shard_map over mesh_1d and combine the blocks' "
                              "maxima with a collective.")


KEY = {
    "lab00.1": grading.equal(_BLOCK_SHAPE, name="block shape",
                             hint="Dimension 0 is split over 'model' (4 devices), dimension 1 "
                                  "over 'data' (2)."),
    "lab00.2": grading.equal(_HOLDERS_OF_W0, name="copies of w[0]",
                             hint="The spec does not mention 'data': what happens along it?"),
    "lab00.3": grading.code(_check_global_max, name="global maximum",
                            hint="Take each block's maximum inside a shard_map over mesh_1d, "
                                 "then combine the 8 with jax.lax.pmax over 'data'.",
                            exports=[grading.Export(args=[((64,), "float32")], n_devices=8)]),
    # no references: the library has no global maximum; jnp.max and jax.lax.pmax are JAX's
}
