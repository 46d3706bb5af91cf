"""The course's pictures draw what the data says: one box per piece of work or per message,
bar heights equal to the memory model."""

from __future__ import annotations

import subprocess
import sys

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from clusterlab.analytic import memory  # noqa: E402
from clusterlab.course import plotting
from clusterlab.analytic.schedule import BACKWARD, FORWARD, IDLE, make_schedule  # noqa: E402


def test_plotting_and_check_import_without_jax():
    # Chapters that plot (and check their numbers) must not pull JAX in: a fresh interpreter.
    code = ("import sys, clusterlab.course.plotting, clusterlab.course.check, clusterlab.analytic.tables; "
            "print('jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _boxes(ax, gid):
    return [p for p in ax.patches if isinstance(p, Rectangle) and p.get_gid() == gid]


@pytest.mark.parametrize("name, stages, microbatches, virtual_stages", [
    ("gpipe", 4, 8, 1), ("1f1b", 3, 5, 1), ("interleaved", 4, 8, 2), ("interleaved", 2, 4, 3)])
def test_pipeline_timeline_draws_every_slot(name, stages, microbatches, virtual_stages):
    schedule = make_schedule(stages, microbatches, name, virtual_stages=virtual_stages)
    ax = plotting.pipeline_timeline(schedule)
    for gid, kind in [("forward", FORWARD), ("backward", BACKWARD),
                      ("idle", IDLE)]:
        boxes = _boxes(ax, gid)
        assert len(boxes) == np.sum(schedule.kind == kind)
        # each box sits at its slot (1/v of a pass wide) on its stage's row
        drawn = sorted((round(b.get_x() * virtual_stages), round(b.get_y() + 0.4))
                       for b in boxes)
        assert drawn == sorted(zip(*map(list, np.nonzero(schedule.kind == kind))))
        assert [b.get_width() for b in boxes] == pytest.approx([1 / virtual_stages] * len(boxes))
    # work boxes are coloured by micro-batch and labelled with it
    for box in _boxes(ax, "forward"):
        t, s = round(box.get_x() * virtual_stages), round(box.get_y() + 0.4)
        colour = plt.get_cmap("tab10")(int(schedule.microbatch[t, s]) % 10)
        assert box.get_facecolor()[:3] == pytest.approx(colour[:3])
    labels = sorted(text.get_text() for text in ax.texts)
    work = schedule.kind != IDLE
    expected = [f"{i}.{c}" if virtual_stages > 1 else f"{i}"
                for i, c in zip(schedule.microbatch[work], schedule.chunk[work])]
    if virtual_stages > plotting.MAX_LABELLED_VIRTUAL_STAGES:
        expected = []  # too narrow to label
    assert labels == sorted(expected)
    assert f"idle {schedule.idle_fraction:.1%}" in ax.get_title()


def test_pipeline_timelines_share_the_longest_time():
    schedules = [make_schedule(4, 8, "gpipe"),
                 make_schedule(4, 8, "interleaved", virtual_stages=2)]
    fig = plotting.pipeline_timelines(schedules)
    assert [ax.get_xlim() for ax in fig.axes[:2]] == [(0, 22), (0, 22)]  # GPipe: 2(m+p-1)
    with pytest.raises(ValueError, match="at least one schedule"):
        plotting.pipeline_timelines([])


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_ring_chunks_sent_is_an_all_reduce(p):
    # Run the drawn steps on numbers: after the reduce-scatter steps device i holds the full sum
    # of chunk i (as collectives.ring_reduce_scatter returns), after the all-gather every device
    # holds every sum.
    sent = plotting.ring_chunks_sent(p)
    assert sent.shape == (2 * (p - 1), p)
    rng = np.random.default_rng(p)
    data = rng.integers(0, 100, size=(p, p))  # data[device, chunk]
    buffers = data.copy()
    for k in range(p - 1):
        outgoing = buffers[np.arange(p), sent[k]].copy()
        for i in range(p):
            buffers[(i + 1) % p, sent[k, i]] += outgoing[i]
    total = data.sum(axis=0)
    assert [buffers[i, i] for i in range(p)] == list(total)
    for k in range(p - 1, 2 * (p - 1)):
        outgoing = buffers[np.arange(p), sent[k]].copy()
        for i in range(p):
            buffers[(i + 1) % p, sent[k, i]] = outgoing[i]
    assert np.array_equal(buffers, np.tile(total, (p, 1)))


def test_ring_chunks_sent_wrong_order_is_caught():
    # negative control for the test above: all-gather steps that pass the wrong chunk leave some
    # device without some sum
    p = 4
    sent = plotting.ring_chunks_sent(p)
    data = np.arange(p * p).reshape(p, p)
    buffers = data.copy()
    for k in range(p - 1):
        outgoing = buffers[np.arange(p), sent[k]].copy()
        for i in range(p):
            buffers[(i + 1) % p, sent[k, i]] += outgoing[i]
    for k in range(p - 1, 2 * (p - 1)):
        wrong = (sent[k] + 1) % p
        outgoing = buffers[np.arange(p), wrong].copy()
        for i in range(p):
            buffers[(i + 1) % p, wrong[i]] = outgoing[i]
    assert not np.array_equal(buffers, np.tile(data.sum(axis=0), (p, 1)))


def test_ring_all_reduce_steps_draws_every_message():
    p = 4
    ax = plotting.ring_all_reduce_steps(p)
    sent = plotting.ring_chunks_sent(p)
    assert len(_boxes(ax, "reduce-scatter")) == len(_boxes(ax, "all-gather")) == p * (p - 1)
    drawn = {(round(b.get_x()), round(b.get_y() + 0.4)): b
             for b in _boxes(ax, "reduce-scatter") + _boxes(ax, "all-gather")}
    texts = {(int(t.get_position()[0] - 0.5), int(t.get_position()[1])): t.get_text()
             for t in ax.texts}
    for (k, i), box in drawn.items():
        colour = plt.get_cmap("tab10")(int(sent[k, i]))
        assert box.get_facecolor()[:3] == pytest.approx(colour[:3])
        assert texts[k, i] == f"c{sent[k, i]} \u2192 {(i + 1) % p}"
    with pytest.raises(ValueError, match="p must be an integer >= 2"):
        plotting.ring_all_reduce_steps(1)


@pytest.mark.parametrize("kwargs", [{}, {"bytes_param": 4, "bytes_grad": 4,
                                         "optimizer_bytes_per_param": 8}])
def test_zero_memory_bars_heights_are_the_memory_model(kwargs):
    n_params, dp = 7.5e9, 64
    ax = plotting.zero_memory_bars(n_params, dp, capacity_bytes=80e9, **kwargs)
    totals = np.zeros(4)
    for name in plotting.ZERO_COMPONENTS:
        bars = _boxes(ax, name)
        assert len(bars) == 4
        for stage, bar in enumerate(sorted(bars, key=lambda b: b.get_x())):
            assert bar.get_y() == pytest.approx(totals[stage])  # stacked on the parts below
            totals[stage] += bar.get_height()
    expected = [memory.training_memory_per_device(n_params, dp, s, **kwargs) / 1e9
                for s in memory.ZERO_STAGES]
    assert totals == pytest.approx(expected)
    assert ax.lines[0].get_ydata()[0] == pytest.approx(80)


def test_zero_memory_components_by_hand():
    # stage 2 on 4 devices: parameters whole (2 N), gradients and Adam state sharded (2 N/4, 12 N/4)
    assert plotting.zero_memory_components(1e9, 4, 2) == pytest.approx((2e9, 0.5e9, 3e9))
    assert plotting.zero_memory_components(1e9, 4, 0) == pytest.approx((2e9, 2e9, 12e9))
    with pytest.raises(ValueError, match="capacity_bytes must be a positive"):
        plotting.zero_memory_bars(1e9, 4, capacity_bytes=-1)
