"""Tensor parallelism (Megatron style) against the single-device reference, its all-reduces
counted from the compiled program against the formula, and its input checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clusterlab.analytic import costmodel
from clusterlab.course import check
from clusterlab.device import collectives, hlo, models, parallel
from clusterlab.device.parallel import tensor
from conftest import reference_run, sub_mesh

AXIS = "model"
D, H, BLOCKS, BATCH, STEPS = 16, 32, 3, 16, 4


@pytest.fixture(scope="module")
def mlp_case():
    params, batches, _, reference, losses = reference_run(
        d_model=D, d_hidden=H, n_blocks=BLOCKS, batch=BATCH, steps=STEPS, n_samples=2 * BATCH)
    return params, batches, reference, losses


def _transformer_loss(params, x, y):
    return models.mse_loss(params, x, y, forward=models.transformer_block)


@pytest.fixture(scope="module")
def transformer_case():
    params = models.init_transformer_block(jax.random.key(2), d_model=16, n_heads=8, d_hidden=32)
    x = jax.random.normal(jax.random.key(3), (2, 8, 16), jnp.float32)  # f32[B, S, D]
    batches = [(x * (1 + 0.1 * k), jnp.tanh(x)) for k in range(STEPS)]
    reference, losses = models.reference_train(params, batches, loss_fn=_transformer_loss)
    return params, batches, jax.device_get(reference), np.asarray(losses)


@pytest.mark.parametrize("tp, automatic",
                         [(1, False), (2, False), (4, False), (8, False), (4, True)])
def test_mlp_equals_single_device(mlp_case, tp, automatic):
    params, batches, reference, losses = mlp_case
    strategy = tensor.make_tensor_parallel(params, sub_mesh(tp, AXIS), axis_name=AXIS,
                                           automatic=automatic)
    trained, tp_losses = parallel.train(strategy, params, batches)
    assert all(isinstance(leaf, np.ndarray) for leaf in jax.tree.leaves(trained))  # on the host
    assert models.max_abs_diff(trained, reference) < 1e-6
    np.testing.assert_allclose(tp_losses, losses, rtol=1e-5, atol=1e-6)
    assert not np.allclose(losses[0], losses[-1])  # training moved the parameters


@pytest.mark.parametrize("tp", [2, 8])
def test_transformer_equals_single_device(transformer_case, tp):
    params, batches, reference, losses = transformer_case
    strategy = tensor.make_tensor_parallel(params, sub_mesh(tp, AXIS), axis_name=AXIS)
    trained, tp_losses = parallel.train(strategy, params, batches)
    assert models.max_abs_diff(trained, reference) < 1e-6
    np.testing.assert_allclose(tp_losses, losses, rtol=1e-5, atol=1e-6)


def test_shards_have_the_split_shapes(mlp_case):
    params = mlp_case[0]
    sharded = tensor.shard_params(params, sub_mesh(4, AXIS), AXIS)
    block = sharded[0]
    assert block["w1"].addressable_shards[0].data.shape == (D, H // 4)
    assert block["w2"].addressable_shards[0].data.shape == (H // 4, D)
    assert block["b2"].addressable_shards[0].data.shape == (D,)


def _compiled_all_reduces(params, x, y, tp, automatic=False):
    strategy = tensor.make_tensor_parallel(params, sub_mesh(tp, AXIS), axis_name=AXIS,
                                           automatic=automatic)
    return hlo.summarize(hlo.compiled_collectives(
        strategy.step, *strategy.init(params), *strategy.place_batch(x, y)))


@pytest.mark.parametrize("tp", [2, 4])
def test_mlp_all_reduces_match_formula(mlp_case, tp):
    params, batches = mlp_case[:2]
    x, y = batches[0]
    summary = _compiled_all_reduces(params, x, y, tp)
    expected = costmodel.tensor_parallel_bytes_per_step(BATCH, D, BLOCKS, tp,
                                                        first_input_needs_grad=False)
    assert set(summary) == {"all-reduce"}
    assert summary["all-reduce"].n_ops == expected.all_reduces == 2 * BLOCKS - 1
    assert summary["all-reduce"].total_bytes == expected.total_bytes == 5 * BATCH * D * 4


def test_transformer_all_reduces_match_formula(transformer_case):
    params, batches = transformer_case[:2]
    x, y = batches[0]
    summary = _compiled_all_reduces(params, x, y, 4)
    expected = costmodel.tensor_parallel_bytes_per_step(2 * 8, 16, 2, 4)
    assert summary["all-reduce"].n_ops == expected.all_reduces == 4  # Megatron: 4 per layer
    assert summary["all-reduce"].total_bytes == expected.total_bytes


def test_formula_values():
    traffic = costmodel.tensor_parallel_bytes_per_step(1024, 4096, 2, 8, bytes_per_element=2)
    assert (traffic.forward_all_reduces, traffic.backward_all_reduces) == (2, 2)
    assert traffic.all_reduce_bytes == 1024 * 4096 * 2
    assert traffic.sent_bytes_per_device == pytest.approx(4 * 2 * 7 / 8 * 1024 * 4096 * 2)
    assert costmodel.tensor_parallel_bytes_per_step(8, 8, 3, 1).all_reduces == 0


@pytest.mark.parametrize("check_vma", [True, False])
def test_copy_and_reduce_are_conjugate(check_vma):
    # f: identity forward, psum backward; g: psum forward, identity backward. With check_vma
    # they are JAX's pcast and psum; without it, the custom_vjp fallback gives the same.
    mesh = sub_mesh(4, AXIS)
    w = jnp.arange(4.0)  # one scalar weight per device

    def per_device(w_block, x):
        y = collectives.reduce_from_model_parallel(
            collectives.copy_to_model_parallel(x, AXIS) * w_block[0], AXIS)
        return jnp.sum(y)

    grad_w, grad_x = jax.jit(jax.shard_map(
        jax.grad(per_device, argnums=(0, 1)), mesh=mesh, in_specs=(jax.P(AXIS), jax.P()),
        out_specs=(jax.P(AXIS), jax.P()), check_vma=check_vma))(w, jnp.ones(3))
    np.testing.assert_allclose(grad_x, np.full(3, 0 + 1 + 2 + 3))
    np.testing.assert_allclose(grad_w, np.full(4, 3.0))  # not 4 x 3: g's backward is a copy


def test_bare_psum_without_replication_checking_is_wrong():
    # What f and g are for: with check_vma=False, psum transposes to psum (grad_w 4 x too large)
    # and nothing sums the partial gradients of x.
    mesh = sub_mesh(4, AXIS)

    def per_device(w_block, x):
        return jnp.sum(jax.lax.psum(x * w_block[0], AXIS))

    grad_w, _ = jax.jit(jax.shard_map(
        jax.grad(per_device, argnums=(0, 1)), mesh=mesh, in_specs=(jax.P(AXIS), jax.P()),
        out_specs=(jax.P(AXIS), jax.P()), check_vma=False))(jnp.arange(4.0), jnp.ones(3))
    np.testing.assert_allclose(grad_w, np.full(4, 12.0))


def test_copy_refuses_a_varying_input():
    mesh = sub_mesh(4, AXIS)
    with pytest.raises(ValueError, match="already varies over it"):
        jax.shard_map(lambda x: collectives.copy_to_model_parallel(x, AXIS), mesh=mesh,
                      in_specs=jax.P(AXIS), out_specs=jax.P(AXIS))(jnp.arange(4.0))


def _reference_grads(params, x, y, forward=models.mlp_forward):
    return jax.device_get(jax.grad(models.mse_loss)(params, x, y, forward=forward))


def _tp_grads(params, x, y, tp, **options):
    strategy = tensor.make_tensor_parallel(params, sub_mesh(tp, AXIS), axis_name=AXIS,
                                           **options)
    return strategy.grads(strategy.shard(params), x, y)


@pytest.mark.parametrize("tp", [2, 8])
def test_mlp_gradients_equal_single_device(mlp_case, tp):
    params, batches = mlp_case[:2]
    x, y = batches[0]
    check.verify_close("gradients", _tp_grads(params, x, y, tp),
                       _reference_grads(params, x, y), rtol=1e-5)


def test_transformer_gradients_equal_single_device(transformer_case):
    params, batches = transformer_case[:2]
    x, y = batches[0]
    check.verify_close("gradients", _tp_grads(params, x, y, 4),
                       _reference_grads(params, x, y, models.transformer_block), rtol=1e-5)


def _identity(x, axis_name):
    return x


@pytest.mark.parametrize("bug, options", [
    ("bare psum, no f, check_vma off",
     {"ops": tensor.MegatronOps(_identity, jax.lax.psum), "check_vma": False}),
    ("f left out, check_vma off",
     {"ops": tensor.MEGATRON._replace(copy=_identity), "check_vma": False})])
def test_gradient_check_catches_missing_all_reduces(mlp_case, bug, options):
    params, batches = mlp_case[:2]
    x, y = batches[0]
    expected = _reference_grads(params, x, y)
    caught = check.verify_catches(bug, lambda: check.verify_close(
        "gradients", _tp_grads(params, x, y, 4, **options), expected, rtol=1e-5))
    assert "max relative difference" in str(caught)


def test_replication_checking_inserts_a_missing_f(mlp_case):
    # With check_vma=True, JAX copies the replicated x where it meets device-varying weights,
    # and transposes that copy to the psum f would have made.
    params, batches = mlp_case[:2]
    x, y = batches[0]
    check.verify_close("gradients", _tp_grads(params, x, y, 4, ops=tensor.MEGATRON._replace(
        copy=_identity)), _reference_grads(params, x, y), rtol=1e-5)


@pytest.mark.parametrize("n_blocks, message", [
    (1, r"out_specs\[0\] is P\(\)"),  # the loss would differ per device, claimed replicated
    (3, "already varies over it")])  # the next block's f receives a partial sum
def test_replication_checking_refuses_a_missing_g(mlp_case, n_blocks, message):
    params, batches = mlp_case[:2]
    x, y = batches[0]
    with pytest.raises(ValueError, match=message):
        _tp_grads(params[:n_blocks], x, y, 4, ops=tensor.MEGATRON._replace(reduce=_identity))


def test_hidden_size_must_divide():
    params = models.init_mlp(jax.random.key(0), d_model=8, d_hidden=12, n_blocks=1)
    with pytest.raises(ValueError, match="d_hidden = 12 does not divide by 8"):
        tensor.shard_params(params, sub_mesh(8, AXIS), AXIS)


def test_heads_must_divide():
    params = models.init_transformer_block(jax.random.key(0), d_model=24, n_heads=6, d_hidden=24)
    with pytest.raises(ValueError, match="n_heads = 6 does not divide by 4"):
        tensor.make_tensor_parallel(params, sub_mesh(4, AXIS), axis_name=AXIS)


def test_automatic_takes_no_hand_written_options(mlp_case):
    with pytest.raises(ValueError, match="hand-written step"):
        tensor.make_tensor_parallel(mlp_case[0], sub_mesh(2, AXIS), axis_name=AXIS,
                                    automatic=True, check_vma=False)


def test_automatic_gradients_equal_single_device(mlp_case):
    params, batches = mlp_case[:2]
    x, y = batches[0]
    strategy = tensor.make_tensor_parallel(params, sub_mesh(4, AXIS), axis_name=AXIS,
                                           automatic=True)
    check.verify_close("gradients", strategy.grads(strategy.shard(params), x, y),
                       _reference_grads(params, x, y), rtol=1e-5)


def test_unknown_params():
    with pytest.raises(ValueError, match="init_mlp"):
        tensor.param_specs({"w": jnp.ones(2)}, AXIS)
