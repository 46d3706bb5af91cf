"""Answer key of lab 00, devices and meshes (instructor-only: student copies leave keys/ out)."""

import jax
import jax.numpy as jnp

from clusterlab import grading


def _block_shape(ns):
    y = ns["y"]                                   # the lab's f32[16, 12] on P("model", "data")
    return y.sharding.shard_shape(y.shape)


def _holders_of_first_element(ns):
    w = ns["w"]                                   # the lab's f32[8] on P("model")
    return sum(1 for index in w.sharding.devices_indices_map(w.shape).values()
               if (index[0].start or 0) == 0)


def _check_global_max(function, ns):
    # a fresh input on one device: jnp.max compiles to no collective there, while a shard_map
    # over the lab's 8-device mesh must combine the blocks' maxima with an all-reduce (pmax)
    data = 3.0 * jax.random.normal(jax.random.key(2026), (64,)) + 1.0   # data: f32[64]
    grading.require_close(function(data), jnp.max(data, keepdims=True), what="its result",
                          rtol=0.0, atol=0.0)
    grading.require_collectives(function, data, includes=["all-reduce"])
    # jnp.max of an array constrained to P("data") also compiles to an all-reduce: the exercise
    # asks for the per-block maximum written by hand, so the traced program must hold a shard_map
    if "shard_map" not in str(jax.make_jaxpr(function)(data)):
        raise grading.Refused("it computes the maximum without a shard_map: write the per-block "
                              "maximum inside jax.shard_map over mesh_1d and combine the blocks' "
                              "maxima with a collective.")


KEY = {
    "lab00.1": grading.equal(_block_shape, name="block shape",
                             hint="Dimension 0 is split over 'model' (4 devices), dimension 1 "
                                  "over 'data' (2)."),
    "lab00.2": grading.equal(_holders_of_first_element, name="copies of w[0]",
                             hint="The spec does not mention 'data': what happens along it?"),
    "lab00.3": grading.code(_check_global_max, name="global maximum",
                            hint="Take each block's maximum inside a shard_map over mesh_1d, "
                                 "then combine the 8 with jax.lax.pmax over 'data'."),
}
