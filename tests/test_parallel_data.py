"""Unit tests of data parallelism (clusterlab.device.parallel.data), the gradient all-reduce and the
program inspection in clusterlab.device.collectives, and the data-parallel cost model."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from clusterlab.analytic import costmodel
from clusterlab.course import check
from clusterlab.device import collectives, devices, hlo, models, parallel
from clusterlab.device.parallel import data
from conftest import reference_run, sub_mesh

D, H, BLOCKS, BATCH, STEPS = 16, 32, 2, 32, 4
AXIS = "data"
# the three forms side by side: two hand-written, one left to the compiler
FORMS = {"pmap": {"form": "pmap"}, "shard_map": {}, "jit": {"automatic": True}}


def make(form, optimizer, mesh, **options):
    return data.make_data_parallel(models.mse_loss, mesh, optimizer, axis_name=AXIS,
                                   **FORMS[form], **options)


@pytest.fixture(scope="module")
def problem():
    """Initial parameters, batches, optimizer and the single-device reference run."""
    return reference_run(d_model=D, d_hidden=H, n_blocks=BLOCKS, batch=BATCH, steps=STEPS,
                         n_samples=96, learning_rate=1e-2)


def max_relative_diff(trained, reference) -> float:
    scale = max(float(np.max(np.abs(np.asarray(leaf)))) for leaf in jax.tree.leaves(reference))
    return models.max_abs_diff(trained, reference) / scale


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("form", FORMS)
def test_each_form_equals_the_single_device_run(problem, form, n):
    params, batches, optimizer, reference, ref_losses = problem
    dp = make(form, optimizer, sub_mesh(n, AXIS))
    trained, losses = parallel.train(dp, params, batches)
    assert dp.n_devices == n and dp.axis_names == (AXIS,) and dp.automatic == (form == "jit")
    assert all(isinstance(leaf, np.ndarray) for leaf in jax.tree.leaves(trained))  # on the host
    assert max_relative_diff(trained, reference) < 1e-5
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    # and it did train: the parameters moved far more than the tolerance
    assert max_relative_diff(params, reference) > 1e-3


def test_bucketed_all_reduce_equals_the_single_device_run(problem):
    params, batches, optimizer, reference, _ = problem
    for form in ("pmap", "shard_map"):
        dp = make(form, optimizer, sub_mesh(4, AXIS), bucket_bytes=1000)
        trained, _ = parallel.train(dp, params, batches)
        assert max_relative_diff(trained, reference) < 1e-5


def test_without_gradient_sync_the_replicas_drift(problem):
    params, batches, optimizer, reference, _ = problem
    dp = make("shard_map", optimizer, sub_mesh(4, AXIS), sync_gradients=False)
    state = dp.init(params)
    x, y = dp.place_batch(*batches[0])
    new_params, _, _ = dp.step(*state, x, y)
    # out_specs P() claims replication; without the all-reduce the shards differ
    w1 = new_params[0]["w1"]
    first, second = (np.asarray(s.data) for s in w1.addressable_shards[:2])
    assert np.max(np.abs(first - second)) > 1e-6
    assert "all-reduce" not in hlo.summarize(
        [op for op in hlo.compiled_collectives(dp.step, *state, x, y) if op.bytes > 4])


def compiled_step(form: str, n: int, problem, **options):
    params, batches, optimizer, _, _ = problem
    dp = make(form, optimizer, sub_mesh(n, AXIS), **options)
    state = dp.init(params)
    return dp, hlo.compiled_collectives(dp.step, *state, *dp.place_batch(*batches[0]))


@pytest.mark.parametrize("form", FORMS)
def test_bytes_all_reduced_per_step_are_the_gradient(problem, form):
    params = problem[0]
    gradient_bytes = data.gradient_bytes(params)
    assert gradient_bytes == 4 * BLOCKS * (2 * D * H + H + D)
    for n in (2, 8):
        _, ops = compiled_step(form, n, problem)
        summary = hlo.summarize(ops)
        assert set(summary) == {"all-reduce"}
        # the gradients, plus 4 bytes: the f32 loss averaged for reporting
        assert summary["all-reduce"].total_bytes == gradient_bytes + 4
        per_device = costmodel.data_parallel_bytes_per_step(
            summary["all-reduce"].total_bytes - 4, 1, n)
        assert per_device == pytest.approx(2 * (n - 1) / n * gradient_bytes)


def test_xla_combines_the_per_leaf_all_reduces(problem):
    params = problem[0]
    _, combined = compiled_step("shard_map", 4, problem)
    _, separate = compiled_step("shard_map", 4, problem, combine_all_reduces=False)
    assert len(combined) == 1  # one tuple all-reduce: XLA's combiner did the bucketing
    n_leaves = len(jax.tree.leaves(params))
    assert len(separate) == n_leaves + 1  # one per gradient leaf, one for the loss
    assert sum(op.bytes for op in separate) == sum(op.bytes for op in combined)
    _, jit_separate = compiled_step("jit", 4, problem, combine_all_reduces=False)
    assert sorted(op.bytes for op in jit_separate) == sorted(op.bytes for op in separate)


@pytest.mark.parametrize("bucket_bytes", [256, 4096, 10_000, 1 << 20])
def test_bucketing_gives_ceil_total_over_bucket_all_reduces(problem, bucket_bytes):
    gradient_bytes = data.gradient_bytes(problem[0])
    _, ops = compiled_step("shard_map", 4, problem, bucket_bytes=bucket_bytes,
                           combine_all_reduces=False)
    buckets = [op.bytes for op in ops if op.shape != "f32[]"]  # the loss is f32[]
    assert len(buckets) == math.ceil(gradient_bytes / bucket_bytes)
    assert sorted(buckets) == sorted(costmodel.gradient_buckets(gradient_bytes, bucket_bytes))


def test_batch_must_divide_over_the_devices(problem):
    params, batches, optimizer, _, _ = problem
    x, y = batches[0]
    for form in FORMS:
        dp = make(form, optimizer, sub_mesh(8, AXIS))
        with pytest.raises(ValueError, match=r"30 examples .* 8 data-parallel devices.*"
                                             r"multiple of 8 \(e\.g\. 32\)"):
            dp.place_batch(x[:30], y[:30])
        with pytest.raises(ValueError, match="multiple of 8"):
            parallel.train(dp, params, [(x[:12], y[:12])])


def test_bad_configurations_are_named():
    opt = models.make_optimizer()
    with pytest.raises(ValueError, match="Unknown data-parallel form 'ddp'"):
        data.make_data_parallel(models.mse_loss, sub_mesh(2, AXIS), opt, axis_name=AXIS,
                                form="ddp")
    with pytest.raises(ValueError, match="'batch' is not in the mesh"):
        data.make_data_parallel(models.mse_loss, sub_mesh(2, AXIS), opt, axis_name="batch",
                                automatic=True)
    mesh_2d = devices.mesh((2, 2), (AXIS, "model"), jax.devices()[:4])
    with pytest.raises(ValueError, match="pmap form runs over one axis"):
        data.make_data_parallel(models.mse_loss, mesh_2d, opt, axis_name=AXIS, form="pmap")
    with pytest.raises(ValueError, match="automatic=True leaves the all-reduce"):
        make("jit", opt, sub_mesh(2, AXIS), reduce="sum")
    with pytest.raises(ValueError, match="pmap form takes no"):
        make("pmap", opt, sub_mesh(2, AXIS), sync_gradients=False)


def test_all_reduce_gradients_mean_and_buckets():
    mesh = sub_mesh(4, AXIS)
    tree = {"a": jnp.arange(4 * 6, dtype=jnp.float32).reshape(4, 6),
            "b": jnp.arange(4 * 3, dtype=jnp.float32).reshape(4, 3) * 10}
    expected = jax.tree.map(lambda leaf: jnp.broadcast_to(leaf.mean(0), leaf.shape), tree)

    def run(bucket_bytes):
        fn = jax.jit(jax.shard_map(
            lambda t: collectives.all_reduce_gradients(t, AXIS, bucket_bytes=bucket_bytes),
            mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS)))
        return fn(tree)

    for bucket_bytes in (None, 4, 12, 20, 1000):
        out = run(bucket_bytes)
        for key in tree:
            np.testing.assert_allclose(out[key], expected[key], rtol=1e-6)
    with pytest.raises(ValueError, match="multiple of the gradients' item size"):
        run(6)
    with pytest.raises(ValueError, match="share one dtype"):
        jax.jit(jax.shard_map(
            lambda t: collectives.all_reduce_gradients(t, AXIS, bucket_bytes=8),
            mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS)))(
                {"a": jnp.ones((4, 2)), "b": jnp.ones((4, 2), jnp.bfloat16)})


def test_all_reduce_gradients_skips_a_size_one_axis():
    mesh = sub_mesh(1, AXIS)
    fn = jax.jit(jax.shard_map(lambda g: collectives.all_reduce_gradients(g, AXIS),
                               mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS)))
    assert hlo.compiled_collectives(fn, jnp.ones(4)) == []


# --- Program inspection --------------------------------------------------------------------

def test_psum_on_eight_devices_is_one_all_reduce_of_the_block():
    mesh = sub_mesh(8, "i")
    x = devices.shard(jnp.ones((8, 128), jnp.float32), mesh, P("i"))
    total = jax.jit(jax.shard_map(lambda b: jax.lax.psum(b, "i"), mesh=mesh, in_specs=P("i"),
                                  out_specs=P("i")))
    ops = hlo.compiled_collectives(total, x)
    assert ops == [hlo.CollectiveOp("all-reduce", 512, "f32[1,128]{1,0}")]
    assert hlo.summarize(ops) == {"all-reduce": hlo.CollectiveSummary(1, 512)}


def test_each_collective_kind_and_its_result_bytes():
    mesh = sub_mesh(4, "i")
    x = devices.shard(jnp.ones((4 * 8, 16), jnp.float32), mesh, P("i"))  # block f32[8, 16]
    ring = [(i, (i + 1) % 4) for i in range(4)]
    fn = jax.jit(jax.shard_map(
        lambda b: (jax.lax.all_gather(b, "i", tiled=True),
                   jax.lax.psum_scatter(b, "i", tiled=True),
                   jax.lax.ppermute(b, "i", ring),
                   jax.lax.all_to_all(b, "i", 0, 0, tiled=True)),
        mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    summary = hlo.summarize(hlo.compiled_collectives(fn, x))
    block = 8 * 16 * 4
    assert summary == {"all-gather": (1, 4 * block), "reduce-scatter": (1, block // 4),
                       "collective-permute": (1, block), "all-to-all": (1, block)}
    assert hlo.hlo_op_count(fn, x, op="all-gather") == 1


def test_jit_inserts_the_all_reduce_of_a_sharded_sum():
    mesh = sub_mesh(8, "i")
    x = devices.shard(jnp.ones((8, 128), jnp.float32), mesh, P("i"))
    ops = hlo.compiled_collectives(jax.jit(lambda a: a.sum(axis=0)), x)
    assert [(op.kind, op.bytes) for op in ops] == [("all-reduce", 128 * 4)]


def test_shape_bytes():
    assert hlo.shape_bytes("f32[1024]{0}") == 4096
    assert hlo.shape_bytes("f32[]") == 4
    assert hlo.shape_bytes("bf16[8,128]{1,0}") == 2048
    assert hlo.shape_bytes("(f32[8,128]{1,0}, /*index=1*/s32[2]{0}, pred[3])") == 4096 + 11
    assert hlo.shape_bytes("f8e4m3fn[16]") == 16
    assert hlo.shape_bytes("f32[<=8]") == 32
    assert hlo.shape_bytes("token[]") == 0
    with pytest.raises(ValueError, match="Unknown HLO element type"):
        hlo.shape_bytes("q99[4]")


GPU_STYLE_HLO = """\
HloModule jit_step, entry_computation_layout={(f32[256]{0})->f32[256]{0}}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(f32[] %a, f32[] %b)
}

ENTRY %main (p: f32[256]) -> f32[256] {
  %p = f32[256]{0} parameter(0)
  %ar-start = f32[256]{0} all-reduce-start(f32[256]{0} %p), replica_groups={{0,1}}, to_apply=%add
  %ar-done = f32[256]{0} all-reduce-done(f32[256]{0} %ar-start)
  %ag-start = (f32[256]{0}, f32[512]{0}) all-gather-start(f32[256]{0} %ar-done), dimensions={0}
  %ag-done = f32[512]{0} all-gather-done((f32[256]{0}, f32[512]{0}) %ag-start)
  ROOT %cp = f32[256]{0} collective-permute(f32[256]{0} %ar-done), source_target_pairs={{0,1},{1,0}}
}
"""


def test_async_pairs_count_once_with_the_result_bytes():
    ops = hlo.collectives_in_text(GPU_STYLE_HLO)
    assert [(op.kind, op.bytes) for op in ops] == [
        ("all-reduce", 1024), ("all-gather", 2048), ("collective-permute", 1024)]
    opcodes = [ins.opcode for ins in hlo.hlo_instructions(GPU_STYLE_HLO)]
    assert opcodes.count("all-reduce-start") == 1 and "add" in opcodes


def test_compiled_collectives_needs_jit():
    with pytest.raises(TypeError, match="jax.jit"):
        hlo.compiled_collectives(jnp.sum, jnp.ones(4))


# --- Cost model ----------------------------------------------------------------------------

def test_data_parallel_bytes_per_step():
    assert costmodel.data_parallel_bytes_per_step(1000, 4, 8) == pytest.approx(7000.0)
    assert costmodel.data_parallel_bytes_per_step(1000, 2, 2) == pytest.approx(2000.0)
    assert costmodel.data_parallel_bytes_per_step(1000, 4, 1) == 0.0
    # the same as ZeRO stage 0
    assert costmodel.data_parallel_bytes_per_step(1e9, 2, 64) == pytest.approx(
        costmodel.sharded_data_parallel_bytes_per_step(1e9, 2, 64, 0))
    with pytest.raises(ValueError, match="n_params"):
        costmodel.data_parallel_bytes_per_step(0, 4, 8)


def test_gradient_buckets():
    assert costmodel.gradient_buckets(10, 4) == [4, 4, 2]
    assert costmodel.gradient_buckets(8, 4) == [4, 4]
    assert costmodel.gradient_buckets(3, 100) == [3]
    with pytest.raises(ValueError, match="bucket_bytes"):
        costmodel.gradient_buckets(10, 0)


def test_gradient_all_reduce_alone(problem):
    params = problem[0]
    mesh = sub_mesh(4, AXIS)
    grads = jax.device_put(params, jax.sharding.NamedSharding(mesh, P()))
    for bucket_bytes in (None, 8192):
        fn = data.make_gradient_all_reduce(mesh, axis_name=AXIS, bucket_bytes=bucket_bytes,
                                           combine_all_reduces=False)
        assert models.max_abs_diff(fn(grads), params) < 1e-6  # the mean of 4 equal copies
        ops = hlo.compiled_collectives(fn, grads)
        expected = (len(jax.tree.leaves(params)) if bucket_bytes is None
                    else math.ceil(data.gradient_bytes(params) / bucket_bytes))
        assert len(ops) == expected
        assert sum(op.bytes for op in ops) == data.gradient_bytes(params)


# --- Gradients against one device: where a wrong factor of p shows ---------------------------

def _gradients(dp, problem):
    params, batches = problem[0], problem[1]
    state = dp.init(params)
    return dp.grads(state[0], *dp.place_batch(*batches[0]))


@pytest.mark.parametrize("n", [2, 8])
@pytest.mark.parametrize("form", FORMS)
def test_each_devices_gradient_equals_the_single_device_gradient(problem, form, n):
    params, batches = problem[0], problem[1]
    dp = make(form, problem[2], sub_mesh(n, AXIS))
    reference = models.reference_gradients(params, *batches[0])
    per_device = _gradients(dp, problem)
    assert jax.tree.leaves(per_device)[0].shape[0] == n  # one row per device
    check.verify_close(f"{form} on {n}", per_device, models.stack_copies(reference, n),
                       rtol=1e-5)


@pytest.mark.parametrize("form", ["pmap", "shard_map"])
def test_summed_gradients_are_caught_p_times_too_large(problem, form):
    params, batches = problem[0], problem[1]
    n = 4
    dp = make(form, problem[2], sub_mesh(n, AXIS), reduce="sum")
    reference = models.reference_gradients(params, *batches[0])
    per_device = _gradients(dp, problem)
    caught = check.verify_catches("sum for mean", lambda: check.verify_close(
        "gradients", per_device, models.stack_copies(reference, n), rtol=1e-5))
    assert "relative difference 3.0e+00" in str(caught)  # (p - 1): p times the mean
    for got, want in zip(jax.tree.leaves(per_device), jax.tree.leaves(reference)):
        np.testing.assert_allclose(got, n * np.broadcast_to(want, got.shape), rtol=1e-4,
                                   atol=1e-6)


def test_unsynchronized_gradients_are_caught(problem):
    params, batches = problem[0], problem[1]
    dp = make("shard_map", problem[2], sub_mesh(4, AXIS), sync_gradients=False)
    reference = models.reference_gradients(params, *batches[0])
    per_device = _gradients(dp, problem)
    check.verify_catches("no gradient sync", lambda: check.verify_close(
        "gradients", per_device, models.stack_copies(reference, 4), rtol=1e-5))
    rows = jax.tree.leaves(per_device)[0]
    assert np.max(np.abs(rows[0] - rows[1])) > 1e-3  # each device kept its own slice's


def test_sgd_training_equals_one_device_and_sees_a_sum():
    """Plain SGD, unlike Adam, passes a gradient's scale into the parameters."""
    params, batches, optimizer, reference, _ = reference_run(
        d_model=D, d_hidden=H, n_blocks=BLOCKS, batch=BATCH, steps=3, n_samples=96)
    sgd = optax.sgd(0.5)
    reference, _ = models.reference_train(params, batches, optimizer=sgd)
    mesh = sub_mesh(4, AXIS)
    for reduce in ("mean", "sum"):
        dp = make("shard_map", sgd, mesh, reduce=reduce)
        trained, _ = parallel.train(dp, params, batches)
        check_it = lambda: check.verify_close("SGD", trained, reference, rtol=1e-5)  # noqa: E731
        if reduce == "mean":
            check_it()
        else:
            check.verify_catches("sum for mean under SGD", check_it)


def test_reduce_must_be_mean_or_sum():
    with pytest.raises(ValueError, match="reduce must be 'mean'.*got 'avg'"):
        make("shard_map", models.make_optimizer(), sub_mesh(2, AXIS), reduce="avg")


def test_replication_check_rejects_a_step_without_the_all_reduce(problem):
    """check_vma=True is what lets the synced step claim replicated parameters (out_specs P())."""
    params, batches, optimizer = problem[0], problem[1], problem[2]
    mesh = sub_mesh(4, AXIS)
    gradients = data._local_gradients(models.mse_loss, (AXIS,), bucket_bytes=None,
                                      sync_gradients=False, reduce="mean")
    unsynced = jax.shard_map(
        data._local_step(optimizer, gradients), mesh=mesh,
        in_specs=(P(), P(), P(AXIS), P(AXIS)), out_specs=(P(), P(), P()))
    dp = make("shard_map", optimizer, mesh)
    state, batch = dp.init(params), dp.place_batch(*batches[0])
    with pytest.raises(ValueError, match="out_specs"):
        jax.jit(unsynced)(*state, *batch)
    dp.step(*state, *batch)  # the synced step passes the same check


def test_a_tuple_of_axes_reduces_over_both_as_one_data_axis(problem):
    """Data parallelism over ("hosts", "devices"): what the multi-host example runs."""
    params, batches, optimizer, reference, ref_losses = problem
    mesh = devices.mesh((2, 4), ("hosts", "devices"), jax.devices()[:8])
    dp = data.make_data_parallel(models.mse_loss, mesh, optimizer, axis_name=("hosts", "devices"))
    assert dp.n_devices == 8 and dp.axis_names == ("hosts", "devices")
    trained, losses = parallel.train(dp, params, batches)
    assert max_relative_diff(trained, reference) < 1e-5
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    summed = data.make_data_parallel(models.mse_loss, mesh, optimizer,
                                     axis_name=("hosts", "devices"), reduce="sum")
    rows = jax.tree.leaves(_gradients(summed, problem))[0]
    want = jax.tree.leaves(models.reference_gradients(params, *batches[0]))[0]
    assert rows.shape[0] == 8
    np.testing.assert_allclose(rows, 8 * np.broadcast_to(want, rows.shape), rtol=1e-4, atol=1e-6)
