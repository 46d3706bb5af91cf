"""One look for every figure in the course."""

from __future__ import annotations

import itertools
from typing import Callable, Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch, Rectangle
from matplotlib.ticker import FuncFormatter, MaxNLocator

from clusterlab import _checks
from clusterlab.analytic import memory, moe
from clusterlab.catalog import hardware
from clusterlab.analytic.schedule import FORWARD, IDLE, Schedule
from clusterlab.analytic.tables import format_bytes

MEASURED_STYLE = {"marker": "o", "linestyle": "-", "linewidth": 1.5, "markersize": 4}
MODEL_STYLE = {"linestyle": "--", "linewidth": 1.5}


FIGURE_DPI = 120  # x 2 for retina: a cropped 7-in default figure is >= 1,300 px wide


def use_course_style() -> None:
    """Set matplotlib defaults shared by chapters and labs.

    In a notebook or a book page, figures are drawn as PNGs at twice their size in pixels
    ("retina") at 120 dots per inch: a 7-inch figure is 1,680 px wide before its white margin is
    cropped, and a 6-inch one, cropped, still over 1,300 px; sharp on high-density and phone
    screens, and shown at half that width in CSS pixels.
    """
    try:
        from matplotlib_inline.backend_inline import set_matplotlib_formats
        from IPython import get_ipython
    except ImportError:  # plain Python, the base install: no inline figures to set
        pass
    else:
        if get_ipython() is not None:
            set_matplotlib_formats("retina")
    plt.rcParams.update({
        "figure.figsize": (7.0, 4.0),
        "figure.dpi": FIGURE_DPI,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "legend.frameon": False,
    })


def bytes_axis(ax: Axes, axis: str = "x") -> None:
    """Log-scale axis labelled in binary units (4 KiB, 1 MiB, ...)."""
    formatter = FuncFormatter(lambda value, _: format_bytes(value))
    if axis == "x":
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(formatter)
    else:
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(formatter)


def measured_vs_model(ax: Axes, sizes_bytes: Sequence[float], measured: Sequence[float],
                      model: Sequence[float] | None = None, *, label: str = "",
                      color: str | None = None) -> None:
    """Measured points joined by a line, and the model as a dashed line in the same colour."""
    (line,) = ax.plot(sizes_bytes, measured, label=f"{label} measured".strip(), color=color,
                      **MEASURED_STYLE)
    if model is not None:
        ax.plot(sizes_bytes, model, color=line.get_color(), label=f"{label} model".strip(),
                **MODEL_STYLE)


def _axes(ax: Axes | None) -> Axes:
    return plt.subplots()[1] if ax is None else ax


def _colour(index: int) -> tuple:
    return plt.get_cmap("tab10")(index % 10)


IDLE_COLOUR = "0.92"
MAX_LABELLED_VIRTUAL_STAGES = 2


def _chunk_shade(colour, chunk: int, virtual_stages: int) -> tuple:
    """A micro-batch's colour for model chunk ``chunk``: chunk 0 as is, later chunks darker
    (mixed with up to 55% black), so one micro-batch's chunks differ by shade alone."""
    rgb = np.array(matplotlib.colors.to_rgb(colour))
    darkness = 0.55 * chunk / max(virtual_stages - 1, 1)
    return tuple(rgb * (1 - darkness))


def pipeline_timeline(schedule: Schedule, ax: Axes | None = None) -> Axes:
    """A pipeline schedule as a coloured timeline: one row per stage, one box per piece of work.

    Forward passes are solid, backward passes lighter and hatched, in the micro-batch's colour
    and labelled with its number; idle slots are grey. Interleaved (v > 1), a micro-batch's
    model chunks differ by shade, chunk 0 brightest and later chunks darker, and the legend says
    so; boxes are labelled up to v = 2 (narrower ones have no room). Time runs in passes of one
    micro-batch through a whole stage, so an interleaved slot is ``1/v`` wide and schedules
    compare on one axis. Each box's ``gid`` is ``"forward"``, ``"backward"`` or ``"idle"``.

    Args:
        schedule: from :func:`clusterlab.analytic.schedule.make_schedule` (kind and micro-batch
            tables i32[T, p]).
        ax: where to draw; a new figure when None.

    Returns:
        The axes, titled with the schedule and its idle fraction.
    """
    ax = _axes(ax)
    v = schedule.virtual_stages
    width = 1 / v
    for t, s in np.ndindex(schedule.kind.shape):
        kind, i = int(schedule.kind[t, s]), int(schedule.microbatch[t, s])
        if kind == IDLE:
            ax.add_patch(Rectangle((t * width, s - 0.4), width, 0.8, facecolor=IDLE_COLOUR,
                                   edgecolor="white", linewidth=0.5, gid="idle"))
            continue
        forward = kind == FORWARD
        colour = _chunk_shade(_colour(i), int(schedule.chunk[t, s]), v)
        alpha = 1.0 if forward else 0.45
        ax.add_patch(Rectangle((t * width, s - 0.4), width, 0.8, facecolor=colour,
                               alpha=alpha, hatch=None if forward else "///",
                               edgecolor="white", linewidth=0.5,
                               gid="forward" if forward else "backward"))
        if v <= MAX_LABELLED_VIRTUAL_STAGES:  # narrower boxes have no room for a label
            seen = tuple(alpha * np.array(colour) + (1 - alpha))  # as drawn on white
            ax.text((t + 0.5) * width, s, str(i), ha="center", va="center", fontsize=9,
                    color=_text_on(seen), clip_on=True)
    ax.set_xlim(0, schedule.slots * width)
    ax.set_ylim(schedule.stages - 0.5, -0.5)  # stage 0 on top
    ax.set_yticks(range(schedule.stages), [f"stage {s}" for s in range(schedule.stages)])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(False)
    ax.set_xlabel("time (passes of one micro-batch through one stage)")
    chunks = f", v = {v}" if v > 1 else ""
    ax.set_title(f"{schedule.name}: p = {schedule.stages}, m = {schedule.microbatches}{chunks}, "
                 f"idle {schedule.idle_fraction:.1%}", fontsize=10)
    handles = [Patch(facecolor="0.5", label="forward"),
               Patch(facecolor="0.5", alpha=0.45, hatch="///", label="backward"),
               Patch(facecolor=IDLE_COLOUR, label="idle")]
    handles += [Patch(facecolor=_chunk_shade(_colour(0), c, v), label=f"chunk {c}")
                for c in range(v if v > 1 else 0)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=9)
    return ax


def pipeline_timelines(schedules: Sequence[Schedule], *,
                       width_in: float = 9.0) -> plt.Figure:
    """Several schedules' timelines (:func:`pipeline_timeline`) stacked on one time axis.

    Args:
        schedules: from :func:`clusterlab.analytic.schedule.make_schedule`, at least one.
        width_in: the figure's width in inches.

    Returns:
        The figure, one row per schedule, all drawn up to the longest schedule's time.
    """
    if not schedules:
        raise ValueError("pipeline_timelines needs at least one schedule.")
    height_in = 0.4 + sum(0.35 * s.stages + 0.9 for s in schedules)
    fig, axes = plt.subplots(len(schedules), 1, squeeze=False, figsize=(width_in, height_in))
    end = max(s.slots / s.virtual_stages for s in schedules)
    for ax, schedule in zip(axes[:, 0], schedules):
        pipeline_timeline(schedule, ax)
        ax.set_xlim(0, end)
    fig.tight_layout()
    return fig


def ring_chunks_sent(n_devices: int) -> np.ndarray:
    """Which chunk each device sends to its right neighbour in each step of a ring all-reduce.

    The buffer is cut into p chunks. In reduce-scatter step ``k`` (1 to p-1) device ``i`` sends
    its partial sum of chunk ``(i - k) mod p`` and ends owning the full sum of chunk ``i``; in
    all-gather step ``k`` it passes on chunk ``(i + 1 - k) mod p``. This is the order of
    :func:`clusterlab.device.collectives.ring_reduce_scatter` and
    :func:`clusterlab.device.collectives.ring_all_gather`.

    Args:
        n_devices: devices in the ring, at least 2.

    Returns:
        i32[2(p-1), p]: the chunk index per step (reduce-scatter steps first) and device.
    """
    n_devices = _checks.count("n_devices", n_devices, minimum=2)
    device = np.arange(n_devices)
    steps = np.arange(1, n_devices)[:, None]
    return np.vstack([(device - steps) % n_devices, (device + 1 - steps) % n_devices]).astype(np.int32)


def ring_all_reduce_steps(n_devices: int, ax: Axes | None = None) -> Axes:
    """A ring all-reduce as a picture: the chunk each device sends in each of its 2(p-1) steps.

    Rows are devices, columns steps: p-1 reduce-scatter steps (each device adds what it receives
    to its own share and passes the partial sum on), then p-1 all-gather steps (the completed
    chunks travel round). Each box, in its chunk's colour, says which chunk goes to the right
    neighbour (``gid`` ``"reduce-scatter"`` or ``"all-gather"``); the steps come from
    :func:`ring_chunks_sent`.

    Args:
        n_devices: devices in the ring, at least 2.
        ax: where to draw; a new figure when None.

    Returns:
        The axes.
    """
    sent = ring_chunks_sent(n_devices)
    ax = _axes(ax)
    for k, i in np.ndindex(sent.shape):
        reduce_scatter = k < n_devices - 1
        ax.add_patch(Rectangle((k, i - 0.4), 1, 0.8, facecolor=_colour(int(sent[k, i])),
                               alpha=0.5 if reduce_scatter else 1.0, edgecolor="white",
                               gid="reduce-scatter" if reduce_scatter else "all-gather"))
        ax.text(k + 0.5, i, f"c{sent[k, i]} \u2192 {(i + 1) % n_devices}", ha="center", va="center",
                fontsize=8)
    ax.axvline(n_devices - 1, color="black", linewidth=1)
    ax.set_xlim(0, 2 * (n_devices - 1))
    ax.set_ylim(n_devices - 0.5, -0.5)
    ax.set_xticks(np.arange(2 * (n_devices - 1)) + 0.5,
                  [f"RS {k}" for k in range(1, n_devices)] + [f"AG {k}" for k in range(1, n_devices)])
    ax.set_yticks(range(n_devices), [f"device {i}" for i in range(n_devices)])
    ax.grid(False)
    ax.set_xlabel("step (RS: reduce-scatter, partial sums; AG: all-gather, finished chunks)")
    ax.set_title(f"Ring all-reduce on {n_devices} devices: chunk sent to the right neighbour per step",
                 fontsize=10)
    return ax


ZERO_COMPONENTS = ("parameters", "gradients", "optimizer state")


def zero_memory_components(n_params: float, dp: int, zero_stage: int, *,
                           bytes_param: float = 2, bytes_grad: float = 2,
                           optimizer_bytes_per_param: float = 12) -> tuple[float, float, float]:
    """Bytes per device of parameters, gradients and optimizer state under a ZeRO stage.

    Each part is a difference of :func:`clusterlab.analytic.memory.training_memory_per_device` with
    the later parts' bytes set to zero, so the three add up to it exactly.

    Args:
        n_params, dp, zero_stage, bytes_param, bytes_grad, optimizer_bytes_per_param: as for
            :func:`clusterlab.analytic.memory.training_memory_per_device`.

    Returns:
        ``(parameters, gradients, optimizer state)`` in bytes per device.
    """
    def states(grad: float, optimizer: float) -> float:
        return memory.training_memory_per_device(n_params, dp, zero_stage, bytes_param=bytes_param,
                                                 bytes_grad=grad,
                                                 optimizer_bytes_per_param=optimizer)

    params_only = states(0, 0)
    with_grads = states(bytes_grad, 0)
    return params_only, with_grads - params_only, states(bytes_grad, optimizer_bytes_per_param) \
        - with_grads


def zero_memory_bars(n_params: float, dp: int, ax: Axes | None = None, *,
                     capacity_bytes: float | None = None, capacity_label: str = "",
                     **bytes_per_param: float) -> Axes:
    """Per-device model states under ZeRO stages 0-3 as stacked bars, in GB (1e9 bytes).

    One bar per stage, stacked parameters / gradients / optimizer state
    (:func:`zero_memory_components`), each total labelled; an optional dotted line marks a
    device's memory.

    Args:
        n_params: N, the model's parameters.
        dp: data-parallel devices the states are sharded across.
        ax: where to draw; a new figure when None.
        capacity_bytes: a device's memory, drawn as a dotted line when given.
        capacity_label: the line's label (e.g. ``"H100, 80 GB"``).
        **bytes_per_param: ``bytes_param``, ``bytes_grad``, ``optimizer_bytes_per_param`` as
            for :func:`clusterlab.analytic.memory.training_memory_per_device`.

    Returns:
        The axes; the bars of component ``c`` carry ``gid = c``.
    """
    ax = _axes(ax)
    parts = np.array([zero_memory_components(n_params, dp, stage, **bytes_per_param)
                      for stage in memory.ZERO_STAGES]) / 1e9  # f64[4 stages, 3 components] GB
    bottom = np.zeros(len(memory.ZERO_STAGES))
    for c, name in enumerate(ZERO_COMPONENTS):
        bars = ax.bar(memory.ZERO_STAGES, parts[:, c], bottom=bottom, color=_colour(c),
                      label=name, width=0.6)
        for bar in bars:
            bar.set_gid(name)
        bottom += parts[:, c]
    for stage, total in zip(memory.ZERO_STAGES, bottom):
        ax.text(stage, total, f"{total:.3g} GB", ha="center", va="bottom", fontsize=8)
    if capacity_bytes is not None:
        ax.axhline(_checks.positive("capacity_bytes", capacity_bytes) / 1e9, color="0.3",
                   linestyle=":", label=capacity_label or "device memory")
    ax.set_xticks(memory.ZERO_STAGES, [f"stage {s}" for s in memory.ZERO_STAGES])
    ax.set_xlabel("ZeRO stage")
    ax.set_ylabel("GB per device")
    ax.set_title(f"Model states per device: {n_params / 1e9:.3g}B parameters, dp = {dp}",
                 fontsize=10)
    ax.legend()
    return ax


def _collective_buffers(n_devices: int) -> dict:
    """Each collective's (where in training, before, after): a list of (label, colour) cells
    per device, for :func:`collectives_before_after`."""
    letters = "abcd"
    colours = plt.get_cmap("tab10").colors[:n_devices]
    sum_colour = "0.35"

    def chunk(device, k):
        return (f"${letters[device]}_{k}$", colours[device])

    def total(k):
        return (f"$\\Sigma_{k}$", sum_colour)

    def whole(device):
        return (f"${letters[device]}$", colours[device])

    inputs = [[chunk(d, k) for k in range(n_devices)] for d in range(n_devices)]
    nothing = [[] for _ in range(n_devices)]
    return {
        "all-reduce": ("data-parallel gradients", inputs, [[total(k) for k in range(n_devices)]] * n_devices),
        "reduce-scatter": ("ZeRO/FSDP gradients", inputs, [[total(d)] for d in range(n_devices)]),
        "all-gather": ("ZeRO/FSDP parameters", [[whole(d)] for d in range(n_devices)],
                       [[whole(k) for k in range(n_devices)]] * n_devices),
        "all-to-all": ("expert-parallel token routing", inputs,
                       [[chunk(k, d) for k in range(n_devices)] for d in range(n_devices)]),
        "broadcast (root 0)": ("initial weights from one rank", [inputs[0]] + nothing[1:],
                               [inputs[0]] * n_devices),
        "reduce (root 0)": ("a metric summed on one rank", inputs,
                            [[total(k) for k in range(n_devices)]] + nothing[1:]),
        "send/recv (0 → 1)": ("pipeline activations", [inputs[0]] + nothing[1:],
                              [[], inputs[0]] + nothing[2:]),
    }


def _draw_buffers(ax, x0: float, buffers, title: str, n_devices: int) -> None:
    """One row of ``p`` chunk cells per device, starting at ``x0``, titled ``title``."""
    for d, cells in enumerate(buffers):
        y = n_devices - 1 - d
        ax.text(x0 - 0.15, y + 0.4, f"GPU{d}", ha="right", va="center", fontsize=8)
        ax.add_patch(Rectangle((x0, y), n_devices, 0.8, fill=False, ec="0.75", lw=0.8, ls=":"))
        for k, (label, colour) in enumerate(cells):
            ax.add_patch(Rectangle((x0 + k, y), 1, 0.8, fc=colour, ec="white", lw=1.5,
                                   alpha=0.9))
            ax.text(x0 + k + 0.5, y + 0.4, label, ha="center", va="center", color="white",
                    fontsize=10)
    ax.text(x0 + n_devices / 2, n_devices + 0.05, title, ha="center", va="bottom", fontsize=8, color="0.3")


def collectives_before_after(n_devices: int = 4) -> plt.Figure:
    """What each of ``p`` devices holds before and after each of the seven collectives.

    One panel per collective (all-reduce, reduce-scatter, all-gather, all-to-all, broadcast,
    reduce, send/recv): a row of chunks per device before and after, device ``d``'s input in
    its own colour and cut into ``p`` chunks (``a_0 .. a_{p-1}`` for device 0, ``b`` for device
    1, ...), a reduced chunk ``Σ_k`` in grey; a dotted outline is a buffer that receives no
    result. The grey line under each name says where the collective appears in training.

    Args:
        n_devices: devices, 2 to 4 (one letter each: a, b, c, d).

    Returns:
        The figure (4 x 2 panels; the last one is the legend).
    """
    n_devices = _checks.count("n_devices", n_devices)
    if not 2 <= n_devices <= 4:
        raise ValueError(f"n_devices must be 2 to 4 (one letter per device), got {n_devices}.")
    letters = "abcd"
    fig, axes = plt.subplots(4, 2, figsize=(9.5, 11))
    for ax, (name, (use, before, after)) in zip(axes.flat, _collective_buffers(n_devices).items()):
        _draw_buffers(ax, 0.0, before, "before", n_devices)
        ax.annotate("", xy=(n_devices + 1.55, n_devices / 2), xytext=(n_devices + 0.25, n_devices / 2),
                    arrowprops={"arrowstyle": "-|>", "color": "0.3", "lw": 1.5})
        _draw_buffers(ax, n_devices + 2.2, after, "after", n_devices)
        ax.text(-1.0, n_devices + 1.25, name, fontsize=11, fontweight="bold")
        ax.text(-1.0, n_devices + 0.75, use, fontsize=9, color="0.4")
        ax.set_xlim(-1.0, 2 * n_devices + 2.3)
        ax.set_ylim(-0.2, n_devices + 1.5)
        ax.set_aspect("equal")
        ax.axis("off")
    legend_ax = axes.flat[-1]
    legend_ax.axis("off")
    devices = ", ".join(f"{letters[d]}: GPU{d}" for d in range(1, n_devices))
    sums = " + ".join(f"{letters[d]}_k" for d in range(n_devices))
    legend_ax.text(0.0, 0.8, f"$a_k$: chunk $k$ of GPU0's input\n({devices})\n"
                   f"$\\Sigma_k = {sums}$\n"
                   "$a$: GPU0's whole input (all-gather)\n"
                   "dotted outline: no result there", transform=legend_ax.transAxes, va="top",
                   fontsize=10, linespacing=1.8)
    fig.tight_layout()
    return fig


def profile_timeline(profile, ax: Axes | None = None, *, step: int = 0) -> Axes:
    """One row per device of a read trace (:class:`clusterlab.device.profile.Profile`): its ops over
    time in one step, compute, collectives and the rendezvous waits inside them.

    Args:
        profile: what ``clusterlab.device.profile.read_trace`` returned (only its ``ops``, ``waits``
        and
            ``devices`` are read, so this module needs no JAX).
        ax: axes to draw on; a new figure if ``None``.
        step: which traced step to draw, 0 for the first (in order of their start).

    Returns:
        The axes.
    """
    ax = _axes(ax)
    steps: dict = {}
    for op in profile.ops:
        steps.setdefault(op.step, []).append(op)
    ordered = sorted(steps.values(), key=lambda ops: ops[0].start_us)
    if not 0 <= step < len(ordered):
        raise ValueError(f"profile_timeline(step={step}): the profile has {len(ordered)} "
                         "step(s), numbered from 0.")
    ops = ordered[step]
    t0, t1 = ops[0].start_us, max(op.end_us for op in ops)
    names = [d.device for d in profile.devices]
    colours = {"compute": _colour(0), "collective": _colour(1), "waiting": _colour(3)}
    for row, device in enumerate(names):
        mine = [op for op in ops if op.device == device]
        for kind in ("compute", "collective"):
            spans = [((op.start_us - t0) / 1e3, op.dur_us / 1e3) for op in mine
                     if (op.kind == "compute") == (kind == "compute")]
            ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=colours[kind])
        waits = [((s - t0) / 1e3, (e - s) / 1e3) for d, s, e in profile.waits
                 if d == device and t0 <= s <= t1]
        ax.broken_barh(waits, (row - 0.2, 0.4), facecolors=colours["waiting"])
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("time in the step (ms)")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in colours.items()], loc="upper right",
              fontsize="small")
    return ax


# Drawn diagrams: ring, tensor-parallel split, 3-D parallelism, expert routing, the four layers.
# Each is sized to be read when the book shows it 390 px wide (a phone): no wider than
# DIAGRAM_MAX_WIDTH_IN inches, no text smaller than DIAGRAM_MIN_FONT points.

DIAGRAM_MIN_FONT = 9
DIAGRAM_MAX_WIDTH_IN = 6.5
RING_MAX_DEVICES = 8
RING_MAX_PANELS_PER_PHASE = 3


def _grey_arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float]) -> None:
    """A plain grey arrow from ``start`` to ``end`` (data flow in a diagram)."""
    ax.annotate("", xy=end, xytext=start, arrowprops={"arrowstyle": "-|>", "color": "0.4"})


def _diagram_axes(ax: Axes, xlim: tuple[float, float], ylim: tuple[float, float]) -> None:
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.axis("off")


def _ring_steps_shown(n_devices: int) -> list[int]:
    """Steps (1 to p-1) drawn per phase: all of them, or 1, 2 and p-1 when there are more."""
    if n_devices - 1 <= RING_MAX_PANELS_PER_PHASE:
        return list(range(1, n_devices))
    return [1, 2, n_devices - 1]


def ring_all_reduce_diagram(n_devices: int = 4) -> plt.Figure:
    """A ring all-reduce drawn as a ring of ``p`` GPUs, one panel per step.

    The top row is the reduce-scatter (each GPU adds the chunk that arrives to its own copy and
    passes the partial sum on), the bottom row the all-gather (the finished sums travel round).
    Each arrow goes from GPU ``i`` to GPU ``i + 1`` and is labelled with the chunk it carries,
    ``c0`` to ``c{p-1}`` in the chunk's colour, taken from :func:`ring_chunks_sent` (the
    course's ring, as :func:`ring_all_reduce_steps` draws it as a grid). With more than four
    GPUs only steps 1, 2 and p-1 of each phase are drawn, and the figure says so. Each arrow's
    label carries ``gid = "RS k i"`` or ``"AG k i"`` (phase, step k from 1, sending GPU i).

    Args:
        n_devices: GPUs in the ring, 2 to 8.

    Returns:
        The figure.
    """
    n_devices = _checks.count("n_devices", n_devices, minimum=2)
    if n_devices > RING_MAX_DEVICES:
        raise ValueError(f"ring_all_reduce_diagram draws 2 to {RING_MAX_DEVICES} GPUs, got "
                         f"n_devices = {n_devices}; use ring_all_reduce_steps for a larger ring.")
    sent = ring_chunks_sent(n_devices)
    shown = _ring_steps_shown(n_devices)
    cols = len(shown)
    fig, axes = plt.subplots(2, cols, squeeze=False, figsize=(5.7, 4.6))
    angle = np.pi / 2 - 2 * np.pi * np.arange(n_devices) / n_devices  # GPU 0 on top, clockwise
    ring_r = max(1.0, 0.27 * n_devices)  # the ring's radius; a GPU's circle has radius 0.27
    xy = ring_r * np.stack([np.cos(angle), np.sin(angle)], axis=1)
    node_r = 0.27
    gap = (node_r + 0.1) / ring_r  # radians kept clear of a GPU's circle at either arrow end
    sweep = 2 * np.pi / n_devices - 2 * gap
    rad = -np.tan(sweep / 4)  # arc3's bulge that keeps a clockwise arrow on the ring
    label_out = 0.38 if n_devices <= 4 else 0.5  # a label's distance outside the ring
    for row, (tag, alpha) in enumerate([("RS", 0.55), ("AG", 1.0)]):
        for col, k in enumerate(shown):
            ax = axes[row, col]
            step = sent[(n_devices - 1) * row + k - 1]
            for i in range(n_devices):
                ax.add_patch(plt.Circle(xy[i], node_r, facecolor="white", edgecolor="0.2",
                                        linewidth=1.2, zorder=3))
                ax.text(*xy[i], str(i), ha="center", va="center", fontsize=10, zorder=4)
                colour = _colour(int(step[i]))
                start, end = angle[i] - gap, angle[i] - gap - sweep
                ax.add_patch(FancyArrowPatch((ring_r * np.cos(start), ring_r * np.sin(start)),
                                             (ring_r * np.cos(end), ring_r * np.sin(end)),
                                             connectionstyle=f"arc3,rad={rad}",
                                             arrowstyle="-|>", mutation_scale=12,
                                             shrinkA=0, shrinkB=0, color=colour, alpha=alpha,
                                             linewidth=2.4, gid=f"{tag} {k} {i}"))
                middle = angle[i] - np.pi / n_devices
                label_r = ring_r + label_out
                ax.text(label_r * np.cos(middle), label_r * np.sin(middle), f"c{step[i]}",
                        ha="center", va="center", fontsize=10, fontweight="bold",
                        color=colour, gid=f"{tag} {k} {i}")
            ax.set_title(f"{tag} step {k}", fontsize=10)
            edge = ring_r + label_out
            _diagram_axes(ax, (-edge - 0.24, edge + 0.24), (-edge - 0.17, edge + 0.17))
        for col in range(cols, axes.shape[1]):
            axes[row, col].axis("off")
    fig.text(0.02, 0.965, "Reduce-scatter (RS): add the chunk that arrives, pass the sum on",
             fontsize=10, fontweight="bold", va="top")
    fig.text(0.02, 0.49, "All-gather (AG): pass the finished sums on", fontsize=10,
             fontweight="bold", va="top")
    note = f"{n_devices} GPUs in a ring; arrow: one chunk (c0-c{n_devices - 1}) to the next GPU"
    if len(shown) < n_devices - 1:
        note += f"\nSteps 1, 2 and {n_devices - 1} of {n_devices - 1} per phase shown"
    fig.text(0.02, 0.02, note, fontsize=9, color="0.3", va="bottom")
    fig.subplots_adjust(left=0.02, right=0.98, top=0.86, bottom=0.12 if len(shown) < n_devices - 1
                        else 0.07, hspace=0.55, wspace=0.1)
    return fig


def tensor_parallel_diagram(t: int = 2) -> plt.Figure:
    """Megatron-LM's tensor-parallel MLP, ``Z = GeLU(X A) B``, on ``t`` GPUs.

    ``A`` is split by columns: GPU ``i`` holds ``A_i`` and computes its slice of the hidden
    units, ``Y_i = GeLU(X A_i)``, with no communication. ``B`` is split by rows: GPU ``i``
    multiplies ``Y_i`` by ``B_i`` and holds a partial sum ``Z_i``. The operator ``f`` before the
    block is the identity forward and an all-reduce backward; ``g`` after it is an all-reduce
    forward and the identity backward (Shoeybi et al. 2019, figure 3a). The shaded slices
    carry ``gid = "A column i"`` and ``"B row i"``.

    Args:
        t: tensor-parallel GPUs, 2 to 4.

    Returns:
        The figure.
    """
    t = _checks.count("t", t, minimum=2)
    if t > 4:
        raise ValueError(f"tensor_parallel_diagram draws 2 to 4 GPUs, got t = {t}.")
    lane = 1.35  # height of one GPU's lane
    height = t * lane
    xlim, ylim = (-0.1, 11.7), (-1.0, height + 0.45)
    fig, ax = plt.subplots(figsize=(6.4, 6.4 * (ylim[1] - ylim[0]) / (xlim[1] - xlim[0])))
    mid = height / 2
    box = {"boxstyle": "round,pad=0.25", "facecolor": "white", "edgecolor": "0.3"}
    op = {"boxstyle": "circle,pad=0.3", "facecolor": "#ffe08a", "edgecolor": "0.2"}
    ax.text(0.3, mid, "$X$", ha="center", va="center", fontsize=11, bbox=box)
    ax.text(1.25, mid, "$f$", ha="center", va="center", fontsize=12, fontweight="bold", bbox=op,
            gid="f")
    ax.text(10.35, mid, "$g$", ha="center", va="center", fontsize=12, fontweight="bold", bbox=op,
            gid="g")
    ax.text(11.3, mid, "$Z$", ha="center", va="center", fontsize=11, bbox=box)
    for x0, x1 in ((0.6, 0.95), (10.65, 11.0)):
        ax.annotate("", xy=(x1, mid), xytext=(x0, mid),
                    arrowprops={"arrowstyle": "-|>", "color": "0.3"})
    a_w, a_h, b_w, b_h = 1.0, 0.5, 0.5, 1.0  # A is h x 4h (wide), B is 4h x h (tall)
    for i in range(t):
        y = height - (i + 0.5) * lane  # lane centre, GPU 0 on top
        colour = _colour(i)
        ax.add_patch(FancyBboxPatch((1.85, y - 0.58), 7.85, 1.16, boxstyle="round,pad=0.02",
                                    facecolor=colour, alpha=0.08, edgecolor="none"))
        ax.text(1.92, y + 0.55, f"GPU {i}", ha="left", va="top", fontsize=9, color=colour,
                fontweight="bold")
        _grey_arrow(ax, (1.55, mid), (2.0, y))
        # A: the whole matrix outlined, GPU i's column block shaded
        ax.add_patch(Rectangle((2.05, y - a_h / 2), a_w, a_h, fill=False, edgecolor="0.6"))
        ax.add_patch(Rectangle((2.05 + i * a_w / t, y - a_h / 2), a_w / t, a_h,
                               facecolor=colour, alpha=0.8, edgecolor="0.2",
                               gid=f"A column {i}"))
        ax.text(2.05 + a_w / 2, y - a_h / 2 - 0.04, f"$A_{i}$", ha="center", va="top",
                fontsize=10)
        _grey_arrow(ax, (3.1, y), (3.55, y))
        ax.text(4.55, y, f"$Y_{i}$ = GeLU($XA_{i}$)", ha="center", va="center", fontsize=10,
                bbox={**box, "edgecolor": colour})
        _grey_arrow(ax, (5.6, y), (6.1, y))
        # B: the whole matrix outlined, GPU i's row block shaded
        ax.add_patch(Rectangle((6.15, y - b_h / 2), b_w, b_h, fill=False, edgecolor="0.6"))
        ax.add_patch(Rectangle((6.15, y + b_h / 2 - (i + 1) * b_h / t), b_w, b_h / t,
                               facecolor=colour, alpha=0.8, edgecolor="0.2", gid=f"B row {i}"))
        ax.text(6.15 + b_w + 0.08, y + 0.3, f"$B_{i}$", ha="left", va="center", fontsize=10)
        _grey_arrow(ax, (6.75, y), (7.55, y))
        ax.text(8.6, y, f"$Z_{i} = Y_{i} B_{i}$", ha="center", va="center", fontsize=10,
                bbox={**box, "edgecolor": colour})
        _grey_arrow(ax, (9.55, y), (10.1, mid))
    ax.text(2.55, height + 0.05, "A: by columns", ha="center", va="bottom", fontsize=9)
    ax.text(6.4, height + 0.05, "B: by rows", ha="center", va="bottom", fontsize=9)
    ax.text(8.6, height + 0.05, "partial sums", ha="center", va="bottom", fontsize=9)
    ax.text(0.0, -0.12, "$f$: copy forward, all-reduce backward", ha="left", va="top",
            fontsize=10)
    ax.text(0.0, -0.55, "$g$: all-reduce forward ($Z = \\Sigma_i Z_i$), copy backward",
            ha="left", va="top", fontsize=10)
    _diagram_axes(ax, xlim, ylim)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.99, bottom=0.01)
    return fig


def _text_on(colour) -> str:
    """Black or white, whichever reads better on ``colour`` (by its relative luminance)."""
    r, g, b = matplotlib.colors.to_rgb(colour)
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.6 else "white"


def three_d_ranks(dp: int, pp: int, tp: int) -> np.ndarray:
    """The GPU of each (pipeline stage, data-parallel replica, tensor rank) in a 3-D layout.

    The placement of :class:`clusterlab.analytic.plan.workload.Layout` (Megatron-LM's order):
    tensor ranks innermost, then data-parallel replicas, then pipeline stages, so GPU
    ``tp * (dp * stage + replica) + tensor_rank``.

    Returns:
        i32[pp, dp, tp]: GPU numbers 0 to ``dp * pp * tp - 1``. A tensor-parallel group is
        ``[s, d, :]``, a data-parallel group ``[s, :, r]``, a pipeline ``[:, d, r]``.
    """
    dp, pp, tp = (_checks.count(n, v) for n, v in (("dp", dp), ("pp", pp), ("tp", tp)))
    return np.arange(dp * pp * tp, dtype=np.int32).reshape(pp, dp, tp)


def three_d_groups(dp: int, pp: int, tp: int) -> dict[str, np.ndarray]:
    """Each kind of group of a 3-D layout (:func:`three_d_ranks`) as rows of GPU numbers.

    Returns:
        ``{"tensor": i32[dp*pp, tp], "pipeline": i32[dp*tp, pp], "data": i32[pp*tp, dp]}``.
    """
    ranks = three_d_ranks(dp, pp, tp)
    return {"tensor": ranks.reshape(-1, tp),
            "pipeline": ranks.transpose(1, 2, 0).reshape(-1, pp),
            "data": ranks.transpose(0, 2, 1).reshape(-1, dp)}


def three_d_parallelism_diagram(dp: int = 2, pp: int = 2, tp: int = 4, *,
                                gpus_per_server: int = 8) -> plt.Figure:
    """The GPUs of a small cluster coloured by their tensor, pipeline and data-parallel groups.

    Three panels show the same ``dp * pp * tp`` GPUs (servers of ``gpus_per_server``, GPUs
    numbered as :func:`three_d_ranks` places them): in each, GPUs of one group share a colour,
    and the title says whether every group of that kind stays inside a server or some cross
    servers. Each GPU's box carries ``gid = "<kind> <group>"`` (kind ``tensor``, ``pipeline``
    or ``data``, group the row of :func:`three_d_groups`).

    Args:
        dp, pp, tp: data-parallel replicas, pipeline stages, tensor-parallel GPUs.
        gpus_per_server: GPUs in a server; ``tp`` must divide it (tensor parallelism stays on
            NVLink), and the GPUs must fill whole servers, at most four.

    Returns:
        The figure.
    """
    gps = _checks.count("gpus_per_server", gpus_per_server)
    groups = three_d_groups(dp, pp, tp)
    n = dp * pp * tp
    if gps % tp:
        raise ValueError(f"tp = {tp} must divide gpus_per_server = {gps}: a tensor-parallel "
                         "group stays inside one server.")
    if n % gps or not 1 <= n // gps <= 4:
        raise ValueError(f"dp * pp * tp = {n} GPUs must fill 1 to 4 whole servers of {gps}; "
                         "choose dp and pp so that it does.")
    servers = n // gps
    rows_per_server = 1 if servers <= 2 else 2  # a server's GPUs in one row, or two
    cols = int(np.ceil(gps / rows_per_server))
    cmap = plt.get_cmap("tab20" if max(len(g) for g in groups.values()) > 10 else "tab10")
    names = {"tensor": f"Tensor groups of {tp}", "pipeline": f"Pipeline groups of {pp} stages",
             "data": f"Data-parallel groups of {dp}"}
    xlim = (-0.2, servers * (cols + 0.8) - 0.6)
    ylim = (-0.2, rows_per_server + 0.55)
    panel_h = DIAGRAM_MAX_WIDTH_IN * (ylim[1] - ylim[0]) / (xlim[1] - xlim[0])
    fig, axes = plt.subplots(3, 1, figsize=(DIAGRAM_MAX_WIDTH_IN, 3 * (panel_h + 0.45) + 0.3))
    for ax, (kind, members_of) in zip(axes, groups.items()):
        group_of = np.empty(n, dtype=int)
        for g, members in enumerate(members_of):
            group_of[members] = g
        crosses = any(len(set(members // gps)) > 1 for members in members_of)
        for s in range(servers):
            x0 = s * (cols + 0.8)
            ax.add_patch(FancyBboxPatch((x0 - 0.08, -0.08), cols + 0.16, rows_per_server + 0.16,
                                        boxstyle="round,pad=0.04", facecolor="0.95",
                                        edgecolor="0.5"))
            ax.text(x0 + cols / 2, rows_per_server + 0.14, f"server {s}", ha="center",
                    va="bottom", fontsize=9, color="0.3")
            for local in range(gps):
                gpu = s * gps + local
                x, y = x0 + local % cols, rows_per_server - 1 - local // cols
                colour = cmap(group_of[gpu] % cmap.N)
                ax.add_patch(Rectangle((x + 0.05, y + 0.05), 0.9, 0.9, facecolor=colour,
                                       edgecolor="white", gid=f"{kind} {group_of[gpu]}"))
                ax.text(x + 0.5, y + 0.5, str(gpu), ha="center", va="center", fontsize=10,
                        color=_text_on(colour), fontweight="bold")
        where = "some cross servers (network)" if crosses else "each inside a server (NVLink)"
        ax.set_title(f"{names[kind]}: {where}", fontsize=10, loc="left",
                     color="#b2182b" if crosses else "0.1")
        _diagram_axes(ax, xlim, ylim)
    fig.text(0.01, 0.01, f"dp = {dp}, pp = {pp}, tp = {tp}: {n} GPUs; a colour is a group",
             fontsize=9, color="0.3")
    fig.subplots_adjust(left=0.02, right=0.98, top=0.93, bottom=0.07, hspace=0.5)
    return fig


#: The expert diagram's default routing: 2 devices, 4 tokens each, top-2 of 4 experts, every
#: expert chosen twice by each device (an even load; i32[devices, tokens, k]).
EXPERT_DIAGRAM_CHOICES = np.array([[[0, 2], [1, 3], [0, 3], [1, 2]],
                                   [[1, 2], [0, 3], [0, 2], [1, 3]]], dtype=np.int32)
EXPERT_DIAGRAM_MAX_SLOTS = 16


def expert_slots(choices: np.ndarray, n_experts: int, capacity: int) -> np.ndarray:
    """Which token fills each slot of each device's dispatch buffer, first come first served.

    Args:
        choices: i32[p, T, k], the experts each device's tokens chose.
        n_experts: E.
        capacity: C, slots per expert per device.

    Returns:
        i32[p, E, C]: the token (0 to T-1 on that device) in each slot, -1 where empty; a
        token past an expert's ``C`` slots is dropped, as in
        :func:`clusterlab.analytic.moe.predicted_dropped`.
    """
    p, tokens, _ = choices.shape
    slots = np.full((p, n_experts, capacity), -1, dtype=np.int32)
    filled = np.zeros((p, n_experts), dtype=int)
    for d in range(p):
        for token in range(tokens):
            for e in choices[d, token]:
                if filled[d, e] < capacity:
                    slots[d, e, filled[d, e]] = token
                    filled[d, e] += 1
    return slots


def _moe_slot(ax: Axes, x: float, y: float, token: int, source: int, gid: str,
              colour) -> None:
    """One slot of the expert diagram: token ``token`` of device ``source`` in its home
    device's colour, or a dotted empty slot (``token < 0``, headroom)."""
    if token < 0:
        ax.add_patch(Rectangle((x + 0.05, y), 0.9, 0.9, fill=False, edgecolor="0.6",
                               linestyle=":", gid=gid))
        return
    ax.add_patch(Rectangle((x + 0.05, y), 0.9, 0.9, facecolor=colour, edgecolor="white",
                           gid=gid))
    ax.text(x + 0.5, y + 0.45, f"{'abcdefgh'[source]}{token}", ha="center", va="center",
            fontsize=9, color="white", fontweight="bold")


def _moe_all_to_all_arrows(ax: Axes, x_src: float, x_dst: float, rows: dict[str, float], *,
                           crosses: bool) -> None:
    """The dispatch arrow (buffer to expert) and the combine arrow back, for one pair of
    devices: solid where it crosses devices, dashed where it stays."""
    style = {"arrowstyle": "-|>", "mutation_scale": 12, "color": "black" if crosses else "0.6",
             "linewidth": 2.0 if crosses else 1.2, "linestyle": "-" if crosses else "--"}
    ax.add_patch(FancyArrowPatch((x_src, rows["buffer"] - 0.5),
                                 (x_dst, rows["experts"] + 1.5), **style))
    ax.add_patch(FancyArrowPatch((x_dst, rows["experts"] - 0.2),
                                 (x_src, rows["outputs"] + 1.05), **style))


def _check_expert_choices(choices: np.ndarray, n_experts: int) -> None:
    """Refuse choices the expert diagram cannot draw, naming what to give instead."""
    if choices.ndim != 3:
        raise ValueError(f"choices must be [devices, tokens, k], got shape {choices.shape}.")
    p = choices.shape[0]
    if p < 2 or n_experts % p:
        raise ValueError(f"Expert parallelism needs at least 2 devices and a number of experts "
                         f"that they divide, got {p} devices and {n_experts} experts.")
    if choices.min() < 0 or choices.max() >= n_experts:
        raise ValueError(f"choices must name experts 0 to {n_experts - 1}.")


def _check_expert_width(n_devices: int, n_experts: int, capacity: int, tokens: int) -> None:
    """Refuse a diagram too wide to read: more slots across than EXPERT_DIAGRAM_MAX_SLOTS."""
    width = n_experts * capacity
    if n_devices * width > EXPERT_DIAGRAM_MAX_SLOTS or tokens > width:
        raise ValueError(f"{n_devices} devices of {n_experts} x {capacity} slots are too many to draw "
                         f"legibly (at most {EXPERT_DIAGRAM_MAX_SLOTS} slots across).")


def _moe_expert_box(ax: Axes, x0: float, width: float, y: float, expert: int) -> None:
    """The rounded box of one expert on its device, with its name above it."""
    ax.add_patch(FancyBboxPatch((x0, y - 0.1), width, 1.1, boxstyle="round,pad=0.05",
                                fill=False, edgecolor="0.2", linewidth=1.2))
    ax.text(x0 + width / 2, y + 1.1, f"expert E{expert}", ha="center", va="bottom",
            fontsize=9, fontweight="bold")


def _moe_router_lines(ax: Axes, choices: np.ndarray, slots: np.ndarray,
                      token_x: Callable[[int], float], expert_x: Callable[[int], float],
                      rows: dict[str, float]) -> None:
    """The router on one device: a line from each token to each of its k slots in that
    device's dispatch buffer (none for an assignment that was dropped).

    Args:
        choices: i32[T, k] the experts of each token. slots: i32[E, C] the token in each slot.
        token_x, expert_x: a token's centre and an expert's left edge, in the device's row.
    """
    for token, chosen in enumerate(choices):
        for e in chosen:
            where = np.flatnonzero(slots[e] == token)
            if where.size:
                ax.plot([token_x(token), expert_x(e) + where[0] + 0.5],
                        [rows["tokens"] - 0.05, rows["buffer"] + 0.95], color="0.6",
                        linewidth=0.8)


def _moe_note(n_experts: int, per_device: int, capacity: int, dropped: int) -> str:
    """The expert diagram's footnote: experts, slots and what was dropped."""
    return (f"{n_experts} experts, {per_device} per device; C = {capacity} "
            f"slot{'s' if capacity > 1 else ''} per expert per device"
            + (f"; {dropped} assignments dropped" if dropped else "")
            + "\nsolid arrow: crosses devices; dashed: stays")


def _moe_row_labels(ax: Axes, rows: dict[str, float], k: int) -> None:
    """The expert diagram's row names and its two all-to-alls, down the left edge."""
    labels = {"tokens": "tokens", "buffer": f"top-{k}\nrouting", "experts": "experts\nrun",
              "outputs": f"sum of {k}\noutputs"}
    for key, text in labels.items():
        ax.text(0.0, rows[key] + 0.45, text, ha="left", va="center", fontsize=9)
    ax.text(0.0, (rows["buffer"] + rows["experts"] + 0.9) / 2, "dispatch\nall-to-all",
            ha="left", va="center", fontsize=10, fontweight="bold")
    ax.text(0.0, (rows["experts"] + rows["outputs"] + 0.7) / 2, "combine\nall-to-all",
            ha="left", va="center", fontsize=10, fontweight="bold")


def expert_routing_diagram(choices: np.ndarray | None = None, *, n_experts: int = 4,
                           capacity_factor: float = 1.0) -> plt.Figure:
    """A mixture-of-experts layer under expert parallelism, top to bottom.

    Device 0's tokens (``a0``, ``a1``, ...) and device 1's (``b0``, ...) pick their top-k
    experts; each device fills ``C`` slots per expert (:func:`expert_slots`, first come first
    served); the dispatch all-to-all sends each expert's slots to its device; the experts run;
    the combine all-to-all brings the outputs back, each token summing its k, weighted. A
    token's colour is its home device's; empty slots are dotted. Slot ``gid``s: ``"buffer d e
    c"`` (on device d), ``"expert d e s c"`` (expert e on device d, from device s).

    Args:
        choices: i32[p, T, k], the experts chosen by each of device d's T tokens; None:
            :data:`EXPERT_DIAGRAM_CHOICES` (2 devices, 4 tokens, top-2 of 4 experts).
        n_experts: E, a multiple of the p devices.
        capacity_factor: c in ``C = ceil(c T k / E)``.

    Returns:
        The figure.
    """
    choices = EXPERT_DIAGRAM_CHOICES if choices is None else np.asarray(choices)
    n_experts = _checks.count("n_experts", n_experts)
    _check_expert_choices(choices, n_experts)
    p, tokens, k = choices.shape
    capacity = moe.expert_capacity(tokens, n_experts=n_experts, top_k=k,
                                   capacity_factor=capacity_factor)
    width = n_experts * capacity  # slots per device in a buffer row and in the experts row
    _check_expert_width(p, n_experts, capacity, tokens)
    slots = expert_slots(choices, n_experts, capacity)
    per_device = n_experts // p
    home = [_colour(d) for d in range(p)]
    gap, expert_gap = 1.6, 0.25
    col_w = width + expert_gap * (n_experts - 1)
    x_dev = [3.3 + d * (col_w + gap) for d in range(p)]
    rows = {"tokens": 8.4, "buffer": 6.4, "experts": 3.4, "outputs": 0.6}
    xlim, ylim = (-0.1, x_dev[-1] + col_w + 0.1), (-1.6, rows["tokens"] + 1.7)
    fig, ax = plt.subplots(figsize=(6.4, 6.4 * (ylim[1] - ylim[0]) / (xlim[1] - xlim[0])))

    def slot(x, y, token, source, gid):
        _moe_slot(ax, x, y, token, source, gid, home[source])

    def expert_x(d, e):  # left edge of expert e's group in device d's row
        return x_dev[d] + e * (capacity + expert_gap)

    for label in ("token", "output"):  # each device's tokens, in and out, in its colour
        for d in range(p):
            for token in range(tokens):
                slot(x_dev[d] + (token + 0.5) * col_w / tokens - 0.5, rows[f"{label}s"], token,
                     d, f"{label} {d} {token}")
    for d in range(p):
        ax.text(x_dev[d] + col_w / 2, rows["tokens"] + 1.15, f"device {d}", ha="center",
                va="bottom", fontsize=10, fontweight="bold", color=home[d])
        for e in range(n_experts):  # dispatch buffer: C slots per expert, by destination
            for c in range(capacity):
                slot(expert_x(d, e) + c, rows["buffer"], int(slots[d, e, c]), d,
                     f"buffer {d} {e} {c}")
            ax.text(expert_x(d, e) + capacity / 2, rows["buffer"] - 0.05, f"E{e}",
                    ha="center", va="top", fontsize=9)
        _moe_router_lines(ax, choices[d], slots[d],
                          lambda token, d=d: x_dev[d] + (token + 0.5) * col_w / tokens,
                          lambda e, d=d: expert_x(d, e), rows)
        for j, e in enumerate(range(d * per_device, (d + 1) * per_device)):
            x0 = x_dev[d] + j * (p * capacity + expert_gap)
            _moe_expert_box(ax, x0, p * capacity, rows["experts"], e)
            for s in range(p):
                for c in range(capacity):
                    slot(x0 + s * capacity + c, rows["experts"], int(slots[s, e, c]), s,
                         f"expert {d} {e} {s} {c}")
    for s, d in itertools.product(range(p), repeat=2):  # all-to-alls: a block per pair
        x_src = (expert_x(s, d * per_device) + expert_x(s, (d + 1) * per_device - 1)
                 + capacity) / 2
        _moe_all_to_all_arrows(ax, x_src, x_dev[d] + col_w / 2 + (s - (p - 1) / 2) * 1.2,
                               rows, crosses=s != d)
    _moe_row_labels(ax, rows, k)
    dropped = moe.predicted_dropped(choices, capacity, n_experts)
    ax.text(0.0, -0.2, _moe_note(n_experts, per_device, capacity, dropped), ha="left",
            va="top", fontsize=9, color="0.3")
    _diagram_axes(ax, xlim, ylim)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.99, bottom=0.01)
    return fig


FOUR_LAYERS_COLOURS = {"gpu": "#76b900", "server": "#eeeeee", "nvlink": "#1f77b4",
                       "fabric": "#ff7f0e", "storage": "#9467bd", "software": "#d9d9d9"}


def _draw_servers(ax: Axes, xs: Sequence[float], server_w: float, gpus_per_server: int) -> None:
    """Layer 1, servers with their GPUs and NICs; layer 2, the NVSwitch inside each."""
    colors = FOUR_LAYERS_COLOURS
    slot = (server_w - 0.3) / gpus_per_server
    for x in xs:
        ax.add_patch(FancyBboxPatch((x, 1.2), server_w, 1.6, boxstyle="round,pad=0.02",
                                    facecolor=colors["server"], edgecolor="black", lw=1,
                                    gid="server"))
        ax.add_patch(Rectangle((x + 0.15, 1.95), server_w - 0.3, 0.16, facecolor=colors["nvlink"],
                               edgecolor="none"))
        for g in range(gpus_per_server):
            gx = x + 0.15 + g * slot
            ax.add_patch(Rectangle((gx + 0.025, 1.35), slot - 0.05, 0.42,
                                   facecolor=colors["gpu"], edgecolor="black", lw=0.5, gid="gpu"))
            ax.plot([gx + slot / 2] * 2, [1.77, 1.95], color=colors["nvlink"], lw=1)
        ax.add_patch(Rectangle((x + 0.15, 2.28), server_w - 0.3, 0.38, facecolor="white",
                               edgecolor="black", lw=0.5))
        ax.text(x + server_w / 2, 2.47, "NICs", ha="center", va="center", fontsize=9)


def _draw_leaf_spine(ax: Axes, xs: Sequence[float], server_w: float,
                     right: float) -> list[float]:
    """Layer 3: two leaf and two spine switches above the servers; the leaves' centres."""
    colors = FOUR_LAYERS_COLOURS
    leaves = [right * f for f in (0.25, 0.75)]
    spines = [right * f for f in (0.4, 0.6)]
    for i, x in enumerate(xs):
        leaf = leaves[0] if i < len(xs) // 2 else leaves[1]
        ax.plot([x + server_w / 2, leaf], [2.66, 3.45], color=colors["fabric"], lw=2)
    for leaf in leaves:
        for spine in spines:
            ax.plot([leaf, spine], [3.85, 4.45], color=colors["fabric"], lw=2)
    for names, centres, y in (("leaf", leaves, 3.45), ("spine", spines, 4.45)):
        for cx in centres:
            ax.add_patch(Rectangle((cx - 0.75, y), 1.5, 0.4, facecolor=colors["fabric"],
                                   edgecolor="black", lw=0.8))
            ax.text(cx, y + 0.2, names, ha="center", va="center", fontsize=9)
    return leaves


def _draw_storage_and_software(ax: Axes, xs: Sequence[float], sx: float) -> None:
    """Layer 4, shared storage on a network of its own (not the compute fabric), and the
    software stack below everything."""
    colors = FOUR_LAYERS_COLOURS
    ax.add_patch(FancyBboxPatch((sx, 1.2), 1.9, 1.6, boxstyle="round,pad=0.02",
                                facecolor=colors["storage"], edgecolor="black", lw=1))
    ax.text(sx + 0.95, 2.0, "shared\nstorage", ha="center", va="center", fontsize=10,
            color="white", fontweight="bold")
    ax.plot([xs[0] + 0.3, sx + 0.3], [1.0, 1.0], color=colors["storage"], lw=2)
    for x in [*xs, sx]:
        ax.plot([x + 0.3, x + 0.3], [1.0, 1.2], color=colors["storage"], lw=2)
    ax.text(sx + 0.95, 0.93, "storage network", ha="center", va="top", fontsize=9,
            color=colors["storage"])
    ax.add_patch(Rectangle((xs[0], 0.0), sx + 1.9 - xs[0], 0.5, facecolor=colors["software"],
                           edgecolor="black", lw=0.8))
    ax.text((xs[0] + sx + 1.9) / 2, 0.25,
            "software: scheduler, JAX / PyTorch, NCCL, monitoring",
            ha="center", va="center", fontsize=9)


def _layer_marker(ax: Axes, x: float, y: float, number: int) -> None:
    """A numbered black disc (``gid = "layer N"``) tying a part of the drawing to the legend."""
    ax.add_patch(plt.Circle((x, y), 0.2, facecolor="black", edgecolor="none", zorder=5,
                            gid=f"layer {number}"))
    ax.text(x, y, str(number), color="white", ha="center", va="center", fontsize=9,
            fontweight="bold", zorder=6)


def four_layers_diagram(n_servers: int = 4, gpus_per_server: int = 8) -> plt.Figure:
    """The four layers of a GPU cluster, drawn: servers of GPUs (1) joined inside by NVLink (2),
    a leaf-spine fabric between them (3), shared storage on a network of its own (4), and the
    software below.

    Numbered black markers (``gid = "layer 1"`` to ``"layer 4"``) tie the parts to the legend;
    each GPU's box carries ``gid = "gpu"``, each server's ``"server"``.

    Args:
        n_servers: servers drawn, 2 to 6 (half of them under each leaf switch).
        gpus_per_server: GPUs drawn in each server, 1 to 8.

    Returns:
        The figure.
    """
    n_servers = _checks.count("n_servers", n_servers, minimum=2)
    gpus_per_server = _checks.count("gpus_per_server", gpus_per_server)
    if n_servers > 6 or gpus_per_server > 8:
        raise ValueError(f"four_layers_diagram draws 2 to 6 servers of 1 to 8 GPUs, got "
                         f"{n_servers} servers of {gpus_per_server}.")
    server_w, gap = 2.2, 0.3
    xs = [i * (server_w + gap) for i in range(n_servers)]
    right = xs[-1] + server_w
    sx = right + 0.6  # the storage box's left edge
    xlim, ylim = (-0.55, sx + 2.15), (-0.1, 4.95)
    fig, ax = plt.subplots(figsize=(DIAGRAM_MAX_WIDTH_IN, DIAGRAM_MAX_WIDTH_IN
                                    * (ylim[1] - ylim[0]) / (xlim[1] - xlim[0])))
    _draw_servers(ax, xs, server_w, gpus_per_server)
    leaves = _draw_leaf_spine(ax, xs, server_w, right)
    _draw_storage_and_software(ax, xs, sx)
    _layer_marker(ax, xs[0] - 0.25, 1.56, 1)
    _layer_marker(ax, xs[0] - 0.25, 2.03, 2)
    _layer_marker(ax, leaves[0] - 1.0, 3.65, 3)
    _layer_marker(ax, sx + 1.9, 2.8, 4)
    legend = [f"GPU servers ({gpus_per_server} GPUs)", "node interconnect: NVLink",
              "fabric: InfiniBand / RoCE", "shared storage"]
    for i, text in enumerate(legend):
        y = 4.65 - 0.42 * i
        _layer_marker(ax, leaves[1] + 1.3, y, i + 1)
        ax.text(leaves[1] + 1.58, y, text, ha="left", va="center", fontsize=9)
    _diagram_axes(ax, xlim, ylim)
    fig.subplots_adjust(left=0.0, right=1.0, top=1.0, bottom=0.0)
    return fig


def sharding_blocks(mesh_shape: tuple[int, int], axis_names: tuple[str, str],
                    spec: tuple[str | None, ...]) -> dict[tuple[int, int], tuple[int, ...]]:
    """Which devices hold each block of a 2-D array under a partition spec on a 2-D mesh.

    The mesh numbers its devices row by row (``np.arange(n).reshape(mesh_shape)``), as
    ``devices.mesh`` does with lab 00's CPU devices. A spec has at most one entry per array
    dimension: a mesh axis's name splits that dimension over the axis, ``None`` or a missing
    entry keeps it whole; mesh axes the spec leaves out replicate the blocks.

    Args:
        mesh_shape: the mesh's shape, two positive whole numbers.
        axis_names: the names of its two axes.
        spec: like ``PartitionSpec``'s entries, e.g. ``("data",)``, ``(None, "model")``, ``()``.

    Returns:
        ``{(block row, block column): devices holding that block, ascending}``.
    """
    rows, cols = (_checks.count(f"mesh_shape[{i}]", n) for i, n in enumerate(mesh_shape))
    if len(axis_names) != 2 or len(set(axis_names)) != 2:
        raise ValueError(f"axis_names must be two different names, got {axis_names!r}.")
    spec = tuple(spec) + (None,) * (2 - len(spec))
    if len(spec) > 2:
        raise ValueError(f"spec {spec!r} has more entries than the array's 2 dimensions.")
    for entry in spec:
        if entry is not None and entry not in axis_names:
            raise ValueError(f"spec entry {entry!r} is not a mesh axis: use one of "
                             f"{axis_names} or None.")
    used = [e for e in spec if e is not None]
    if len(used) != len(set(used)):
        raise ValueError(f"spec {spec!r} splits two dimensions over one mesh axis; "
                         "name each mesh axis at most once.")
    ids = np.arange(rows * cols).reshape(rows, cols)
    blocks: dict[tuple[int, int], list[int]] = {}
    for coord in np.ndindex(rows, cols):
        block = tuple(0 if e is None else coord[axis_names.index(e)] for e in spec)
        blocks.setdefault(block, []).append(int(ids[coord]))
    return {block: tuple(sorted(held)) for block, held in sorted(blocks.items())}


def _device_list(devices: tuple[int, ...]) -> str:
    """``"3"``, ``"0, 4"`` or ``"0-3"`` for a run of consecutive devices."""
    if len(devices) > 2 and devices == tuple(range(devices[0], devices[-1] + 1)):
        return f"{devices[0]}-{devices[-1]}"
    return ", ".join(map(str, devices))


def _spec_text(spec: tuple[str | None, ...]) -> str:
    return "P(" + ", ".join("None" if e is None else repr(e) for e in spec) + ")"


def _checked_mesh_specs(mesh_shape, axis_names, specs, array_shape):
    """``(rows, cols, specs)`` for :func:`mesh_shardings_diagram`, or a ValueError naming the fix."""
    rows, cols = (_checks.count(f"mesh_shape[{i}]", n) for i, n in enumerate(mesh_shape))
    if rows > 4 or cols > 4:
        raise ValueError(f"mesh_shardings_diagram draws meshes of up to 4 x 4 devices, got "
                         f"{rows} x {cols}.")
    first, second = axis_names
    specs = [(first,), (first, second), (None, second), ()] if specs is None else list(specs)
    if not 1 <= len(specs) <= 4:
        raise ValueError(f"mesh_shardings_diagram draws 1 to 4 specs, got {len(specs)}.")
    size = dict(zip(axis_names, (rows, cols)))
    for spec in specs:
        for dim, entry in enumerate(spec):
            if entry in size and array_shape[dim] % size[entry]:
                raise ValueError(f"{_spec_text(spec)}: dimension {dim} of the array "
                                 f"({array_shape[dim]}) does not divide over the {size[entry]} "
                                 f"devices of {entry!r}; choose an array_shape that divides.")
    return rows, cols, specs


def _draw_mesh(ax: Axes, shape: tuple[int, int], axis_names: tuple[str, str],
               top_left: tuple[float, float], cell: float) -> None:
    """The mesh's devices, numbered row by row in their colours, and its two named axes."""
    (rows, cols), (mesh_x, mesh_top), (first, second) = shape, top_left, axis_names
    for r, c in np.ndindex(rows, cols):
        device = r * cols + c
        ax.add_patch(Rectangle((mesh_x + c * cell, mesh_top - (r + 1) * cell), cell * 0.92,
                               cell * 0.92, facecolor=_colour(device), edgecolor="white",
                               gid=f"device {device}"))
        ax.text(mesh_x + (c + 0.46) * cell, mesh_top - (r + 0.54) * cell, str(device),
                ha="center", va="center", fontsize=10, fontweight="bold",
                color=_text_on(_colour(device)))
    mesh_bottom = mesh_top - rows * cell
    _grey_arrow(ax, (mesh_x - 0.2, mesh_top), (mesh_x - 0.2, mesh_bottom))
    ax.text(mesh_x - 0.3, (mesh_top + mesh_bottom) / 2, repr(first), rotation=90, ha="right",
            va="center", fontsize=10)
    _grey_arrow(ax, (mesh_x, mesh_bottom - 0.15), (mesh_x + cols * cell, mesh_bottom - 0.15))
    ax.text(mesh_x + cols * cell / 2, mesh_bottom - 0.25, repr(second), ha="center", va="top",
            fontsize=10)


def _draw_sharded_array(ax: Axes, blocks: dict, spec: tuple, x0: float,
                        size: tuple[float, float]) -> None:
    """One spec's array at ``x0``: its blocks in the colour of their lowest device, labelled."""
    array_w, array_h = size
    n_r = 1 + max(b[0] for b in blocks)
    n_c = 1 + max(b[1] for b in blocks)
    ax.text(x0 + array_w / 2, array_h + 0.1, _spec_text(spec), ha="center", va="bottom",
            fontsize=10, fontfamily="monospace")
    for (r, c), held in blocks.items():
        colour = _colour(held[0])
        gid = f"{_spec_text(spec)} block {r} {c}"
        bw, bh = array_w / n_c, array_h / n_r
        ax.add_patch(Rectangle((x0 + c * bw, array_h - (r + 1) * bh), bw, bh,
                               facecolor=colour, edgecolor="white", linewidth=1.5, gid=gid))
        label = _device_list(held)
        if len(label) > 3 and bw < 1.0:  # a narrow block: one device per line
            label = "\n".join(map(str, held))
        ax.text(x0 + (c + 0.5) * bw, array_h - (r + 0.5) * bh, label, ha="center",
                va="center", fontsize=9, color=_text_on(colour), gid=gid)


def mesh_shardings_diagram(mesh_shape: tuple[int, int] = (2, 4),
                           axis_names: tuple[str, str] = ("data", "model"),
                           specs: Sequence[tuple[str | None, ...]] | None = None,
                           array_shape: tuple[int, int] = (8, 12)) -> plt.Figure:
    """A 2-D device mesh, and the blocks of one array under several partition specs.

    Top: the mesh, its devices numbered row by row, its axes named. Below: the array once per
    spec, cut into the blocks :func:`sharding_blocks` gives, each block labelled with the devices
    that hold it and drawn in the colour of the lowest of them (the mesh's colours). Each
    device's box carries ``gid = "device i"``, each block's box and label
    ``"<spec> block r c"`` (spec as ``P('data', None)``).

    Args:
        mesh_shape: the mesh's shape (1 to 4 rows, 1 to 4 columns).
        axis_names: the mesh's axis names (rows, columns).
        specs: 1 to 4 specs; default: split rows, both, columns only, nothing (replicated).
        array_shape: the array's (rows, columns); each split must divide evenly.

    Returns:
        The figure.
    """
    rows, cols, specs = _checked_mesh_specs(mesh_shape, axis_names, specs, array_shape)
    first, second = axis_names
    cell = 0.7  # a device's box in the mesh
    array_w = 3.0
    array_h = array_w * array_shape[0] / array_shape[1]
    gap = 0.9
    width = len(specs) * array_w + (len(specs) - 1) * gap
    mesh_top = array_h + 1.3 + rows * cell
    xlim, ylim = (-0.1, max(width, cols * cell + 3.6) + 0.1), (-0.15, mesh_top + 0.15)
    fig, ax = plt.subplots(figsize=(DIAGRAM_MAX_WIDTH_IN, DIAGRAM_MAX_WIDTH_IN
                                    * (ylim[1] - ylim[0]) / (xlim[1] - xlim[0])))
    _draw_mesh(ax, (rows, cols), axis_names, (0.9, mesh_top), cell)
    ax.text(0.9 + cols * cell + 0.3, mesh_top - 0.1,
            f"a mesh of {rows} x {cols} devices,\naxes {first!r} (rows) and {second!r} "
            f"(columns);\nbelow, an array f32[{array_shape[0]}, {array_shape[1]}] under\n"
            "each spec, a block labelled with\nthe devices that hold it",
            ha="left", va="top", fontsize=9)
    for k, spec in enumerate(specs):
        _draw_sharded_array(ax, sharding_blocks((rows, cols), axis_names, spec), spec,
                            k * (array_w + gap), (array_w, array_h))
    _diagram_axes(ax, xlim, ylim)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.99, bottom=0.01)
    return fig


RACK_COLOURS = {"gpu": "#76b900", "tray": "#eeeeee", "nvlink": "#1f77b4", "fabric": "#ff7f0e"}
RACK_MAX_OTHER_RACKS = 3


def _rack_rows(rack: hardware.Rack) -> list[str]:
    """The rack's trays from top to bottom: compute trays, the NVLink switch trays in the
    middle, then the rest of the compute trays (the upper group has the odd one)."""
    upper = (rack.compute_trays + 1) // 2
    return (["compute"] * upper + ["switch"] * rack.nvlink_switch_trays
            + ["compute"] * (rack.compute_trays - upper))


def _draw_rack_trays(ax: Axes, rack: hardware.Rack, x0: float, pitch: float) -> list[float]:
    """The rack's trays, their GPUs, NICs and NVLink links to the spine; the compute trays'
    centres (y), top first."""
    rows = _rack_rows(rack)
    top = len(rows) * pitch
    tray_w, gpu = 2.3, 0.8 * pitch
    spine_x = x0 + 0.12
    compute_y = []
    for k, kind in enumerate(rows):
        y = top - (k + 1) * pitch
        colour = RACK_COLOURS["nvlink"] if kind == "switch" else RACK_COLOURS["tray"]
        ax.add_patch(Rectangle((x0 + 0.25, y + 0.05 * pitch), tray_w, 0.9 * pitch,
                               facecolor=colour, edgecolor="0.4", linewidth=0.5,
                               gid=f"{kind} tray"))
        ax.plot([spine_x, x0 + 0.25], [y + pitch / 2] * 2, color=RACK_COLOURS["nvlink"], lw=1.2,
                gid="nvlink")
        if kind == "switch":
            continue
        compute_y.append(y + pitch / 2)
        for g in range(rack.gpus_per_tray):
            ax.add_patch(Rectangle((x0 + 0.35 + g * 1.3 * gpu, y + 0.1 * pitch), gpu, gpu,
                                   facecolor=RACK_COLOURS["gpu"], edgecolor="black",
                                   linewidth=0.4, gid="gpu"))
        for n in range(rack.nics_per_tray):
            ax.add_patch(Rectangle((x0 + 0.2 + tray_w - (n + 1) * 0.6 * gpu, y + 0.3 * pitch),
                                   0.5 * gpu, 0.4 * pitch, facecolor="white", edgecolor="black",
                                   linewidth=0.4, gid="nic"))
    ax.plot([spine_x] * 2, [pitch / 2, top - pitch / 2], color=RACK_COLOURS["nvlink"], lw=3,
            gid="nvlink spine")
    ax.add_patch(Rectangle((x0, -0.05), tray_w + 0.35, top + 0.1, facecolor="none",
                           edgecolor="black", linewidth=1.2, gid="rack"))
    return compute_y


def _draw_scale_out(ax: Axes, compute_y: Sequence[float], nic_x: float, top: float,
                    other_racks: int) -> None:
    """Two leaves (one line from each compute tray's NICs), two spines, other racks."""
    leaf_x, spine_x, other_x = 6.3, 7.9, 9.4
    leaves = [top * 0.72, top * 0.28]
    for k, y in enumerate(compute_y):
        leaf = leaves[0] if k < len(compute_y) / 2 else leaves[1]
        ax.plot([nic_x, leaf_x - 0.4], [y, leaf], color=RACK_COLOURS["fabric"], lw=0.8,
                gid="tray uplink")
    spines = [top * 0.62, top * 0.38]
    other_ys = list(np.linspace(top * 0.85, top * 0.15, other_racks)) if other_racks > 1 \
        else [top / 2]
    for leaf in leaves:
        for spine in spines:
            ax.plot([leaf_x + 0.4, spine_x - 0.4], [leaf, spine], color=RACK_COLOURS["fabric"],
                    lw=2)
    for spine in spines:
        for y in other_ys:
            ax.plot([spine_x + 0.4, other_x - 0.45], [spine, y], color=RACK_COLOURS["fabric"],
                    lw=2)
    for name, x, ys in (("leaf", leaf_x, leaves), ("spine", spine_x, spines)):
        for y in ys:
            ax.add_patch(Rectangle((x - 0.4, y - 0.18), 0.8, 0.36,
                                   facecolor=RACK_COLOURS["fabric"], edgecolor="black", lw=0.8,
                                   gid=name))
            ax.text(x, y, name, ha="center", va="center", fontsize=9)
    for y in other_ys:
        ax.add_patch(Rectangle((other_x - 0.45, y - 0.3), 1.1, 0.6, facecolor=RACK_COLOURS["tray"],
                               edgecolor="black", lw=1, gid="other rack"))
        ax.text(other_x + 0.1, y, "another\nrack", ha="center", va="center", fontsize=9)
    ax.text((leaf_x + spine_x) / 2, top + 0.12, "scale-out network:\nInfiniBand or Ethernet",
            ha="center", va="bottom", fontsize=9, color=RACK_COLOURS["fabric"],
            fontweight="bold")


def nvl72_rack_diagram(rack: hardware.Rack | str = "GB200 NVL72", *,
                       other_racks: int = 2) -> plt.Figure:
    """A rack-scale NVLink system and its scale-out network, drawn from the catalog's counts.

    Left, the rack: its compute trays of GPUs (green) and NICs (white), and in the middle its
    NVLink switch trays (blue), every tray cabled to one NVLink spine, so all its GPUs form one
    NVLink domain (scale-up). Right, the scale-out network: each compute tray's NICs run to a
    leaf switch (one line per tray), leaves to spines, and spines to other racks. For the
    GB200 NVL72 the counts are NVIDIA's: 72 Blackwell GPUs in one NVLink domain, 18 compute
    trays of 4 GPUs and 9 NVLink switch trays (NVIDIA GB200 NVL72,
    https://www.nvidia.com/en-us/data-center/gb200-nvl72/, and the DGX GB200 user guide; see
    ``hardware.rack("GB200 NVL72").source``), and 4 NICs per tray, one per GPU.
    Boxes carry ``gid`` ``"gpu"``, ``"nic"``, ``"compute tray"``, ``"switch tray"``, ``"leaf"``,
    ``"spine"`` and ``"other rack"``; the tray-to-leaf lines ``"tray uplink"``.

    Args:
        rack: a :class:`clusterlab.catalog.hardware.Rack` or its name.
        other_racks: racks drawn beyond this one, 1 to 3.

    Returns:
        The figure.
    """
    rack = hardware.rack(rack) if isinstance(rack, str) else rack
    other_racks = _checks.count("other_racks", other_racks)
    if other_racks > RACK_MAX_OTHER_RACKS:
        raise ValueError(f"nvl72_rack_diagram draws 1 to {RACK_MAX_OTHER_RACKS} other racks, "
                         f"got other_racks = {other_racks}.")
    pitch = 0.2
    rows = _rack_rows(rack)
    top = len(rows) * pitch
    x0 = 2.3
    fig, ax = plt.subplots(figsize=(DIAGRAM_MAX_WIDTH_IN,
                                    DIAGRAM_MAX_WIDTH_IN * (top + 1.2) / 10.8))
    compute_y = _draw_rack_trays(ax, rack, x0, pitch)
    upper = (rack.compute_trays + 1) // 2
    labels = [(f"{upper} compute trays,\n{rack.gpus_per_tray} GPUs and "
               f"{rack.nics_per_tray} NICs each", top - upper * pitch / 2),
              (f"{rack.nvlink_switch_trays} NVLink\nswitch trays",
               top - (upper + rack.nvlink_switch_trays / 2) * pitch),
              (f"{rack.compute_trays - upper} compute trays",
               (rack.compute_trays - upper) * pitch / 2)]
    for text, y in labels:
        ax.text(x0 - 0.1, y, text, ha="right", va="center", fontsize=9)
    ax.text(x0 + 1.3, top + 0.12, f"{rack.name}: {rack.nvlink_domain_gpus} GPUs,\n"
            "one NVLink domain (scale-up)", ha="center", va="bottom", fontsize=9,
            color=RACK_COLOURS["nvlink"], fontweight="bold")
    nic_x = x0 + 2.55
    _draw_scale_out(ax, compute_y, nic_x, top, other_racks)
    ax.text(nic_x + 0.1, -0.12, "orange line: one compute tray's NICs", ha="left", va="top",
            fontsize=9, color="0.3")
    _diagram_axes(ax, (-0.1, 10.7), (-0.5, top + 0.7))
    fig.subplots_adjust(left=0.0, right=1.0, top=1.0, bottom=0.0)
    return fig
