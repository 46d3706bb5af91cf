"""The planner's search: every layout that fits, ranked (:func:`rank_layouts`); the smallest
cluster that meets a deadline (:func:`gpus_needed`); and tables of plans for a reader."""

from __future__ import annotations

from dataclasses import replace

from clusterlab import costmodel, memory
from clusterlab.hardware import ClusterSpec
from clusterlab.plan.prediction import Plan, predict
from clusterlab.plan.workload import Assumptions, Layout, Workload


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_layouts(workload: Workload, cluster: ClusterSpec) -> list[Layout]:
    """Every layout the planner considers: tp dividing a node, pp up to the layer count, dp
    dividing the global batch, ZeRO stages 0-3 (only 0 when dp = 1), micro-batches of one
    sequence, no interleaving."""
    n_layers, _ = workload.shape
    layouts = []
    for tp in _divisors(cluster.gpus_per_node):
        if cluster.n_gpus % tp:
            continue
        for pp in _divisors(cluster.n_gpus // tp):
            dp = cluster.n_gpus // (tp * pp)
            if pp > n_layers or workload.global_batch % dp:
                continue
            for stage in (memory.ZERO_STAGES if dp > 1 else (0,)):
                layouts.append(Layout(dp=dp, tp=tp, pp=pp, zero_stage=stage))
    return layouts


def rank_layouts(workload: Workload, cluster: ClusterSpec,
                 assumptions: Assumptions = Assumptions(), *,
                 limit: int | None = None) -> list[Plan]:
    """The layouts that fit in memory, fastest step first.

    Args:
        workload: what to train.
        cluster: the cluster.
        assumptions: software efficiencies.
        limit: keep only the first ``limit`` plans.

    Returns:
        Plans sorted by step time (ties: lower ZeRO stage, fewer stages, less tensor
        parallelism).

    Raises:
        ValueError: when no layout fits, naming the smallest memory found and what to change.
    """
    plans = [predict(workload, cluster, layout, assumptions)
             for layout in candidate_layouts(workload, cluster)]
    if not plans:
        raise ValueError(f"No layout of {cluster.n_gpus} GPUs divides the global batch of "
                         f"{workload.global_batch} sequences; use a GPU count or batch that "
                         f"share powers of two.")
    fitting = [p for p in plans if p.fits]
    if not fitting:
        least = min(plans, key=lambda p: p.memory_bytes)
        raise ValueError(
            f"No layout fits: the smallest, {least.layout}, needs {least.memory_bytes / 1e9:.1f} "
            f"GB of model states per GPU against {least.memory_limit_bytes / 1e9:.1f} GB usable "
            f"on a {cluster.gpu.name}; use more GPUs or GPUs with more memory.")
    fitting.sort(key=lambda p: (p.step_s, p.layout.zero_stage, p.layout.pp, p.layout.tp))
    return fitting[:limit] if limit else fitting


def best_plan(workload: Workload, cluster: ClusterSpec,
              assumptions: Assumptions = Assumptions()) -> Plan:
    """The fastest layout that fits (the first of :func:`rank_layouts`)."""
    return rank_layouts(workload, cluster, assumptions, limit=1)[0]


def gpus_needed(workload: Workload, cluster: ClusterSpec,
                assumptions: Assumptions = Assumptions(), *, max_gpus: int = 2**20) -> Plan:
    """The smallest cluster, in a power of two of whole nodes, that trains within the budget.

    ``cluster`` gives everything but the node count (its ``n_nodes`` is replaced). The storage
    is the same shared system for every size, so a larger cluster can end up waiting for it.

    Args:
        workload: needs both ``n_tokens`` and ``time_budget_s``.
        cluster: the cluster design.
        assumptions: software efficiencies.
        max_gpus: give up beyond this many GPUs.

    Returns:
        The best plan on the smallest size that meets the budget.

    Raises:
        ValueError: without tokens and budget, or if no size up to ``max_gpus`` meets it.
    """
    if workload.n_tokens is None or workload.time_budget_s is None:
        raise ValueError("gpus_needed needs a workload with both n_tokens and time_budget_s.")
    nodes, fastest = 1, None
    while nodes * cluster.gpus_per_node <= max_gpus:
        try:
            plan = best_plan(workload, replace(cluster, n_nodes=nodes), assumptions)
        except ValueError:           # nothing fits or divides yet: more GPUs
            plan = None
        if plan is not None:
            if plan.meets_budget:
                return plan
            if fastest is None or plan.time_to_train_s < fastest.time_to_train_s:
                fastest = plan
        nodes *= 2
    best = ("" if fastest is None else
            f" The fastest, {fastest.hardware.n_gpus} GPUs, takes "
            f"{fastest.time_to_train_s / 86400:.1f} days.")
    raise ValueError(f"No cluster of up to {max_gpus} GPUs trains {workload.n_tokens:.3g} tokens "
                     f"within {workload.time_budget_s / 86400:.1f} days.{best}")


def format_plans(plans: list[Plan]) -> str:
    """A fixed-width table of plans: layout, memory, step parts, MFU, days, bottleneck."""
    header = (f"{'layout':<24} {'mem GB':>7} {'compute':>8} {'tp':>7} {'pp':>7} {'bubble':>7} "
              f"{'dp':>7} {'data':>7} {'step s':>8} {'MFU':>6} {'days':>7}  "
              f"{'network model':<13}  bottleneck")
    lines = [header]
    for p in plans:
        days = p.time_to_train_s / 86400 if p.time_to_train_s is not None else float("nan")
        lines.append(
            f"{str(p.layout):<24} {p.memory_bytes / 1e9:7.1f} {p.compute_s:8.3f} "
            f"{p.tp_comm_s:7.3f} {p.pp_comm_s:7.3f} {p.bubble_s:7.3f} {p.dp_comm_s:7.3f} "
            f"{p.data_wait_s:7.3f} {p.step_s:8.3f} {100 * p.mfu:5.1f}% {days:7.1f}  "
            f"{p.network_model:<13}  {p.bottleneck}")
    lines.append(f"# all-reduces priced by NCCL {costmodel.NCCL_RELEASE}'s tuning model "
                 f"(costmodel.cluster_collective); 'unvalidated': no published rows in that "
                 f"regime (costmodel.validation_by_regime)")
    return "\n".join(lines)


def describe_plan(plan: Plan) -> str:
    """Several lines that summarize one plan for a reader."""
    w, cluster = plan.workload, plan.hardware
    n_layers, d_model = w.shape
    lines = [
        f"workload: {w.n_params:.3g} parameters ({n_layers} layers x {d_model}), "
        f"{w.global_batch} x {w.seq_len} = {w.tokens_per_step:,} tokens per step",
        f"hardware: {cluster.n_gpus} x {cluster.gpu.name} ({cluster.n_nodes} nodes of "
        f"{cluster.gpus_per_node}); node {cluster.node_link_bytes_per_s / 1e9:.0f} GB/s, fabric "
        f"{cluster.network_bytes_per_gpu / 1e9:.1f} GB/s per GPU; storage "
        f"{cluster.storage_read_bytes_per_s / 1e9:.1f} GB/s",
        f"layout: {plan.layout}; {plan.memory_bytes / 1e9:.1f} GB per GPU "
        f"({plan.states_bytes / 1e9:.1f} model states + {plan.activation_bytes / 1e9:.1f} "
        f"activations) of {plan.memory_limit_bytes / 1e9:.1f} GB usable",
        f"step: {plan.step_s:.3f} s; MFU {100 * plan.mfu:.1f}%; bottleneck: {plan.bottleneck}",
    ]
    for label, estimate in (("data-parallel", plan.dp_estimate),
                            ("tensor-parallel", plan.tp_estimate)):
        if estimate is not None:
            lines.append(
                f"{label} all-reduce: {estimate.algorithm}/{estimate.protocol} as NCCL "
                f"{estimate.nccl_release} would run it, {estimate.busbw / 1e9:.0f} GB/s busbw; "
                f"regime {estimate.regime}: "
                + ("validated against published rows" if estimate.validated else
                   "unvalidated (no published rows in this regime)"))
    if plan.time_to_train_s is not None:
        lines.append(f"time to train {w.n_tokens:.3g} tokens: "
                     f"{plan.time_to_train_s / 86400:.1f} days")
    if plan.tokens_in_budget is not None:
        lines.append(f"tokens in the {w.time_budget_s / 86400:.1f}-day budget: "
                     f"{plan.tokens_in_budget:.3g}")
    return "\n".join(lines)
