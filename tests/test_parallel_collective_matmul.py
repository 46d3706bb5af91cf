"""The collective matmul (Wang et al. 2023): the all-gather before a column-parallel matmul, and
the reduce-scatter after a row-parallel one, split into p-1 ring steps interleaved with partial
matmuls. Checked against the plain collective-then-matmul, forward and gradients, on 2, 4 and 8
devices; its collectives counted in the compiled program; its schedule read from it; and a
misplaced block caught."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from clusterlab.course import check
from clusterlab.device import devices, hlo
from clusterlab.device.parallel import tensor
from conftest import sub_mesh

AXIS = "model"
T, D, H = 32, 16, 64  # tokens, width, hidden width: divisible by 8 devices


def _inputs(p: int):
    mesh = sub_mesh(p, AXIS)
    keys = jax.random.split(jax.random.key(p), 4)
    x = jax.random.normal(keys[0], (T, D), jnp.float32)   # f32[T, D], split by tokens
    w1 = jax.random.normal(keys[1], (D, H), jnp.float32)  # f32[D, H], split by columns
    h = jax.random.normal(keys[2], (T, H), jnp.float32)   # f32[T, H], split by columns
    w2 = jax.random.normal(keys[3], (H, D), jnp.float32)  # f32[H, D], split by rows
    return mesh, {
        "column": (devices.shard(x, mesh, P(AXIS)), devices.shard(w1, mesh, P(None, AXIS))),
        "row": (devices.shard(h, mesh, P(None, AXIS)), devices.shard(w2, mesh, P(AXIS)))}


_MAKE = {"column": tensor.make_column_matmul, "row": tensor.make_row_matmul}
_PLAIN_COLLECTIVE = {"column": "all-gather", "row": "reduce-scatter"}


def _loss_and_grads(matmul):
    # a loss that weighs every output element differently, so a misplaced block changes it
    def loss(a, b):
        y = matmul(a, b)
        return jnp.sum(y * jnp.sin(jnp.arange(y.size, dtype=y.dtype).reshape(y.shape)))
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


@pytest.mark.parametrize("kind", ["column", "row"])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_equals_plain_forward_and_gradients(p, kind):
    mesh, inputs = _inputs(p)
    a, b = inputs[kind]
    with check.fp32_matmuls():
        plain = _MAKE[kind](mesh, AXIS, overlap=False)
        overlapped = _MAKE[kind](mesh, AXIS, overlap=True)
        check.verify_close(f"{kind} collective matmul on {p} devices: output", overlapped(a, b),
                           plain(a, b), rtol=check.fp32_rtol())
        # and both against the one-device product, so the plain one is not wrong alike
        check.verify_close(f"plain {kind} matmul on {p} devices vs one device", plain(a, b),
                           np.asarray(a) @ np.asarray(b), rtol=check.fp32_rtol())
        loss, grads = _loss_and_grads(overlapped)(a, b)
        loss_plain, grads_plain = _loss_and_grads(plain)(a, b)
        check.verify_close(f"{kind} on {p} devices: loss", loss, loss_plain, rtol=check.fp32_rtol())
        check.verify_close(f"{kind} on {p} devices: gradients", jax.device_get(grads),
                           jax.device_get(grads_plain), rtol=check.fp32_rtol())


@pytest.mark.parametrize("kind", ["column", "row"])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_off_by_one_rotation_is_caught(p, kind):
    """Negative control: each partial product written (or each share taken) one block off."""
    mesh, inputs = _inputs(p)
    a, b = inputs[kind]
    with check.fp32_matmuls():
        plain = _MAKE[kind](mesh, AXIS, overlap=False)
        wrong = _MAKE[kind](mesh, AXIS, overlap=True, misplace_by=1)
        failure = check.verify_catches(
            f"{kind} collective matmul, block index off by one", lambda: check.verify_close(
                "output", wrong(a, b), plain(a, b), rtol=check.fp32_rtol()))
        assert "output" in str(failure)
        check.verify_catches(f"{kind}, off by one: gradients", lambda: check.verify_close(
            "gradients", jax.device_get(_loss_and_grads(wrong)(a, b)[1]),
            jax.device_get(_loss_and_grads(plain)(a, b)[1]), rtol=check.fp32_rtol()))


@pytest.mark.parametrize("kind", ["column", "row"])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_compiled_collectives(p, kind):
    mesh, inputs = _inputs(p)
    a, b = inputs[kind]
    block_bytes = T // p * D * 4  # a token block: T/p x D float32, sent in either form
    overlapped = hlo.summarize(
        hlo.compiled_collectives(_MAKE[kind](mesh, AXIS, overlap=True), a, b))
    check.verify_equal(f"{kind} collective matmul on {p} devices: only collective-permutes",
                       list(overlapped), ["collective-permute"])
    check.verify_equal(f"{kind}, {p} devices: p-1 collective-permutes",
                       overlapped["collective-permute"].n_ops, p - 1)
    check.verify_equal(f"{kind}, {p} devices: each a T/p x D float32 block",
                       overlapped["collective-permute"].total_bytes, (p - 1) * block_bytes)
    plain = hlo.summarize(
        hlo.compiled_collectives(_MAKE[kind](mesh, AXIS, overlap=False), a, b))
    check.verify_equal(f"plain {kind} matmul on {p} devices: one {_PLAIN_COLLECTIVE[kind]}",
                       {k: s.n_ops for k, s in plain.items()}, {_PLAIN_COLLECTIVE[kind]: 1})
    # backward: each permute transposed into one in the opposite direction
    grads = hlo.summarize(hlo.compiled_collectives(
        _loss_and_grads(_MAKE[kind](mesh, AXIS, overlap=True)), a, b))
    # the loss is summed over the sharded output outside shard_map: one all-reduce of 4 bytes
    check.verify_equal(f"{kind}, {p} devices, forward and backward: 2(p-1) permutes and the "
                       f"loss's all-reduce", dict(grads),
                       {"collective-permute": (2 * (p - 1), 2 * (p - 1) * block_bytes),
                        "all-reduce": (1, 4)})


@pytest.mark.parametrize("p", [2, 4, 8])
def test_schedule_on_xla_cpu(p):
    """What XLA:CPU does with the schedule, read from the compiled program (not assumed)."""
    mesh, inputs = _inputs(p)
    text = hlo.compiled_text(tensor.make_column_matmul(mesh, AXIS, overlap=True),
                                     *inputs["column"])
    check.verify("the compiled module is scheduled", "is_scheduled=true" in text.split("\n")[0])
    slots = hlo.permute_schedule(text)
    check.verify_equal(f"{p} devices: p-1 permutes in the schedule", len(slots), p - 1)
    check.verify("every permute sends a block that a matmul of the entry also reads",
                 all(slot.matmul for slot in slots), detail=str(slots))
    # XLA:CPU (jaxlib 0.10.2) compiles synchronous collective-permutes: no -start/-done pair
    check.verify(f"XLA:CPU (jaxlib {jaxlib.__version__}): every permute synchronous",
                 not any(slot.asynchronous for slot in slots)
                 and "collective-permute-start" not in text)
    check.verify("so none is in flight during a matmul in the schedule",
                 not any(slot.in_flight_during_matmul for slot in slots))
    issued_before = [slot.issued_before_matmul for slot in slots]
    # measured on jaxlib 0.10.2: the first permute is placed before block 0's matmul, and each
    # later one after the matmul of the block it sends; the positions are printed on failure
    check.verify_equal(f"{p} devices: permutes issued before their block's matmul",
                       issued_before, [True] + [False] * (p - 2))

    row_text = hlo.compiled_text(tensor.make_row_matmul(mesh, AXIS, overlap=True),
                                         *inputs["row"])
    row_slots = hlo.permute_schedule(row_text)
    check.verify_equal(f"{p} devices, reduce-scatter form: p-1 permutes", len(row_slots), p - 1)
    check.verify("reduce-scatter form: each permute paired with the matmul added to it",
                 all(slot.matmul for slot in row_slots), detail=str(row_slots))
    check.verify("reduce-scatter form on XLA:CPU: every matmul scheduled before the permute "
                 "it could hide", not any(slot.issued_before_matmul for slot in row_slots),
                 detail=str(row_slots))


_ASYNC_HLO = """HloModule toy, is_scheduled=true

%fused_dot (a: f32[4,8], b: f32[8,4]) -> f32[4,4] {
  %a = f32[4,8]{1,0} parameter(0)
  %b = f32[8,4]{1,0} parameter(1)
  ROOT %d = f32[4,4]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (x: f32[4,8], w: f32[8,4]) -> (f32[4,8], f32[4,4]) {
  %x = f32[4,8]{1,0} parameter(0)
  %w = f32[8,4]{1,0} parameter(1)
  %cp-start = (f32[4,8]{1,0}, f32[4,8]{1,0}) collective-permute-start(%x), channel_id=1
  %mm = f32[4,4]{1,0} fusion(%x, %w), kind=kOutput, calls=%fused_dot
  %cp-done = f32[4,8]{1,0} collective-permute-done(%cp-start)
  ROOT %t = (f32[4,8]{1,0}, f32[4,4]{1,0}) tuple(%cp-done, %mm)
}
"""


def test_schedule_reader_on_an_asynchronous_permute():
    """The reader on a hand-written GPU-style schedule: start, the matmul, done."""
    (slot,) = hlo.permute_schedule(_ASYNC_HLO)
    check.verify_equal("the permute, what it sends, its matmul",
                       (slot.permute, slot.sent, slot.matmul), ("cp-start", "x", "mm"))
    check.verify("asynchronous, in flight during the matmul",
                 slot.asynchronous and slot.issued_before_matmul and slot.in_flight_during_matmul,
                 detail=str(slot))
    # negative control: the same program with done moved before the matmul
    lines = _ASYNC_HLO.splitlines()
    done = next(i for i, line in enumerate(lines) if "collective-permute-done" in line)
    lines[done - 1], lines[done] = lines[done], lines[done - 1]
    (moved,) = hlo.permute_schedule("\n".join(lines))
    check.verify("done before the matmul: not in flight during it",
                 moved.issued_before_matmul and not moved.in_flight_during_matmul,
                 detail=str(moved))


def test_one_device_and_refusals():
    mesh, inputs = _inputs(1)
    a, b = inputs["column"]
    check.verify_equal("one device: no collective", hlo.compiled_collectives(
        tensor.make_column_matmul(mesh, AXIS, overlap=True), a, b), [])
    with pytest.raises(ValueError, match="misplace_by"):
        tensor.make_column_matmul(mesh, AXIS, overlap=False, misplace_by=1)
    with pytest.raises(ValueError, match="axis"):
        tensor.make_row_matmul(mesh, "nope", overlap=True)
    mesh4, _ = _inputs(4)
    odd_h = devices.shard(jnp.ones((6, 8)), mesh4, P(None, AXIS))
    odd_w = devices.shard(jnp.ones((8, 4)), mesh4, P(AXIS))
    with pytest.raises(ValueError, match="multiple of 4"):
        tensor.make_row_matmul(mesh4, AXIS, overlap=True)(odd_h, odd_w)
