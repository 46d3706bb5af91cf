"""Explorers: grids of the course's models that a reader of the HTML book moves through.

An explorer is a set of controls, each a short list of options, and one *cell* per combination
of options. A cell holds what ``clusterlab`` computes for that input, or the message of the
``ValueError`` it raises there (a layout that does not fit, an algorithm NCCL does not run).
The grid is computed when the book builds, by calling the library, so a change to a model shows
up in the next build.

:meth:`Explorer._repr_html_` writes an explorer as an HTML fragment: the grid as JSON and a
script tag for ``explorers.js`` (``_assets/`` in the repository, served as ``_static/``). That
script draws the controls, the numbers and a chart in plain JavaScript: nothing is fetched from
another machine. :func:`static_figure` draws the same chart at the default options, for the PDF.

The four explorers:

* :func:`memory_explorer`: memory per GPU by the planner's memory model;
* :func:`collective_explorer`: an all-reduce's time and busbw by ``costmodel.cluster_collective``;
* :func:`planner_explorer`: the step-time breakdown of the planner's best layouts;
* :func:`fabric_explorer`: an all-reduce on a shared leaf-spine fabric by the flow-level model.
"""

from __future__ import annotations

import html
import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import matplotlib.pyplot as plt
import numpy as np

from clusterlab.analytic import costmodel, fabric, plan, topology
from clusterlab.catalog import hardware

#: Significant digits of the numbers in the page: it shows 3; the tests compare 7.
JSON_DIGITS = 8
#: Where the book serves explorers.js and explorers.css, relative to a chapter's page.
STATIC_FROM_CHAPTER = "../_static"


@dataclass(frozen=True)
class Option:
    """One choice of a control: the label the reader sees and the value the model gets."""

    label: str
    value: Any  # JSON-serialisable


@dataclass(frozen=True)
class Control:
    """A slider (ordered options) or a select (named options)."""

    name: str
    label: str
    options: tuple[Option, ...]
    default: int = 0
    kind: Literal["slider", "select"] = "select"

    def __post_init__(self) -> None:
        if not 0 <= self.default < len(self.options):
            raise ValueError(f"Control {self.name!r}: default {self.default} is not an index "
                             f"of its {len(self.options)} options.")


@dataclass(frozen=True)
class Output:
    """A number (shown as ``value / scale`` with its unit) or a text the explorer shows."""

    name: str
    label: str
    unit: str = ""
    scale: float = 1.0
    kind: Literal["number", "text"] = "number"


@dataclass(frozen=True)
class Chart:
    """What the chart draws: ``"line"``, output ``y`` over the options of control ``over``; or
    ``"stacks"``, the outputs named in ``parts`` stacked, one bar per option of ``over``, with
    the output ``limit`` (if given) as a dashed line. Both in the units of their outputs."""

    kind: Literal["line", "stacks"]
    over: str
    y: str = ""
    parts: tuple[str, ...] = ()
    y_label: str = ""
    limit: str = ""


@dataclass(frozen=True)
class Explorer:
    """Controls, outputs, a chart and the grid of cells (see the module's docstring).

    ``cells`` maps :meth:`key` of a choice to ``{"values": {output name: value}}`` or
    ``{"error": message}``.
    """

    name: str
    title: str
    note: str
    controls: tuple[Control, ...]
    outputs: tuple[Output, ...]
    chart: Chart
    cells: dict[str, dict] = field(repr=False)

    def key(self, choice: dict[str, int]) -> str:
        """The cell key of a choice ``{control name: option index}`` (defaults for the rest)."""
        unknown = set(choice) - {c.name for c in self.controls}
        if unknown:
            raise ValueError(f"{self.name} has no control {sorted(unknown)}; its controls are "
                             f"{[c.name for c in self.controls]}.")
        return ",".join(str(choice.get(c.name, c.default)) for c in self.controls)

    def cell(self, choice: dict[str, int]) -> dict:
        """The cell of a choice ``{control name: option index}`` (defaults for the rest)."""
        return self.cells[self.key(choice)]

    def control(self, name: str) -> Control:
        """The control called ``name``."""
        for control in self.controls:
            if control.name == name:
                return control
        raise ValueError(f"{self.name} has no control {name!r}; its controls are "
                         f"{[c.name for c in self.controls]}.")

    def to_json(self) -> str:
        """The explorer for explorers.js, compact: a cell is the list of its outputs' values
        (numbers in their output's unit, to :data:`JSON_DIGITS` significant digits), or the
        index of its error message in ``errors``."""
        errors = list(dict.fromkeys(c["error"] for c in self.cells.values() if "error" in c))

        def encode(cell: dict) -> list | int:
            if "error" in cell:
                return errors.index(cell["error"])
            values = cell["values"]
            return [float(f"{values[o.name] / o.scale:.{JSON_DIGITS}g}") if o.kind == "number"
                    else values[o.name] for o in self.outputs]

        spec = {"name": self.name, "title": self.title, "note": self.note,
                "controls": [{"name": c.name, "label": c.label, "kind": c.kind,
                              "default": c.default, "options": [o.label for o in c.options]}
                             for c in self.controls],
                "outputs": [vars(o) for o in self.outputs], "chart": vars(self.chart),
                "errors": errors, "cells": {k: encode(c) for k, c in self.cells.items()}}
        return json.dumps(spec, separators=(",", ":"), allow_nan=False)

    def _repr_html_(self) -> str:
        # "</" inside a script element would end it; JSON allows "<\/" for "</".
        data = self.to_json().replace("</", "<\\/")
        return (f'<link rel="stylesheet" href="{STATIC_FROM_CHAPTER}/explorers.css">\n'
                f'<div class="cl-explorer" id="explorer-{self.name}" '
                f'data-explorer="{html.escape(self.name)}">\n'
                f'<script type="application/json" class="cl-explorer-data">{data}</script>\n'
                f'<noscript>This explorer needs JavaScript.</noscript>\n</div>\n'
                f'<script src="{STATIC_FROM_CHAPTER}/explorers.js" defer></script>')


def build(name: str, title: str, note: str, controls: Sequence[Control],
          outputs: Sequence[Output], chart: Chart,
          compute: Callable[..., dict]) -> Explorer:
    """An explorer whose cell for each combination of options is ``compute(**values)``.

    Args:
        name, title, note, controls, outputs, chart: as in :class:`Explorer`; ``note`` says
            what is fixed (the cluster, the sequence length...).
        compute: called with one keyword per control (its option's value); returns
            ``{"values": {output name: number or text}}``. A ``ValueError`` it raises becomes
            the cell's ``"error"``.

    Returns:
        The :class:`Explorer`.
    """
    names = [c.name for c in controls]
    if chart.over not in names:
        raise ValueError(f"The chart of {name} is drawn over {chart.over!r}, which is not one of "
                         f"its controls {names}.")
    cells = {}
    for indices in itertools.product(*(range(len(c.options)) for c in controls)):
        values = {c.name: c.options[i].value for c, i in zip(controls, indices)}
        try:
            cell = compute(**values)
        except ValueError as error:
            cell = {"error": str(error)}
        cells[",".join(map(str, indices))] = cell
    return Explorer(name, title, note, tuple(controls), tuple(outputs), chart, cells)


def _options(labels_values: Sequence[tuple[str, Any]]) -> tuple[Option, ...]:
    return tuple(Option(label, value) for label, value in labels_values)


# --- 1. Memory per GPU ------------------------------------------------------------------------

#: The memory explorer's fixed inputs: 64 H100s (dp = 64 / (tp pp)), 4096-token sequences,
#: 512 per step, one per micro-batch.
MEMORY_GPU, MEMORY_GPUS, MEMORY_SEQ_LEN, MEMORY_GLOBAL_BATCH = "H100", 64, 4096, 512
#: Storage rate of the explorers' clusters: the planner needs one, memory does not depend on it.
STORAGE_BYTES_PER_S = 20e9


def memory_plan(n_params: float, zero_stage: int, tp: int, pp: int, recompute: str,
                fp32_grads: bool) -> plan.Plan:
    """The planner's prediction behind one cell of :func:`memory_explorer`."""
    workload = plan.Workload(n_params, MEMORY_SEQ_LEN, MEMORY_GLOBAL_BATCH, n_tokens=1e12,
                             recompute=recompute)
    cluster = plan.cluster(MEMORY_GPU, MEMORY_GPUS, storage_read_bytes_per_s=STORAGE_BYTES_PER_S)
    layout = plan.Layout(dp=MEMORY_GPUS // (tp * pp), tp=tp, pp=pp, zero_stage=zero_stage)
    return plan.predict(workload, cluster, layout,
                        plan.Assumptions(fp32_grad_accumulation=fp32_grads))


def _memory_cell(**choice) -> dict:
    p = memory_plan(**choice)
    return {"values": {"states": p.states_bytes, "activations": p.activation_bytes,
                       "total": p.memory_bytes, "limit": p.memory_limit_bytes,
                       "dp": p.layout.dp, "fits": "fits" if p.fits else "does not fit"}}


def memory_explorer() -> Explorer:
    """Memory per GPU (model size, ZeRO stage, tp, pp, recomputation, gradient precision) by
    :func:`clusterlab.analytic.plan.predict`, whose memory is
    ``memory.training_memory_per_device`` plus ``memory.transformer_layer_activation_bytes``
    of the micro-batches in flight on the first pipeline stage."""
    controls = (
        Control("n_params", "Model size", _options([("1.3B", 1.3e9), ("7B", 7e9),
                                                    ("13B", 13e9), ("70B", 70e9)]), default=1),
        Control("zero_stage", "ZeRO stage", _options([(str(s), s) for s in range(4)]),
                default=1, kind="slider"),
        Control("tp", "Tensor parallel (tp)", _options([(str(t), t) for t in (1, 2, 4, 8)]),
                kind="slider"),
        Control("pp", "Pipeline stages (pp)", _options([(str(p), p) for p in (1, 2, 4, 8)]),
                kind="slider"),
        Control("recompute", "Recomputation", _options([
            ("none (scores stored)", "none"), ("FlashAttention", "flash"),
            ("selective", "selective"), ("full", "full")]), default=1),
        Control("fp32_grads", "Gradients", _options([("BF16 (16 B/param)", False),
                                                     ("FP32 (18 B/param)", True)])),
    )
    outputs = (Output("total", "Memory per GPU", "GB", 1e9),
               Output("states", "Model states", "GB", 1e9),
               Output("activations", "Activations", "GB", 1e9),
               Output("limit", "Usable HBM", "GB", 1e9),
               Output("dp", "Data parallel (dp)"),
               Output("fits", "Verdict", kind="text"))
    note = (f"{MEMORY_GPUS} {MEMORY_GPU} GPUs, so dp = {MEMORY_GPUS} / (tp pp); "
            f"{MEMORY_SEQ_LEN}-token sequences, {MEMORY_GLOBAL_BATCH} per step, one per "
            f"micro-batch. The planner's memory model.")
    return build("memory", "Memory per GPU", note, controls, outputs,
                 Chart("stacks", over="zero_stage", parts=("states", "activations"),
                       y_label="GB per GPU", limit="limit"),
                 _memory_cell)


# --- 2. A collective on a cluster -------------------------------------------------------------

#: Message sizes of the collective explorer: 1 KiB to 16 GiB, by factors of 4.
COLLECTIVE_SIZES = tuple(2**k for k in range(10, 35, 2))


def collective_cluster(server: str, n_nodes: int, nics_per_node: int) -> hardware.ClusterSpec:
    """The cluster of one cell of :func:`collective_explorer`: catalog servers, their NIC."""
    return hardware.ClusterSpec.from_node(server, n_nodes=n_nodes, nics_per_node=nics_per_node)


def _size_label(nbytes: int) -> str:
    for unit, power in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 2**power:
            return f"{nbytes / 2**power:g} {unit}"
    return f"{nbytes} B"


def _collective_cell(server: str, n_nodes: int, nics_per_node: int, algorithm: str,
                     nbytes: int) -> dict:
    estimate = costmodel.cluster_collective("all_reduce", nbytes,
                                            collective_cluster(server, n_nodes, nics_per_node),
                                            algorithm=algorithm)
    return {"values": {"time": estimate.time_s, "busbw": estimate.busbw,
                       "algorithm": estimate.algorithm, "protocol": estimate.protocol,
                       "bottleneck": estimate.bottleneck}}


def collective_explorer() -> Explorer:
    """An all-reduce's time and busbw against message size on a cluster of catalog servers
    (server, nodes, NICs per node, algorithm) by ``costmodel.cluster_collective``."""
    controls = (
        Control("server", "Server", _options([(s, s) for s in ("DGX A100", "DGX H100",
                                                               "DGX B200")]), default=1),
        Control("n_nodes", "Nodes", _options([(str(n), n) for n in (1, 2, 4, 8, 16)]),
                default=2, kind="slider"),
        Control("nics_per_node", "NICs per node", _options([(str(n), n) for n in (1, 2, 4, 8)]),
                default=3, kind="slider"),
        Control("algorithm", "Algorithm (NCCL_ALGO)", _options([
            ("auto (NCCL's pick)", "auto"), ("ring", "ring"), ("tree", "tree"),
            ("NVLS", "nvls"), ("NVLS-tree", "nvls_tree")])),
        Control("nbytes", "Message size", _options([(_size_label(s), s)
                                                    for s in COLLECTIVE_SIZES]),
                default=COLLECTIVE_SIZES.index(2**30), kind="slider"),
    )
    outputs = (Output("time", "Time", "ms", 1e-3), Output("busbw", "Bus bandwidth", "GB/s", 1e9),
               Output("algorithm", "Algorithm", kind="text"),
               Output("protocol", "Protocol", kind="text"),
               Output("bottleneck", "Bound by", kind="text"))
    note = (f"All-reduce on 8-GPU servers with the catalog's NIC; NCCL "
            f"{costmodel.NCCL_RELEASE}'s tuning model as the course ports it.")
    return build("collective", "An all-reduce on a cluster", note, controls, outputs,
                 Chart("line", over="nbytes", y="busbw", y_label="busbw, GB/s"),
                 _collective_cell)


# --- 3. The planner's step over layouts -------------------------------------------------------

#: The planner explorer's workloads and clusters: this chapter's 7B on 256 H100s, and lab 10's
#: 70B on 1,024.
PLANNER_CASES = {
    "7B, 2T tokens, 256 H100": (dict(n_params=7e9, seq_len=4096, global_batch=1024,
                                     n_tokens=2e12), 256),
    "70B, 2T tokens, 1,024 H100": (dict(n_params=70e9, seq_len=4096, global_batch=1024,
                                        n_tokens=2e12, n_layers=80, d_model=8192), 1024),
}
#: Layouts the planner explorer shows per case: the best ones.
PLANNER_LAYOUTS = 8


def planner_ranking(case: str) -> list[plan.Plan]:
    """``plan.rank_layouts`` of one :data:`PLANNER_CASES` entry, the best
    :data:`PLANNER_LAYOUTS`."""
    workload, n_gpus = PLANNER_CASES[case]
    cluster = plan.cluster("H100", n_gpus, storage_read_bytes_per_s=STORAGE_BYTES_PER_S)
    return plan.rank_layouts(plan.Workload(**workload), cluster, limit=PLANNER_LAYOUTS)


def planner_explorer() -> Explorer:
    """The step-time breakdown (``Plan.breakdown``) of the planner's best layouts."""
    rankings = {case: planner_ranking(case) for case in PLANNER_CASES}
    if min(len(r) for r in rankings.values()) < PLANNER_LAYOUTS:
        raise ValueError(f"The planner found fewer than {PLANNER_LAYOUTS} layouts for a case of "
                         f"PLANNER_CASES; lower PLANNER_LAYOUTS.")

    # A part a layout lacks (context parallelism without cp) takes it no time.
    parts = list(dict.fromkeys(part for ranking in rankings.values() for p in ranking
                               for part in p.breakdown()))

    def cell(case: str, rank: int) -> dict:
        p = rankings[case][rank]
        breakdown = p.breakdown()
        return {"values": {"layout": plan.search.layout_label(p), "step": p.step_s,
                           "mfu": p.mfu, "memory": p.memory_bytes, "bottleneck": p.bottleneck}
                | {part: breakdown.get(part, 0.0) for part in parts}}

    controls = (Control("case", "Workload", _options([(c, c) for c in PLANNER_CASES])),
                Control("rank", "Layout, by rank", _options([(str(k + 1), k)
                                                             for k in range(PLANNER_LAYOUTS)]),
                        kind="slider"))
    outputs = (Output("layout", "Layout", kind="text"), Output("step", "Step time", "s"),
               Output("mfu", "MFU", "%", 0.01), Output("memory", "Memory per GPU", "GB", 1e9),
               Output("bottleneck", "Bottleneck", kind="text"))
    outputs += tuple(Output(part, part.capitalize(), "s") for part in parts)
    note = ("The planner's ranking (plan.rank_layouts) on H100 nodes of 8 with one 400 Gb/s "
            "NIC per GPU; 4096-token sequences, 1024 per step.")
    return build("planner", "The planner's step, layout by layout", note, controls, outputs,
                 Chart("stacks", over="rank", parts=tuple(parts), y_label="seconds per step"), cell)


# --- 4. Fabric contention ---------------------------------------------------------------------

#: The fabric explorer's fabric: 4 leaves of 16 GPUs, 400 Gb/s links (one NDR port).
FABRIC_LEAVES, FABRIC_GPUS_PER_LEAF = 4, 16
FABRIC_LINK = "IB-NDR"
#: Its job: a 1 GiB ring all-reduce over 16 GPUs, one ECMP hash seed.
FABRIC_BYTES, FABRIC_SEED = 2**30, 0
#: Where the 16 GPUs sit, in ring order (GPU i sits on leaf i // 16).
FABRIC_PLACEMENTS = {
    "one leaf": list(range(16)),
    "two leaves": list(range(8)) + list(range(16, 24)),
    "four leaves": [leaf * 16 + i for leaf in range(4) for i in range(4)],
    "four leaves, ring interleaved": [(i % 4) * 16 + i // 4 for i in range(16)],
}


def shared_fabric(oversubscription: int) -> fabric.Fabric:
    """The fabric explorer's leaf-spine fabric at ``oversubscription``:1 (fewer spines)."""
    graph = topology.fat_tree(FABRIC_LEAVES, FABRIC_GPUS_PER_LEAF,
                              FABRIC_GPUS_PER_LEAF // oversubscription,
                              hardware.link(FABRIC_LINK).bytes_per_s)
    return fabric.Fabric(graph)


def fabric_explorer() -> Explorer:
    """A ring all-reduce's busbw and contention factor on a shared leaf-spine fabric (queue
    pairs, oversubscription, placement, routing) by the flow-level model
    (``fabric.collective`` and ``fabric.contention_factor``)."""
    fabrics: dict[int, fabric.Fabric] = {}

    def cell(qps: int, oversubscription: int, placement: str, policy: str) -> dict:
        if oversubscription not in fabrics:
            fabrics[oversubscription] = shared_fabric(oversubscription)
        net = fabrics[oversubscription]
        args = dict(ranks=FABRIC_PLACEMENTS[placement], aware=False, policy=policy,
                    seed=FABRIC_SEED, qps=qps)
        result = fabric.collective(net, "all_reduce", FABRIC_BYTES, **args)
        factor = fabric.contention_factor(net, FABRIC_BYTES, **args)
        return {"values": {"busbw": result.busbw, "time": result.time_s, "factor": factor}}

    controls = (
        Control("qps", "Queue pairs per connection",
                _options([(str(q), q) for q in (1, 2, 4, 8, 16)]), kind="slider"),
        Control("oversubscription", "Leaf oversubscription",
                _options([(f"{r}:1", r) for r in (1, 2, 4)]), default=1, kind="slider"),
        Control("placement", "Placement", _options([(p, p) for p in FABRIC_PLACEMENTS]),
                default=3),
        Control("policy", "Routing", _options([("ECMP hashing", "ecmp"),
                                               ("packet spraying", "spray")])),
    )
    outputs = (Output("busbw", "Bus bandwidth", "GB/s", 1e9), Output("time", "Time", "ms", 1e-3),
               Output("factor", "Contention factor", "x"))
    note = (f"A 1 GiB ring all-reduce over 16 GPUs on {FABRIC_LEAVES} leaves of "
            f"{FABRIC_GPUS_PER_LEAF} GPUs, {FABRIC_LINK} links, ECMP hash seed {FABRIC_SEED}; "
            f"the course's flow-level model.")
    return build("fabric", "An all-reduce on a shared fabric", note, controls, outputs,
                 Chart("line", over="qps", y="busbw", y_label="busbw, GB/s"), cell)


# --- The PDF's view ---------------------------------------------------------------------------

def static_figure(explorer: Explorer) -> plt.Figure:
    """The explorer's chart at its default options, for the PDF edition."""
    over = explorer.control(explorer.chart.over)
    labels = [o.label for o in over.options]
    cells = [explorer.cell({over.name: i}) for i in range(len(labels))]
    fig, ax = plt.subplots(figsize=(7.2, 3.2))
    x = np.arange(len(labels))
    outputs = {o.name: o for o in explorer.outputs}
    if explorer.chart.kind == "line":
        output = outputs[explorer.chart.y]
        y = [c["values"][output.name] / output.scale if "values" in c else np.nan for c in cells]
        ax.plot(x, y, "o-")
    else:
        bottoms = np.zeros(len(labels))
        for part in explorer.chart.parts:
            output = outputs[part]
            heights = np.array([c["values"][part] / output.scale if "values" in c else 0.0
                                for c in cells])
            ax.bar(x, heights, bottom=bottoms, label=output.label)
            bottoms += heights
        if explorer.chart.limit:
            limit = outputs[explorer.chart.limit]
            ax.axhline(cells[over.default]["values"][limit.name] / limit.scale, color="black",
                       linestyle="--", label=limit.label)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_ylim(bottom=0)
    # Long labels (message sizes) turn, so that they do not overlap.
    ax.set_xticks(x, labels, rotation=45 if sum(map(len, labels)) > 40 else 0)
    ax.set_xlabel(over.label)
    ax.set_ylabel(explorer.chart.y_label)
    fixed = ", ".join(f"{c.label} {c.options[c.default].label}" for c in explorer.controls
                      if c.name != over.name)
    ax.set_title(f"{explorer.title}: {fixed}", fontsize="small", wrap=True)
    fig.tight_layout()
    return fig
