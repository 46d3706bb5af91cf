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
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from clusterlab.analytic import memory, moe  # noqa: E402
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
    # work boxes are coloured by micro-batch, chunk 0 as is and later chunks darker
    for box in _boxes(ax, "forward"):
        t, s = round(box.get_x() * virtual_stages), round(box.get_y() + 0.4)
        colour = np.array(plt.get_cmap("tab10")(int(schedule.microbatch[t, s]) % 10)[:3])
        chunk = int(schedule.chunk[t, s])
        darkness = 0.55 * chunk / max(virtual_stages - 1, 1)
        assert box.get_facecolor()[:3] == pytest.approx(tuple(colour * (1 - darkness)))
    chunk_keys = [t.get_text() for t in ax.get_legend().get_texts() if "chunk" in t.get_text()]
    assert chunk_keys == ([f"chunk {c}" for c in range(virtual_stages)]
                          if virtual_stages > 1 else [])
    labels = sorted(text.get_text() for text in ax.texts)
    work = schedule.kind != IDLE
    expected = [str(i) for i in schedule.microbatch[work]]  # the chunk is told by the shade
    if virtual_stages > plotting.MAX_LABELLED_VIRTUAL_STAGES:
        expected = []  # too narrow to label
    assert labels == sorted(expected)
    assert f"idle {schedule.idle_fraction:.1%}" in ax.get_title()


def test_interleaved_timeline_labels_fit_their_boxes():
    # The chapter's interleaved figure at phone-ready width: every number inside its box.
    fig = plotting.pipeline_timelines([make_schedule(4, 8, "1f1b"),
                                       make_schedule(4, 8, "interleaved", virtual_stages=2)],
                                      width_in=plotting.DIAGRAM_MAX_WIDTH_IN)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[1]
    boxes = _boxes(ax, "forward") + _boxes(ax, "backward")
    assert len(ax.texts) == len(boxes) == 2 * 2 * 8 * 4  # 2 passes x v x m per stage
    for text in ax.texts:
        label = text.get_window_extent(renderer)
        x, y = text.get_position()
        box = next(b for b in boxes if b.get_x() < x < b.get_x() + b.get_width()
                   and b.get_y() < y < b.get_y() + b.get_height())
        outline = box.get_window_extent(renderer)
        assert outline.x0 <= label.x0 and label.x1 <= outline.x1, text.get_text()
        assert text.get_fontsize() >= plotting.DIAGRAM_MIN_FONT


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
    with pytest.raises(ValueError, match="n_devices must be an integer >= 2"):
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


# The drawn diagrams: each is drawn from the course's own numbers and legible at phone width.

DIAGRAMS = {
    "ring": plotting.ring_all_reduce_diagram,
    "ring, p = 8": lambda: plotting.ring_all_reduce_diagram(8),
    "tensor": plotting.tensor_parallel_diagram,
    "3-D": plotting.three_d_parallelism_diagram,
    "3-D, 4 servers": lambda: plotting.three_d_parallelism_diagram(4, 2, 4),
    "experts": plotting.expert_routing_diagram,
    "four layers": plotting.four_layers_diagram,
    "mesh shardings": plotting.mesh_shardings_diagram,
    "NVL72 rack": plotting.nvl72_rack_diagram,
    "interleaved timeline": lambda: plotting.pipeline_timelines(
        [make_schedule(4, 8, "1f1b"), make_schedule(4, 8, "interleaved", virtual_stages=2)],
        width_in=plotting.DIAGRAM_MAX_WIDTH_IN),
}


def _drawn_texts(fig) -> list[Text]:
    """The texts a reader sees: the figure's and axes' texts, titles, and the tick labels and
    legends of axes that are drawn."""
    texts = list(fig.texts)
    for ax in fig.axes:
        texts += ax.texts + [ax.title, ax._left_title, ax._right_title]
        if ax.axison:
            texts += ax.get_xticklabels() + ax.get_yticklabels() + [ax.xaxis.label,
                                                                      ax.yaxis.label]
        if ax.get_legend() is not None:
            texts += ax.get_legend().get_texts()
    return [t for t in texts if t.get_visible() and t.get_text().strip()]


@pytest.mark.parametrize("name", DIAGRAMS)
def test_diagrams_are_legible_at_phone_width(name):
    # Shown 390 px wide, a figure of at most 6.5 in puts 9 pt text at >= 7.5 px.
    fig = DIAGRAMS[name]()
    assert isinstance(fig, plt.Figure)
    assert fig.get_size_inches()[0] <= plotting.DIAGRAM_MAX_WIDTH_IN
    texts = _drawn_texts(fig)
    assert texts
    small = [(t.get_text(), t.get_fontsize()) for t in texts
             if t.get_fontsize() < plotting.DIAGRAM_MIN_FONT]
    assert small == []


def test_legibility_check_catches_small_text():
    # negative control for the test above: an 8-pt label is found
    fig = plotting.ring_all_reduce_diagram(4)
    fig.axes[0].text(0, 0, "tiny", fontsize=8)
    assert [t.get_text() for t in _drawn_texts(fig) if t.get_fontsize() < 9] == ["tiny"]


def _by_gid(fig, kind):
    return {a.get_gid(): a for ax in fig.axes for a in ax.findobj(kind)
            if a.get_gid() and a is not ax}


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
def test_ring_diagram_labels_are_the_course_schedule(p):
    fig = plotting.ring_all_reduce_diagram(p)
    sent = plotting.ring_chunks_sent(p)
    shown = list(range(1, p)) if p <= 4 else [1, 2, p - 1]
    labels = {g: t.get_text() for g, t in _by_gid(fig, Text).items()}
    arrows = _by_gid(fig, FancyArrowPatch)
    expected = {}
    for phase, offset in (("RS", 0), ("AG", p - 1)):
        for k in shown:
            for i in range(p):
                expected[f"{phase} {k} {i}"] = f"c{sent[offset + k - 1, i]}"
    assert labels == expected
    assert set(arrows) == set(expected)
    for gid, arrow in arrows.items():  # each arrow in its chunk's colour
        chunk = int(expected[gid][1:])
        assert arrow.get_edgecolor()[:3] == pytest.approx(plt.get_cmap("tab10")(chunk)[:3])
    subset_note = [t for t in fig.texts if "per phase shown" in t.get_text()]
    assert bool(subset_note) == (len(shown) < p - 1)


def test_ring_diagram_refuses_a_wrong_p():
    with pytest.raises(ValueError, match="n_devices must be an integer >= 2"):
        plotting.ring_all_reduce_diagram(1)
    with pytest.raises(ValueError, match="draws 2 to 8 GPUs"):
        plotting.ring_all_reduce_diagram(9)


@pytest.mark.parametrize("t", [2, 3, 4])
def test_tensor_parallel_diagram_splits_a_by_columns_and_b_by_rows(t):
    fig = plotting.tensor_parallel_diagram(t)
    boxes = _by_gid(fig, Rectangle)
    a = [boxes[f"A column {i}"] for i in range(t)]
    b = [boxes[f"B row {i}"] for i in range(t)]
    # A's slices: equal widths, side by side (each in its own GPU's lane), full height
    assert len({round(r.get_width(), 9) for r in a}) == 1
    assert sorted(round(r.get_x() - a[0].get_x(), 9) for r in a) == pytest.approx(
        [i * a[0].get_width() for i in range(t)])
    assert len({round(r.get_height(), 9) for r in a}) == 1
    # B's slices: equal heights, GPU i's slice i-th from the top of its matrix
    assert len({round(r.get_height(), 9) for r in b}) == 1
    assert len({round(r.get_width(), 9) for r in b}) == 1
    assert b[0].get_width() < a[0].get_width() * t  # B is tall and narrow (4h x h)
    operators = {g: x.get_text() for g, x in _by_gid(fig, Text).items()}
    assert operators == {"f": "$f$", "g": "$g$"}
    notes = " ".join(x.get_text() for x in fig.axes[0].texts)
    assert "$f$: copy forward, all-reduce backward" in notes
    assert "$g$: all-reduce forward" in notes and "copy backward" in notes


def test_tensor_parallel_diagram_refuses_a_wrong_t():
    for t in (1, 5):
        with pytest.raises(ValueError, match="t"):
            plotting.tensor_parallel_diagram(t)


@pytest.mark.parametrize("dp, pp, tp", [(2, 2, 4), (1, 2, 8), (4, 2, 4), (2, 4, 2), (8, 1, 1)])
def test_three_d_groups_follow_the_planners_placement(dp, pp, tp):
    from clusterlab.analytic.plan import prediction
    from clusterlab.analytic.plan.workload import Layout
    from clusterlab.catalog.hardware import ClusterSpec

    groups = plotting.three_d_groups(dp, pp, tp)
    assert {k: v.shape for k, v in groups.items()} == {
        "tensor": (dp * pp, tp), "pipeline": (dp * tp, pp), "data": (pp * tp, dp)}
    for members in groups.values():  # every GPU in exactly one group of each kind
        assert sorted(members.ravel()) == list(range(dp * pp * tp))
    layout = Layout(dp=dp, tp=tp, pp=pp)
    cluster = ClusterSpec.from_node("DGX H100", n_nodes=max(1, dp * pp * tp // 8))
    local, nodes = prediction._dp_placement(layout, cluster)
    data = groups["data"][0]
    assert (np.sum(data // 8 == data[0] // 8), len(set(data // 8))) == (local, nodes)
    # the planner asks whether neighbouring stages sit on different servers
    boundaries_cross = all(g[s] // 8 != g[s + 1] // 8 for g in groups["pipeline"]
                           for s in range(pp - 1))
    assert (pp > 1 and boundaries_cross) == prediction._stages_cross_nodes(layout, cluster)
    assert all(len(set(g // 8)) == 1 for g in groups["tensor"])  # tensor stays on NVLink


@pytest.mark.parametrize("dp, pp, tp", [(2, 2, 4), (4, 2, 4), (1, 2, 8)])
def test_three_d_diagram_colours_the_groups(dp, pp, tp):
    fig = plotting.three_d_parallelism_diagram(dp, pp, tp)
    sizes = {"tensor": tp, "pipeline": pp, "data": dp}
    names = {"tensor": "Tensor", "pipeline": "Pipeline", "data": "Data-parallel"}
    groups = plotting.three_d_groups(dp, pp, tp)
    for ax, kind in zip(fig.axes, ("tensor", "pipeline", "data")):
        boxes = [r for r in ax.patches if isinstance(r, Rectangle)
                 and (r.get_gid() or "").startswith(kind)]
        assert len(boxes) == dp * pp * tp
        counts = {}
        colours = {}
        for r in boxes:
            counts[r.get_gid()] = counts.get(r.get_gid(), 0) + 1
            colours.setdefault(r.get_gid(), set()).add(tuple(r.get_facecolor()))
        assert set(counts.values()) == {sizes[kind]}  # group sizes are dp, pp and tp
        assert all(len(c) == 1 for c in colours.values())  # one colour per group
        crosses = any(len(set(g // 8)) > 1 for g in groups[kind])
        title = ax.get_title(loc="left")
        assert title.startswith(f"{names[kind]} groups of {sizes[kind]}")
        assert title.endswith("some cross servers (network)" if crosses
                              else "each inside a server (NVLink)")
    assert fig.axes[0].get_title(loc="left").endswith("(NVLink)")  # tensor stays in a server


def test_three_d_diagram_refuses_what_it_cannot_draw():
    with pytest.raises(ValueError, match="must divide gpus_per_server"):
        plotting.three_d_parallelism_diagram(2, 2, 3)
    with pytest.raises(ValueError, match="whole servers"):
        plotting.three_d_parallelism_diagram(3, 1, 4)
    with pytest.raises(ValueError, match="whole servers"):
        plotting.three_d_parallelism_diagram(8, 2, 4)  # 64 GPUs: 8 servers


@pytest.mark.parametrize("seed", range(5))
def test_expert_slots_drop_what_moe_predicts(seed):
    rng = np.random.default_rng(seed)
    choices = np.stack([[rng.choice(4, size=2, replace=False) for _ in range(4)]
                        for _ in range(2)])
    capacity = moe.expert_capacity(4, n_experts=4, top_k=2, capacity_factor=1.0)
    slots = plotting.expert_slots(choices, 4, capacity)
    assert slots.shape == (2, 4, capacity)
    assert np.sum(slots >= 0) == choices.size - moe.predicted_dropped(choices, capacity, 4)
    for d, e, c in zip(*np.nonzero(slots >= 0)):  # a slot holds a token that chose its expert
        assert e in choices[d, slots[d, e, c]]


@pytest.mark.parametrize("capacity_factor", [1.0, 0.5])
def test_expert_diagram_draws_the_dispatch_and_combine(capacity_factor):
    choices = plotting.EXPERT_DIAGRAM_CHOICES
    fig = plotting.expert_routing_diagram(capacity_factor=capacity_factor)
    p, tokens, k = choices.shape
    capacity = moe.expert_capacity(tokens, n_experts=4, top_k=k, capacity_factor=capacity_factor)
    slots = plotting.expert_slots(choices, 4, capacity)
    boxes = _by_gid(fig, Rectangle)
    buffers = {g: r for g, r in boxes.items() if g.startswith("buffer")}
    at_experts = {g: r for g, r in boxes.items() if g.startswith("expert")}
    assert len(buffers) == len(at_experts) == p * 4 * capacity  # E C slots per device
    filled = [g for g, r in buffers.items() if r.get_fill()]
    assert len(filled) == choices.size - moe.predicted_dropped(choices, capacity, 4)
    for d, e, c in np.ndindex(slots.shape):  # the all-to-all moves buffer slots to the experts
        owner = e // 2
        assert buffers[f"buffer {d} {e} {c}"].get_fill() == (slots[d, e, c] >= 0)
        assert at_experts[f"expert {owner} {e} {d} {c}"].get_fill() == (slots[d, e, c] >= 0)
    note = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert f"C = {capacity} slot" in note
    dropped = moe.predicted_dropped(choices, capacity, 4)
    assert (f"{dropped} assignments dropped" in note) == (dropped > 0)
    assert dropped == (0 if capacity_factor == 1.0 else 8)  # the default routing is even
    arrows = [a for a in fig.axes[0].patches if isinstance(a, FancyArrowPatch)]
    assert len(arrows) == 2 * p * p  # a block per (source, destination), dispatch and combine


def test_expert_diagram_refuses_bad_routing():
    with pytest.raises(ValueError, match="experts that they divide"):
        plotting.expert_routing_diagram(n_experts=3)
    with pytest.raises(ValueError, match="name experts 0 to 3"):
        plotting.expert_routing_diagram(plotting.EXPERT_DIAGRAM_CHOICES + 1)
    with pytest.raises(ValueError, match="too many to draw legibly"):
        plotting.expert_routing_diagram(capacity_factor=1.5)  # 2 x 4 experts x 3 slots
    with pytest.raises(ValueError, match="top_k must be between 1"):
        plotting.expert_routing_diagram(np.zeros((2, 4, 5), int), n_experts=4)


def test_four_layers_diagram_draws_every_gpu_and_layer():
    fig = plotting.four_layers_diagram(4, 8)
    ax = fig.axes[0]
    assert len([r for r in ax.patches if r.get_gid() == "gpu"]) == 32
    assert len([r for r in ax.patches if r.get_gid() == "server"]) == 4
    markers = sorted(c.get_gid() for c in ax.patches if (c.get_gid() or "").startswith("layer"))
    assert markers == sorted([f"layer {i}" for i in range(1, 5)] * 2)  # drawing and legend
    assert len([r for r in plotting.four_layers_diagram(2, 4).axes[0].patches
                if r.get_gid() == "gpu"]) == 8
    with pytest.raises(ValueError, match="2 to 6 servers"):
        plotting.four_layers_diagram(7)


@pytest.mark.parametrize("spec, expected", [
    (("data",), {(0, 0): (0, 1, 2, 3), (1, 0): (4, 5, 6, 7)}),
    (("data", "model"), {(r, c): (4 * r + c,) for r in range(2) for c in range(4)}),
    ((None, "model"), {(0, c): (c, c + 4) for c in range(4)}),
    ((), {(0, 0): tuple(range(8))}),
    (("model", "data"), {(r, c): (4 * c + r,) for r in range(4) for c in range(2)}),
])
def test_sharding_blocks_by_hand(spec, expected):
    assert plotting.sharding_blocks((2, 4), ("data", "model"), spec) == expected


def test_sharding_blocks_refuses_a_wrong_spec():
    with pytest.raises(ValueError, match="'x' is not a mesh axis"):
        plotting.sharding_blocks((2, 4), ("data", "model"), ("x",))
    with pytest.raises(ValueError, match="name each mesh axis at most once"):
        plotting.sharding_blocks((2, 4), ("data", "model"), ("data", "data"))
    with pytest.raises(ValueError, match="more entries than the array's 2 dimensions"):
        plotting.sharding_blocks((2, 4), ("data", "model"), ("data", None, None))


def test_mesh_shardings_diagram_draws_every_block():
    fig = plotting.mesh_shardings_diagram()
    boxes = _by_gid(fig, Rectangle)
    labels = {g: t.get_text() for g, t in _by_gid(fig, Text).items()}
    assert sorted(g for g in boxes if g.startswith("device")) == [f"device {i}" for i in range(8)]
    specs = {"P('data')": 2, "P('data', 'model')": 8, "P(None, 'model')": 4, "P()": 1}
    for spec, n_blocks in specs.items():
        blocks = {g: r for g, r in boxes.items() if g.startswith(f"{spec} block")}
        assert len(blocks) == n_blocks
        for gid, box in blocks.items():  # in the colour of the lowest device holding it
            held = [int(d) for d in labels[gid].replace("\n", ", ").replace("-", ", ")
                    .split(", ")]
            assert box.get_facecolor()[:3] == pytest.approx(boxes[f"device {held[0]}"]
                                                            .get_facecolor()[:3])
    assert labels["P()" + " block 0 0"] == "0-7"
    assert labels["P(None, 'model') block 0 2"] == "2\n6"
    assert labels["P('data') block 1 0"] == "4-7"
    with pytest.raises(ValueError, match="does not divide over the 4 devices of 'model'"):
        plotting.mesh_shardings_diagram(array_shape=(8, 6))
    with pytest.raises(ValueError, match="up to 4 x 4 devices"):
        plotting.mesh_shardings_diagram((2, 8))


@pytest.mark.parametrize("name", ["GB200 NVL72", "GB300 NVL72"])
def test_nvl72_diagram_draws_the_catalogs_rack(name):
    from clusterlab.catalog import hardware
    rack = hardware.rack(name)
    fig = plotting.nvl72_rack_diagram(name, other_racks=3)
    ax = fig.axes[0]

    def count(gid):
        return len([a for a in ax.patches + ax.lines if a.get_gid() == gid])

    assert count("gpu") == rack.compute_trays * rack.gpus_per_tray == 72
    assert count("nic") == rack.compute_trays * rack.nics_per_tray
    assert count("compute tray") == rack.compute_trays == 18
    assert count("switch tray") == rack.nvlink_switch_trays == 9
    assert count("nvlink") == 18 + 9  # every tray on the NVLink spine
    assert count("tray uplink") == 18  # every compute tray on the scale-out network
    assert (count("leaf"), count("spine"), count("other rack")) == (2, 2, 3)
    texts = " ".join(t.get_text() for t in ax.texts)
    assert f"{name}: 72 GPUs" in texts and "9 NVLink\nswitch trays" in texts


def test_nvl72_diagram_refuses_what_it_cannot_draw():
    with pytest.raises(ValueError, match="1 to 3 other racks"):
        plotting.nvl72_rack_diagram(other_racks=4)
    with pytest.raises(ValueError, match="other_racks must be a positive integer"):
        plotting.nvl72_rack_diagram(other_racks=0)
    with pytest.raises(ValueError, match="Unknown rack"):
        plotting.nvl72_rack_diagram("NVL36")
