"""2-D data x tensor parallelism (clusterlab.parallel.two_d) against one device."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from clusterlab import check, collectives, devices, models
from clusterlab.parallel import two_d
from conftest import DEVICES, reference_run

D, H, N_BLOCKS, BATCH, STEPS = 32, 64, 2, 32, 4
TOL = 2e-6  # fp32, several Adam steps


@functools.lru_cache(maxsize=None)
def _setup():
    return reference_run(d_model=D, d_hidden=H, n_blocks=N_BLOCKS, batch=BATCH, steps=STEPS,
                         n_samples=128, learning_rate=1e-2)


@pytest.mark.parametrize("shape", [(2, 4), (4, 2)])
def test_2d_equals_single_device(shape):
    params, batches, optimizer, ref, ref_losses = _setup()
    mesh = devices.mesh(shape, ("data", "model"), DEVICES)
    for automatic in (False, True):
        strategy = two_d.make_2d_parallel(params, mesh, optimizer, data_axis="data",
                                          model_axis="model", automatic=automatic)
        assert strategy.axis_names == ("data", "model")
        trained, losses = two_d.train(strategy, params, batches)
        assert models.max_abs_diff(trained, ref) < TOL
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)




@pytest.mark.parametrize("shape", [(2, 4), (4, 2)])
def test_2d_gradients_equal_single_device_and_a_sum_over_data_is_caught(shape):
    params, batches, _, _, _ = _setup()
    mesh = devices.mesh(shape, ("data", "model"), DEVICES)
    reference = models.reference_gradients(params, *batches[0])
    for reduce in ("mean", "sum"):
        strategy = two_d.make_2d_parallel(params, mesh, data_axis="data", model_axis="model",
                                          reduce=reduce)
        grads = strategy.grads(strategy.shard(params), *strategy.place_batch(*batches[0]))
        check_it = functools.partial(check.verify_close, f"2-D {shape}", grads, reference,
                                     rtol=1e-5)
        if reduce == "mean":
            check_it()
        else:
            caught = check.verify_catches("sum over the data axis", check_it)
            assert f"relative difference {shape[0] - 1:.1e}" in str(caught)


def test_2d_batch_must_split_and_reduce_is_named():
    params, batches, _, _, _ = _setup()
    mesh = devices.mesh((2, 4), ("data", "model"), DEVICES)
    strategy = two_d.make_2d_parallel(params, mesh, data_axis="data", model_axis="model")
    with pytest.raises(ValueError, match="multiple of 2"):
        strategy.place_batch(batches[0][0][:5], batches[0][1][:5])
    with pytest.raises(ValueError, match="reduce must be"):
        two_d.make_2d_parallel(params, mesh, data_axis="data", model_axis="model", reduce="max")
    with pytest.raises(ValueError, match="hand-written step"):
        two_d.make_2d_parallel(params, mesh, data_axis="data", model_axis="model",
                               automatic=True, reduce="sum")


def test_2d_all_reduces_two_kinds():
    """Activations within a tensor-parallel group, weight-slice gradients within a data one."""
    params, batches, _, _, _ = _setup()
    mesh = devices.mesh((2, 4), ("data", "model"), DEVICES)
    strategy = two_d.make_2d_parallel(params, mesh, data_axis="data", model_axis="model")
    laid_out, opt_state = strategy.init(params)
    ops = collectives.compiled_collectives(strategy.step, laid_out, opt_state,
                                           *strategy.place_batch(*batches[0]))
    activation_bytes = BATCH // 2 * D * 4  # f32[B/dp, D]
    slice_bytes = sum(leaf.addressable_shards[0].data.nbytes
                      for leaf in jax.tree.leaves(laid_out))
    assert sorted((op.kind, op.bytes) for op in ops) == sorted(
        [("all-reduce", activation_bytes)] * (2 * N_BLOCKS - 1) + [("all-reduce", slice_bytes)])
