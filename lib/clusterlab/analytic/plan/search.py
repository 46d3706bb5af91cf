"""The planner's search: every layout of a search space, predicted and ranked
(:func:`search_layouts`, :func:`rank_layouts`), with the reasons the rest were refused; the
smallest cluster that meets a deadline (:func:`gpus_needed`); and tables of plans for a reader.

The space covers tp (dividing a node), pp, dp (dividing the batch), the micro-batch size, the
interleaved schedule's virtual stages, the recomputation policy, the ZeRO stage, context
parallelism's cp (``SearchSpace.cp``, default ``(1,)``: none) and, for a workload with experts
(``Workload.moe``), expert parallelism's ep (``SearchSpace.ep``, default ``(1,)``: none; its
all-to-alls are unvalidated: no published all-to-all measurement backs them). With the defaults the search and
its time are those measured below. ``SearchSpace.pp`` can narrow the pipeline depths (default:
every divisor).

Benchmark (2 December 2026, the course's 2-core build machine, shared with other helpers and a
background test run, load average 1.2): a 70B model (``Workload(70e9, 4096, 1024,
n_tokens=2e12)``, 71 layers x 9088) on ``cluster("H100", 1024, storage_read_bytes_per_s=20e9)``
with the default space: 5,376 candidates, 3,744 refused by a divisibility rule, 1,632 predicted;
``search_layouts`` took 0.55, 0.62 and 0.56 s in three fresh processes (median 0.56 s; 0.3 s
when the process has priced the same layers before, clusterlab.analytic.gemm caches a layer's time).
Remeasured after expert parallelism entered the space (3 December 2026, same machine, load
average 2.7): 0.473, 0.471 and 0.477 s in fresh processes, against 0.490, 0.458 and 0.523 s
for the planner before it (its plan/ from git) run alternately; the same 5,376 candidates and
ranking (the default ``SearchSpace.ep`` is ``(1,)``).
"""

from __future__ import annotations

from collections import Counter
from itertools import product
from dataclasses import dataclass, field, replace

from clusterlab.analytic import costmodel, memory
from clusterlab.catalog.hardware import ClusterSpec
from clusterlab.catalog.published import mfu_records
from clusterlab.analytic.plan.prediction import (EP_TERM, Plan, batch_fix, broken_rule,
                                                 ep_all_to_alls_per_layer, predict)
from clusterlab.analytic.gemm import RECOMPUTE_POLICIES
from clusterlab.analytic.plan import validation
from clusterlab.analytic.plan.workload import Assumptions, Layout, Workload


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


#: The policies :class:`SearchSpace` tries unless told: every one of
#: :data:`clusterlab.analytic.gemm.RECOMPUTE_POLICIES` but "flash_full", which is opt-in
#: (``SearchSpace(recompute=RECOMPUTE_POLICIES)``, ``plan --recompute flash_full``) so that
#: the default search, and the candidate count and plans lab 10 prints from it, stay as they
#: were. For one layout it is never faster than "flash" (one more forward) and keeps what
#: "full" keeps, so it matters only where "flash" does not fit.
DEFAULT_RECOMPUTE: tuple[str, ...] = tuple(p for p in RECOMPUTE_POLICIES if p != "flash_full")


@dataclass(frozen=True)
class SearchSpace:
    """The values the search tries; a value that a layout's rules forbid is refused, not tried.

    Rules (Megatron-LM's, :func:`clusterlab.analytic.plan.prediction.broken_rule`): a micro-batch
    size divides each replica's sequences; virtual stages > 1 need pp > 1, layers divisible by
    pp * v and micro-batches a multiple of pp; ZeRO > 0 needs dp * cp > 1; cp > 1 needs the
    sequence divisible by 2 * cp and tp * cp dividing a node or a multiple of it; ep > 1 needs
    a workload with experts and ep dividing dp and the number of experts.
    """

    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    virtual_stages: tuple[int, ...] = (1, 2, 4)
    recompute: tuple[str, ...] = DEFAULT_RECOMPUTE
    zero_stages: tuple[int, ...] = memory.ZERO_STAGES
    #: context-parallel degrees; (1,): none (long sequences: e.g. (1, 2, 4, 8, 16))
    cp: tuple[int, ...] = (1,)
    #: expert-parallel degrees, carved from dp; (1,): none (a workload with experts: e.g.
    #: (1, 2, 4, 8))
    ep: tuple[int, ...] = (1,)
    #: pipeline depths to try; None: every divisor of the GPUs left by tp and cp
    pp: tuple[int, ...] | None = None
    #: tensor-parallel degrees to try; None: every divisor of a node's GPUs
    tp: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        names = (("micro_batches", "virtual_stages", "cp", "ep")
                 + tuple(name for name in ("pp", "tp") if getattr(self, name) is not None))
        for name in names:
            values = getattr(self, name)
            if not values or any(not isinstance(v, int) or v < 1 for v in values):
                raise ValueError(f"SearchSpace.{name} must be positive integers, got {values!r}.")
        bad = [p for p in self.recompute if p not in RECOMPUTE_POLICIES]
        if not self.recompute or bad:
            raise ValueError(f"SearchSpace.recompute must be among {RECOMPUTE_POLICIES}, got "
                             f"{self.recompute!r}.")
        if not self.zero_stages or any(z not in memory.ZERO_STAGES for z in self.zero_stages):
            raise ValueError(f"SearchSpace.zero_stages must be among {memory.ZERO_STAGES}, got "
                             f"{self.zero_stages!r}.")


@dataclass(frozen=True)
class Refusal:
    """How many candidates one reason refused, and the first of them as an example."""

    reason: str
    count: int
    layout: Layout               # the example
    recompute: str               # its recomputation policy
    detail: str = ""             # its memory against the limit, or its step time

    @property
    def example(self) -> str:
        label = _label(self.layout, self.recompute)
        return f"{label}: {self.detail}" if self.detail else label


@dataclass(frozen=True)
class SearchResult:
    """The ranked plans that fit, and the refused candidates by reason."""

    plans: list[Plan]
    refused: list[Refusal] = field(default_factory=list)
    n_candidates: int = 0


def _grids(workload: Workload, cluster: ClusterSpec,
           space: SearchSpace) -> list[tuple[int, int, int, int]]:
    """Every ``(tp, cp, pp, dp)`` of the space that fills the cluster, the batch not checked."""
    n_layers, _ = workload.shape
    tps = _divisors(cluster.gpus_per_node) if space.tp is None else space.tp
    return [(tp, cp, pp, cluster.n_gpus // (tp * cp * pp))
            for tp in tps for cp in space.cp if cluster.n_gpus % (tp * cp) == 0
            for pp in _divisors(cluster.n_gpus // (tp * cp))
            if pp <= n_layers and (space.pp is None or pp in space.pp)]


def _candidates(workload: Workload, cluster: ClusterSpec, space: SearchSpace):
    """Every (workload, layout) of the space on the cluster, with the rule each breaks; a grid
    whose dp does not divide the batch is skipped (:func:`search_layouts` names the fix when
    none is left)."""
    for tp, cp, pp, dp in _grids(workload, cluster, space):
        if workload.global_batch % dp:
            continue
        for policy in space.recompute:
            policy_workload = replace(workload, recompute=policy)
            for mbs, v, stage, ep in product(space.micro_batches, space.virtual_stages,
                                             space.zero_stages, space.ep):
                layout = Layout(dp=dp, tp=tp, pp=pp, zero_stage=stage, micro_batch=mbs,
                                virtual_stages=v, cp=cp, ep=ep)
                yield policy_workload, layout, broken_rule(
                    workload, layout, gpus_per_node=cluster.gpus_per_node)


def candidate_layouts(workload: Workload, cluster: ClusterSpec,
                      space: SearchSpace | None = None) -> list[Layout]:
    """The layouts of ``space`` (default: the workload's own policy, micro-batches of one, no
    interleaving) that break no divisibility rule."""
    if space is None:
        space = SearchSpace(micro_batches=(1,), virtual_stages=(1,),
                            recompute=(workload.recompute_policy,))
    seen, layouts = set(), []
    for _, layout, rule in _candidates(workload, cluster, space):
        if rule is None and layout not in seen:
            seen.add(layout)
            layouts.append(layout)
    return layouts


def layout_label(plan: Plan) -> str:
    """The layout with its micro-batch size and recomputation policy where they are not the
    defaults (one sequence; "flash")."""
    return _label(plan.layout, plan.workload.recompute_policy)


def _label(layout: Layout, policy: str) -> str:
    mbs = f" mbs{layout.micro_batch}" if layout.micro_batch > 1 else ""
    return f"{layout}{mbs}" + (f" {policy}" if policy != "flash" else "")


def search_layouts(workload: Workload, cluster: ClusterSpec,
                   assumptions: Assumptions = Assumptions(), *,
                   space: SearchSpace = SearchSpace(), limit: int | None = None,
                   include_unfit: bool = False) -> SearchResult:
    """Every layout of ``space``: the ones that fit, fastest step first, and the refused ones.

    Refusals: "does not divide: <rule>", "does not fit in memory" (example with its memory
    against the limit) and "fits, slower than the shown ones" (beyond ``limit``). With
    ``include_unfit`` the layouts that do not fit are ranked too, after those that fit (their
    ``Plan.fits`` is False), instead of being refused: a pinned layout's numbers are then shown
    even when it needs more memory than the planner's model allows.

    Raises:
        ValueError: when no layout divides or none fits, naming the smallest memory found and
            what to change.
    """
    reasons: Counter[str] = Counter()
    examples: dict[str, tuple[Layout, str, str]] = {}

    def refuse(reason: str, layout: Layout, policy: str, detail: str = "") -> None:
        reasons[reason] += 1
        examples.setdefault(reason, (layout, policy, detail))

    plans, n_candidates = [], 0
    for policy_workload, layout, rule in _candidates(workload, cluster, space):
        n_candidates += 1
        if rule is not None:
            refuse(f"does not divide: {rule}", layout, policy_workload.recompute_policy)
            continue
        plans.append(predict(policy_workload, cluster, layout, assumptions))
    if not plans:
        rules = "; ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
        skipped = sorted({dp for *_, dp in _grids(workload, cluster, space)
                          if workload.global_batch % dp})
        fixes = "; ".join(batch_fix(workload.global_batch, dp) for dp in skipped[:3])
        raise ValueError(f"No layout of {cluster.n_gpus} GPUs in the search space passes the "
                         f"layout rules for a global batch of {workload.global_batch} "
                         f"sequences" + (f" (refused: {rules})" if rules else "")
                         + (f"; {fixes}" if fixes else "; widen the search space") + ".")
    fitting = plans if include_unfit else [p for p in plans if p.fits]
    for p in plans:
        if not p.fits and not include_unfit:
            refuse("does not fit in memory", p.layout, p.workload.recompute_policy,
                   f"{p.memory_bytes / 1e9:.1f} GB > {p.memory_limit_bytes / 1e9:.1f} GB usable")
    if not fitting:
        least = min(plans, key=lambda p: p.memory_bytes)
        experts = ("" if workload.moe is None else
                   f", expert parallelism (SearchSpace.ep: each GPU holds 1/ep of the "
                   f"{workload.moe.n_experts} experts; tried {space.ep})")
        raise ValueError(
            f"No layout fits: the smallest, {layout_label(least)}, needs "
            f"{least.memory_bytes / 1e9:.1f} GB per GPU against "
            f"{least.memory_limit_bytes / 1e9:.1f} GB usable on a {cluster.gpu.name}; use more "
            f"GPUs, GPUs with more memory, full recomputation (with FlashAttention: "
            f"SearchSpace.recompute 'flash_full'){experts} or (long sequences) "
            f"context parallelism (SearchSpace.cp); include_unfit=True (plan --include-unfit) "
            f"shows the layouts that do not fit.")
    fitting.sort(key=lambda p: (not p.fits, p.step_s, p.layout.zero_stage, p.layout.pp, p.layout.tp,
                                p.layout.virtual_stages, p.layout.micro_batch, p.layout.cp,
                                p.layout.ep))
    shown = fitting[:limit] if limit else fitting
    for p in fitting[len(shown):]:
        refuse("fits, slower than the shown ones", p.layout, p.workload.recompute_policy,
               f"{p.step_s:.3f} s")
    refused = [Refusal(r, n, *examples[r]) for r, n in sorted(reasons.items())]
    return SearchResult(shown, refused, n_candidates)


def _fit_line(plan: Plan) -> str:
    """The plan's memory against the usable memory, with a warning when it does not fit."""
    line = (f"{plan.memory_bytes / 1e9:.1f} GB per GPU ({plan.states_bytes / 1e9:.1f} model "
            f"states + {plan.activation_bytes / 1e9:.1f} activations) of "
            f"{plan.memory_limit_bytes / 1e9:.1f} GB usable")
    return line if plan.fits else line + " - DOES NOT FIT"


def rank_layouts(workload: Workload, cluster: ClusterSpec,
                 assumptions: Assumptions = Assumptions(), *,
                 space: SearchSpace = SearchSpace(), limit: int | None = None) -> list[Plan]:
    """The layouts of ``space`` that fit in memory, fastest step first (see
    :func:`search_layouts`; ties: lower ZeRO stage, fewer stages, less tensor parallelism)."""
    return search_layouts(workload, cluster, assumptions, space=space, limit=limit).plans


def format_refusals(result: SearchResult) -> str:
    """The refused candidates: count, reason and one example each."""
    lines = [f"# {result.n_candidates} candidates: {len(result.plans)} shown; refused:"]
    lines += [f"#   {r.count:6d}  {r.reason}  (e.g. {r.example})" for r in result.refused]
    return "\n".join(lines)


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
    """A fixed-width table of plans: the layout (dp, tp, pp, and cp and ep where > 1;
    micro-batch size, virtual stages, recomputation policy, ZeRO stage), memory, step parts
    (opt: the optimizer step; cp: context parallelism's K/V collectives, a column only when
    some plan has cp > 1; ep a2a: expert parallelism's all-to-alls, unvalidated, a column only
    when some plan has ep > 1), MFU, days, bottleneck."""
    with_cp = any(p.layout.cp > 1 for p in plans)
    with_ep = any(p.layout.ep > 1 for p in plans)
    cp_header = f" {'cp':>7}" if with_cp else ""
    cp_header += f" {'ep a2a':>7}" if with_ep else ""
    # the policy column widens only for a policy longer than its header ("flash_full")
    policy_width = max([len("recompute"), *(len(p.workload.recompute_policy) for p in plans)])
    header = (f"{'layout':<17} {'mbs':>3} {'v':>2} {'recompute':<{policy_width}} {'ZeRO':>4} "
              f"{'mem GB':>7} "
              f"{'compute':>8} {'tp':>7}{cp_header} {'pp':>7} {'bubble':>7} {'dp':>7} {'opt':>7} "
              f"{'data':>7} {'step s':>8} {'MFU':>6} {'days':>7}  {'network model':<13}  "
              f"bottleneck")
    lines = [header]
    for p in plans:
        days = (f"{p.time_to_train_s / 86400:7.1f}" if p.time_to_train_s is not None
                else f"{'-':>7}")
        grid = f"dp{p.layout.dp} tp{p.layout.tp} pp{p.layout.pp}"
        if p.layout.cp > 1:
            grid += f" cp{p.layout.cp}"
        if p.layout.ep > 1:
            grid += f" ep{p.layout.ep}"
        cp_cell = f" {p.cp_comm_s:7.3f}" if with_cp else ""
        cp_cell += f" {p.ep_comm_s:7.3f}" if with_ep else ""
        lines.append(
            f"{grid:<17} {p.layout.micro_batch:3d} {p.layout.virtual_stages:2d} "
            f"{p.workload.recompute_policy:<{policy_width}} {p.layout.zero_stage:4d} "
            f"{p.memory_bytes / 1e9:7.1f} {p.compute_s:8.3f} "
            f"{p.tp_comm_s:7.3f}{cp_cell} {p.pp_comm_s:7.3f} {p.bubble_s:7.3f} {p.dp_comm_s:7.3f} "
            f"{p.optimizer_s:7.3f} {p.data_wait_s:7.3f} {p.step_s:8.3f} {100 * p.mfu:5.1f}% {days}  "
            f"{p.network_model:<13}  {p.bottleneck}")
    lines.append(f"# all-reduces priced by NCCL {costmodel.NCCL_RELEASE}'s tuning model "
                 f"(costmodel.cluster_collective); network model: 'validated' where published "
                 f"rows in each collective's regime hold the model within "
                 f"{100 * costmodel.TOLERANCE:.0f}% (median) on their node counts, 'tested' "
                 f"where they show a larger error, 'extrapolated' beyond their node counts, "
                 f"'untested' without rows (costmodel.validation_by_regime)")
    if with_ep:
        lines.append("# ep a2a: expert parallelism's all-to-alls (costmodel.cluster_collective's "
                     "grouped send/receive), unvalidated: no published all-to-all "
                     "measurement backs them")
    return "\n".join(lines)


def published_mfu(plan: Plan) -> mfu_records.MfuRecord | None:
    """The best published MFU of the plan's class (its GPU; dense or with experts; precision) in
    :mod:`clusterlab.catalog.published.mfu_records`; None where none is recorded."""
    kind = "dense" if plan.workload.moe is None else "moe"
    return mfu_records.record(plan.hardware.gpu.name, kind, plan.workload.precision)


def mfu_warning(plan: Plan) -> str | None:
    """A warning when the plan's MFU exceeds the best published run of its class (the
    prediction is then more optimistic than anything shown; read it as an upper bound), else
    None."""
    best = published_mfu(plan)
    if best is None or plan.mfu <= best.mfu:
        return None
    return (f"MFU {plan.mfu:.1%} is above the best published {best.kind} run on "
            f"{best.gpu}, {best.mfu:.1%} ({best.run}; {best.source}): the course's model "
            f"predicts more than anyone has shown, so read it as an upper bound")


def moe_warning(plan: Plan) -> str | None:
    """For a plan with experts, how far the course's model missed the published
    mixture-of-experts runs it was tested on (:func:`clusterlab.analytic.plan.validation.
    moe_error_span`); None for a dense model."""
    if plan.workload.moe is None:
        return None
    low, high, rows = validation.moe_error_span()
    return (f"mixtures of experts: on the {rows} published runs it was tested on, the course's "
            f"model predicted {low:+.0%} to {high:+.0%} more tokens per second than they "
            f"reached (plan.validation.moe_validation_table): read this step as a floor")


def plan_record(plan: Plan) -> dict:
    """One plan as plain data (``plan --json``): the layout (with the experts' load imbalance
    it was priced at, None for a dense model), ``step_s``, ``mfu``,
    ``tokens_per_s_per_gpu``, ``memory_bytes_per_gpu``, ``fits``, ``bottleneck``, the step's
    parts in seconds and the published MFU it exceeds (None when it does not)."""
    layout, best = plan.layout, published_mfu(plan)
    above = None if mfu_warning(plan) is None else {"mfu": best.mfu, "run": best.run,
                                                    "source": best.source}
    return {
        "layout": {"dp": layout.dp, "tp": layout.tp, "pp": layout.pp, "cp": layout.cp,
                   "ep": layout.ep, "zero_stage": layout.zero_stage,
                   "micro_batch": layout.micro_batch,
                   "virtual_stages": layout.virtual_stages,
                   "sequence_parallel": layout.sequence_parallel,
                   "recompute": plan.workload.recompute_policy,
                   "load_imbalance": (None if plan.workload.moe is None
                                      else plan.workload.moe.load_imbalance)},
        "step_s": plan.step_s, "mfu": plan.mfu,
        "tokens_per_s_per_gpu": plan.workload.tokens_per_step / plan.step_s
        / plan.hardware.n_gpus,
        "memory_bytes_per_gpu": plan.memory_bytes,
        "memory_limit_bytes_per_gpu": plan.memory_limit_bytes, "fits": plan.fits,
        "bottleneck": plan.bottleneck, "breakdown_s": plan.breakdown(),
        "mfu_above_published": above,
        "moe_warning": moe_warning(plan),
    }


#: how each ZeRO stage's data-parallel collectives overlap compute (prediction._data_parallel)
_LAST_MICROBATCH = ("in buckets during the last micro-batch's backward pass (Megatron's "
                    "overlap_grad_reduce)")
DP_OVERLAP = {
    0: _LAST_MICROBATCH,
    1: _LAST_MICROBATCH,
    2: "in buckets during every micro-batch's backward pass (ZeRO-2 keeps a gradient shard)",
    3: "in every micro-batch, behind its forward and backward passes (ZeRO-3)",
}


def _validation_words(estimate: costmodel.CollectiveEstimate) -> str:
    """How far published rows back one of a plan's collectives, in words."""
    summary = costmodel.regime_summaries().get(estimate.regime)
    if estimate.validation == "untested" or summary is None:
        return "untested (no published rows back it)"
    if estimate.validation == "extrapolated":
        return f"extrapolated (published rows on {summary.row_span()} only)"
    return f"{summary.verdict()} over {summary.rows} published rows"


def describe_plan(plan: Plan) -> str:
    """Several lines that summarize one plan for a reader."""
    w, cluster = plan.workload, plan.hardware
    n_layers, d_model = w.shape
    experts = ("" if w.moe is None else
               f", {w.moe_layers} MoE layers of {w.moe.n_experts} experts (top-{w.moe.top_k}, "
               f"expert MLP {w.moe.expert_mlp_width}) holding {w.expert_params:.3g} of "
               f"them")
    lines = [
        f"workload: {w.n_params:.3g} parameters ({n_layers} layers x {d_model}{experts}), "
        f"{w.global_batch} x {w.seq_len} = {w.tokens_per_step:,} tokens per step",
        f"hardware: {cluster.n_gpus} x {cluster.gpu.name} ({cluster.n_nodes} nodes of "
        f"{cluster.gpus_per_node}); node {cluster.node_link_bytes_per_s / 1e9:.0f} GB/s, fabric "
        f"{cluster.network_bytes_per_gpu / 1e9:.1f} GB/s per GPU; storage "
        f"{cluster.storage_read_bytes_per_s / 1e9:.1f} GB/s",
        f"layout: {layout_label(plan)}; {_fit_line(plan)}",
        f"step: {plan.step_s:.3f} s; MFU {100 * plan.mfu:.1f}%; bottleneck: {plan.bottleneck}",
    ]
    for warning in (mfu_warning(plan), moe_warning(plan)):
        if warning is not None:
            lines.append(f"warning: {warning}")
    for label, estimate in (("data-parallel all-reduce", plan.dp_estimate),
                            ("tensor-parallel all-reduce", plan.tp_estimate),
                            ("context-parallel K/V all-gather", plan.cp_estimate)):
        if estimate is not None:
            lines.append(
                f"{label}: {estimate.algorithm}/{estimate.protocol} as NCCL "
                f"{estimate.nccl_release} would run it, {estimate.busbw / 1e9:.0f} GB/s busbw; "
                f"regime {estimate.regime}: {_validation_words(estimate)}")
    if plan.dp_reduce_s > 0:
        overlap = (DP_OVERLAP[plan.layout.zero_stage] if plan.assumptions.overlap_grad_reduce
                   else "none of it overlapped")
        lines.append(f"data-parallel collectives: {plan.dp_reduce_s:.3f} s per step, "
                     f"{overlap}: {plan.dp_comm_s:.3f} s exposed")
    if plan.ep_estimate is not None:
        e = plan.ep_estimate
        lines.append(
            f"{EP_TERM}: {plan.ep_comm_s:.3f} s per step, "
            f"{ep_all_to_alls_per_layer(w.recompute_policy)} per MoE layer and micro-batch of "
            f"{e.nbytes / 2**20:.1f} MiB per GPU, each {e.time_s * 1e3:.2f} ms "
            f"(costmodel.cluster_collective's grouped send/receive over {e.n_nodes} node(s) of "
            f"{e.gpus_per_node}); unvalidated: no published all-to-all measurement backs it")
    if plan.time_to_train_s is not None:
        lines.append(f"time to train {w.n_tokens:.3g} tokens: "
                     f"{plan.time_to_train_s / 86400:.1f} days")
    if plan.tokens_in_budget is not None:
        lines.append(f"tokens in the {w.time_budget_s / 86400:.1f}-day budget: "
                     f"{plan.tokens_in_budget:.3g}")
    return "\n".join(lines)
