"""One strategy shape: every constructor of clusterlab.device.parallel takes (model, mesh, optimizer),
then keyword-only axis names and ``automatic``, and returns the one Strategy type that
``parallel.train`` runs, with host parameters out."""

from __future__ import annotations

import inspect

import jax
import numpy as np
import pytest

from clusterlab.device import devices, models, parallel
from clusterlab.device.parallel import data, pipeline, sharded, tensor, two_d
from conftest import DEVICES, reference_run

CONSTRUCTORS = {
    "data": (data.make_data_parallel, ("axis_name",)),
    "sharded": (sharded.make_sharded_data_parallel, ("axis_name",)),
    "tensor": (tensor.make_tensor_parallel, ("axis_name",)),
    "pipeline": (pipeline.make_pipeline_parallel, ("axis_name",)),
    "2d": (two_d.make_2d_parallel, ("data_axis", "model_axis")),
}


@pytest.mark.parametrize("name", CONSTRUCTORS)
def test_every_constructor_has_the_same_shape(name):
    constructor, axes = CONSTRUCTORS[name]
    parameters = inspect.signature(constructor).parameters
    positional = [p for p in parameters.values()
                  if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert [p.name for p in positional][1:] == ["mesh", "optimizer"]
    assert positional[0].name == ("loss_fn" if name == "data" else "params")
    assert positional[2].default is None  # Adam unless told otherwise
    for keyword in (*axes, "automatic"):
        assert parameters[keyword].kind is inspect.Parameter.KEYWORD_ONLY
    assert parameters["automatic"].default is False


def test_one_train_and_one_strategy_type_with_one_path():
    # parallel.train and parallel.Strategy; no strategy module offers them under a second name
    assert parallel.Strategy.__module__ == "clusterlab.device.parallel._common"
    for module in (data, sharded, tensor, pipeline, two_d):
        assert not {"train", "Strategy"} & set(module.__all__), module.__name__
        assert not hasattr(module, "train"), module.__name__


def test_every_strategy_trains_to_host_parameters_equal_to_one_device():
    params, batches, optimizer, reference, losses = reference_run(
        d_model=16, d_hidden=32, n_blocks=2, batch=16, steps=2, n_samples=32)
    mesh_1d = devices.mesh((2,), ("x",), DEVICES[:2])
    strategies = [
        data.make_data_parallel(models.mse_loss, mesh_1d, optimizer, axis_name="x"),
        sharded.make_sharded_data_parallel(params, mesh_1d, optimizer, axis_name="x"),
        tensor.make_tensor_parallel(params, mesh_1d, optimizer, axis_name="x"),
        pipeline.make_pipeline_parallel(params, mesh_1d, optimizer, axis_name="x",
                                        microbatches=2),
        two_d.make_2d_parallel(params, devices.mesh((2, 2), ("d", "m"), DEVICES[:4]), optimizer,
                               data_axis="d", model_axis="m"),
    ]
    for strategy in strategies:
        trained, strategy_losses = parallel.train(strategy, params, batches)
        assert jax.tree.structure(trained) == jax.tree.structure(reference), strategy.name
        assert all(isinstance(leaf, np.ndarray) for leaf in jax.tree.leaves(trained))
        assert models.max_abs_diff(trained, reference) < 1e-6, strategy.name
        np.testing.assert_allclose(strategy_losses, losses, rtol=1e-5, err_msg=strategy.name)
