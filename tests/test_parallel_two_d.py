"""2-D data x tensor parallelism (clusterlab.device.parallel.two_d) against one device."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from clusterlab.course import check
from clusterlab.device import devices, hlo, models, parallel
from clusterlab.device.parallel import two_d
from conftest import DEVICES, SMALL_RUN, check_mean_and_catch_sum, small_reference_run

D, H, N_BLOCKS, BATCH = (SMALL_RUN[k] for k in ("d_model", "d_hidden", "n_blocks", "batch"))
TOL = 2e-6  # fp32, several Adam steps
_setup = small_reference_run


@pytest.mark.parametrize("shape", [(2, 4), (4, 2)])
def test_2d_equals_single_device(shape):
    params, batches, optimizer, ref, ref_losses = _setup()
    mesh = devices.mesh(shape, ("data", "model"), DEVICES)
    for automatic in (False, True):
        strategy = two_d.make_2d_parallel(params, mesh, optimizer, data_axis="data",
                                          model_axis="model", automatic=automatic)
        assert strategy.axis_names == ("data", "model")
        trained, losses = parallel.train(strategy, params, batches)
        assert models.max_abs_diff(trained, ref) < TOL
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)




@pytest.mark.parametrize("shape", [(2, 4), (4, 2)])
def test_2d_gradients_equal_single_device_and_a_sum_over_data_is_caught(shape):
    params, batches, _, _, _ = _setup()
    mesh = devices.mesh(shape, ("data", "model"), DEVICES)
    reference = models.reference_gradients(params, *batches[0])

    def grads_for(reduce):
        strategy = two_d.make_2d_parallel(params, mesh, data_axis="data", model_axis="model",
                                          reduce=reduce)
        return strategy.grads(strategy.shard(params), *strategy.place_batch(*batches[0]))

    check_mean_and_catch_sum(f"2-D {shape}", grads_for, reference, shape[0],
                             "sum over the data axis")


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
    ops = hlo.compiled_collectives(strategy.step, laid_out, opt_state,
                                           *strategy.place_batch(*batches[0]))
    activation_bytes = BATCH // 2 * D * 4  # f32[B/dp, D]
    slice_bytes = sum(leaf.addressable_shards[0].data.nbytes
                      for leaf in jax.tree.leaves(laid_out))
    assert sorted((op.kind, op.bytes) for op in ops) == sorted(
        [("all-reduce", activation_bytes)] * (2 * N_BLOCKS - 1) + [("all-reduce", slice_bytes)])
