"""Answer key of lab 04, tensor parallelism (instructor-only: student copies leave keys/ out).

``lab04.3`` and ``lab04.4`` are the Megatron MLP block's forward and hand-written backward inside
``shard_map`` over ``"model"`` (w1 split by columns, w2 by rows; x, b2 and dy as stacked copies;
the backward takes x, w1, b1, w2, dy: b2 enters no gradient).
Hidden tests on 2, 4 and 8 devices with widths and batches the lab never shows compare the output
with ``models.mlp_block`` on one device and every gradient with ``jax.vjp`` of it, and require
exactly one all-reduce of B x D x 4 bytes in each compiled program.

``lab04.6`` is the same block under Megatron's sequence parallelism: the tokens x f32[T, D]
split over the devices (f32[T/t, D] each), the weights as in ``lab04.3``. Hidden tests on 2, 4 and
8 devices with widths and token counts the lab never shows compare the output, f32[T/t, D] per
device, with ``models.mlp_block`` on one device, and require exactly one all-gather of the T x D
tokens and one reduce-scatter to T/t x D (float32), nothing else: the all-reduce kept, a
reduce-scatter along the wrong axis or a missing gather fails by name. Its source locations must
name no file of ``clusterlab.device.collectives`` or ``clusterlab.device.parallel``.

The backward must be written by hand, and the grader holds that rule from the exported program.
JAX (0.10.2 here) names every operation it lowers after its transformation stack: what autodiff
derives carries ``jvp(...)`` (linearisation) or ``transpose(...)`` (the backward) in its source
location, which ``jax.export`` keeps in the StableHLO it serializes. A hand-written chain rule
has neither; ``jax.vjp``, ``jax.grad``, ``jax.jvp`` or ``jax.linear_transpose`` of any piece of
the block leaves them. The math alone cannot tell them apart (both run the same dots and the one
all-reduce), so the test reads the locations, and a program exported without any (locations
stripped) is refused too. A kernel that rewrites the locations before exporting forges this test
as it could forge any; what it stops is the shortcut the exercise forbids.
"""

import re

from typing import NamedTuple

import jax
import numpy as np

from clusterlab.analytic import costmodel
from clusterlab.catalog import hardware
from clusterlab.course import grading
from clusterlab.device import models


def _all_reduced_bytes(ns):
    # counted in the compiled step of the student cell's wide 6-block MLP on 4 devices
    return ns["counted"](ns["six"], ns["x0"], ns["y0"], 4)["all-reduce"].total_bytes


_LAYER = costmodel.tensor_parallel_bytes_per_step(2 * 4096, 8192, 2, 8, bytes_per_element=2)


def _overlap_ratio() -> float:
    # lab04.5: one collective-matmul step on 8 H100s, 2 x 4096 tokens, D = 8192, bf16, 4D columns
    tokens, width, tp = 2 * 4096, 8192, 8
    matmul_s = 2 * (tokens // tp) * width * (4 * width // tp) / hardware.gpu("H100").bf16_flops
    transfer_s = (tokens // tp) * width * 2 / hardware.link("NVLink4").bytes_per_s
    return matmul_s / transfer_s


_OVERLAP_RATIO = _overlap_ratio()

KEY = {
    "lab04.1": grading.equal(_all_reduced_bytes, name="bytes all-reduced",
                             hint="Count the forward pass's and the backward pass's all-reduces "
                                  "separately, then ask which tensor each one carries: does the "
                                  "hidden width, or the device count, enter its size?"),
    "lab04.2": grading.close(
        _LAYER.sent_bytes_per_device / hardware.link("NVLink4").bytes_per_s,
        name="all-reduce time",
        hint="Count a layer's all-reduces in a training step and the bytes of each (tokens x "
             "width x bytes per value); a ring sends a share of each over the link."),
    "lab04.5": grading.close(_OVERLAP_RATIO, name="partial matmul time over transfer time",
                             hint="One ring step moves one token block (T/p tokens of width D); "
                                  "its matmul multiplies that block by the GPU's 4D/p columns. "
                                  "Time each at peak: FLOPs (2 per multiply-add) over the bf16 "
                                  "peak, bytes over NVLink's bandwidth."),
}


# ---- lab04.3 and lab04.4: the Megatron MLP block's forward and backward, written by hand ----

_AXIS = "model"
# a source location naming an autodiff transformation: "jvp(...)/dot_general",
# "transpose(jvp(...))/select_n" (JAX's name stack, kept in the exported StableHLO)
_AUTODIFF_LOCATION = re.compile(r'loc\("[^"]*\b(jvp|transpose)\(')
_GRAD_NAMES = ("dx", "dw1", "db1", "dw2", "db2")


class _Case(NamedTuple):
    """One hidden case: t devices, a block of width D and hidden width H, a batch of B rows."""

    devices: int
    d_model: int
    d_hidden: int
    batch_size: int
    seed: int

    @property
    def name(self) -> str:
        return (f"{self.devices} devices, D = {self.d_model}, H = {self.d_hidden}, "
                f"batch {self.batch_size}")


# the lab shows 4 devices, D = 16, H = 32, a batch of 32; none of these
_CASES = (_Case(2, 6, 10, 5, 401), _Case(4, 8, 12, 7, 402), _Case(8, 4, 24, 3, 403))


def _split(block: dict, t: int) -> list[np.ndarray]:
    """The block split over t devices as the export passes it: w1 by columns f32[t, D, H/t], b1
    f32[t, H/t], w2 by rows f32[t, H/t, D], b2 as t copies f32[t, D]."""
    w1, b1, w2, b2 = (np.asarray(block[k]) for k in ("w1", "b1", "w2", "b2"))
    d, h = w1.shape
    return [w1.reshape(d, t, h // t).transpose(1, 0, 2), b1.reshape(t, h // t),
            w2.reshape(t, h // t, d), models.stack_copies(b2, t)]


def _inputs(case: _Case) -> tuple[dict, np.ndarray, np.ndarray]:
    """The whole block, the batch x f32[B, D] and an upstream gradient dy f32[B, D]."""
    block = models.init_mlp(jax.random.key(grading.hidden_seed(case.seed)), d_model=case.d_model,
                            d_hidden=case.d_hidden, n_blocks=1)[0]
    kx, ky, kb1, kb2 = jax.random.split(jax.random.key(grading.hidden_seed(case.seed + 1)), 4)
    # init_mlp's biases are zeros, under which b2 counted t times would not show
    block = {**block, "b1": jax.random.normal(kb1, block["b1"].shape),
             "b2": jax.random.normal(kb2, block["b2"].shape)}
    x = np.asarray(jax.random.normal(kx, (case.batch_size, case.d_model)))
    dy = np.asarray(jax.random.normal(ky, (case.batch_size, case.d_model)))
    return block, x, dy


def _export(case: _Case, with_dy: bool) -> grading.Export:
    t, d, h, b = case.devices, case.d_model, case.d_hidden, case.batch_size
    # the backward takes dy in b2's place: b2 enters no gradient of the block
    shapes = [(t, b, d), (t, d, h // t), (t, h // t), (t, h // t, d), (t, d)]
    shapes[-1] = (t, b, d) if with_dy else (t, d)
    return grading.Export(args=[(s, "float32") for s in shapes], n_devices=t, wrap="shard_map",
                          axis=_AXIS)


def _require_one_all_reduce(test: str, program: grading.Program, args: list, nbytes: int,
                            hint: str) -> None:
    """Refuse unless the program runs exactly one collective: an all-reduce of ``nbytes``."""
    ops = program.collective_ops(*args)
    found = [(op.kind, op.bytes) for op in ops]
    if found != [("all-reduce", nbytes)]:
        raise grading.Refused(f"{test}: its program runs {found}; the Megatron block runs one "
                              f"all-reduce of the block's B x D output ({nbytes} B) and nothing "
                              f"else. Hint: {hint}")


def _check_forward(programs) -> None:
    for program, case in zip(programs, _CASES):
        block, x, _ = _inputs(case)
        args = [models.stack_copies(x, case.devices), *_split(block, case.devices)]
        expected = models.stack_copies(np.asarray(models.mlp_block(block, x)), case.devices)
        grading.require_close(
            f"output on {case.name}", program(*args), expected,
            hint="each device's relu(x @ w1_i + b1_i) @ w2_i is a partial sum: g all-reduces it "
                 "(psum), and x and b2 are added once, after the all-reduce.")
        _require_one_all_reduce(f"{case.name}: forward collectives", program, args,
                                4 * x.size, "psum the partial block output once (g).")


def _require_hand_written(test: str, program: grading.Program) -> None:
    """Refuse a program whose operations autodiff derived (or that carries no locations)."""
    text = program.exported.mlir_module()
    if 'loc("' not in text:
        raise grading.Refused(f"{test}: its program carries no source locations, which the "
                              "grader reads to see how the gradients were derived; export it "
                              "as check.answer does.")
    found = sorted({m.group(1) for m in _AUTODIFF_LOCATION.finditer(text)})
    if found:
        raise grading.Refused(
            f"{test}: its program holds operations JAX's autodiff derived ({', '.join(found)} "
            "in their source locations). Hint: write the chain rule yourself, with matmuls, the "
            "relu's mask and one psum; no jax.grad, jax.vjp or jax.jvp.")


def _check_backward(programs) -> None:
    for program, case in zip(programs, _CASES):
        block, x, dy = _inputs(case)
        t = case.devices
        args = [models.stack_copies(x, t), *_split(block, t)[:3], models.stack_copies(dy, t)]
        _, vjp = jax.vjp(models.mlp_block, block, x)
        d_block, dx = vjp(dy)
        expected = dict(zip(_GRAD_NAMES, [models.stack_copies(np.asarray(dx), t),
                                          *_split({k: np.asarray(v) for k, v in d_block.items()},
                                                  t)]))
        grading.require_close(
            f"gradients on {case.name}", dict(zip(_GRAD_NAMES, program(*args))), expected,
            hint="dw1, db1, dw2 are this device's slices and need no collective; db2 is the sum "
                 "of dy over the batch, the same on every device; dx is dy plus the all-reduce "
                 "(f's backward) of each device's partial dx.")
        _require_one_all_reduce(f"{case.name}: backward collectives", program, args,
                                4 * x.size, "all-reduce the partial dx once (f's backward).")
        # last: a submission refused here had the right gradients and collectives
        _require_hand_written(f"{case.name}: written by hand", program)


_MLP_BLOCK = "clusterlab.device.parallel.tensor.mlp_block"   # the library's Megatron block
KEY["lab04.3"] = grading.code(
    _check_forward, name="Megatron MLP forward",
    hint="w1 split by columns, w2 by rows: one psum of the partial output, then add x and b2.",
    exports=[_export(case, with_dy=False) for case in _CASES],
    references=[_MLP_BLOCK])
KEY["lab04.4"] = grading.code(
    _check_backward, name="Megatron MLP backward",
    hint="Write the backward by hand: the chain rule through relu, one psum of dx.",
    exports=[_export(case, with_dy=True) for case in _CASES],
    references=[_MLP_BLOCK])   # jax.vjp of the library's block is the backward asked for


# ---- lab04.6: the block under sequence parallelism (all-gather, reduce-scatter) ---------------

# a source location in the library's parallel code (JAX keeps file names in the exported program)
_LIBRARY_LOCATION = re.compile(r'"[^"]*clusterlab/device/(?:collectives\.py|parallel/)[^"]*"')


class _SequenceCase(NamedTuple):
    """One hidden case of lab04.6: t devices, T tokens of width D, hidden width H."""

    devices: int
    d_model: int
    d_hidden: int
    tokens: int
    seed: int

    @property
    def name(self) -> str:
        return (f"{self.devices} devices, T = {self.tokens} tokens, D = {self.d_model}, "
                f"H = {self.d_hidden}")


# the lab shows 4 devices, T = 32, D = 16, H = 32; none of these
_SEQUENCE_CASES = (_SequenceCase(2, 6, 10, 6, 461), _SequenceCase(4, 8, 12, 12, 462),
                   _SequenceCase(8, 8, 16, 24, 463))


def _sequence_export(case: _SequenceCase) -> grading.Export:
    t, d, h, n = case.devices, case.d_model, case.d_hidden, case.tokens
    shapes = [(n, d), (t, d, h // t), (t, h // t), (t, h // t, d), (t, d)]
    return grading.Export(args=[(s, "float32") for s in shapes], n_devices=t, wrap="shard_map",
                          axis=_AXIS)


def _check_sequence_parallel(programs) -> None:
    for program, case in zip(programs, _SEQUENCE_CASES):
        block, x, _ = _inputs(_Case(case.devices, case.d_model, case.d_hidden, case.tokens,
                                    case.seed))
        args = [x, *_split(block, case.devices)]
        grading.require_close(
            f"output on {case.name}", program(*args), np.asarray(models.mlp_block(block, x)),
            hint="gather all T tokens, run this device's columns and rows on them, and "
                 "reduce-scatter the partial output along the tokens (axis 0); add this "
                 "device's own tokens and b2 once, after it.")
        ops = sorted((op.kind, op.bytes) for op in program.collective_ops(*args))
        expected = [("all-gather", 4 * x.size), ("reduce-scatter", 4 * x.size // case.devices)]
        if ops != expected:
            raise grading.Refused(
                f"{case.name}: its collectives: its program runs {ops}; sequence parallelism "
                f"runs one all-gather of the T x D tokens and one reduce-scatter to this "
                f"device's T/t x D, {expected}, in place of the all-reduce. Hint: "
                "jax.lax.all_gather(..., tiled=True) before w1, jax.lax.psum_scatter(..., "
                "tiled=True) after w2.")
        library = sorted(set(_LIBRARY_LOCATION.findall(program.exported.mlir_module())))
        if library:
            raise grading.Refused(f"{case.name}: written by hand: its program runs code of "
                                  f"{library[0]}. Hint: use jax.lax collectives only.")


KEY["lab04.6"] = grading.code(
    _check_sequence_parallel, name="sequence-parallel MLP block",
    hint="All-gather the tokens before the column-parallel matmul, reduce-scatter the "
         "row-parallel output over the tokens: no all-reduce.",
    exports=[_sequence_export(case) for case in _SEQUENCE_CASES],
    # the block, and the library's sequence-parallel matmuls it would be built from
    references=[_MLP_BLOCK, *(f"clusterlab.device.parallel.tensor.{name}" for name in (
        "all_gather_matmul", "collective_matmul", "matmul_reduce_scatter",
        "collective_matmul_reduce_scatter"))])
