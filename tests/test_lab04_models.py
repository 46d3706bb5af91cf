"""The library's own claims that lab 04 (tensor parallelism) makes, held here with the lab's
numbers: its model (3 blocks, D = 16, H = 32, batches of 32), its transformer block (8 heads),
its collective-matmul inputs (T = 32 tokens, D = 16, H = 64) and its margins. The lab keeps one
decisive check and one negative control per idea; these are the regression checks of
``clusterlab`` functions that it no longer runs. The XLA:CPU schedule of the collective
matmuls that the lab prints is asserted in tests/test_parallel_collective_matmul.py
(``test_schedule_on_xla_cpu``, p = 2, 4, 8).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from clusterlab.catalog import hardware
from clusterlab.course import check
from clusterlab.device import devices, hlo, models, parallel
from clusterlab.device.parallel import tensor
from conftest import sub_mesh

AXIS = "model"
D, H, BLOCKS, BATCH = 16, 32, 3, 32
FP32_RTOL, TRAINED_RTOL = 1e-5, 1e-3       # check.fp32_rtol() and (trained=True) in float32
T_SEQ, D_SEQ, H_SEQ = 32, 16, 64


def _relative_differences(actual, expected) -> dict[str, float]:
    """Each leaf's largest |difference| over its largest expected magnitude, as the lab's
    check.verify_close measures it."""
    return {jax.tree_util.keystr(path): float(np.max(np.abs(np.asarray(a, np.float64)
                                                             - np.asarray(e, np.float64)))
                                              / np.max(np.abs(np.asarray(e, np.float64))))
            for (path, a), (_, e) in zip(jax.tree_util.tree_leaves_with_path(actual),
                                         jax.tree_util.tree_leaves_with_path(expected))}


def _worst(actual, expected) -> float:
    return max(_relative_differences(actual, expected).values())


@pytest.fixture(scope="module")
def lab_mlp():
    """The lab's MLP, its 6 batches, its optimizer and the single-device training run."""
    params = models.init_mlp(jax.random.key(0), d_model=D, d_hidden=H, n_blocks=BLOCKS)
    x_all, y_all = models.synthetic_regression(jax.random.key(1), n_samples=4 * BATCH, d_model=D)
    batches = models.make_batches(x_all, y_all, batch_size=BATCH, n_steps=6)
    optimizer = models.make_optimizer()
    with check.fp32_matmuls():
        reference, losses = models.reference_train(params, batches, optimizer=optimizer)
    return params, batches, optimizer, jax.device_get(reference), np.asarray(losses)


def _tp_grads(params, x, y, tp, optimizer, **options):
    strategy = tensor.make_tensor_parallel(params, sub_mesh(tp, AXIS), optimizer, axis_name=AXIS,
                                           **options)
    return strategy.grads(strategy.shard(params), x, y)


def test_lab04_model_has_3216_parameters(lab_mlp):
    params = lab_mlp[0]
    assert models.param_count(params) == BLOCKS * (2 * D * H + H + D) == 3216


def test_lab04_shards_on_4_devices_have_the_split_shapes(lab_mlp):
    sharded = tensor.shard_params(lab_mlp[0], sub_mesh(4, AXIS), AXIS)
    shapes = [sharded[0][n].addressable_shards[0].data.shape for n in ("w1", "b1", "w2", "b2")]
    assert shapes == [(D, H // 4), (H // 4,), (H // 4, D), (D,)]


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_lab04_training_on_tp_devices_equals_one_device(lab_mlp, tp):
    params, batches, optimizer, reference, reference_losses = lab_mlp
    assert reference_losses[-1] < reference_losses[0]        # training lowers the loss
    strategy = tensor.make_tensor_parallel(params, sub_mesh(tp, AXIS), optimizer, axis_name=AXIS)
    with check.fp32_matmuls():
        trained, losses = parallel.train(strategy, params, batches)
    assert _worst(trained, reference) <= TRAINED_RTOL
    assert _worst(np.asarray(losses), reference_losses) <= FP32_RTOL


def test_lab04_automatic_training_on_4_devices_equals_one_device(lab_mlp):
    params, batches, optimizer, reference, _ = lab_mlp
    strategy = tensor.make_tensor_parallel(params, sub_mesh(4, AXIS), optimizer, axis_name=AXIS,
                                           automatic=True)
    with check.fp32_matmuls():
        trained, _ = parallel.train(strategy, params, batches)
    assert _worst(trained, reference) <= TRAINED_RTOL


def test_lab04_bare_psum_without_f_makes_gradients_t_times_too_large(lab_mlp):
    params, batches, optimizer, _, _ = lab_mlp
    x0, y0 = batches[0]
    bare_psum = tensor.MegatronOps(copy=lambda x, axis_name: x, reduce=jax.lax.psum)
    with check.fp32_matmuls():
        reference_grads = jax.grad(models.mse_loss)(params, x0, y0)
        wrong = _tp_grads(params, x0, y0, 4, optimizer, ops=bare_psum, check_vma=False)
    # the last block's w2 gradient: t = 4 times one device's (relative difference t - 1 = 3)
    scale = float(np.linalg.norm(wrong[-1]["w2"]) / np.linalg.norm(reference_grads[-1]["w2"]))
    assert abs(scale - 4.0) < 4e-4, scale
    # every leaf is flagged but the last block's b2, which no psum precedes in the backward
    flagged = [leaf for leaf, d in _relative_differences(wrong, reference_grads).items()
               if d > FP32_RTOL]
    assert flagged == [leaf for leaf in _relative_differences(wrong, reference_grads)
                       if leaf != f"[{BLOCKS - 1}]['b2']"]


def test_lab04_missing_g_on_one_block_is_refused_by_out_specs(lab_mlp):
    params, batches, optimizer, _, _ = lab_mlp
    no_g = tensor.MEGATRON._replace(reduce=lambda x, axis_name: x)
    with pytest.raises(ValueError) as refusal:
        _tp_grads(params[:1], *batches[0], 4, optimizer, ops=no_g)
    out_specs = next(line for line in str(refusal.value).splitlines()
                     if line.startswith("out_specs"))
    assert "is P()" in out_specs


def _transformer_loss(p, x, y):
    return models.mse_loss(p, x, y, forward=models.transformer_block)


@pytest.fixture(scope="module")
def lab_transformer():
    """The lab's transformer block (8 heads), its 4 batches, its optimizer and the
    single-device run."""
    block = models.init_transformer_block(jax.random.key(2), d_model=16, n_heads=8, d_hidden=32)
    x_seq = jax.random.normal(jax.random.key(3), (4, 8, 16), jnp.float32)   # f32[B, S, D]
    seq_batches = [(x_seq * (1 + 0.1 * k), jnp.tanh(x_seq)) for k in range(4)]
    optimizer = models.make_optimizer()
    with check.fp32_matmuls():
        reference, _ = models.reference_train(block, seq_batches, loss_fn=_transformer_loss,
                                              optimizer=optimizer)
    return block, seq_batches, optimizer, jax.device_get(reference)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_lab04_transformer_block_trains_like_one_device(lab_transformer, tp):
    block, seq_batches, optimizer, reference = lab_transformer
    strategy = tensor.make_tensor_parallel(block, sub_mesh(tp, AXIS), optimizer, axis_name=AXIS)
    with check.fp32_matmuls():
        trained, _ = parallel.train(strategy, block, seq_batches)
    assert _worst(trained, reference) <= TRAINED_RTOL


def _ring_inputs(form: str, tp: int):
    mesh = sub_mesh(tp, AXIS)
    if form == "column":
        x = jax.random.normal(jax.random.key(9), (T_SEQ, D_SEQ), jnp.float32)
        w = jax.random.normal(jax.random.key(10), (D_SEQ, H_SEQ), jnp.float32)
        placed = (devices.shard(x, mesh, P(AXIS)), devices.shard(w, mesh, P(None, AXIS)))
        return mesh, (x, w), placed
    h = jax.random.normal(jax.random.key(13), (T_SEQ, H_SEQ), jnp.float32)
    w = jax.random.normal(jax.random.key(14), (H_SEQ, D_SEQ), jnp.float32)
    return mesh, (h, w), (devices.shard(h, mesh, P(None, AXIS)), devices.shard(w, mesh, P(AXIS)))


def test_lab04_plain_column_matmul_on_8_devices_equals_x_at_w():
    mesh, (x, w), placed = _ring_inputs("column", 8)
    with check.fp32_matmuls():
        plain = tensor.make_column_matmul(mesh, AXIS, overlap=False)(*placed)
        assert _worst(plain, x @ w) <= FP32_RTOL


def test_lab04_reduce_scatter_form_off_by_one_is_caught_and_sends_3_blocks():
    mesh, _, placed = _ring_inputs("row", 4)
    with check.fp32_matmuls():
        plain = tensor.make_row_matmul(mesh, AXIS, overlap=False)(*placed)
        rotated = tensor.make_row_matmul(mesh, AXIS, overlap=True, misplace_by=1)(*placed)
    assert _worst(rotated, plain) > 1.0                    # the lab measured 1.4: not rounding
    ring = tensor.make_row_matmul(mesh, AXIS, overlap=True)
    block_bytes = T_SEQ // 4 * D_SEQ * 4                   # one token block, f32[T/p, D]: 512 B
    assert dict(hlo.summarize(hlo.compiled_collectives(ring, *placed))) == {
        "collective-permute": (3, 3 * block_bytes)}


def test_lab04_h100_partial_matmul_outlasts_its_nvlink_transfer_less_than_twice():
    # exercise lab04.5's numbers: at the H100's dense bf16 peak the partial matmul of one token
    # block only just hides the block's NVLink 4 transfer
    h100, nvlink = hardware.gpu("H100"), hardware.link("NVLink4")
    tokens, width, tp = 2 * 4096, 8192, 8
    matmul_s = 2 * (tokens // tp) * width * (4 * width // tp) / h100.bf16_flops
    transfer_s = (tokens // tp) * width * 2 / nvlink.bytes_per_s
    assert 1 < matmul_s / transfer_s < 2
