"""Answer key of lab 08, utilization and rooflines (instructor-only: student copies leave keys/
out)."""

import jax
import jax.numpy as jnp

from clusterlab.analytic import flops
from clusterlab.catalog import hardware
from clusterlab.course import grading
from clusterlab.device import bench


def _matmul_intensity(ns):
    # XLA's cost analysis of the f32 (1024 x 4096) @ (4096 x 1024) matmul
    left = jax.ShapeDtypeStruct((1024, 4096), jnp.float32)
    right = jax.ShapeDtypeStruct((4096, 1024), jnp.float32)
    return bench.program_cost(jax.jit(jnp.matmul), left, right).flops_per_byte


KEY = {
    "lab08.1": grading.close(_matmul_intensity, name="arithmetic intensity (FLOP/byte)",
                             hint="Count the multiply-adds of an (m x k) by (k x n) matmul as 2 "
                                  "FLOPs each, and the bytes of all three matrices in float32."),
    "lab08.2": grading.close(
        flops.mfu(flops.training_flops(7e9, 4e6) / 1.6, 256, hardware.gpu("H100").bf16_flops),
        name="MFU",
        hint="MFU is the model's FLOPs per second over what all the GPUs could do at peak; "
             "count a training step's FLOPs from the parameters and the tokens."),
    "lab08.3": grading.close(hardware.roofline_flops("H100", 0.25) / 1e12,
                             name="attainable TFLOP/s",
                             hint="Is 0.25 FLOP/byte left or right of the H100's ridge point, "
                                  "and what limits a kernel there? Answer in TFLOP/s."),
}
