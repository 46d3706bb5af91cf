"""Context parallelism (clusterlab.device.parallel.context): ring attention (contiguous and zig-zag) and
Ulysses against one device's attention, forward and gradients; the causal work per device
counted by the implementation against the formula; the collectives of the compiled programs
against the formulas; per-device memory from the compiled program against 1/p; input checks;
and negative controls (a block skipped, the rescale left out) caught by the same check."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clusterlab.course import check
from clusterlab.device import hlo
from clusterlab.device.parallel import context
from conftest import sub_mesh

AXIS = "seq"
B, S, H, DH = 2, 32, 4, 8          # q, k, v: f32[B, S, H, Dh]


@pytest.fixture(scope="module")
def qkv():
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v, dy = (jax.random.normal(key, (B, S, H, DH), jnp.float32) for key in keys)
    return q, k, v, dy


def _ring_output(q, k, v, p, *, causal, placement, update=context.online_softmax_update):
    """Ring attention on p devices, its output back in sequence order, and its block counts."""
    ring = context.make_ring_attention(sub_mesh(p, AXIS), AXIS, causal=causal,
                                       placement=placement, update=update)
    with check.fp32_matmuls():
        out, blocks = ring(*(context.to_placement(x, p, placement) for x in (q, k, v)))
    return context.from_placement(out, p, placement), np.asarray(blocks)


def _reference(q, k, v, causal):
    with check.fp32_matmuls():
        return context.reference_attention(q, k, v, causal=causal)


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("placement", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_forward_equals_one_device_and_counts_its_blocks(qkv, p, placement, causal):
    q, k, v, _ = qkv
    out, blocks = _ring_output(q, k, v, p, causal=causal, placement=placement)
    check.verify_close(f"ring attention, {p} devices, {placement}, causal={causal}", out,
                       _reference(q, k, v, causal), rtol=check.fp32_rtol())
    # the blocks the implementation computed (it skips the fully masked ones) = the formula
    expected = context.causal_blocks_per_device(p, placement, causal=causal)
    np.testing.assert_array_equal(blocks, expected)


def test_work_formulas():
    for p in (1, 2, 3, 4, 8, 16):
        contiguous = context.causal_blocks_per_device(p, "contiguous")
        assert contiguous == list(range(1, p + 1))
        assert sum(contiguous) == p * (p + 1) // 2           # blocks of (S/p)^2
        zigzag = context.causal_blocks_per_device(p, "zigzag")
        assert zigzag == [2 * p + 1] * p                     # blocks of (S/2p)^2, all equal
        assert context.causal_blocks_per_device(p, "zigzag", causal=False) == [4 * p] * p
        # in scores: the zig-zag's busiest device does (2p+1)/4 of a contiguous block's
        # (S/p)^2 scores, against p for the contiguous placement's last device
        elems_c = context.score_elements_per_device(64 * p, p, "contiguous")
        elems_z = context.score_elements_per_device(64 * p, p, "zigzag")
        assert max(elems_c) == p * 64 ** 2
        assert max(elems_z) * 4 == (2 * p + 1) * 64 ** 2
        # the zig-zag's blocks are the 2p chunks' pairs (query a, key b <= a), each once
        assert sum(zigzag) == 2 * p * (2 * p + 1) // 2
    with pytest.raises(ValueError, match="at least one device"):
        context.causal_blocks_per_device(0, "contiguous")


@pytest.mark.parametrize("p, placement, causal",
                         [(2, "contiguous", True), (2, "zigzag", False), (4, "contiguous", False),
                          (4, "zigzag", True)])
def test_ring_gradients_equal_one_device(qkv, p, placement, causal):
    q, k, v, dy = qkv
    ring = context.make_ring_attention(sub_mesh(p, AXIS), AXIS, causal=causal,
                                       placement=placement)
    dy_placed = context.to_placement(dy, p, placement)

    def loss(q, k, v):                      # inputs in the placement's order
        return jnp.sum(ring(q, k, v)[0] * dy_placed)

    def reference_loss(q, k, v):
        return jnp.sum(context.reference_attention(q, k, v, causal=causal) * dy)

    with check.fp32_matmuls():
        grads = jax.grad(loss, argnums=(0, 1, 2))(
            *(context.to_placement(x, p, placement) for x in (q, k, v)))
        expected = jax.grad(reference_loss, argnums=(0, 1, 2))(q, k, v)
    grads = [context.from_placement(g, p, placement) for g in grads]
    check.verify_close(f"ring gradients, {p} devices, {placement}, causal={causal}", grads,
                       expected, rtol=check.fp32_rtol())
    # backward: the transposed ring, p-1 more permutes of dk and dv stacked
    ops = hlo.summarize(hlo.compiled_collectives(jax.jit(jax.grad(loss, argnums=(0, 1, 2))),
                                                 q, k, v))
    traffic = context.ring_attention_traffic(B, S, H, DH, p)
    assert ops == {"collective-permute": (2 * traffic.n_ops, 2 * traffic.total_bytes)}


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_ulysses_equals_one_device(qkv, p, causal):
    q, k, v, dy = qkv
    ulysses = context.make_ulysses_attention(sub_mesh(p, AXIS), AXIS, causal=causal)
    with check.fp32_matmuls():
        check.verify_close(f"Ulysses, {p} devices, causal={causal}", ulysses(q, k, v),
                           _reference(q, k, v, causal), rtol=check.fp32_rtol())
        grads = jax.grad(lambda *a: jnp.sum(ulysses(*a) * dy), argnums=(0, 1, 2))(q, k, v)
        expected = jax.grad(lambda *a: jnp.sum(context.reference_attention(*a, causal=causal)
                                               * dy), argnums=(0, 1, 2))(q, k, v)
    check.verify_close(f"Ulysses gradients, {p} devices", grads, expected,
                       rtol=check.fp32_rtol())


@pytest.mark.parametrize("p", [2, 4, 8])
def test_ring_collectives_equal_formula(qkv, p):
    q, k, v, _ = qkv
    ring = context.make_ring_attention(sub_mesh(p, AXIS), AXIS, causal=True)
    ops = hlo.compiled_collectives(ring, q, k, v)
    traffic = context.ring_attention_traffic(B, S, H, DH, p)
    assert [(op.kind, op.bytes) for op in ops] == [(traffic.kind, b)
                                                   for b in traffic.result_bytes]
    assert traffic.total_bytes == (p - 1) * 2 * B * (S // p) * H * DH * 4


@pytest.mark.parametrize("p", [2, 4])
def test_ulysses_collectives_equal_formula(qkv, p):
    q, k, v, _ = qkv
    ulysses = context.make_ulysses_attention(sub_mesh(p, AXIS), AXIS, causal=True)
    ops = hlo.compiled_collectives(ulysses, q, k, v)
    traffic = context.ulysses_traffic(B, S, H, DH, p)
    assert [(op.kind, op.bytes) for op in ops] == [("all-to-all", b)
                                                   for b in traffic.result_bytes]
    block = B * (S // p) * H * DH * 4
    assert traffic.result_bytes == (3 * block, block)
    assert traffic.sent_bytes_per_device == pytest.approx(4 * block * (p - 1) / p)
    # the ring sends p/2 times Ulysses' bytes per device
    ring = context.ring_attention_traffic(B, S, H, DH, p)
    assert ring.sent_bytes_per_device / traffic.sent_bytes_per_device == pytest.approx(p / 2)


def test_memory_per_device_falls_as_one_over_p():
    # a longer sequence, so that the score blocks dominate the temporaries
    b, s, h, dh = 1, 256, 2, 16
    q = jnp.zeros((b, s, h, dh), jnp.float32)
    sizes = {}
    for p in (1, 2, 4, 8):
        ring = context.make_ring_attention(sub_mesh(p, AXIS), AXIS, causal=True)
        memory = ring.lower(q, q, q).compile().memory_analysis()
        sizes[p] = memory
        # arguments: this device's q, k, v; outputs: its output and its block count
        assert memory.argument_size_in_bytes == 3 * b * (s // p) * h * dh * 4
        assert memory.output_size_in_bytes >= b * (s // p) * h * dh * 4
    for p in (2, 4, 8):
        total_p = (sizes[p].temp_size_in_bytes + sizes[p].argument_size_in_bytes
                   + sizes[p].output_size_in_bytes)
        total_1 = (sizes[1].temp_size_in_bytes + sizes[1].argument_size_in_bytes
                   + sizes[1].output_size_in_bytes)
        # at least as fast as 1/p (score blocks fall as 1/p^2); 25% for XLA's small buffers
        assert total_p <= 1.25 * total_1 / p, (p, total_p, total_1)
        # temporaries hold at least one (S/p)^2 score block per head
        assert sizes[p].temp_size_in_bytes >= b * h * (s // p) ** 2 * 4


def _skip_call(n):
    """An update that leaves out the n-th block it is given (a negative control)."""
    calls = itertools.count()

    def update(acc, scores, mask, v):
        if next(calls) == n:
            return acc
        return context.online_softmax_update(acc, scores, mask, v)

    return update


def _no_rescale(acc, scores, mask, v):
    """The online softmax without rescaling the old sum and output by exp(m - m')."""
    scores = jnp.where(mask, scores, -1e30)
    new_max = jnp.maximum(acc.max, scores.max(axis=-1))
    weights = jnp.where(mask, jnp.exp(scores - new_max[..., None]), 0.0)
    return context.Accumulator(new_max, acc.sum + weights.sum(axis=-1),
                               acc.out + jnp.einsum("bhst,bthe->bshe", weights, v))


@pytest.mark.parametrize("bug, update", [("a block skipped", _skip_call(1)),
                                         ("the rescale left out", _no_rescale)])
def test_negative_controls_are_caught(qkv, bug, update):
    q, k, v, _ = qkv
    out, _ = _ring_output(q, k, v, 4, causal=False, placement="contiguous", update=update)
    caught = check.verify_catches(bug, lambda: check.verify_close(
        "ring attention, 4 devices", out, _reference(q, k, v, False), rtol=check.fp32_rtol()))
    assert "max relative difference" in str(caught)


def test_input_errors(qkv):
    q, k, v, _ = qkv
    with pytest.raises(ValueError, match="multiple of 16"):   # zig-zag on 8: 2p = 16 chunks
        context.make_ring_attention(sub_mesh(8, AXIS), AXIS, causal=True,
                                    placement="zigzag")(q[:, :24], k[:, :24], v[:, :24])
    with pytest.raises(ValueError, match="do not split 8 ways"):
        context.make_ulysses_attention(sub_mesh(8, AXIS), AXIS, causal=True)(q, k, v)
    with pytest.raises(ValueError, match="placement must be one of"):
        context.make_ring_attention(sub_mesh(2, AXIS), AXIS, causal=True, placement="striped")
    with pytest.raises(ValueError, match="one shape"):
        context.make_ring_attention(sub_mesh(2, AXIS), AXIS, causal=True)(q, k[:, :16], v)


def test_placement_round_trip(qkv):
    q = qkv[0]
    order = context.token_order(16, 4, "zigzag")
    assert order.reshape(4, 4).tolist() == [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11],
                                            [6, 7, 8, 9]]
    np.testing.assert_array_equal(context.from_placement(context.to_placement(q, 4, "zigzag"),
                                                         4, "zigzag"), q)


def test_ring_overlap_condition():
    # multi-head attention in bf16: S/p >= F / W, FLOPs over bytes per second
    assert context.ring_overlap_min_block_tokens(1e15, 5e11, n_heads=32) == pytest.approx(2000)
    # grouped-query attention sends fewer keys and values: 8 of 128 heads, 16 times fewer tokens
    assert context.ring_overlap_min_block_tokens(1e15, 5e11, n_heads=128, n_kv_heads=8) == \
        pytest.approx(125)
    # the condition from its definition: compute of one step = transfer of one step
    tokens = context.ring_overlap_min_block_tokens(989e12, 450e9, n_heads=16, n_kv_heads=4,
                                                   causal_fraction=0.5)
    compute_s = 0.5 * 4 * tokens ** 2 * 16 * 128 / 989e12
    transfer_s = 2 * tokens * 4 * 128 * 2 / 450e9
    assert compute_s == pytest.approx(transfer_s)
    with pytest.raises(ValueError, match="share of a block"):
        context.ring_overlap_min_block_tokens(1e15, 5e11, n_heads=8, causal_fraction=0)


def test_a_placement_mismatch_is_caught(qkv):
    # zig-zag tokens handed to a ring that masks as if they were contiguous
    q, k, v, _ = qkv
    ring = context.make_ring_attention(sub_mesh(4, AXIS), AXIS, causal=True)
    with check.fp32_matmuls():
        out, _ = ring(*(context.to_placement(x, 4, "zigzag") for x in (q, k, v)))
    check.verify_catches("zig-zag tokens, contiguous ring", lambda: check.verify_close(
        "causal ring attention", context.from_placement(out, 4, "zigzag"),
        _reference(q, k, v, True), rtol=check.fp32_rtol()))
