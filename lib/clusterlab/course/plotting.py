"""One look for every figure in the course."""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter, MaxNLocator

from clusterlab import _checks
from clusterlab.analytic import memory
from clusterlab.analytic.schedule import FORWARD, IDLE, Schedule
from clusterlab.analytic.tables import format_bytes

MEASURED_STYLE = {"marker": "o", "linestyle": "-", "linewidth": 1.5, "markersize": 4}
MODEL_STYLE = {"linestyle": "--", "linewidth": 1.5}


def use_course_style() -> None:
    """Set matplotlib defaults shared by chapters and labs."""
    plt.rcParams.update({
        "figure.figsize": (7.0, 4.0),
        "figure.dpi": 100,
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


def pipeline_timeline(schedule: Schedule, ax: Axes | None = None) -> Axes:
    """A pipeline schedule as a coloured timeline: one row per stage, one box per piece of work.

    Forward passes are solid, backward passes lighter and hatched, in the micro-batch's colour
    and labelled with its number (``3.1``: micro-batch 3, model chunk 1, when interleaved with
    v = 2; narrower boxes are left unlabelled); idle slots are grey. Time runs in passes of one
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
        ax.add_patch(Rectangle((t * width, s - 0.4), width, 0.8, facecolor=_colour(i),
                               alpha=1.0 if forward else 0.45, hatch=None if forward else "///",
                               edgecolor="white", linewidth=0.5,
                               gid="forward" if forward else "backward"))
        if v <= MAX_LABELLED_VIRTUAL_STAGES:  # narrower boxes have no room for a label
            label = f"{i}.{int(schedule.chunk[t, s])}" if v > 1 else f"{i}"
            ax.text((t + 0.5) * width, s, label, ha="center", va="center",
                    fontsize=7 if v == 1 else 5, clip_on=True)
    ax.set_xlim(0, schedule.slots * width)
    ax.set_ylim(schedule.stages - 0.5, -0.5)  # stage 0 on top
    ax.set_yticks(range(schedule.stages), [f"stage {s}" for s in range(schedule.stages)])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(False)
    ax.set_xlabel("time (passes of one micro-batch through one stage)")
    chunks = f", v = {v}" if v > 1 else ""
    ax.set_title(f"{schedule.name}: p = {schedule.stages}, m = {schedule.microbatches}{chunks}, "
                 f"idle {schedule.idle_fraction:.1%}", fontsize=10)
    ax.legend(handles=[Patch(facecolor="0.5", label="forward"),
                       Patch(facecolor="0.5", alpha=0.45, hatch="///", label="backward"),
                       Patch(facecolor=IDLE_COLOUR, label="idle")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
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


def ring_chunks_sent(p: int) -> np.ndarray:
    """Which chunk each device sends to its right neighbour in each step of a ring all-reduce.

    The buffer is cut into p chunks. In reduce-scatter step ``k`` (1 to p-1) device ``i`` sends
    its partial sum of chunk ``(i - k) mod p`` and ends owning the full sum of chunk ``i``; in
    all-gather step ``k`` it passes on chunk ``(i + 1 - k) mod p``. This is the order of
    :func:`clusterlab.device.collectives.ring_reduce_scatter` and
    :func:`clusterlab.device.collectives.ring_all_gather`.

    Args:
        p: devices in the ring, at least 2.

    Returns:
        i32[2(p-1), p]: the chunk index per step (reduce-scatter steps first) and device.
    """
    p = _checks.count("p", p, minimum=2)
    device = np.arange(p)
    steps = np.arange(1, p)[:, None]
    return np.vstack([(device - steps) % p, (device + 1 - steps) % p]).astype(np.int32)


def ring_all_reduce_steps(p: int, ax: Axes | None = None) -> Axes:
    """A ring all-reduce as a picture: the chunk each device sends in each of its 2(p-1) steps.

    Rows are devices, columns steps: p-1 reduce-scatter steps (each device adds what it receives
    to its own share and passes the partial sum on), then p-1 all-gather steps (the completed
    chunks travel round). Each box, in its chunk's colour, says which chunk goes to the right
    neighbour (``gid`` ``"reduce-scatter"`` or ``"all-gather"``); the steps come from
    :func:`ring_chunks_sent`.

    Args:
        p: devices in the ring, at least 2.
        ax: where to draw; a new figure when None.

    Returns:
        The axes.
    """
    sent = ring_chunks_sent(p)
    ax = _axes(ax)
    for k, i in np.ndindex(sent.shape):
        reduce_scatter = k < p - 1
        ax.add_patch(Rectangle((k, i - 0.4), 1, 0.8, facecolor=_colour(int(sent[k, i])),
                               alpha=0.5 if reduce_scatter else 1.0, edgecolor="white",
                               gid="reduce-scatter" if reduce_scatter else "all-gather"))
        ax.text(k + 0.5, i, f"c{sent[k, i]} \u2192 {(i + 1) % p}", ha="center", va="center",
                fontsize=8)
    ax.axvline(p - 1, color="black", linewidth=1)
    ax.set_xlim(0, 2 * (p - 1))
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_xticks(np.arange(2 * (p - 1)) + 0.5,
                  [f"RS {k}" for k in range(1, p)] + [f"AG {k}" for k in range(1, p)])
    ax.set_yticks(range(p), [f"device {i}" for i in range(p)])
    ax.grid(False)
    ax.set_xlabel("step (RS: reduce-scatter, partial sums; AG: all-gather, finished chunks)")
    ax.set_title(f"Ring all-reduce on {p} devices: chunk sent to the right neighbour per step",
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


def _collective_buffers(p: int) -> dict:
    """Each collective's (where in training, before, after): a list of (label, colour) cells
    per device, for :func:`collectives_before_after`."""
    letters = "abcd"
    colours = plt.get_cmap("tab10").colors[:p]
    sum_colour = "0.35"

    def chunk(device, k):
        return (f"${letters[device]}_{k}$", colours[device])

    def total(k):
        return (f"$\\Sigma_{k}$", sum_colour)

    def whole(device):
        return (f"${letters[device]}$", colours[device])

    inputs = [[chunk(d, k) for k in range(p)] for d in range(p)]
    nothing = [[] for _ in range(p)]
    return {
        "all-reduce": ("data-parallel gradients", inputs, [[total(k) for k in range(p)]] * p),
        "reduce-scatter": ("ZeRO/FSDP gradients", inputs, [[total(d)] for d in range(p)]),
        "all-gather": ("ZeRO/FSDP parameters", [[whole(d)] for d in range(p)],
                       [[whole(k) for k in range(p)]] * p),
        "all-to-all": ("expert-parallel token routing", inputs,
                       [[chunk(k, d) for k in range(p)] for d in range(p)]),
        "broadcast (root 0)": ("initial weights from one rank", [inputs[0]] + nothing[1:],
                               [inputs[0]] * p),
        "reduce (root 0)": ("a metric summed on one rank", inputs,
                            [[total(k) for k in range(p)]] + nothing[1:]),
        "send/recv (0 → 1)": ("pipeline activations", [inputs[0]] + nothing[1:],
                              [[], inputs[0]] + nothing[2:]),
    }


def _draw_buffers(ax, x0: float, buffers, title: str, p: int) -> None:
    """One row of ``p`` chunk cells per device, starting at ``x0``, titled ``title``."""
    for d, cells in enumerate(buffers):
        y = p - 1 - d
        ax.text(x0 - 0.15, y + 0.4, f"GPU{d}", ha="right", va="center", fontsize=8)
        ax.add_patch(Rectangle((x0, y), p, 0.8, fill=False, ec="0.75", lw=0.8, ls=":"))
        for k, (label, colour) in enumerate(cells):
            ax.add_patch(Rectangle((x0 + k, y), 1, 0.8, fc=colour, ec="white", lw=1.5,
                                   alpha=0.9))
            ax.text(x0 + k + 0.5, y + 0.4, label, ha="center", va="center", color="white",
                    fontsize=10)
    ax.text(x0 + p / 2, p + 0.05, title, ha="center", va="bottom", fontsize=8, color="0.3")


def collectives_before_after(p: int = 4) -> plt.Figure:
    """What each of ``p`` devices holds before and after each of the seven collectives.

    One panel per collective (all-reduce, reduce-scatter, all-gather, all-to-all, broadcast,
    reduce, send/recv): a row of chunks per device before and after, device ``d``'s input in
    its own colour and cut into ``p`` chunks (``a_0 .. a_{p-1}`` for device 0, ``b`` for device
    1, ...), a reduced chunk ``Σ_k`` in grey; a dotted outline is a buffer that receives no
    result. The grey line under each name says where the collective appears in training.

    Args:
        p: devices, 2 to 4 (one letter each: a, b, c, d).

    Returns:
        The figure (4 x 2 panels; the last one is the legend).
    """
    p = _checks.count("p", p)
    if not 2 <= p <= 4:
        raise ValueError(f"p must be 2 to 4 (one letter per device), got {p}.")
    letters = "abcd"
    fig, axes = plt.subplots(4, 2, figsize=(9.5, 11))
    for ax, (name, (use, before, after)) in zip(axes.flat, _collective_buffers(p).items()):
        _draw_buffers(ax, 0.0, before, "before", p)
        ax.annotate("", xy=(p + 1.55, p / 2), xytext=(p + 0.25, p / 2),
                    arrowprops={"arrowstyle": "-|>", "color": "0.3", "lw": 1.5})
        _draw_buffers(ax, p + 2.2, after, "after", p)
        ax.text(-1.0, p + 1.25, name, fontsize=11, fontweight="bold")
        ax.text(-1.0, p + 0.75, use, fontsize=9, color="0.4")
        ax.set_xlim(-1.0, 2 * p + 2.3)
        ax.set_ylim(-0.2, p + 1.5)
        ax.set_aspect("equal")
        ax.axis("off")
    legend_ax = axes.flat[-1]
    legend_ax.axis("off")
    devices = ", ".join(f"{letters[d]}: GPU{d}" for d in range(1, p))
    sums = " + ".join(f"{letters[d]}_k" for d in range(p))
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
