"""The library's own claims that lab 03 (data parallelism) makes, held here with the lab's
numbers: its model (4 blocks, D = 256, H = 512), its 6 Adam steps on batches of 128 over 8
devices, its bucket sizes and its tolerances. The lab keeps one decisive check and one negative
control per idea; these are the regression checks of ``clusterlab`` functions it no longer runs.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from clusterlab.analytic import costmodel
from clusterlab.course import check
from clusterlab.device import hlo, models, parallel
from clusterlab.device.parallel import data
from conftest import sub_mesh

AXIS = "data"
P_DEVICES = 8
TRAINED_RTOL, FP32_RTOL = 1e-3, 1e-5   # check.fp32_rtol(trained=True) and fp32_rtol() in float32
FORMS = {"pmap": {"form": "pmap"}, "shard_map": {}, "jit": {"automatic": True}}


def _worst(actual, expected) -> float:
    """The largest leaf's |difference| over its largest expected magnitude, as the lab's
    check.verify_close measures it."""
    return max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(e, np.float64)))
                     / np.max(np.abs(np.asarray(e, np.float64))))
               for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)))


@pytest.fixture(scope="module")
def lab_run():
    """The lab's model, batches, optimizer and single-device run."""
    params = models.init_mlp(jax.random.key(0), d_model=256, d_hidden=512, n_blocks=4)
    x, y = models.synthetic_regression(jax.random.key(1), n_samples=1024, d_model=256)
    batches = models.make_batches(x, y, batch_size=128, n_steps=6)
    optimizer = models.make_optimizer(learning_rate=1e-3)
    with check.fp32_matmuls():
        reference, losses = models.reference_train(params, batches, optimizer=optimizer)
    return params, batches, optimizer, jax.device_get(reference), np.asarray(losses)


def _trained(lab_run, **options):
    params, batches, optimizer, _, _ = lab_run
    strategy = data.make_data_parallel(models.mse_loss, sub_mesh(P_DEVICES, AXIS), optimizer,
                                       axis_name=AXIS, **options)
    with check.fp32_matmuls():
        trained, losses = parallel.train(strategy, params, batches)
    return trained, np.asarray(losses)


def test_lab03_model_sizes(lab_run):
    params = lab_run[0]
    assert models.param_count(params) == 4 * (2 * 256 * 512 + 512 + 256) == 1_051_648
    assert data.gradient_bytes(params) == 4 * 1_051_648


@pytest.mark.parametrize("form", FORMS)
def test_lab03_each_form_trains_like_one_device(lab_run, form):
    reference, reference_losses = lab_run[3], lab_run[4]
    trained, losses = _trained(lab_run, **FORMS[form])
    assert _worst(trained, reference) <= TRAINED_RTOL
    assert _worst(losses, reference_losses) <= FP32_RTOL


def test_lab03_adam_shrinks_a_summed_gradient_but_the_trained_check_still_fails(lab_run):
    # the sum's relative difference of p - 1 = 7 in the gradient shrinks more than ten times in
    # the trained parameters (the lab measured 1.5e-2), yet stays above the trained tolerance
    trained, _ = _trained(lab_run, reduce="sum")
    assert TRAINED_RTOL < _worst(trained, lab_run[3]) <= 0.7


def test_lab03_bucketed_run_trains_like_one_device(lab_run):
    trained, _ = _trained(lab_run, bucket_bytes=2**18, combine_all_reduces=False)
    assert _worst(trained, lab_run[3]) <= TRAINED_RTOL


def test_lab03_gradient_in_8_kib_and_4_mib_buckets_compiles_to_ceil_g_over_b(lab_run):
    params, _, optimizer, _, _ = lab_run
    mesh = sub_mesh(P_DEVICES, AXIS)
    strategy = data.make_data_parallel(models.mse_loss, mesh, optimizer, axis_name=AXIS)
    gradient = strategy.init(params)[0]              # a gradient-sized pytree on every device
    counts = [hlo.summarize(hlo.compiled_collectives(
        data.make_gradient_all_reduce(mesh, axis_name=AXIS, bucket_bytes=b,
                                      combine_all_reduces=False), gradient))["all-reduce"].n_ops
        for b in (2**13, 2**22)]
    gradient_bytes = data.gradient_bytes(params)
    assert counts == [len(costmodel.gradient_buckets(gradient_bytes, b))
                      for b in (2**13, 2**22)] == [514, 2]
