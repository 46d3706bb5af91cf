"""Sharded data parallelism (ZeRO 0-3) against one device: training, gradients, bytes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from clusterlab.analytic import costmodel, memory
from clusterlab.course import check
from clusterlab.device import collectives, devices, hlo, models, parallel
from clusterlab.device.parallel import sharded
from conftest import SMALL_RUN, check_mean_and_catch_sum, small_reference_run, sub_mesh

D, H, N_BLOCKS, BATCH = (SMALL_RUN[k] for k in ("d_model", "d_hidden", "n_blocks", "batch"))
TOL = 2e-6  # fp32, several Adam steps
_setup = small_reference_run


@pytest.mark.parametrize("n", [2, 4, 8])
def test_zero3_equals_single_device(n):
    params, batches, optimizer, ref, ref_losses = _setup()
    sdp = sharded.make_sharded_data_parallel(params, sub_mesh(n, "data"), axis_name="data",
                                             zero_stage=3, optimizer=optimizer)
    trained, losses = parallel.train(sdp, params, batches)
    assert sdp.name == "zero3" and sdp.axis_names == ("data",)
    assert models.max_abs_diff(trained, ref) < TOL
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_lower_stages_equal_single_device(stage):
    params, batches, optimizer, ref, _ = _setup()
    sdp = sharded.make_sharded_data_parallel(params, sub_mesh(4, "data"), axis_name="data",
                                             zero_stage=stage, optimizer=optimizer)
    trained, _ = parallel.train(sdp, params, batches)
    assert models.max_abs_diff(trained, ref) < TOL


def test_automatic_sharding_equals_single_device():
    params, batches, optimizer, ref, _ = _setup()
    sdp = sharded.make_sharded_data_parallel(params, sub_mesh(4, "data"), axis_name="data",
                                             zero_stage=3, optimizer=optimizer, automatic=True)
    trained, _ = parallel.train(sdp, params, batches)
    assert models.max_abs_diff(trained, ref) < TOL


@pytest.mark.parametrize("stage,n", [(0, 4), (2, 4), (3, 2), (3, 8)])
def test_compiled_bytes_equal_formula_and_shard_bytes_equal_memory_model(stage, n):
    params, batches, optimizer, _, _ = _setup()
    sdp = sharded.make_sharded_data_parallel(params, sub_mesh(n, "data"), axis_name="data",
                                             zero_stage=stage, optimizer=optimizer)
    flat, opt_state = sdp.init(params)
    ops = hlo.executed_collectives(sdp.step, flat, opt_state,
                                           *sdp.place_batch(*batches[0]))
    kinds = hlo.summarize(ops)
    n_params = models.param_count(params)
    assert sharded.sent_bytes_per_device(ops, n) == pytest.approx(
        costmodel.sharded_data_parallel_bytes_per_step(n_params, 4, n, stage), rel=1e-12)
    if stage == 3:  # one all-gather per block forward, one backward, one reduce-scatter
        assert kinds["all-gather"].n_ops == 2 * N_BLOCKS
        assert kinds["reduce-scatter"].n_ops == N_BLOCKS
    measured = devices.per_device_bytes((flat, opt_state))
    assert len(measured) == n
    expected = memory.training_memory_per_device(n_params, n, stage, bytes_param=4, bytes_grad=0,
                                                 optimizer_bytes_per_param=8)
    adam_count_bytes = 4  # Adam's step counter, one int32 on every device
    assert set(measured.values()) == {int(expected) + adam_count_bytes}


def test_sharded_data_parallel_bytes_per_step_formula():
    psi = 1e9 * 2
    assert costmodel.sharded_data_parallel_bytes_per_step(1e9, 2, 8, 0) == pytest.approx(
        2 * 7 / 8 * psi)
    for stage in (1, 2):
        assert costmodel.sharded_data_parallel_bytes_per_step(1e9, 2, 8, stage) == pytest.approx(
            2 * 7 / 8 * psi)
    assert costmodel.sharded_data_parallel_bytes_per_step(1e9, 2, 8, 3) == pytest.approx(
        3 * 7 / 8 * psi)
    assert costmodel.sharded_data_parallel_bytes_per_step(1e9, 2, 1, 3) == 0.0
    with pytest.raises(ValueError, match="zero_stage"):
        costmodel.sharded_data_parallel_bytes_per_step(1e9, 2, 8, 4)


def test_gather_params_backward_is_reduce_scatter():
    mesh = sub_mesh(4, "data")
    x = jnp.arange(16.0)

    def local(shard):  # shard: f32[4]; loss sum(w * full) with w = device index + 1
        full = collectives.gather_params(shard, "data")
        weight = jax.lax.axis_index("data").astype(jnp.float32) + 1
        return jax.grad(lambda s: jnp.sum(weight * collectives.gather_params(s, "data")))(
            shard), full

    grad, full = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("data"),
                                       out_specs=(P("data"), P("data")), check_vma=False))(x)
    np.testing.assert_array_equal(full.reshape(4, 16)[0], x)
    np.testing.assert_array_equal(grad, np.full(16, 1 + 2 + 3 + 4.0))  # summed over devices


def test_executed_collectives_counts_loop_trips():
    mesh = sub_mesh(2, "data")

    def local(x):  # x: f32[3, 4]
        def body(c, row):
            return c + jax.lax.psum(row, "data"), None
        return jax.lax.scan(body, jnp.zeros(4), x)[0][None]

    fn = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P(None, "data"), out_specs=P("data"),
                               check_vma=False))
    x = jnp.ones((3, 8))
    static = hlo.summarize(hlo.compiled_collectives(fn, x))
    executed = hlo.summarize(hlo.executed_collectives(fn, x))
    assert executed["all-reduce"].n_ops == 3 * static["all-reduce"].n_ops


def test_bad_sizes_name_the_constraint():
    params = models.init_mlp(jax.random.key(0), d_model=3, d_hidden=5, n_blocks=1)  # F = 38
    with pytest.raises(ValueError, match="multiple of 4"):
        sharded.make_sharded_data_parallel(params, sub_mesh(4, "data"), axis_name="data")
    good, batches, *_ = _setup()
    sdp = sharded.make_sharded_data_parallel(good, sub_mesh(4, "data"), axis_name="data")
    with pytest.raises(ValueError, match="does not split evenly over 4 data-parallel devices"):
        sdp.place_batch(batches[0][0][:6], batches[0][1][:6])
    with pytest.raises(ValueError, match="zero_stage"):
        sharded.make_sharded_data_parallel(good, sub_mesh(4, "data"), axis_name="data",
                                           zero_stage=5)
    with pytest.raises(ValueError, match="not in the mesh"):
        sharded.make_sharded_data_parallel(good, sub_mesh(4, "data"), axis_name="batch")


def test_flatten_roundtrip():
    params, *_ = _setup()
    flat, unravel = sharded.flatten_blocks(params)
    assert flat.shape == (N_BLOCKS, 2 * D * H + H + D)
    assert models.max_abs_diff(sharded.unflatten_blocks(flat, unravel), params) == 0.0


# --- Gradients against one device: a shard's gradient not divided by p is caught -------------

def _stage_gradients(sdp, params, batch):
    flat, _ = sdp.init(params)
    return sdp.grads(flat, *sdp.place_batch(*batch))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_each_stage_applies_the_single_device_gradient_and_a_sum_is_caught(stage):
    params, batches, optimizer, _, _ = _setup()
    reference = models.reference_gradients(params, *batches[0])
    mesh = sub_mesh(4, "data")

    def grads_for(reduce):
        sdp = sharded.make_sharded_data_parallel(params, mesh, axis_name="data", zero_stage=stage,
                                                 optimizer=optimizer, reduce=reduce)
        return _stage_gradients(sdp, params, batches[0])

    check_mean_and_catch_sum(f"stage {stage}", grads_for, reference, 4,
                             "shard gradient not divided by p")


def test_automatic_gradients_equal_single_device():
    params, batches, optimizer, _, _ = _setup()
    sdp = sharded.make_sharded_data_parallel(params, sub_mesh(8, "data"), axis_name="data",
                                             zero_stage=3, optimizer=optimizer, automatic=True)
    check.verify_close("automatic", _stage_gradients(sdp, params, batches[0]),
                       models.reference_gradients(params, *batches[0]), rtol=1e-5)
    with pytest.raises(ValueError, match="hand-written step"):
        sharded.make_sharded_data_parallel(params, sub_mesh(8, "data"), axis_name="data",
                                           automatic=True, reduce="sum")


def test_zero3_sgd_equals_single_device_and_sees_the_missing_division():
    """Plain SGD passes the gradient's scale into the parameters, where Adam hides it."""
    params, batches, _, _, _ = _setup()
    sgd = optax.sgd(0.2)
    reference, _ = models.reference_train(params, batches[:3], optimizer=sgd)
    for reduce in ("mean", "sum"):
        sdp = sharded.make_sharded_data_parallel(params, sub_mesh(4, "data"), axis_name="data",
                                                 zero_stage=3, optimizer=sgd, reduce=reduce)
        trained, _ = parallel.train(sdp, params, batches[:3])
        check_it = functools.partial(check.verify_close, "ZeRO-3 SGD", trained, reference,
                                     rtol=1e-5)
        if reduce == "mean":
            check_it()
        else:
            check.verify_catches("shard gradient not divided by p, SGD", check_it)
