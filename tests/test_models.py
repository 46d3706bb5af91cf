"""Unit tests of clusterlab.device.models: shapes, determinism, the transformer's causality and heads,
and the single-device reference training run."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from clusterlab.device import models

D, H, BLOCKS = 16, 32, 3


def small_mlp(seed: int = 0):
    return models.init_mlp(jax.random.key(seed), d_model=D, d_hidden=H, n_blocks=BLOCKS)


def test_init_mlp_shapes_and_count():
    params = small_mlp()
    assert len(params) == BLOCKS
    for block in params:
        assert block["w1"].shape == (D, H) and block["b1"].shape == (H,)
        assert block["w2"].shape == (H, D) and block["b2"].shape == (D,)
        assert all(leaf.dtype == jnp.float32 for leaf in block.values())
    assert models.param_count(params) == BLOCKS * (2 * D * H + H + D)
    assert models.param_bytes(params) == 4 * models.param_count(params)


def test_init_is_deterministic_and_seeded():
    assert models.max_abs_diff(small_mlp(0), small_mlp(0)) == 0.0
    assert models.max_abs_diff(small_mlp(0), small_mlp(1)) > 0.0


def test_mlp_block_formula_and_forward():
    params = small_mlp()
    x = jax.random.normal(jax.random.key(3), (5, D))
    block = params[0]
    expected = x + jnp.maximum(x @ block["w1"] + block["b1"], 0) @ block["w2"] + block["b2"]
    np.testing.assert_allclose(models.mlp_block(block, x), expected, rtol=1e-6, atol=1e-6)
    out = x
    for b in params:
        out = models.mlp_block(b, out)
    np.testing.assert_allclose(models.mlp_forward(params, x), out, rtol=1e-6, atol=1e-6)
    assert models.mlp_forward(params, x).shape == (5, D)


def test_mse_loss_value():
    params = small_mlp()
    x = jax.random.normal(jax.random.key(4), (6, D))
    y = jnp.zeros((6, D))
    expected = jnp.mean(models.mlp_forward(params, x) ** 2)
    assert float(models.mse_loss(params, x, y)) == pytest.approx(float(expected), rel=1e-6)


def test_init_rejects_bad_sizes():
    with pytest.raises(ValueError, match="d_hidden"):
        models.init_mlp(jax.random.key(0), d_model=4, d_hidden=0, n_blocks=1)
    with pytest.raises(ValueError, match="multiple of n_heads"):
        models.init_transformer_block(jax.random.key(0), d_model=10, n_heads=4, d_hidden=8)


def transformer(seed: int = 0):
    return models.init_transformer_block(jax.random.key(seed), d_model=D, n_heads=4, d_hidden=H)


def test_transformer_block_shapes():
    params = transformer()
    assert params["wq"].shape == (D, 4, D // 4)
    assert params["wo"].shape == (4, D // 4, D)
    x = jax.random.normal(jax.random.key(1), (2, 7, D))
    assert jax.jit(models.transformer_block)(params, x).shape == (2, 7, D)


def test_transformer_block_is_causal():
    params = transformer()
    x = jax.random.normal(jax.random.key(1), (2, 8, D))
    changed = x.at[:, 5:].set(jax.random.normal(jax.random.key(2), (2, 3, D)))
    block = jax.jit(models.transformer_block)
    before, after = block(params, x), block(params, changed)
    np.testing.assert_allclose(before[:, :5], after[:, :5], rtol=1e-5, atol=1e-6)
    assert float(jnp.max(jnp.abs(before[:, 5:] - after[:, 5:]))) > 1e-3


def test_attention_heads_sum_to_the_whole():
    """Split the heads in two groups (as tensor parallelism does): the outputs add up."""
    params = transformer()
    x = jax.random.normal(jax.random.key(1), (2, 6, D))
    attention = jax.jit(models.causal_attention)
    whole = attention(params, x)
    halves = [{"wq": params["wq"][:, s], "wk": params["wk"][:, s], "wv": params["wv"][:, s],
               "wo": params["wo"][s]} for s in (slice(0, 2), slice(2, 4))]
    parts = attention(halves[0], x) + attention(halves[1], x)
    np.testing.assert_allclose(parts, whole, rtol=1e-5, atol=1e-5)


def test_layer_norm_normalises():
    x = jax.random.normal(jax.random.key(0), (3, D)) * 5 + 2
    out = models.layer_norm(x, jnp.ones(D), jnp.zeros(D))
    np.testing.assert_allclose(jnp.mean(out, -1), 0, atol=1e-5)
    np.testing.assert_allclose(jnp.std(out, -1), 1, atol=1e-3)


def test_synthetic_regression_and_batches():
    x, y = models.synthetic_regression(jax.random.key(0), n_samples=10, d_model=D)
    assert x.shape == y.shape == (10, D)
    x2, _ = models.synthetic_regression(jax.random.key(0), n_samples=10, d_model=D)
    assert bool(jnp.all(x == x2))
    batches = models.make_batches(x, y, batch_size=4, n_steps=3)
    assert [b[0].shape for b in batches] == [(4, D)] * 3
    # the third batch wraps around: examples 8, 9, 0, 1
    np.testing.assert_array_equal(batches[2][0], x[jnp.array([8, 9, 0, 1])])
    with pytest.raises(ValueError, match="larger than the data"):
        models.make_batches(x, y, batch_size=11, n_steps=1)
    with pytest.raises(ValueError, match="same number of examples"):
        models.make_batches(x, y[:5], batch_size=2, n_steps=1)


def test_make_optimizer_is_adam():
    opt = models.make_optimizer(1e-2)
    params = {"w": jnp.ones(3)}
    grads = {"w": jnp.array([1.0, -2.0, 0.5])}
    ours, _ = opt.update(grads, opt.init(params), params)
    ref, _ = optax.adam(1e-2).update(grads, optax.adam(1e-2).init(params), params)
    np.testing.assert_allclose(ours["w"], ref["w"])
    with pytest.raises(ValueError, match="learning_rate"):
        models.make_optimizer(0.0)


def test_reference_train_learns_and_is_deterministic():
    x, y = models.synthetic_regression(jax.random.key(1), n_samples=64, d_model=D)
    batches = models.make_batches(x, y, batch_size=32, n_steps=20)
    opt = models.make_optimizer(1e-2)
    params, losses = models.reference_train(small_mlp(), batches, optimizer=opt)
    assert losses.shape == (20,) and losses.dtype == np.float32
    assert losses[-1] < 0.7 * losses[0]
    params2, losses2 = models.reference_train(small_mlp(), batches, optimizer=opt)
    np.testing.assert_array_equal(losses, losses2)
    assert models.max_abs_diff(params, params2) == 0.0


def test_reference_train_matches_a_hand_written_loop():
    x, y = models.synthetic_regression(jax.random.key(1), n_samples=32, d_model=D)
    batches = models.make_batches(x, y, batch_size=16, n_steps=3)
    opt = optax.adam(1e-3)
    params, state = small_mlp(), opt.init(small_mlp())

    @jax.jit
    def step(params, state, xb, yb):
        grads = jax.grad(models.mse_loss)(params, xb, yb)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for xb, yb in batches:
        params, state = step(params, state, xb, yb)
    trained, _ = models.reference_train(small_mlp(), batches, optimizer=opt)
    assert models.max_abs_diff(trained, params) < 1e-6


def test_reference_train_with_transformer_loss():
    x = jax.random.normal(jax.random.key(5), (8, 4, D))
    batches = [(x, jnp.roll(x, 1, axis=1))] * 3

    def loss(p, xb, yb):
        return models.mse_loss(p, xb, yb, forward=models.transformer_block)

    _, losses = models.reference_train(transformer(), batches, loss_fn=loss)
    assert losses.shape == (3,) and losses[2] < losses[0]


def test_reference_train_needs_batches():
    with pytest.raises(ValueError, match="no batches"):
        models.reference_train(small_mlp(), [])


def test_reference_gradients_is_the_gradient_of_the_batch_loss():
    params = small_mlp()
    x, y = models.synthetic_regression(jax.random.key(2), n_samples=8, d_model=D)
    grads = models.reference_gradients(params, x, y)
    expected = jax.grad(models.mse_loss)(params, x, y)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(expected)):
        assert isinstance(got, np.ndarray)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    # the mean over halves of the batch: what data parallelism's all-reduce computes
    halves = [models.reference_gradients(params, x[i:i + 4], y[i:i + 4]) for i in (0, 4)]
    mean = jax.tree.map(lambda a, b: (a + b) / 2, *halves)
    assert models.max_abs_diff(mean, grads) < 1e-5
    assert models.max_abs_diff(jax.tree.map(lambda a, b: a + b, *halves), grads) > 1e-3


def test_stack_copies():
    tree = {"a": np.arange(3.0), "b": np.ones((2, 2))}
    stacked = models.stack_copies(tree, 4)
    assert stacked["a"].shape == (4, 3) and stacked["b"].shape == (4, 2, 2)
    np.testing.assert_array_equal(stacked["a"][3], tree["a"])
    with pytest.raises(ValueError, match="n must be a positive integer"):
        models.stack_copies(tree, 0)
