"""Context parallelism's backward traffic (clusterlab.device.parallel.context): the ring's and
Ulysses' backward collectives against the compiled gradient programs, the memory-saving ring's
bytes against its definition, and the backward overlap condition against compute = transfer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from clusterlab.device import hlo
from clusterlab.device.parallel import context
from conftest import sub_mesh

AXIS = "seq"
B, S, H, DH = 2, 32, 4, 8          # q, k, v: f32[B, S, H, Dh]
F32 = 4


def _qkv():
    keys = jax.random.split(jax.random.key(1), 3)
    return [jax.random.normal(key, (B, S, H, DH), jnp.float32) for key in keys]


def _gradient_collectives(attention, q, k, v) -> list[tuple[str, int]]:
    def loss(q, k, v):
        out = attention(q, k, v)
        return jnp.sum((out[0] if isinstance(out, tuple) else out) ** 2)
    ops = hlo.compiled_collectives(jax.jit(jax.grad(loss, argnums=(0, 1, 2))), q, k, v)
    return sorted((op.kind, op.bytes) for op in ops)


@pytest.mark.parametrize("p", [2, 4])
def test_ring_differentiated_as_written_matches_the_compiled_gradient(p):
    ring = context.make_ring_attention(sub_mesh(p, AXIS), AXIS, causal=True)
    forward = context.ring_attention_traffic(B, S, H, DH, p, bytes_per_element=F32)
    backward = context.ring_attention_backward_traffic(
        B, S, H, DH, p, bytes_per_element=F32, grad_bytes_per_element=F32, keeps_blocks=True)
    expected = sorted((kind, b) for t in (forward, backward) for kind, b in
                      zip([t.kind] * t.n_ops, t.result_bytes))
    assert _gradient_collectives(ring, *_qkv()) == expected


@pytest.mark.parametrize("p", [2, 4])
def test_ulysses_backward_matches_the_compiled_gradient(p):
    ulysses = context.make_ulysses_attention(sub_mesh(p, AXIS), AXIS, causal=True)
    forward = context.ulysses_traffic(B, S, H, DH, p, bytes_per_element=F32)
    backward = context.ulysses_backward_traffic(B, S, H, DH, p, grad_bytes_per_element=F32)
    assert backward.result_bytes == forward.result_bytes[::-1]
    expected = sorted(("all-to-all", b) for b in forward.result_bytes + backward.result_bytes)
    assert _gradient_collectives(ulysses, *_qkv()) == expected


@pytest.mark.parametrize("p", [2, 8, 16])
def test_memory_saving_ring_sends_the_blocks_again_and_their_gradients(p):
    forward = context.ring_attention_traffic(1, 1024, 8, 128, p, bytes_per_element=2)
    block_values = 2 * (1024 // p) * 8 * 128
    for grad_bytes, ratio in ((2, 2 + 1 / (p - 1)), (4, 3 + 2 / (p - 1))):
        backward = context.ring_attention_backward_traffic(
            1, 1024, 8, 128, p, bytes_per_element=2, grad_bytes_per_element=grad_bytes)
        assert backward.n_ops == 2 * p - 1
        assert backward.total_bytes == block_values * ((p - 1) * 2 + p * grad_bytes)
        assert backward.sent_bytes_per_device / forward.sent_bytes_per_device == \
            pytest.approx(ratio)


def test_backward_overlap_condition():
    flops_per_s, link, heads, kv_heads, head_dim = 989e12, 450e9, 128, 8, 128
    forward = context.ring_overlap_min_block_tokens(flops_per_s, link, n_heads=heads,
                                                    n_kv_heads=kv_heads)
    for grad_bytes, ratio in ((2, 0.8), (4, 1.2)):
        tokens = context.ring_backward_overlap_min_block_tokens(
            flops_per_s, link, n_heads=heads, n_kv_heads=kv_heads,
            grad_bytes_per_element=grad_bytes)
        assert tokens / forward == pytest.approx(ratio)
        # at the bound, 2.5 times the forward step's FLOPs take as long as both transfers
        compute_s = 2.5 * 4 * tokens**2 * heads * head_dim / flops_per_s
        transfer_s = 2 * tokens * kv_heads * head_dim * (2 + grad_bytes) / link
        assert compute_s == pytest.approx(transfer_s)
    with pytest.raises(ValueError, match="backward_flops_ratio"):
        context.ring_backward_overlap_min_block_tokens(1e15, 5e11, n_heads=8,
                                                       backward_flops_ratio=0)
    with pytest.raises(ValueError, match="grad_bytes_per_element must be positive"):
        context.ring_attention_backward_traffic(1, 64, 4, 8, 4, grad_bytes_per_element=0)
