"""Pipeline parallelism: schedules against hand-derived values, GPipe and 1F1B training against
the single-device reference, the ppermutes counted from the compiled program, input checks."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import jax
import numpy as np
import pytest

from clusterlab.analytic import costmodel
from clusterlab.analytic.schedule import BACKWARD, FORWARD, IDLE, make_schedule
from clusterlab.course import check
from clusterlab.device import hlo, models, parallel
from clusterlab.device.parallel import pipeline
from conftest import reference_run, run_python, sub_mesh

AXIS = "stage"
D, H, BLOCKS, BATCH, STEPS = 8, 16, 8, 16, 3


def test_schedules_import_without_jax_and_are_the_executors():
    # plotting and the analytical chapters draw schedules; they must not pull in JAX for it
    result = run_python("-c", "import sys, clusterlab.analytic.schedule as s; "
                        "s.make_schedule(4, 8, '1f1b'); print('jax' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    # one path: the schedules are schedule's; the executor does not offer them again
    assert make_schedule.__module__ == "clusterlab.analytic.schedule"
    assert not {"Schedule", "make_schedule", "FORWARD"} & set(pipeline.__all__)


@pytest.fixture(scope="module")
def case():
    params, batches, _, reference, losses = reference_run(
        d_model=D, d_hidden=H, n_blocks=BLOCKS, batch=BATCH, steps=STEPS, n_samples=2 * BATCH)
    return params, batches, reference, losses


@pytest.mark.parametrize("stages, microbatches, schedule", [
    (2, 4, "gpipe"), (4, 4, "1f1b"), (8, 2, "gpipe"), (2, 1, "1f1b")])
def test_pipeline_equals_single_device(case, stages, microbatches, schedule):
    params, batches, reference, losses = case
    strategy = pipeline.make_pipeline_parallel(params, sub_mesh(stages, AXIS), axis_name=AXIS,
                                               schedule=schedule, microbatches=microbatches)
    assert strategy.name == f"pipeline/{schedule}"
    trained, pp_losses = parallel.train(strategy, params, batches)
    assert models.max_abs_diff(trained, reference) < 1e-6
    np.testing.assert_allclose(pp_losses, losses, rtol=1e-5, atol=1e-6)


def _pipeline_grads(params, x, y, schedule):
    strategy = pipeline.make_pipeline_parallel(params, sub_mesh(schedule.stages, AXIS),
                                               axis_name=AXIS, schedule=schedule)
    return strategy.grads(strategy.shard(params), *strategy.place_batch(x, y))


def _reference_grads(params, x, y):
    return jax.device_get(jax.grad(models.mse_loss)(params, x, y))


@pytest.mark.parametrize("stages, microbatches, schedule", [
    (2, 4, "gpipe"), (4, 8, "1f1b"), (8, 4, "1f1b"), (8, 2, "gpipe")])
def test_gradients_equal_single_device(case, stages, microbatches, schedule):
    params, batches = case[:2]
    x, y = batches[0]
    grads = _pipeline_grads(params, x, y, make_schedule(stages, microbatches, schedule))
    check.verify_close("gradients", grads, _reference_grads(params, x, y), rtol=1e-5)


def _reversed_backwards(schedule, stage):
    """Stage ``stage`` runs its backward passes in the reverse order of its neighbours'."""
    microbatch = schedule.microbatch.copy()
    backward = schedule.kind[:, stage] == BACKWARD
    microbatch[backward, stage] = microbatch[backward, stage][::-1]
    return dataclasses.replace(schedule, microbatch=microbatch)


def _dropped_forward(schedule, stage, microbatch):
    """Stage ``stage`` skips one forward pass: that micro-batch's activation is never sent."""
    kind = schedule.kind.copy()
    kind[(kind[:, stage] == FORWARD) & (schedule.microbatch[:, stage] == microbatch),
         stage] = IDLE
    return dataclasses.replace(schedule, kind=kind)


@pytest.mark.parametrize("bug", ["backwards in reverse order", "a forward (and its send) dropped"])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_gradient_check_catches_a_broken_schedule(case, bug, schedule):
    params, batches = case[:2]
    x, y = batches[0]
    good = make_schedule(4, 4, schedule)
    broken = (_reversed_backwards(good, 1) if bug.startswith("backwards")
              else _dropped_forward(good, 0, 1))
    assert not np.array_equal(broken.kind, good.kind) or not np.array_equal(
        broken.microbatch, good.microbatch)
    reference = _reference_grads(params, x, y)
    check.verify_catches(bug, lambda: check.verify_close(
        "gradients", _pipeline_grads(params, x, y, broken), reference, rtol=1e-5))


def test_automatic_sharding_equals_single_device(case):
    params, batches, reference, losses = case
    strategy = pipeline.make_pipeline_parallel(params, sub_mesh(4, AXIS), axis_name=AXIS,
                                               automatic=True)
    trained, auto_losses = parallel.train(strategy, params, batches)
    x, y = batches[0]
    check.verify_close("gradients", strategy.grads(strategy.shard(params), x, y),
                       _reference_grads(params, x, y), rtol=1e-5)
    assert models.max_abs_diff(trained, reference) < 1e-6
    np.testing.assert_allclose(auto_losses, losses, rtol=1e-5, atol=1e-6)


def test_gpipe_schedule_by_hand():
    # p = 2, m = 2: F0 F1 .. B0 B1 on stage 1 one slot later, 2(m+p-1) = 6 slots.
    schedule = make_schedule(2, 2, "gpipe")
    assert schedule.render().splitlines() == ["stage 0: F0 F1       B0 B1",
                                              "stage 1:    F0 F1 B0 B1   "]
    assert schedule.idle_fraction == pytest.approx(1 / 3)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages, microbatches", [(1, 3), (2, 1), (4, 8), (8, 4), (3, 7)])
def test_idle_fraction_from_schedule_equals_formula(schedule, stages, microbatches):
    table = make_schedule(stages, microbatches, schedule)
    assert table.slots == 2 * (microbatches + stages - 1)
    assert np.all(np.sum(table.kind != IDLE, axis=0) == 2 * microbatches)
    assert table.idle_fraction == pytest.approx(
        costmodel.pipeline_bubble_fraction(stages, microbatches, schedule))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages, microbatches", [(4, 8), (4, 2), (8, 16), (2, 5)])
def test_held_activations_from_schedule(schedule, stages, microbatches):
    table = make_schedule(stages, microbatches, schedule)
    peak = table.held_microbatches().max(axis=0)
    expected = [costmodel.pipeline_activation_microbatches(stages, microbatches, schedule,
                                                           stage=s) for s in range(stages)]
    assert list(peak) == expected
    assert table.stash_slots()[0] == expected[0]  # the executor's stash: m or min(p, m)


def test_bubble_values_by_hand():
    assert costmodel.pipeline_bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert costmodel.pipeline_bubble_fraction(4, 8, "1f1b") == pytest.approx(3 / 11)
    assert costmodel.pipeline_bubble_fraction(1, 5) == 0
    assert costmodel.pipeline_activation_microbatches(4, 8, "gpipe") == 8
    assert costmodel.pipeline_activation_microbatches(4, 8, "1f1b") == 4
    assert costmodel.pipeline_activation_microbatches(4, 8, "1f1b", stage=3) == 1
    assert costmodel.pipeline_bubble_fraction(4, 8, "interleaved", virtual_stages=2) == \
        pytest.approx(3 / 19)
    assert costmodel.pipeline_bubble_fraction(4, 8, "interleaved") == pytest.approx(3 / 11)
    with pytest.raises(ValueError, match="Unknown pipeline schedule 'zigzag'"):
        costmodel.pipeline_bubble_fraction(4, 8, "zigzag")


def test_stash_bytes():
    assert pipeline.stash_bytes(make_schedule(4, 8, "gpipe"), 64, 16) == 8 * 8 * 16 * 4
    assert pipeline.stash_bytes(make_schedule(4, 8, "1f1b"), 64, 16) == 4 * 8 * 16 * 4


def test_ppermutes_counted_from_compiled_program(case):
    params, batches = case[:2]
    x, y = batches[0]
    stages, m = 4, 4
    schedule = make_schedule(stages, m, "1f1b")
    strategy = pipeline.make_pipeline_parallel(params, sub_mesh(stages, AXIS), axis_name=AXIS,
                                               schedule=schedule)
    ops = hlo.executed_collectives(strategy.step, *strategy.init(params),
                                           *strategy.place_batch(x, y))
    permutes = [op for op in ops if op.kind == "collective-permute"]
    # one forward and one backward ppermute of a micro-batch f32[B/m, D] per slot, and one f32[1]
    # that brings the loss from the last stage to where the step returns it
    micro_bytes = BATCH // m * D * 4
    assert sum(op.bytes == micro_bytes for op in permutes) == 2 * schedule.slots
    assert sorted(op.bytes for op in permutes if op.bytes != micro_bytes) == [4]


def test_layers_must_divide(case):
    params, batches = case[:2]
    with pytest.raises(ValueError, match="n_blocks = 8 does not divide by 3 stages"):
        pipeline.make_pipeline_parallel(params, sub_mesh(3, AXIS), axis_name=AXIS,
                                        microbatches=2)


def test_batch_must_divide(case):
    params, batches = case[:2]
    with pytest.raises(ValueError, match="16 examples does not split into 3 equal"):
        parallel.train(pipeline.make_pipeline_parallel(params, sub_mesh(2, AXIS),
                                                       axis_name=AXIS, microbatches=3),
                       params, batches)


def test_mesh_must_match_schedule(case):
    params = case[0]
    with pytest.raises(ValueError, match="4 stages but mesh axis"):
        pipeline.make_pipeline_parallel(params, sub_mesh(2, AXIS), axis_name=AXIS,
                                        schedule=make_schedule(4, 2))
    with pytest.raises(ValueError, match="needs microbatches"):
        pipeline.make_pipeline_parallel(params, sub_mesh(2, AXIS), axis_name=AXIS)
    with pytest.raises(ValueError, match="contradicts the schedule's 2"):
        pipeline.make_pipeline_parallel(params, sub_mesh(2, AXIS), axis_name=AXIS,
                                        schedule=make_schedule(2, 2), microbatches=4)
    with pytest.raises(ValueError, match="automatic=True runs no schedule"):
        pipeline.make_pipeline_parallel(params, sub_mesh(2, AXIS), axis_name=AXIS,
                                        automatic=True, microbatches=2)


def test_lockstep_time():
    gpipe = make_schedule(4, 8, "gpipe")
    one_f_one_b = make_schedule(4, 8, "1f1b")
    assert gpipe.lockstep_time_s(1.0, 1.0) == one_f_one_b.lockstep_time_s(1.0, 1.0) == 22
    assert gpipe.lockstep_time_s(1.0, 2.0) == pytest.approx(11 * 3)
    # 1F1B: 4 forward-only warm-up slots, then 18 slots with a backward somewhere
    assert one_f_one_b.lockstep_time_s(1.0, 2.0) == pytest.approx(4 * 1 + 18 * 2)


def test_interleaved_schedule_by_hand():
    # p = 2, v = 2, m = 2: virtual stages 0 (device 0), 1 (device 1), 2 (device 0), 3 (device 1);
    # 2(v m + p - 1) = 10 slots of half a pass, 4 idle of 20.
    schedule = make_schedule(2, 2, "interleaved", virtual_stages=2)
    assert schedule.render().splitlines() == [
        "stage 0: F0.0 F1.0 F0.1 F1.1      B0.1      B1.1 B0.0 B1.0",
        "stage 1:      F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 B0.0 B1.0     "]
    assert schedule.idle_fraction == pytest.approx(1 / 5)


@pytest.mark.parametrize("stages, microbatches, virtual_stages", [
    (2, 2, 2), (4, 4, 2), (4, 8, 2), (4, 8, 4), (8, 16, 3), (3, 7, 1), (1, 3, 2)])
def test_interleaved_idle_fraction_equals_formula_exactly(stages, microbatches, virtual_stages):
    p, m, v = stages, microbatches, virtual_stages
    table = make_schedule(p, m, "interleaved", virtual_stages=v)
    assert table.slots == 2 * (v * m + p - 1)
    assert np.all(np.sum(table.kind != IDLE, axis=0) == 2 * v * m)
    idle = Fraction(int(np.sum(table.kind == IDLE)), table.kind.size)
    assert idle == Fraction(p - 1, v * m + p - 1)
    assert table.idle_fraction == pytest.approx(
        costmodel.pipeline_bubble_fraction(p, m, "interleaved", virtual_stages=v), abs=1e-15)


@pytest.mark.parametrize("stages, microbatches, virtual_stages", [(4, 8, 2), (3, 6, 3)])
def test_interleaved_schedule_respects_dependencies(stages, microbatches, virtual_stages):
    p, v = stages, virtual_stages
    table = make_schedule(p, microbatches, "interleaved", virtual_stages=v)
    when = {}  # (kind, micro-batch, virtual stage) -> slot; each exactly once
    for t, s in zip(*np.nonzero(table.kind != IDLE)):
        key = (int(table.kind[t, s]), int(table.microbatch[t, s]), int(table.chunk[t, s]) * p + s)
        assert key not in when
        when[key] = t
    assert len(when) == 2 * microbatches * p * v
    last = p * v - 1
    for (kind, i, j), t in when.items():
        if kind == FORWARD and j > 0:
            assert when[FORWARD, i, j - 1] < t
        if kind == BACKWARD:
            assert when[FORWARD, i, j] < t
            assert j == last or when[BACKWARD, i, j + 1] < t


def test_interleaved_lockstep_time_in_passes():
    # every slot is 1/v of a pass: 2(v m + p - 1) slots of 1/2 s when a pass takes 1 s
    table = make_schedule(4, 8, "interleaved", virtual_stages=2)
    assert table.lockstep_time_s(1.0, 1.0) == pytest.approx(2 * (2 * 8 + 3) / 2)


def test_interleaved_errors_name_the_fix(case):
    with pytest.raises(ValueError, match="m = 6 is not a multiple of 4. Use m = 8"):
        make_schedule(4, 6, "interleaved", virtual_stages=2)
    with pytest.raises(ValueError, match="m = 6 is not a multiple of 4"):
        costmodel.pipeline_bubble_fraction(4, 6, "interleaved", virtual_stages=2)
    with pytest.raises(ValueError, match="needs schedule='interleaved'"):
        costmodel.pipeline_bubble_fraction(4, 8, "1f1b", virtual_stages=2)
    with pytest.raises(ValueError, match="virtual_stages must be a positive integer"):
        make_schedule(4, 8, "interleaved", virtual_stages=0)
    with pytest.raises(ValueError, match="modelled for 'gpipe' and '1f1b'"):
        costmodel.pipeline_activation_microbatches(4, 8, "interleaved")
    interleaved = make_schedule(2, 2, "interleaved", virtual_stages=2)
    with pytest.raises(ValueError, match="one model chunk per device"):
        pipeline.make_pipeline_parallel(case[0], sub_mesh(2, AXIS), axis_name=AXIS,
                                        schedule=interleaved)
    with pytest.raises(ValueError, match="one model chunk per device"):
        interleaved.stash_slots()
