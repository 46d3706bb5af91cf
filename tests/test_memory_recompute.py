"""Activation recomputation, measured: the compiled program of a small transformer's gradient
step under no, selective and full recomputation, against
``memory.transformer_block_activation_bytes`` and the FLOPs recomputation adds.

The model: L blocks of ``models.transformer_block`` in a ``jax.lax.scan``
(``models.transformer_stack_loss``), each under ``jax.checkpoint`` with
``models.recompute_policy``: ``everything_saveable`` ("none"), everything but the tensors shaped
like the attention scores ("selective": the backward pass recomputes the scores and the softmax
from the kept Q and K, Korthikanti et al.'s selective recomputation) and ``nothing_saveable``
("full": only each block's input kept).

What the compiled program's temporaries hold besides the activations (the scan's carries, the
backward pass's working buffers, one block's recomputed values, the loss) does not grow with L,
so temp(L=4) - temp(L=2), halved, is the activations one block keeps; that is what is compared
with the formula, and the absolute temporaries are compared through their differences, within a
margin for those working buffers. Parameters and gradients are arguments and outputs, not
temporaries. Measured with JAX 0.10.2 on XLA:CPU.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from clusterlab.analytic import memory
from clusterlab.course import check
from clusterlab.device import hlo, models

B, S, D, NH, H = 2, 64, 32, 4, 128          # batch, sequence, width, heads, MLP width
LENGTHS = (2, 4)                             # blocks; 1 would let XLA unroll the scan
# FLOP ratios: the formula counts matmuls only; LayerNorm, softmax and ReLU, also recomputed,
# are the rest of cost_analysis' count (1-3% off the matmul ratio at this size).
FLOP_RATIO_RTOL = 0.05


@pytest.fixture(scope="module")
def measured():
    """Footprints per (policy, L) and the gradients at L = 4, from one compile each."""
    x = jax.random.normal(jax.random.key(1), (B, S, D))
    y = jax.random.normal(jax.random.key(2), (B, S, D))
    stacks = {n: models.init_transformer_stack(jax.random.key(0), n_blocks=n, d_model=D,
                                               n_heads=NH, d_hidden=H) for n in LENGTHS}
    footprints, grads, dots = {}, {}, {}
    for recompute in models.RECOMPUTE:
        step = jax.jit(jax.grad(lambda p, a, b, r=recompute: models.transformer_stack_loss(
            p, a, b, recompute=r)))
        for n in LENGTHS:
            compiled = step.lower(stacks[n], x, y).compile()
            footprints[recompute, n] = hlo.footprint(compiled)
            if n == LENGTHS[-1]:
                grads[recompute] = jax.device_get(compiled(stacks[n], x, y))
                dots[recompute] = sorted(ins.shape.split("{")[0]
                                         for ins in hlo.hlo_instructions(compiled.as_text())
                                         if ins.opcode == "dot")
    return footprints, grads, dots


def per_block_temp(footprints, recompute):
    (short, long) = LENGTHS
    return (footprints[recompute, long].temp_bytes
            - footprints[recompute, short].temp_bytes) / (long - short)


def formula(recompute, count="jax"):
    return memory.transformer_block_activation_bytes(S, B, D, NH, H, recompute=recompute,
                                                     count=count)


def block_matmul_flops():
    """Forward matmul FLOPs of one block: Q, K, V, output projection, MLP, and attention's
    two s x s matmuls (the causal mask saves none of them here)."""
    return 2 * B * S * (4 * D * D + 2 * D * H) + 2 * 2 * B * S * S * D


def test_gradients_identical_across_policies(measured):
    _, grads, _ = measured
    for recompute in ("selective", "full"):
        check.verify_close(f"{recompute} recomputation: gradients equal no recomputation's",
                           grads[recompute], grads["none"], rtol=1e-5)


def test_temporaries_ordered_none_selective_full(measured):
    footprints, _, _ = measured
    temps = [footprints[r, LENGTHS[-1]].temp_bytes for r in ("none", "selective", "full")]
    check.verify("temporaries: none > selective > full", temps[0] > temps[1] > temps[2],
                 detail=str(temps))


@pytest.mark.parametrize("recompute", models.RECOMPUTE)
def test_per_block_temporaries_equal_formula(measured, recompute):
    footprints, _, _ = measured
    check.verify_close(f"{recompute}: activation bytes per block = the formula (JAX's count)",
                       per_block_temp(footprints, recompute), formula(recompute), rtol=1e-3)


@pytest.mark.parametrize("lower, upper", [("selective", "none"), ("full", "none"),
                                          ("full", "selective")])
def test_differences_of_absolute_temporaries(measured, lower, upper):
    # The absolute temporaries differ by L x the formula's difference, give or take the
    # backward loop's working set, which differs between policies by less than one block's
    # activations: under "full" its body recomputes one block's values that the others read
    # from their saved stack (105 kB more than "none" here, 0.2 block).
    footprints, _, _ = measured
    n = LENGTHS[-1]
    measured_diff = footprints[upper, n].temp_bytes - footprints[lower, n].temp_bytes
    formula_diff = n * (formula(upper) - formula(lower))
    check.verify(f"temp({upper}) - temp({lower}) = L x the formula's difference, within one "
                 f"block's activations", abs(measured_diff - formula_diff) < formula("none"),
                 detail=f"{measured_diff:,} B measured, {formula_diff:,.0f} B formula")


def test_minimal_count_is_below_what_jax_keeps():
    # JAX keeps the softmax's exponentials beside its output and more of each LayerNorm
    for recompute in ("none", "selective"):
        assert formula(recompute, "minimal") < formula(recompute, "jax")
    assert formula("full", "minimal") == formula("full", "jax") == 4 * B * S * D
    assert formula("none", "minimal") - formula("selective", "minimal") == 4 * NH * S * S * B


def test_minimal_count_becomes_korthikanti_with_their_assumptions():
    # 16-bit values, GeLU (its input kept too: + 2 sbH), dropout (1-byte masks: 2 sbh after
    # attention and MLP, as^2 b after the softmax, and the dropped-out softmax, 2 as^2 b)
    s, b, h, a = 2048, 1, 12288, 96
    ours = memory.transformer_block_activation_bytes(s, b, h, a, 4 * h, bytes_per_element=2)
    gelu_input, masks = 2 * s * b * 4 * h, 2 * s * b * h + 3 * a * s * s * b
    assert ours + gelu_input + masks == memory.transformer_layer_activation_bytes(s, b, h, a)
    ours_sel = memory.transformer_block_activation_bytes(s, b, h, a, 4 * h, bytes_per_element=2,
                                                         recompute="selective")
    assert ours_sel + gelu_input + 2 * s * b * h == memory.transformer_layer_activation_bytes(
        s, b, h, a, recompute="selective")


def test_flops_full_and_selective_against_formula(measured):
    footprints, _, _ = measured
    n = LENGTHS[-1]
    # XLA counts a loop body once: these FLOPs are one block's forward and backward (+ loss)
    forward = block_matmul_flops()
    w2 = 2 * B * S * H * D            # the MLP's last matmul: its output is not needed backward
    scores = 2 * B * S * S * D        # Q K^T, recomputed under "selective"
    expected = {"full": (3 * forward + forward - w2) / (3 * forward),
                "selective": (3 * forward + scores) / (3 * forward)}
    for recompute, ratio in expected.items():
        check.verify_close(f"{recompute}/none FLOPs = the matmul formula's {ratio:.4f}",
                           footprints[recompute, n].flops / footprints["none", n].flops, ratio,
                           rtol=FLOP_RATIO_RTOL)
    assert np.isclose(expected["full"], 1.25)   # (4F - F/4) / 3F at H = 4D, S = 2D


def test_negative_control_saving_everything_reported_as_full(measured):
    footprints, _, _ = measured
    check.verify_catches("a save-everything policy reported as full recomputation",
                         lambda: check.verify_close(
                             "full: activation bytes per block = the formula (JAX's count)",
                             per_block_temp(footprints, "none"), formula("full"), rtol=1e-3))


def test_selective_policy_rejects_unknown_level():
    with pytest.raises(ValueError, match="recompute must be one of"):
        models.recompute_policy("some", seq_len=S)
    with pytest.raises(ValueError, match="count must be one of"):
        memory.transformer_block_activation_bytes(S, B, D, NH, H, count="xla")
    with pytest.raises(TypeError, match="jax.jit"):
        hlo.compiled_footprint(lambda v: v, 1.0)


def test_recomputed_matmuls_counted_in_the_compiled_program(measured):
    # Exact where cost_analysis is not (it adds element-wise work, fused differently per
    # program): the dot instructions each policy adds to no recomputation's program, in the
    # scan's loop bodies (one block). Selective: Q K^T only, f32[B, NH, S, S]. Full: the
    # block's forward matmuls but the MLP's last (7 of 8: Q, K, V, Q K^T, weights V, output
    # projection, first MLP matmul).
    _, _, dots = measured

    def added(recompute):
        extra = list(dots[recompute])
        for shape in dots["none"]:
            extra.remove(shape)   # raises if a policy dropped one of the baseline's matmuls
        return extra

    check.verify_equal("selective adds one matmul, Q K^T", added("selective"),
                       [f"f32[{B},{NH},{S},{S}]"])
    check.verify_equal("full adds 7 matmuls, the forward pass but the MLP's last",
                       len(added("full")), 7)
    assert f"f32[{B},{NH},{S},{S}]" in added("full")
