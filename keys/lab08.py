"""Answer key of lab 08, utilization and rooflines (instructor-only: student copies leave keys/
out).

``lab08.4`` is the roofline assignment: the student's ``gemm_roofline(m, n, k, bytes_per_value,
peak_flops_per_s, bytes_per_s)``, written in ``jax.numpy`` and exported with ``jax.export``,
returns for each GEMM ``(m x k) @ (k x n)`` its roofline time in seconds and whether it is
compute-bound. The hidden tests run it on the GEMMs of two transformer layers the lab never shows
(``gemm.transformer_layer_gemms``: a GPT-3 layer split 8 ways on an A100 in BF16, a Llama-like
layer split 4 ways on a B200 in FP8) and on thin and square GEMMs in float32 on a made-up
device, against the course's roofline (``bench.Roofline``: FLOPs over the attainable FLOP/s at
the GEMM's intensity, and its intensity against the ridge point), every GEMM to 1e-5 of its own
time.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from clusterlab.analytic import flops, gemm
from clusterlab.catalog import hardware
from clusterlab.course import grading
from clusterlab.device import bench


def _matmul_intensity(ns):
    # XLA's cost analysis of the f32 (1024 x 4096) @ (4096 x 1024) matmul
    left = jax.ShapeDtypeStruct((1024, 4096), jnp.float32)
    right = jax.ShapeDtypeStruct((4096, 1024), jnp.float32)
    return bench.program_cost(jax.jit(jnp.matmul), left, right).flops_per_byte


class _Case(NamedTuple):
    """One hidden case: GEMMs (one multiplication each) on one device in one number format."""

    name: str
    gemms: tuple[gemm.Gemm, ...]
    roof: bench.Roofline          # the device's peak FLOP/s and memory bandwidth
    bytes_per_value: int

    def arrays(self) -> list[np.ndarray]:
        """The function's arguments: m, n, k as f32[G], then the three scalars."""
        m, n, k = (np.array([getattr(g, d) for g in self.gemms], np.float32) for d in "mnk")
        return [m, n, k, *(np.float32(v) for v in (self.bytes_per_value,
                                                   self.roof.peak_flops_per_s,
                                                   self.roof.memory_bytes_per_s))]

    def expected(self) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, compute-bound) of each GEMM by the course's roofline."""
        flops_ = np.array([g.flops for g in self.gemms])
        # Gemm.hbm_bytes counts A, B and C at BF16's 2 bytes a value
        bytes_ = np.array([g.hbm_bytes for g in self.gemms]) * (self.bytes_per_value
                                                                / gemm.BYTES_PER_VALUE)
        intensity = flops_ / bytes_
        return (flops_ / self.roof.attainable_flops_per_s(intensity),
                intensity > self.roof.ridge_flops_per_byte)


def _layer(*shape, **options) -> tuple[gemm.Gemm, ...]:
    # one multiplication of each distinct shape (a head's, for attention), in the layer's order
    shapes = dict.fromkeys((g.m, g.n, g.k) for g in gemm.transformer_layer_gemms(
        *shape, recompute="none", **options))
    return tuple(gemm.Gemm("hidden", m, n, k) for m, n, k in shapes)


def _device(name: str, peak_flops_per_s: float, bytes_per_s: float, dtype: str):
    return bench.Roofline(name, peak_flops_per_s, bytes_per_s, dtype)


_A100, _B200 = hardware.gpu("A100"), hardware.gpu("B200")
# the lab shows an H100 in BF16 and the host in float32 (its layer: gemm.HOST_LAYER); none of these
_CASES = (
    _Case("a GPT-3 layer (s 2048, d 12288, 96 heads, t 8) on an A100 in BF16",
          _layer(2048, 1, 12288, 96, tensor_parallel=8),
          _device("A100", _A100.bf16_flops, _A100.hbm_bytes_per_s, "bfloat16"), 2),
    _Case("a Llama-like layer (s 4096, b 2, d 4096, f 14336, t 4) on a B200 in FP8",
          _layer(4096, 2, 4096, 32, ffn_hidden=14336, tensor_parallel=4),
          _device("B200", _B200.fp8_flops, _B200.hbm_bytes_per_s, "float8"), 1),
    _Case("thin and square GEMMs in float32 on a 60 TFLOP/s, 1.5 TB/s device",
          tuple(gemm.Gemm("hidden", m, n, k) for m, n, k in (
              (8192, 1, 8192), (1, 14336, 4096), (96, 96, 96), (768, 768, 768),
              (4096, 4096, 4096), (16384, 64, 16384), (300, 5000, 40))),
          _device("made up", 60e12, 1.5e12, "float32"), 4),
)


def _check_gemm_roofline(programs) -> None:
    for program, case in zip(programs, _CASES):
        seconds_expected, bound_expected = case.expected()
        output = program(*case.arrays())
        if not isinstance(output, tuple) or len(output) != 2:
            raise grading.Refused(f"{case.name}: its output is not a pair; return (seconds, "
                                  "compute_bound), one value of each per GEMM.")
        seconds, compute_bound = (np.asarray(o) for o in output)
        for what, got in (("seconds", seconds), ("compute_bound", compute_bound)):
            if got.shape != seconds_expected.shape:
                raise grading.Refused(f"{case.name}: its {what} has shape {got.shape} for "
                                      f"{len(case.gemms)} GEMMs; return one value per GEMM.")
        # each GEMM to its own time: they span several orders of magnitude
        grading.require_close(
            f"{case.name}: its times", seconds / seconds_expected, np.ones_like(seconds_expected),
            hint="count the FLOPs of one (m x k) @ (k x n) product, the bytes of each of its "
                 "three matrices at bytes_per_value, and check which of the two times the "
                 "roofline keeps.")
        if compute_bound.dtype != bool:
            raise grading.Refused(f"{case.name}: its classes are {compute_bound.dtype}; return "
                                  "compute_bound as booleans (a comparison of arrays).")
        wrong = int(np.count_nonzero(compute_bound != bound_expected))
        if wrong:
            raise grading.Refused(
                f"{case.name}: its classes: {wrong} of {len(case.gemms)} GEMMs classified "
                "wrong. Hint: a GEMM is compute-bound when its FLOPs at the peak take longer "
                "than its bytes at the bandwidth.")


def _exports() -> list[grading.Export]:
    # m, n, k: f32[G]; bytes_per_value, peak_flops_per_s, bytes_per_s: f32[]
    return [grading.Export(args=[((len(c.gemms),), "float32")] * 3 + [((), "float32")] * 3,
                           n_devices=1) for c in _CASES]


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
    "lab08.4": grading.code(
        _check_gemm_roofline, name="GEMM roofline",
        hint="Price each GEMM twice, its FLOPs at the peak and its bytes at the bandwidth, "
             "in jax.numpy element by element (jnp.maximum, not max).",
        exports=_exports()),
    # no references: gemm.gemm_time_s prices one Gemm on a catalog GPU in Python floats; the
    # exercise's arrays of GEMMs on any device have no library function
}
