"""The float32 tolerances of the labs' sharded-vs-one-device checks, per backend, and the bugs
their negative controls inject, held above the loosest of those tolerances.

JAX computes float32 matmuls in TF32 on recent GPUs and in bfloat16 on TPUs by default, so a
check that holds at 1e-5 on simulated CPU devices can fail on an H100 with nothing wrong.
``check.fp32_matmuls`` pins full float32 around a check and ``check.fp32_rtol`` derives the
tolerance from the precision in force. The negative controls below are the labs' own (labs 03,
04, 05, 08, 11), run on simulated CPU devices: each injected bug must exceed, by a margin, the
tolerance JAX's *default* GPU precision would need, so a control fires on any backend whether
or not the check is pinned.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clusterlab.analytic.schedule import BACKWARD, FORWARD, IDLE, make_schedule
from clusterlab.course import check
from clusterlab.device import decode, models
from clusterlab.device.parallel import data, pipeline, tensor
from conftest import DEVICES, sub_mesh

# The loosest tolerance a GPU comparison would use: TF32, JAX's default for float32 there.
GPU_DEFAULT_RTOL = check.fp32_rtol(platform="gpu", setting=None)
MARGIN = 10  # an injected bug must exceed that tolerance ten times over


def relative_difference(actual, expected) -> float:
    """The worst leaf's relative difference, as check.verify_close measures it."""
    return check.verify_close("relative difference", actual, expected, rtol=float("inf"))


# --- the tolerance function, per backend -------------------------------------------------------

@pytest.mark.parametrize("platform, setting, precision, rtol", [
    ("cpu", None, "float32", 1e-5),              # XLA:CPU computes float32 dots in float32
    ("cpu", "bfloat16", "float32", 1e-5),        # ... whatever the setting
    ("gpu", None, "tensorfloat32", 5e-3),        # JAX's default on Ampere and later: TF32
    ("cuda", "default", "tensorfloat32", 5e-3),
    ("gpu", "high", "tensorfloat32", 5e-3),
    ("gpu", "bfloat16", "bfloat16", 5e-2),
    ("gpu", "highest", "float32", 1e-5),         # what check.fp32_matmuls() pins
    ("gpu", "F32_F32_F32", "float32", 1e-5),
    ("tpu", None, "bfloat16", 5e-2),             # one bfloat16 pass by default
    ("tpu", "high", "bfloat16_3x", 1e-4),
    ("tpu", "highest", "float32", 1e-5),
])
def test_fp32_rtol_per_backend(platform, setting, precision, rtol):
    assert check.matmul_precision(platform=platform, setting=setting) == precision
    assert check.fp32_rtol(platform=platform, setting=setting) == rtol


def test_trained_tolerance_needs_full_float32():
    assert check.fp32_rtol(trained=True, platform="cpu", setting=None) == 1e-3
    assert check.fp32_rtol(trained=True, platform="gpu", setting="highest") == 1e-3
    with pytest.raises(ValueError, match="fp32_matmuls"):
        check.fp32_rtol(trained=True, platform="gpu", setting=None)
    with pytest.raises(ValueError, match="not a float32"):
        check.fp32_rtol(platform="gpu", setting="F16_F16_F32")
    with pytest.raises(ValueError, match="platforms"):
        check.fp32_rtol(platform="metal")


def test_fp32_matmuls_pins_highest_and_the_tolerance_follows():
    assert jax.config.jax_default_matmul_precision is None
    with check.fp32_matmuls():
        assert jax.config.jax_default_matmul_precision == "highest"
        assert check.fp32_rtol(platform="gpu") == 1e-5
        assert check.fp32_rtol(platform="tpu") == 1e-5
    assert check.fp32_rtol(platform="gpu") == GPU_DEFAULT_RTOL == 5e-3


def test_pinning_reaches_the_compiled_program():
    # jit's cache key holds the setting: inside the pin the dot is traced anew at HIGHEST.
    matmul = jax.jit(jnp.matmul)
    a = jnp.ones((4, 4), jnp.float32)
    assert "HIGHEST" not in matmul.lower(a, a).as_text()
    with check.fp32_matmuls():
        assert "HIGHEST" in matmul.lower(a, a).as_text()


# --- the labs' negative controls exceed the GPU default tolerance ------------------------------

def test_data_parallel_controls_labs_03_and_08():
    params = models.init_mlp(jax.random.key(0), d_model=32, d_hidden=64, n_blocks=2)
    x, y = models.synthetic_regression(jax.random.key(1), n_samples=64, d_model=32)
    batches = models.make_batches(x, y, batch_size=64, n_steps=1)
    optimizer = models.make_optimizer(learning_rate=1e-3)
    mesh = sub_mesh(8, "data")

    def per_device_gradients(**options):
        dp = data.make_data_parallel(models.mse_loss, mesh, optimizer, axis_name="data",
                                     **options)
        return dp.grads(dp.shard(params), *dp.place_batch(*batches[0]))

    with check.fp32_matmuls():
        expected = models.stack_copies(models.reference_gradients(params, *batches[0]), 8)
        assert relative_difference(per_device_gradients(), expected) <= check.fp32_rtol()
        summed = per_device_gradients(reduce="sum")  # lab 03: a sum for the mean, 8 x
        assert relative_difference(summed, expected) > MARGIN * GPU_DEFAULT_RTOL
        unsynced = per_device_gradients(sync_gradients=False)  # labs 03 and 08: no all-reduce
        assert relative_difference(unsynced, expected) > MARGIN * GPU_DEFAULT_RTOL


def test_tensor_parallel_controls_lab_04():
    params = models.init_mlp(jax.random.key(0), d_model=16, d_hidden=32, n_blocks=3)
    x, y = models.synthetic_regression(jax.random.key(1), n_samples=32, d_model=16)
    mesh = sub_mesh(4, "model")

    def grads(**options):
        strategy = tensor.make_tensor_parallel(params, mesh, axis_name="model", **options)
        return strategy.grads(strategy.shard(params), x, y)

    def left_out(v, axis_name):
        return v

    with check.fp32_matmuls():
        reference = jax.grad(models.mse_loss)(params, x, y)
        assert relative_difference(grads(), reference) <= check.fp32_rtol()
        bare_psum = tensor.MegatronOps(copy=left_out, reduce=jax.lax.psum)
        wrong = grads(ops=bare_psum, check_vma=False)
        assert relative_difference(wrong[-1]["w2"], reference[-1]["w2"]) > MARGIN * GPU_DEFAULT_RTOL
        no_f = tensor.MEGATRON._replace(copy=left_out)
        assert (relative_difference(grads(ops=no_f, check_vma=False), reference)
                > MARGIN * GPU_DEFAULT_RTOL)


def test_pipeline_controls_lab_05():
    params = models.init_mlp(jax.random.key(0), d_model=16, d_hidden=32, n_blocks=8)
    x, y = models.synthetic_regression(jax.random.key(1), n_samples=32, d_model=16)
    mesh = sub_mesh(4, "stage")

    def grads(schedule):
        strategy = pipeline.make_pipeline_parallel(params, mesh, axis_name="stage",
                                                   schedule=schedule)
        return strategy.grads(strategy.shard(params), x, y)

    good = make_schedule(4, 4, "gpipe")
    reordered = good.microbatch.copy()
    backward = good.kind[:, 1] == BACKWARD
    reordered[backward, 1] = reordered[backward, 1][::-1]
    dropped = good.kind.copy()
    dropped[(good.kind[:, 0] == FORWARD) & (good.microbatch[:, 0] == 1), 0] = (
        IDLE)
    with check.fp32_matmuls():
        reference = jax.grad(models.mse_loss)(params, x, y)
        assert relative_difference(grads(good), reference) <= check.fp32_rtol()
        for broken in (dataclasses.replace(good, microbatch=reordered),
                       dataclasses.replace(good, kind=dropped)):
            assert relative_difference(grads(broken), reference) > MARGIN * GPU_DEFAULT_RTOL


def test_kv_cache_controls_lab_11():
    params = decode.init_params(jax.random.key(0), vocab_size=256, d_model=64, n_heads=4,
                                d_hidden=128, n_layers=2, max_len=64)
    prompt = jax.random.randint(jax.random.key(1), (2, 4), 0, 256)

    def logits_with_cache(sequence, *, keep_cache=True, position_shift=0):
        logits, cache = decode.prefill(params, prompt, cache_len=16)
        rows = [logits]
        for position in range(prompt.shape[1], sequence.shape[1]):
            step_logits, new_cache = decode.decode_step(params, cache, sequence[:, position],
                                                        position + position_shift)
            cache = new_cache if keep_cache else cache
            rows.append(step_logits[:, None])
        return jnp.concatenate(rows, axis=1)

    with check.fp32_matmuls():
        sequence = jnp.concatenate([prompt, decode.generate(params, prompt, 4)], axis=1)
        expected = decode.forward(params, sequence)
        assert relative_difference(logits_with_cache(sequence), expected) <= check.fp32_rtol()
        for bug in (dict(keep_cache=False), dict(position_shift=1)):
            assert (relative_difference(logits_with_cache(sequence, **bug), expected)
                    > MARGIN * GPU_DEFAULT_RTOL)


def test_devices_are_simulated_cpus():
    # the controls above ran where the labs' stored outputs come from
    assert DEVICES[0].platform == "cpu"
    assert np.isfinite(GPU_DEFAULT_RTOL)
