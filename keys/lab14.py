"""Answer key of lab 14, long sequences and context parallelism (instructor-only: student copies
leave keys/ out).

lab14.1: with a causal mask on p = 16 devices, how many times the work (scores computed) of the
busiest device under the contiguous placement is that of the busiest device under zig-zag:
p (S/p)^2 against (2p+1) (S/2p)^2, i.e. 4p / (2p+1) = 64/33.
lab14.2: bytes each GPU sends in one forward pass of one attention layer with ring attention, for
one sequence of 131,072 tokens on 16 GPUs with 8 key-value heads of 128 in bf16 (a Llama 3
405B-like layer, Dubey et al. 2024): (p-1) blocks of 2 B (S/p) H_kv Dh values, modelled.
lab14.3: the per-device memory (temporaries + arguments + outputs) of the lab's ring-attention
program on 8 devices, as a fraction of one device's: read from the compiled programs the lab
built (a recipe of the lab's namespace).
lab14.4 is the ring-attention backward assignment: the student's ``ring_attention_backward(q, k,
v, out, lse, d_out, axis_name)`` runs inside ``shard_map`` on one sequence split over p devices
(device i holds tokens i S/p .. (i+1) S/p - 1): q, k, v, out, d_out f32[S/p, H, Dh], lse
f32[S/p, H] (the log-sum-exp of the causal, 1/sqrt(Dh)-scaled scores); it returns dq, dk, dv of
its own tokens, recomputing each score block and passing keys/values and their gradients around
the ring (the lab's ``with_backward`` makes it the ``jax.custom_vjp`` of the given forward). The
hidden tests, on device counts and shapes the lab never shows:

1. gradients on 3, 6 and 8 devices against the gradients of full causal attention (float64
   NumPy; checked against ``jax.grad`` of ``context.reference_attention`` in
   tests/test_assignments_lab14.py), inputs drawn fresh each grading run; keys and values not
   passed on (local blocks only), or the gradients of keys and values left one device short of
   home, fail here;
2. the collectives of its compiled program: collective-permutes only, keys and values p - 1
   hops and their gradients p hops, (4p - 2) S/p H Dh x 4 bytes per device in all;
3. its compiled program's temporary memory (``memory_analysis().temp_size_in_bytes``, inputs
   split over the ring) at S = 256, 512, 1024 on 8 devices and at S = 1024 on 2 and 4: at most
   ``_SCORE_BLOCKS`` score blocks of (S/p)^2 per head plus ``_TOKEN_BLOCKS`` blocks of this
   device's tokens (S/p H Dh), and falling as p grows. Autodiff through the forward (``jax.vjp``
   of it inside the backward) keeps every step's scores, p blocks of them, and fails here.
"""

from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from clusterlab.course import grading
from clusterlab.device.parallel import context

_AXIS = "ring"
# the budget of the memory test, in score blocks of (S/p)^2 per head and in blocks of this
# device's tokens (S/p H Dh): a backward that recomputes holds a few of each at a time; one that
# keeps every ring step's scores holds p score blocks
_SCORE_BLOCKS, _TOKEN_BLOCKS = 5, 24


def _busiest_ratio(p: int = 16) -> float:
    seq = 2 * p * 64                       # any multiple of 2p; the ratio does not depend on it
    return (max(context.score_elements_per_device(seq, p, "contiguous"))
            / max(context.score_elements_per_device(seq, p, "zigzag")))


def _memory_fraction(ns):
    sizes = ns["memory_by_p"]
    return sizes[8] / sizes[1]


class _Case(NamedTuple):
    """One hidden case: one sequence of seq_len tokens, n_heads of head_dim, on p devices."""

    p: int
    seq_len: int
    n_heads: int
    head_dim: int
    seed: int

    @property
    def name(self) -> str:
        return f"S = {self.seq_len}, {self.n_heads} head(s) of {self.head_dim} on {self.p} devices"

    @property
    def block(self) -> int:
        """Values in one device's block of q, k or v: S/p H Dh."""
        return self.seq_len // self.p * self.n_heads * self.head_dim

    def args(self) -> list[tuple[tuple[int, ...], str]]:
        tokens = ((self.seq_len, self.n_heads, self.head_dim), "float32")
        return [tokens] * 4 + [((self.seq_len, self.n_heads), "float32"), tokens]

    def export(self) -> grading.Export:
        return grading.Export(args=self.args(), n_devices=self.p, wrap="shard_map", axis=_AXIS)


# the lab shows S = 64 with 2 heads of 8 on 4 devices; these are other device counts and shapes
_GRADIENT_CASES = (_Case(3, 12, 3, 5, 1401), _Case(6, 24, 2, 4, 1402), _Case(8, 40, 1, 8, 1403))
# the memory sweep the review asked for: S = 256, 512, 1024 on 8 devices, and 2, 4, 8 at 1024
_MEMORY_CASES = tuple(_Case(p, s, 2, 16, 0) for p, s in
                      ((8, 256), (8, 512), (8, 1024), (2, 1024), (4, 1024)))


def reference_gradients(q, k, v, d_out):
    """Causal attention of one sequence in float64: (out, lse, dq, dk, dv) for cotangent d_out.

    q, k, v, d_out: [S, H, Dh]; lse [S, H] is the log-sum-exp of the scaled, masked scores.
    """
    q, k, v, d_out = (np.asarray(x, np.float64) for x in (q, k, v, d_out))
    seq, scale = q.shape[0], 1 / np.sqrt(q.shape[-1])
    scores = np.where(np.tril(np.ones((seq, seq), bool)),
                      np.einsum("qhe,khe->hqk", q, k) * scale, -np.inf)   # [H, S, S]
    top = scores.max(axis=-1, keepdims=True)
    lse = top + np.log(np.exp(scores - top).sum(axis=-1, keepdims=True))  # [H, S, 1]
    prob = np.exp(scores - lse)
    out = np.einsum("hqk,khe->qhe", prob, v)
    delta = np.einsum("qhe,qhe->hq", d_out, out)[..., None]
    d_scores = prob * (np.einsum("qhe,khe->hqk", d_out, v) - delta) * scale
    return (out, np.transpose(lse[..., 0]), np.einsum("hqk,khe->qhe", d_scores, k),
            np.einsum("hqk,qhe->khe", d_scores, q), np.einsum("hqk,qhe->khe", prob, d_out))


def _check_gradients(program: grading.Program, case: _Case) -> None:
    rng = np.random.default_rng(grading.hidden_seed(case.seed))
    q, k, v, d_out = (rng.standard_normal(case.args()[0][0]) for _ in range(4))
    out, lse, *gradients = reference_gradients(q, k, v, d_out)
    inputs = [x.astype(np.float32) for x in (q, k, v, out, lse, d_out)]
    grading.require_close(
        f"gradients {case.name}: dq, dk, dv against full causal attention's",
        tuple(program(*inputs)), tuple(gradients), rtol=1e-4,
        hint="every device needs every key/value block (p - 1 ppermutes), and each block's "
             "dk, dv must end on the device that holds that block: they travel with it, one "
             "hop more than the keys.")


def _check_ring_traffic(program: grading.Program, case: _Case) -> None:
    rng = np.random.default_rng(grading.hidden_seed(case.seed))
    ops = program.collective_ops(*(rng.standard_normal(shape).astype(np.float32)
                                   for shape, _ in case.args()))
    kinds, sent = sorted({op.kind for op in ops}), sum(op.bytes for op in ops)
    expected = (4 * case.p - 2) * case.block * 4
    if kinds != ["collective-permute"] or sent != expected:
        raise grading.Refused(
            f"the collectives {case.name}: its program runs {', '.join(kinds) or 'none'}, "
            f"{sent} B per device; the ring sends k and v p - 1 hops and dk and dv p hops, "
            f"(4p - 2) S/p H Dh x 4 B = {expected} B, with ppermute only. Hint: send nothing "
            "twice and no whole-sequence collective.")


def temp_bytes(program: grading.Program, case: _Case) -> int:
    """The temporaries of ``program`` compiled with its inputs split over the ring, per device
    (XLA's ``memory_analysis``, JAX 0.10.2)."""
    mesh = Mesh(np.array(jax.devices()[:case.p]), (_AXIS,))
    split = NamedSharding(mesh, P(_AXIS))
    shapes = [jax.ShapeDtypeStruct(shape, np.dtype(dtype)) for shape, dtype in case.args()]
    compiled = jax.jit(program.exported.call, in_shardings=split, out_shardings=split).lower(
        *shapes).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)


def memory_budget(case: _Case) -> int:
    """The most temporary bytes a recomputing backward may hold per device: ``_SCORE_BLOCKS``
    score blocks of (S/p)^2 per head and ``_TOKEN_BLOCKS`` blocks of S/p H Dh, float32."""
    side = case.seq_len // case.p
    return 4 * (_SCORE_BLOCKS * case.n_heads * side * side + _TOKEN_BLOCKS * case.block)


def _check_memory(programs: list[grading.Program]) -> None:
    measured = {}
    for program, case in zip(programs, _MEMORY_CASES):
        measured[case.p, case.seq_len] = temp_bytes(program, case)
        if measured[case.p, case.seq_len] > memory_budget(case):
            raise grading.Refused(
                f"the temporary memory {case.name}: {measured[case.p, case.seq_len]} B per "
                f"device, over the {memory_budget(case)} B of {_SCORE_BLOCKS} score blocks of "
                "(S/p)^2 per head and a few blocks of this device's tokens. Hint: recompute "
                "each step's probabilities from lse and drop them before the next step; "
                "differentiating the forward keeps all p steps' scores.")
    by_p = [measured[p, 1024] for p in (2, 4, 8)]
    if not by_p[0] > by_p[1] > by_p[2]:
        raise grading.Refused(
            f"the temporary memory at S = 1024 on 2, 4, 8 devices: {by_p} B per device does "
            "not fall as the ring grows. Hint: hold one block of scores at a time, never the "
            "whole sequence's.")


def _check_ring_backward(programs) -> None:
    gradient_programs = programs[:len(_GRADIENT_CASES)]
    for program, case in zip(gradient_programs, _GRADIENT_CASES):
        _check_gradients(program, case)
    _check_memory(programs[len(_GRADIENT_CASES):])
    for program, case in zip(gradient_programs, _GRADIENT_CASES):
        _check_ring_traffic(program, case)


KEY = {
    "lab14.1": grading.close(_busiest_ratio(), name="contiguous over zig-zag, busiest device",
                             hint="Count score blocks per device for each placement "
                                  "(context.causal_blocks_per_device) and mind that a zig-zag "
                                  "block is a quarter of a contiguous one.", rtol=1e-6),
    "lab14.2": grading.close(context.ring_attention_traffic(
        1, 131072, 8, 128, 16, bytes_per_element=2).sent_bytes_per_device,
        name="ring bytes sent per GPU", hint="p-1 ring steps, each sending this GPU's keys and "
                                             "values (2 x tokens/p x KV heads x head size x 2 "
                                             "bytes).", rtol=1e-6),
    "lab14.3": grading.close(_memory_fraction, name="memory on 8 devices over one device's",
                             hint="Add temp_size_in_bytes, argument_size_in_bytes and "
                                  "output_size_in_bytes of each compiled program.", rtol=1e-6),
    "lab14.4": grading.code(
        _check_ring_backward, name="ring attention's backward",
        hint="At ring step s you hold block i - s: rebuild its probabilities as exp(scores - "
             "lse) under the causal mask, add its share to dq, dk and dv, then pass k, v and "
             "their gradients on.",
        exports=[case.export() for case in _GRADIENT_CASES + _MEMORY_CASES],
        # jax.vjp of the library's ring is the shortcut the exercise forbids
        references=["clusterlab.device.parallel.context.ring_attention"]),
}
