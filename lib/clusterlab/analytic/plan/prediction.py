"""One layout's prediction: :func:`predict` sums a step from small terms, each priced by the
function that owns its formula, into a :class:`Plan`.

References:
    Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
    Megatron-LM", SC 2021, sections 2-3 (the three-dimensional layout, the bubble
    ``(p-1)/(m+p-1)``, the tensor-parallel all-reduces). https://arxiv.org/abs/2104.04473
    Rajbhandari et al., "ZeRO", SC 2020 (memory and communication of the stages).
    https://arxiv.org/abs/1910.02054
    [megatron_core_distrib_optimizer] Megatron Core User Guide, "Distributed Optimizer" (bytes
    per parameter of the model states, sharded over the data-parallel ranks).
    https://docs.nvidia.com/megatron-core/developer-guide/latest/distrib_optimizer.html
    [dubey2024] Dubey et al., "The Llama 3 Herd of Models", 2024, section 3.3.2 (context
    parallelism: the all-gather of K and V over the cp group, zig-zag chunks, the order
    [TP, CP, PP, DP]). https://arxiv.org/abs/2407.21783
    Megatron Core, "Context Parallel Overview" (CP partitions the inputs and all activations
    along the sequence; attention's K/V are all-gathered forward and reduce-scattered
    backward). https://docs.nvidia.com/megatron/parallelism-guide/context-parallel
    Megatron-LM, megatron/core/parallel_state.py: the data-parallel group "with context
    parallel" (dp x cp ranks holding the same parameters) over which gradients are reduced and
    the distributed optimizer shards (Megatron-LM core_r0.x; the planner follows it, the
    source was not re-read for this change).
    [te_fp8_current_scaling] NVIDIA Transformer Engine, release v2.9 (tag v2.9, 30 October
    2025): ``transformer_engine/pytorch/csrc/quantizer.cpp``
    (``Float8CurrentScalingQuantizer::quantize_impl``: ``nvte_compute_amax``, the amax
    all-reduce, the scale, then ``nvte_quantize_v2``), ``csrc/extensions/normalization.cpp``
    (``FUSED_NORM_AMAX_FP8``: the norm computes the amax as it writes), ``module/linear.py`` and
    ``module/layernorm_linear.py`` (which tensors are quantized, rowwise and columnwise, and
    FP8 all-gather of rowwise data only under current scaling); and the documentation pages
    "FP8 Current Scaling" ("Quantization is a memory-bound operation that requires reading the
    tensor twice"; "On Hopper, columnwise usage requires a physical transpose") and
    "Performance Considerations: Handling transposes", first in release v2.13.
    https://github.com/NVIDIA/TransformerEngine
    Expert parallelism: DeepSpeed's expert-parallel and expert-data-parallel groups
    (deepspeed/utils/groups.py, ``_create_expert_and_data_parallel``) and Megatron Core's MoE
    guide (see :mod:`clusterlab.analytic.plan.workload`); the all-to-all's buffer is
    :func:`clusterlab.analytic.moe.all_to_all_bytes` (GShard, Lepikhin et al. 2021; Switch, Fedus et
    al. 2021), the function lab 13 checks against the compiled expert-parallel layer. No published
    MoE training run is in :func:`clusterlab.analytic.plan.validation_table`: the expert-parallel
    terms are unvalidated.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

from clusterlab.analytic import costmodel, flops, gemm, memory, moe, storage
from clusterlab.analytic.plan._network import all_reduce, collective, group_of
from clusterlab.analytic.plan.step import exposed_bucketed_reduce_s, megatron_bucket_params
from clusterlab.analytic.plan.workload import (Assumptions, cluster as plan_cluster, Layout, MoE,
                                               Workload)
from clusterlab.catalog import hardware
from clusterlab.catalog.hardware import ClusterSpec
from clusterlab.catalog.published import training_runs

BYTES_PER_VALUE = 2  # BF16: parameters, gradients and activations as they travel (2 bytes)
#: The breakdown's name of expert parallelism's all-to-alls (Plan.breakdown, the CLI's tables)
EP_TERM = "expert-parallel all-to-all (unvalidated)"


@dataclass(frozen=True)
class Plan:
    """A layout's prediction: memory, the step and its parts, MFU, time to train.

    The step is ``compute + tensor-parallel all-reduce + context-parallel K/V collectives +
    expert-parallel all-to-alls + pipeline sends + pipeline bubble + exposed data-parallel
    all-reduce + optimizer step + data wait``; storage prefetches, so it only adds the part of
    its load time that exceeds the rest of the step.
    """

    workload: Workload
    hardware: ClusterSpec
    layout: Layout
    assumptions: Assumptions
    memory_bytes: float          # model states + activations per GPU
    memory_limit_bytes: float    # GPU memory less the reserve
    states_bytes: float          # parameters, gradients, optimizer state (ZeRO-sharded)
    activation_bytes: float      # activations kept for the backward pass, busiest stage
    compute_s: float             # forward + backward + recomputation, last stage (_compute_s)
    tp_comm_s: float             # tensor-parallel all-reduces, node interconnect, not hidden
    pp_comm_s: float             # pipeline sends of activations and their gradients, not hidden
    bubble_s: float              # pipeline bubble: (p-1)/(v m) of compute + tp
    dp_comm_s: float             # data-parallel all-reduce (or ZeRO's collectives), exposed
    data_wait_s: float           # waiting for storage beyond the rest of the step
    load_s: float                # storage time for one step's tokens (prefetched)
    output_layer_s: float        # of compute_s: the last stage's logits and cross-entropy
    optimizer_s: float           # the Adam step over HBM (_optimizer_s), after the all-reduce
    model_flops_per_step: float  # tokens_per_step * flops_per_token (no recomputation)
    hardware_flops_per_step: float  # tokens_per_step * hardware_flops_per_token (recomputed too)
    #: context parallelism's all-gathers of K and V and reduce-scatters of their gradients,
    #: not hidden (_context_parallel); 0 without cp
    cp_comm_s: float = 0.0
    #: cluster_collective's estimates of one data-parallel all-reduce (the gradients, before
    #: ZeRO-3's factor, contention and overlap) and of one tensor-parallel all-reduce; None
    #: where there is none. Their ``validation`` says how far published rows back them.
    dp_estimate: costmodel.CollectiveEstimate | None = field(default=None, compare=False)
    tp_estimate: costmodel.CollectiveEstimate | None = field(default=None, compare=False)
    #: one context-parallel K/V all-gather's estimate (None without cp)
    cp_estimate: costmodel.CollectiveEstimate | None = field(default=None, compare=False)
    #: the data-parallel collectives' seconds before any of them hides (dp_comm_s is what
    #: compute leaves exposed, _data_parallel); 0 without dp
    dp_reduce_s: float = 0.0
    #: expert parallelism's dispatch and combine all-to-alls, forward and backward, not hidden
    #: (_expert_parallel); 0 without ep. Unvalidated: no published all-to-all measurement.
    ep_comm_s: float = 0.0
    #: one expert-parallel all-to-all's estimate, marked unvalidated (None without ep)
    ep_estimate: costmodel.CollectiveEstimate | None = field(default=None, compare=False)

    @property
    def validated(self) -> bool:
        """Whether published rows validate every collective the plan prices: each in a regime
        whose median error is within ``costmodel.TOLERANCE``, on the rows' node counts
        (``costmodel.validation_by_regime``). Never with expert parallelism: no published MoE
        training row backs its all-to-alls."""
        return self.network_model == "validated"

    @property
    def network_model(self) -> str:
        """The weakest validation level of the plan's collectives, one of
        ``costmodel.VALIDATION_LEVELS`` ("validated", "tested", "extrapolated", "untested")."""
        levels = [e.validation for e in (self.dp_estimate, self.tp_estimate, self.cp_estimate,
                                         self.ep_estimate) if e is not None]
        return max(levels, key=costmodel.VALIDATION_LEVELS.index, default="validated")

    @property
    def step_s(self) -> float:
        return (self.compute_s + self.tp_comm_s + self.cp_comm_s + self.ep_comm_s
                + self.pp_comm_s + self.bubble_s + self.dp_comm_s + self.optimizer_s
                + self.data_wait_s)

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.memory_limit_bytes

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization of the whole step (recomputation not counted), over the
        peak of the workload's precision: BF16's, or FP8's for an FP8 workload (whose
        attention and element-wise work still run in BF16, so it reaches less of its peak)."""
        return flops.mfu(self.model_flops_per_step / self.step_s, self.hardware.n_gpus,
                         hardware.peak_flops(self.hardware.gpu,
                                             precision=self.workload.precision))

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilization: recomputed FLOPs counted too."""
        return self.mfu * self.hardware_flops_per_step / self.model_flops_per_step

    @property
    def time_to_train_s(self) -> float | None:
        """Seconds to train on ``workload.n_tokens`` (None without a token count)."""
        if self.workload.n_tokens is None:
            return None
        return self.workload.n_tokens / self.workload.tokens_per_step * self.step_s

    @property
    def tokens_in_budget(self) -> float | None:
        """Tokens trained within ``workload.time_budget_s`` (None without a budget)."""
        if self.workload.time_budget_s is None:
            return None
        return self.workload.time_budget_s / self.step_s * self.workload.tokens_per_step

    @property
    def meets_budget(self) -> bool | None:
        """Whether the tokens fit the budget (None unless both are given)."""
        if self.workload.n_tokens is None or self.workload.time_budget_s is None:
            return None
        return self.time_to_train_s <= self.workload.time_budget_s

    def breakdown(self) -> dict[str, float]:
        """Seconds per step by what the GPUs are doing or waiting for (the context-parallel
        K/V collectives only for a layout with cp > 1, the expert-parallel all-to-alls,
        unvalidated, only for one with ep > 1)."""
        parts = {"compute": self.compute_s, "tensor-parallel all-reduce": self.tp_comm_s}
        if self.layout.cp > 1:
            parts["context-parallel K/V all-gather"] = self.cp_comm_s
        if self.layout.ep > 1:
            parts[EP_TERM] = self.ep_comm_s
        return parts | {"pipeline send/receive": self.pp_comm_s, "pipeline bubble": self.bubble_s,
                        "data-parallel all-reduce": self.dp_comm_s,
                        "optimizer step": self.optimizer_s, "storage": self.data_wait_s}

    @property
    def bottleneck(self) -> str:
        """The resource the step spends most time on: compute, node interconnect, pipeline
        bubble, fabric, HBM (the optimizer step) or storage (the data-parallel all-reduce inside
        one node counts as the node interconnect)."""
        if self.data_wait_s > 0:
            return "storage"
        parts = self.breakdown()
        largest = max(parts, key=parts.get)
        dp_nodes = _dp_placement(self.layout, self.hardware)[1]
        stages_apart = _stages_cross_nodes(self.layout, self.hardware)
        cp_nodes = _cp_placement(self.layout, self.hardware)[1]
        # the all-to-all's own bound: an ep group across hosts of one NVLink domain (an NVL72
        # rack) stays on NVLink
        ep_over_network = self.ep_estimate is not None and self.ep_estimate.bottleneck == "network"
        return {"compute": "compute", "tensor-parallel all-reduce": "node interconnect",
                "context-parallel K/V all-gather": ("fabric" if cp_nodes > 1
                                                    else "node interconnect"),
                EP_TERM: "fabric" if ep_over_network else "node interconnect",
                "pipeline send/receive": "fabric" if stages_apart else "node interconnect",
                "pipeline bubble": "pipeline bubble",
                "data-parallel all-reduce": "fabric" if dp_nodes > 1 else "node interconnect",
                "optimizer step": "HBM", "storage": "storage"}[largest]


def dp_all_reduce(nbytes: float, local: int, nodes: int,
                  cluster: ClusterSpec) -> costmodel.CollectiveEstimate | None:
    """:func:`clusterlab.analytic.costmodel.cluster_collective`'s estimate of the data-parallel
    all-reduce (see :func:`dp_all_reduce_s`), with its regime and ``validation`` level.

    Returns:
        The estimate; None for a group of one GPU. Without a NIC name (``cluster.nic``) the
        fabric is unknown and the estimate is marked untested.
    """
    if local * nodes == 1:
        return None
    return all_reduce(nbytes, group_of(cluster, local, nodes))


def dp_all_reduce_s(nbytes: float, local: int, nodes: int, cluster: ClusterSpec) -> float:
    """Seconds of the data-parallel all-reduce of ``nbytes`` per GPU on ``cluster``.

    One data-parallel group has ``local`` GPUs in each of ``nodes`` nodes; it uses their share
    of the node's NICs (``local / gpus_per_node`` of them). Priced by
    :func:`clusterlab.analytic.costmodel.cluster_collective`, the one model of NCCL across nodes
    (NVLink and network pipelined, all NICs in parallel, NVLS where NCCL picks it, latency by
    protocol).

    Args:
        nbytes: the gradient bytes each GPU all-reduces.
        local: GPUs of the group in one node.
        nodes: nodes the group spans.
        cluster: the cluster.

    Returns:
        Seconds; 0 for a group of one GPU.
    """
    estimate = dp_all_reduce(nbytes, local, nodes, cluster)
    return 0.0 if estimate is None else estimate.time_s


def _cp_placement(layout: Layout, cluster: ClusterSpec) -> tuple[int, int]:
    """(GPUs of one context-parallel group inside a node, nodes the group spans): the cp group
    sits right outside tp (Layout's placement), so it fills the node's ``gpus_per_node / tp``
    slots before it crosses to the next node."""
    slots = max(1, cluster.gpus_per_node // layout.tp)
    local = math.gcd(layout.cp, slots)
    return local, layout.cp // local


def _dp_placement(layout: Layout, cluster: ClusterSpec) -> tuple[int, int]:
    """(GPUs of one gradient-reduction group inside a node, nodes the group spans).

    The gradients are reduced over the ``dp * cp`` GPUs that hold the same parameters (every
    cp GPU holds its tp/pp shard's whole parameters, as in Megatron-LM); with cp = 1 this is the
    data-parallel group. Inside a node tp comes first, then cp, then dp (Layout's placement).
    """
    slots = max(1, cluster.gpus_per_node // layout.tp)
    cp_local = math.gcd(layout.cp, slots)
    local = cp_local * math.gcd(layout.dp, max(1, slots // cp_local))
    return local, layout.dp * layout.cp // local


def _ep_placement(layout: Layout, cluster: ClusterSpec) -> tuple[int, int]:
    """(GPUs of one expert-parallel group inside a node, nodes the group spans): ``ep``
    consecutive data-parallel ranks (DeepSpeed's expert-parallel groups), so the group fills
    the node's data-parallel GPUs (those left by tp and cp) before it crosses nodes."""
    slots = max(1, cluster.gpus_per_node // layout.tp)
    dp_local = math.gcd(layout.dp, max(1, slots // math.gcd(layout.cp, slots)))
    local = math.gcd(layout.ep, dp_local)
    return local, layout.ep // local


def _expert_dp_placement(layout: Layout, cluster: ClusterSpec) -> tuple[int, int]:
    """(GPUs inside a node, nodes) of the group that reduces the experts' gradients: the
    ``dp cp / ep`` GPUs that hold the same experts (DeepSpeed's expert-data-parallel group:
    data-parallel ranks ``ep`` apart, and the cp ranks)."""
    size = layout.dp * layout.cp // layout.ep
    local = math.gcd(size, _dp_placement(layout, cluster)[0] // _ep_placement(layout, cluster)[0])
    return local, size // local


def _stages_cross_nodes(layout: Layout, cluster: ClusterSpec) -> bool:
    """Whether neighbouring pipeline stages sit on different nodes (stages are outermost)."""
    return layout.pp > 1 and layout.tp * layout.cp * layout.dp >= cluster.gpus_per_node


def batch_fix(global_batch: int, dp: int) -> str:
    """What to change when a global batch does not divide over ``dp`` replicas: the nearest
    batches that do, or a dp that divides the batch. Megatron-LM refuses such a batch too (its
    global batch is micro-batch x micro-batches x dp), so the planner does not price it."""
    lower, upper = (global_batch // dp) * dp, (global_batch // dp + 1) * dp
    nearest = f"{lower} or {upper}" if lower else f"{upper}"
    return (f"a batch of {global_batch} sequences does not divide over dp = {dp}: use a batch "
            f"of {nearest} sequences (multiples of {dp}), or fewer or more GPUs so that dp "
            f"divides {global_batch}")


def broken_rule(workload: Workload, layout: Layout, *, schedule_rules: bool = True,
                gpus_per_node: int | None = None) -> str | None:
    """The divisibility rule a layout breaks for a workload, named, or None: the one check
    behind :func:`predict` (which raises it) and the search (which counts refusals by it).

    Rules: the global batch divides over ``dp``; the micro-batch divides each replica's
    sequences; with context parallelism (cp > 1) the sequence divides into ``2 cp`` zig-zag
    chunks, and, given ``gpus_per_node``, ``tp * cp`` GPUs either divide a node or are whole
    nodes (so that every cp group has the same placement); and with ``schedule_rules``
    Megatron-LM's for its schedule: interleaving (v > 1) needs pp > 1, layers divisible by
    ``pp * v`` and micro-batches a multiple of pp; ZeRO > 0 needs more than one GPU to shard
    over (``dp * cp > 1``: Megatron's distributed optimizer shards over the data- and
    context-parallel ranks together). Expert parallelism (ep > 1) needs a workload with
    experts, and ``ep`` dividing both the experts and ``dp`` (its ranks are data-parallel
    ranks, :class:`Layout`). :func:`predict` leaves the schedule rules out: it
    prices a stage of ``L / pp`` layers as an average, so a layout Megatron would refuse (Llama 3's
    126 layers in 16 x 4 chunks) can still be estimated.

    Returns:
        The rule's name (no numbers, so that refusals of one rule count together), or None.
    """
    n_layers, _ = workload.shape
    if workload.global_batch % layout.dp:
        return "global batch does not divide over dp"
    per_replica = workload.global_batch // layout.dp
    if per_replica % layout.micro_batch:
        return "micro-batch does not divide the replica's sequences"
    if layout.cp > 1 and workload.seq_len % (2 * layout.cp):
        return "sequence not divisible into 2 * cp zig-zag chunks"
    if layout.cp > 1 and gpus_per_node is not None:
        group = layout.tp * layout.cp
        if gpus_per_node % group and group % gpus_per_node:
            return "tp * cp neither divides a node nor is whole nodes"
    if layout.ep > 1:
        if workload.moe is None:
            return "expert parallelism needs a mixture-of-experts workload"
        if workload.moe.n_experts % layout.ep:
            return "ep does not divide the experts"
        if layout.dp % layout.ep:
            return "ep does not divide dp (expert-parallel ranks are data-parallel ranks)"
    if not schedule_rules:
        return None
    if layout.virtual_stages > 1:
        if layout.pp == 1:
            return "interleaving needs pp > 1"
        if n_layers % (layout.pp * layout.virtual_stages):
            return "layers not divisible by pp * v"
        if (per_replica // layout.micro_batch) % layout.pp:
            return "interleaving needs micro-batches a multiple of pp"
    if layout.zero_stage > 0 and layout.dp * layout.cp == 1:
        return "ZeRO needs dp > 1"
    return None


def _check_layout(workload: Workload, cluster: ClusterSpec, layout: Layout) -> int:
    """Validate a layout for a workload on a cluster; return micro-batches per replica."""
    if layout.n_gpus != cluster.n_gpus:
        product, with_cp = (("dp*tp*pp*cp", f", cp={layout.cp}") if layout.cp > 1
                            else ("dp*tp*pp", ""))
        raise ValueError(
            f"Layout {layout} uses {product} = {layout.n_gpus} GPUs but the cluster has "
            f"{cluster.n_gpus}; the product must equal the GPU count (e.g. dp = "
            f"{cluster.n_gpus / (layout.tp * layout.pp * layout.cp):g} for tp={layout.tp}, "
            f"pp={layout.pp}{with_cp}).")
    if layout.tp > cluster.gpus_per_node or cluster.gpus_per_node % layout.tp:
        raise ValueError(f"tp={layout.tp} must divide the {cluster.gpus_per_node} GPUs of a "
                         f"node: tensor parallelism stays on the node interconnect.")
    n_layers, _ = workload.shape
    if layout.pp * layout.virtual_stages > n_layers:
        raise ValueError(f"pp * virtual_stages = {layout.pp * layout.virtual_stages} exceeds the "
                         f"{n_layers} layers; each stage needs at least one layer.")
    rule = broken_rule(workload, layout, schedule_rules=False,
                       gpus_per_node=cluster.gpus_per_node)
    if workload.global_batch % layout.dp:
        raise ValueError(f"Layout {layout} breaks a rule: global batch does not divide over dp "
                         f"({workload.global_batch} sequences, dp={layout.dp}); "
                         f"{batch_fix(workload.global_batch, layout.dp)}.")
    if rule is not None:
        raise ValueError(f"Layout {layout} breaks a rule: {rule} (global batch "
                         f"{workload.global_batch} sequences, dp={layout.dp}, micro-batch "
                         f"{layout.micro_batch}, sequence {workload.seq_len} tokens, "
                         f"tp={layout.tp}, cp={layout.cp}, {cluster.gpus_per_node} GPUs per "
                         f"node); choose dp dividing the batch, a micro-batch dividing each "
                         f"replica's share, a cp with 2 * cp dividing the sequence and "
                         f"tp * cp dividing a node or a multiple of it"
                         + ("" if layout.ep == 1 else
                            f", an ep (here {layout.ep}) dividing dp and the experts ("
                            + ("none: the workload is dense" if workload.moe is None else
                               f"{workload.moe.n_experts}") + ")")
                         + ".")
    per_replica = workload.global_batch // layout.dp
    if cluster.storage_read_bytes_per_s is None:
        raise ValueError("The planner needs the cluster's storage: give the ClusterSpec a "
                         "storage_read_bytes_per_s (plan.cluster requires it).")
    return per_replica // layout.micro_batch


# --- The terms of a step ---------------------------------------------------------------------

def _params_per_gpu(workload: Workload, layout: Layout) -> tuple[tuple[float, int], ...]:
    """The parameters one GPU holds, in groups of ``(parameters, GPUs holding the same ones)``;
    ZeRO shards a group's states, and the gradient reduction runs, over its GPUs.

    Without expert parallelism one group, ``N / (tp pp)`` over ``dp cp``; with it two: the
    parameters outside the experts, ``(N - N_e) / (tp pp)`` over ``dp cp``, and the experts',
    ``N_e / (tp pp ep)`` over the ``dp cp / ep`` GPUs that hold the same experts.
    """
    replicas = layout.dp * layout.cp
    if layout.ep == 1:
        return ((workload.n_params / (layout.tp * layout.pp), replicas),)
    dense = (workload.n_params - workload.expert_params) / (layout.tp * layout.pp)
    experts = workload.expert_params / (layout.tp * layout.pp * layout.ep)
    return (dense, replicas), (experts, replicas // layout.ep)


def _memory(workload: Workload, layout: Layout, assumptions: Assumptions,
            microbatches: int) -> tuple[float, float]:
    """(model states, activations) per GPU of the busiest (first) pipeline stage, in bytes.

    The states are :func:`clusterlab.analytic.memory.training_memory_per_device` of the ``N/(tp
    pp)`` parameters a GPU holds, ZeRO-sharded over ``dp`` (FP32 gradients with
    ``fp32_grad_accumulation``). The activations are one micro-batch's of the stage's layers
    (:func:`clusterlab.analytic.memory.transformer_layer_activation_bytes`, sequence parallel when
    tp > 1 unless the layout turns it off; "flash" stores what "selective" does, the scores
    never being stored, and "flash_full" what "full" does, each layer's input; grouped-query
    attention's K and V at ``kv_heads / heads`` of
    multi-head attention's) times the micro-batches the schedule keeps in flight on the first
    stage (:func:`clusterlab.analytic.costmodel.pipeline_activation_microbatches`: ``min(p, m)`` for
    1F1B, ``p + (p-1)/v`` interleaved).

    Context parallelism: a GPU keeps the activations of its ``s / cp`` tokens, ``1/cp`` of a
    layer's (the scores of "none", ``s/cp`` queries by ``s`` keys, too); the gathered K and V
    are not kept (the backward gathers them again, :func:`_context_parallel`). The model
    states are replicated over cp and ZeRO shards them over the ``dp * cp`` GPUs that hold the
    same parameters.

    Expert parallelism: a GPU holds ``1 / (tp pp ep)`` of the experts' parameters
    (:class:`Layout`), and ZeRO shards their states over the ``dp cp / ep`` GPUs that hold the
    same experts; the other parameters as without ep. The MoE layers' activations are counted
    as a dense layer's (memory's formula has no MLP width): the ``k`` expert MLPs' intermediate
    activations of each token are not counted, an underestimate when ``k f > 4 d``.
    """
    n_layers, d_model = workload.shape
    states_bytes = sum(
        memory.training_memory_per_device(params, holders, layout.zero_stage,
                                          fp32_grad_accumulation=assumptions.fp32_grad_accumulation)
        for params, holders in _params_per_gpu(workload, layout))
    layer_bytes = memory.transformer_layer_activation_bytes(
        workload.seq_len, layout.micro_batch, d_model, workload.heads,
        tensor_parallel=layout.tp,
        sequence_parallel=layout.sequence_parallel and layout.tp > 1,
        recompute=workload.recompute_policy, n_kv_heads=workload.kv_heads) / layout.cp
    if layout.virtual_stages > 1:
        in_flight = costmodel.pipeline_activation_microbatches(
            layout.pp, microbatches, "interleaved", virtual_stages=layout.virtual_stages)
    else:
        in_flight = costmodel.pipeline_activation_microbatches(layout.pp, microbatches, "1f1b")
    return states_bytes, layer_bytes * math.ceil(n_layers / layout.pp) * in_flight


def _compute_s(workload: Workload, cluster: ClusterSpec, layout: Layout,
               assumptions: Assumptions, microbatches: int) -> tuple[float, float]:
    """(compute seconds of the last pipeline stage, its output layer's share of them): forward,
    backward and recomputation of one replica's ``microbatches`` through its ``L / pp`` layers,
    plus the output layer (logits and cross-entropy) that Megatron-LM places on the last stage
    when the workload has a ``vocab_size``. Every micro-batch passes through the last stage, so
    a pipeline runs at its pace (the imbalance); the fill and drain of the bubble
    (:func:`_bubble_s`) pass through the plain stages.

    By default (``compute_efficiency`` None) each layer is
    :func:`clusterlab.analytic.gemm.transformer_layer_time_s`: its GEMMs priced by shape (tile and
    wave quantization over the SMs, the ceiling of a published matmul benchmark, the memory-bound
    regime) and its element-wise kernels by their bytes over HBM bandwidth; the output layer is
    :func:`clusterlab.analytic.gemm.output_layer_time_s`. With a ``compute_efficiency`` (a
    calibration), ``Workload.hardware_flops_per_token`` of every token, and the output layer's
    ``6 d V / tp`` per token of the replica, at that fraction of the cluster's peak.

    Context parallelism divides both by ``cp``: each GPU runs the layers on ``s / cp`` tokens,
    and the zig-zag placement (chunks ``i`` and ``2 cp - 1 - i``) gives every GPU the same
    ``1/cp`` of the causal attention blocks (:func:`clusterlab.device.parallel.context.
    causal_blocks_per_device`: ``2 cp + 1`` blocks each). The GEMMs keep the efficiency of the
    whole sequence's shapes (a modelled simplification: at ``s / cp`` of tens of thousands of
    tokens the rows stay far beyond a wave of tiles).

    Mixture of experts: a dense layer runs its MLP; an MoE layer runs attention and, on the
    busiest GPU of its expert-parallel group, its experts as grouped GEMMs, its router and its
    token permutations (:func:`_moe_layer_s`); a stage's layer time is their average.
    """
    n_layers, d_model = workload.shape
    vocab = workload.vocab_size
    if assumptions.compute_efficiency is not None:
        if workload.precision != "bf16":
            raise ValueError("compute_efficiency is a fraction of the BF16 peak; an FP8 "
                             "workload is priced GEMM by GEMM: give compute_efficiency=None.")
        rate = cluster.gpu.bf16_flops * assumptions.compute_efficiency
        hardware_flops = workload.tokens_per_step * workload.hardware_flops_per_token
        output_s = (0.0 if vocab is None else
                    6.0 * workload.tokens_per_step / (layout.dp * layout.cp) * d_model * vocab
                    / layout.tp / rate)
        return hardware_flops / (cluster.n_gpus * rate) + output_s, output_s
    def layer_time_s(ffn_hidden: float) -> float:
        return _layer_time_s(
            cluster.gpu, workload.precision, workload.seq_len, layout.micro_batch, d_model,
            workload.heads, ffn_hidden=ffn_hidden, tensor_parallel=layout.tp,
            sequence_parallel=layout.sequence_parallel and layout.tp > 1,
            recompute=workload.recompute_policy) / layout.cp

    if workload.moe is None:
        layer_s = layer_time_s(workload.mlp_width)
    else:
        n_moe = workload.moe_layers
        dense_s = 0.0 if n_moe == n_layers else (n_layers - n_moe) * layer_time_s(
            workload.mlp_width)
        layer_s = (n_moe * _moe_layer_s(workload, cluster, layout) + dense_s) / n_layers
    output_s = 0.0 if vocab is None else microbatches * gemm.output_layer_time_s(
        cluster.gpu, workload.seq_len, layout.micro_batch, d_model, vocab,
        tensor_parallel=layout.tp) / layout.cp
    return (layer_s * n_layers / layout.pp * microbatches + output_s
            + _fp8_weight_casts_s(workload, cluster, layout), output_s)


def _fp8_weight_casts_s(workload: Workload, cluster: ClusterSpec, layout: Layout) -> float:
    """Seconds a step spends quantizing the dense layers' linear weights to FP8 on one GPU, its
    ``L / pp`` layers' :func:`fp8_weight_casts` over HBM bandwidth (0 in BF16). An MoE layer's
    FP8 casts are not priced."""
    if workload.precision == "bf16":
        return 0.0
    n_layers, d_model = workload.shape
    dense_layers = n_layers - (0 if workload.moe is None else workload.moe_layers)
    gemms = gemm.transformer_layer_gemms(workload.seq_len, layout.micro_batch, d_model,
                                         workload.heads, ffn_hidden=workload.mlp_width,
                                         tensor_parallel=layout.tp)
    return (dense_layers / layout.pp * fp8_weight_casts(cluster.gpu, gemms)
            / cluster.gpu.hbm_bytes_per_s)


def expert_rows(workload: Workload, layout: Layout) -> int:
    """Token copies each expert of the busiest GPU computes per micro-batch: the ``ep``
    replicas' ``T = micro_batch s / cp`` tokens each send ``k`` copies over the ``E`` experts,
    ``ep T k / E`` on average, times ``moe.load_imbalance`` (max / mean), rounded up.

    Raises:
        ValueError: for a dense workload.
    """
    if workload.moe is None:
        raise ValueError("A dense workload has no experts: give Workload.moe.")
    spec = workload.moe
    tokens = layout.micro_batch * workload.seq_len / layout.cp
    mean = layout.ep * tokens * spec.top_k / spec.n_experts
    return max(1, math.ceil(spec.load_imbalance * mean))


def _moe_layer_s(workload: Workload, cluster: ClusterSpec, layout: Layout) -> float:
    """One MoE layer's seconds for one micro-batch on the busiest GPU of its expert-parallel
    group (:func:`_moe_layer_time_s` of its shape): the tokens it routes are its micro-batch's
    ``micro_batch s / cp`` (split over tp when sequence parallel), its experts ``E / ep``, each
    over :func:`expert_rows` rows."""
    spec = workload.moe
    sequence_parallel = layout.sequence_parallel and layout.tp > 1
    tokens = layout.micro_batch * workload.seq_len // layout.cp
    return _moe_layer_time_s(
        cluster.gpu, workload.precision, workload.seq_len, layout.micro_batch,
        workload.shape[1], workload.heads, spec, tensor_parallel=layout.tp,
        sequence_parallel=sequence_parallel, recompute=workload.recompute_policy,
        context_parallel=layout.cp,
        routed_tokens=max(1, tokens // layout.tp if sequence_parallel else tokens),
        rows=expert_rows(workload, layout), local_experts=spec.n_experts // layout.ep)


@functools.lru_cache(maxsize=4096)   # a layout search prices the same layer many times
def _moe_layer_time_s(gpu: hardware.GPU, precision: str, seq_len: int, micro_batch: int,
                      d_model: int, n_heads: int, spec: MoE, *, tensor_parallel: int,
                      sequence_parallel: bool, recompute: str, context_parallel: int,
                      routed_tokens: int, rows: int, local_experts: int) -> float:
    """One MoE layer's seconds for one micro-batch on one GPU, forward, backward and
    recomputation:

    * attention: the layer's GEMMs and element-wise kernels less the dense MLP's
      (:func:`clusterlab.analytic.gemm.transformer_layer_gemms`, without ``mlp_up``,
      ``mlp_down`` and ``gelu``), ``1/cp`` of them as for a dense layer;
    * the experts: each of :func:`clusterlab.analytic.gemm.expert_mlp_gemms` over ``rows``
      token copies, for the ``local_experts`` the GPU holds, as one grouped GEMM
      (:func:`clusterlab.analytic.gemm.grouped_gemm_time_s`: Transformer Engine's four streams
      of per-expert GEMMs on Hopper); a GPU holding fewer, fuller experts runs them more
      efficiently, so ep changes the compute;
    * the router's GEMMs over the ``routed_tokens`` (:func:`clusterlab.analytic.gemm.
      router_gemms`) and the dispatcher's permutations, the router's softmax and the experts'
      gated activation by their bytes over HBM (:func:`clusterlab.analytic.gemm.
      moe_elementwise`), with the clamp, the expert bias and the activation's recomputation
      where ``spec`` asks for them.

    FP8 runs the linear GEMMs (QKV, output projection, the experts') at the FP8 peak, as
    :func:`_layer_time_s` does; attention's two GEMMs and the router stay BF16.
    Not priced: host-side work (the dispatcher's device-to-host synchronisations for the
    split sizes, kernel launches), which CUDA graphs hide in some published runs and not in
    others.
    """
    layer = dict(tensor_parallel=tensor_parallel, recompute=recompute)
    mlp = set(gemm.LAYER_GEMM_GROUPS["MLP"])
    attention_gemms = [g for g in gemm.transformer_layer_gemms(seq_len, micro_batch, d_model,
                                                                n_heads, **layer)
                       if g.name not in mlp]
    attention_kernels = [k for k in gemm.transformer_layer_elementwise(
        seq_len, micro_batch, d_model, n_heads, sequence_parallel=sequence_parallel, **layer)
        if k.name != "gelu"]
    linear = _linear_gpu(gpu, precision)
    scores = set(gemm.LAYER_GEMM_GROUPS["attention"])
    attention_s = (sum(gemm.gemm_time_s(g, gpu if g.name in scores else linear)
                       for g in attention_gemms)
                   + sum(k.hbm_bytes for k in attention_kernels) / gpu.hbm_bytes_per_s)
    experts_s = sum(gemm.grouped_gemm_time_s(g, local_experts, linear)
                    for g in gemm.expert_mlp_gemms(rows, d_model, spec.expert_mlp_width,
                                                   **layer))
    router_s = sum(gemm.gemm_time_s(g, gpu)
                   for g in gemm.router_gemms(routed_tokens, d_model, spec.n_experts))
    kernels = gemm.moe_elementwise(routed_tokens, d_model, spec.expert_mlp_width,
                                   top_k=spec.top_k, n_experts=spec.n_experts,
                                   received_rows=rows * local_experts,
                                   local_experts=local_experts,
                                   activation_clamp=spec.activation_clamp,
                                   expert_bias=spec.expert_bias,
                                   recompute_activation=spec.recompute_activation, **layer)
    kernels_s = sum(k.hbm_bytes for k in kernels) / gpu.hbm_bytes_per_s
    return attention_s / context_parallel + experts_s + router_s + kernels_s


def _linear_gpu(gpu: hardware.GPU, precision: str) -> hardware.GPU:
    """The GPU the linear GEMMs run on: ``gpu`` in BF16; in FP8 the same GPU with its FP8
    peak in place of the BF16 one (:func:`clusterlab.catalog.hardware.peak_flops`)."""
    if precision == "bf16":
        return gpu
    return replace(gpu, bf16_flops=hardware.peak_flops(gpu, precision="fp8"))


#: The GPUs whose FP8 GEMMs need a second, physically transposed FP8 copy of every operand
#: for the backward pass: Hopper's. Blackwell reads the columnwise usage in place
#: [te_fp8_current_scaling].
FP8_TRANSPOSED_COPY_GPUS = ("H100", "H200")
FP8_BYTES = 1   # one FP8 value (E4M3 forward, E5M2 gradients)
#: The linear GEMMs, Megatron's column-parallel ones (their input all-gathered over the tp GPUs
#: under sequence parallelism), and those whose input comes from Transformer Engine's fused
#: LayerNorm (LayerNormLinear: the norm kernel computes the amax as it writes).
FP8_LINEAR_GEMMS = gemm.LAYER_GEMM_GROUPS["projections"] + gemm.LAYER_GEMM_GROUPS["MLP"]
COLUMN_PARALLEL_GEMMS = ("qkv", "mlp_up")
NORM_FED_GEMMS = ("qkv", "mlp_up")


def fp8_cast_bytes(values: float, *, transposed_copy: bool, amax_fused: bool = False,
                   gathered_over: int = 1) -> float:
    """HBM bytes of quantizing ``values`` BF16 values to FP8 under Transformer Engine's current
    scaling recipe (one FP32 scale per tensor, from the tensor's own amax)
    [te_fp8_current_scaling]: an amax kernel reads the tensor (2 bytes a value) unless its
    producer computed the amax on the way (``amax_fused``); the cast reads it again (2) and
    writes the rowwise FP8 copy (1) and, on Hopper (``transposed_copy``), the transposed one
    (1). A tensor all-gathered over ``gathered_over`` > 1 GPUs (sequence parallelism) is
    quantized rowwise on the GPU's ``1/gathered_over`` shard, gathered in FP8, and its
    transposed copy is made in the backward from the gathered FP8 tensor (read 1, write 1):
    Transformer Engine cannot all-gather FP8 columnwise data on Hopper."""
    amax = 0 if amax_fused else BYTES_PER_VALUE
    rowwise = (amax + BYTES_PER_VALUE + FP8_BYTES) * values / gathered_over
    if not transposed_copy:
        return rowwise
    return rowwise + (2 if gathered_over > 1 else 1) * FP8_BYTES * values


def fp8_activation_casts(gpu: hardware.GPU, gemms: tuple[gemm.Gemm, ...], *,
                         tensor_parallel: int, sequence_parallel: bool,
                         ) -> tuple[gemm.Elementwise, ...]:
    """The FP8 quantization kernels of one layer's micro-batch (:func:`fp8_cast_bytes`): each
    linear GEMM's input ``A`` (``m x k``) in its forward and recomputed forward, and its
    output's gradient (``m x n``) in the backward; the weights are :func:`fp8_weight_casts`.

    Megatron Core with Transformer Engine [te_fp8_current_scaling]: QKV and the MLP's first
    GEMM take their input from LayerNormLinear's norm, which computes the amax as it writes; the
    output projection's input (attention's output), the MLP's second GEMM's (Megatron's own
    gated activation) and every gradient need an amax kernel of their own. Under sequence
    parallelism the column-parallel GEMMs' inputs and the row-parallel GEMMs' output gradients
    are all-gathered, so quantized on the GPU's shard. Shapes are the planner's GEMMs (a GQA
    model's QKV counted at ``3 d`` like its FLOPs)."""
    transposed = gpu.name in FP8_TRANSPOSED_COPY_GPUS
    gather = tensor_parallel if sequence_parallel else 1
    kernels = []
    for g in gemms:
        if g.name not in FP8_LINEAR_GEMMS or g.pass_ not in ("forward", "recompute"):
            continue
        column = g.name in COLUMN_PARALLEL_GEMMS
        kernels.append(gemm.Elementwise("fp8_cast_input", fp8_cast_bytes(
            g.m * g.k, transposed_copy=transposed, amax_fused=g.name in NORM_FED_GEMMS,
            gathered_over=gather if column else 1), g.pass_))
        if g.pass_ == "forward":
            kernels.append(gemm.Elementwise("fp8_cast_grad_output", fp8_cast_bytes(
                g.m * g.n, transposed_copy=transposed,
                gathered_over=1 if column else gather), "dgrad"))
    return tuple(kernels)


def fp8_weight_casts(gpu: hardware.GPU, gemms: tuple[gemm.Gemm, ...]) -> float:
    """HBM bytes of quantizing one layer's linear weights (``k x n`` of each forward linear
    GEMM) to FP8 (:func:`fp8_cast_bytes`): once a step, not once a micro-batch, because
    Megatron Core marks the first micro-batch (``forward_step`` calls
    ``set_is_first_microbatch`` in ``megatron/core/pipeline_parallel/schedules.py``; read in
    the search index's copy, its release not pinned) and Transformer Engine v2.9 caches the
    FP8 weights for the rest (``is_first_microbatch``, ``update_workspace`` in
    ``module/linear.py``). An assumption for ZeRO-3, whose gathered weights may be cast again
    in every micro-batch."""
    transposed = gpu.name in FP8_TRANSPOSED_COPY_GPUS
    return sum(fp8_cast_bytes(g.k * g.n, transposed_copy=transposed) for g in gemms
               if g.name in FP8_LINEAR_GEMMS and g.pass_ == "forward")


@functools.lru_cache(maxsize=4096)   # a layout search prices the same layer many times
def _layer_time_s(gpu: hardware.GPU, precision: str, seq_len: int, micro_batch: int,
                  d_model: int, n_heads: int, *, ffn_hidden: float, tensor_parallel: int,
                  sequence_parallel: bool, recompute: str) -> float:
    """One layer's seconds for one micro-batch on one GPU: BF16,
    :func:`clusterlab.analytic.gemm.transformer_layer_time_s`; FP8, the same GEMMs and
    element-wise kernels with the linear GEMMs (QKV, output projection, MLP) at the GPU's FP8
    peak (:func:`clusterlab.catalog.hardware.peak_flops`), as Transformer Engine's FP8 recipe
    runs them, and attention's two GEMMs in BF16 (its default attention is not FP8), plus
    FP8's own casts of the activations and gradients (:func:`fp8_activation_casts`), priced
    like every element-wise kernel by their bytes over HBM bandwidth.

    The FP8 GEMMs keep the BF16 GEMMs' ceiling as a fraction of their peak
    (:func:`clusterlab.analytic.gemm.matmul_ceiling`; an assumption: the course has no FP8
    matmul benchmark row) and their BF16 bytes (an over-estimate of a memory-bound GEMM's
    traffic). Not priced: the amax all-reduce over the tp GPUs of a gathered tensor (a few
    bytes, latency only) and the scale computation (one value)."""
    shape = dict(ffn_hidden=ffn_hidden, tensor_parallel=tensor_parallel, recompute=recompute)
    if precision == "bf16":
        return gemm.transformer_layer_time_s(gpu, seq_len, micro_batch, d_model, n_heads,
                                             sequence_parallel=sequence_parallel, **shape)
    fp8 = _linear_gpu(gpu, precision)
    attention = set(gemm.LAYER_GEMM_GROUPS["attention"])
    gemms = gemm.transformer_layer_gemms(seq_len, micro_batch, d_model, n_heads, **shape)
    kernels = gemm.transformer_layer_elementwise(seq_len, micro_batch, d_model, n_heads,
                                                 sequence_parallel=sequence_parallel, **shape)
    kernels += fp8_activation_casts(gpu, gemms, tensor_parallel=tensor_parallel,
                                    sequence_parallel=sequence_parallel)
    return (sum(gemm.gemm_time_s(g, gpu if g.name in attention else fp8) for g in gemms)
            + sum(k.hbm_bytes for k in kernels) / gpu.hbm_bytes_per_s)


#: Bytes the optimizer step moves over HBM per parameter it updates: Adam reads the gradient
#: (2 bytes in BF16, 4 in FP32 with fp32_grad_accumulation) and reads and writes its 12 bytes of
#: FP32 state (master weight, momentum, variance: 24), and writes the 16-bit parameter (2): each
#: of Megatron's 18 (or the ZeRO paper's 16) bytes of model states touched once, the state twice
#: (Megatron Core, "Distributed Optimizer" [megatron_core_distrib_optimizer]).
ADAM_STATE_BYTES_MOVED = 2 * (4 + 4 + 4)   # read + write of FP32 master, momentum, variance


def optimizer_step_bytes_per_param(fp32_grad_accumulation: bool) -> float:
    """HBM bytes of one Adam step per parameter: the gradient read, the FP32 state read and
    written, the 16-bit parameter written: 28 bytes (BF16 gradients) or 30 (FP32)."""
    grad_bytes = memory.FP32_GRAD_BYTES if fp32_grad_accumulation else BYTES_PER_VALUE
    return grad_bytes + ADAM_STATE_BYTES_MOVED + BYTES_PER_VALUE


def _optimizer_s(workload: Workload, cluster: ClusterSpec, layout: Layout,
                 assumptions: Assumptions) -> float:
    """Seconds of the optimizer step: :func:`optimizer_step_bytes_per_param` of the parameters
    a GPU updates over the datasheet's HBM bandwidth. A GPU holds ``N / (tp pp)`` of them; with
    ZeRO 1-3 (Megatron's distributed optimizer) it updates only its ``1/(dp cp)`` shard. It runs
    after the gradients are reduced, so nothing hides it. With expert parallelism it holds
    ``1/ep`` of the experts' parameters, and ZeRO shards those over ``dp cp / ep``."""
    params = sum(held / holders if layout.zero_stage > 0 else held
                 for held, holders in _params_per_gpu(workload, layout))
    nbytes = params * optimizer_step_bytes_per_param(assumptions.fp32_grad_accumulation)
    return nbytes / cluster.gpu.hbm_bytes_per_s


def _tensor_parallel(workload: Workload, cluster: ClusterSpec, layout: Layout,
                     microbatches: int) -> tuple[float, costmodel.CollectiveEstimate | None]:
    """Seconds of the tensor-parallel all-reduces and one all-reduce's estimate.

    ``m (L/pp) k`` all-reduces of one micro-batch's activations over the ``tp`` GPUs of a node
    (``k`` Megatron's all-reduces per layer and micro-batch,
    :func:`clusterlab.analytic.costmodel.megatron_all_reduces_per_layer`: 4 in training, 6 with full
    recomputation, "full" or "flash_full"), none hidden. With context parallelism a GPU's
    activations are its ``s / cp`` tokens'.
    """
    if layout.tp == 1:
        return 0.0, None
    n_layers, d_model = workload.shape
    # act: bf16[micro_batch, seq_len / cp, d_model], one all-reduce of a layer
    act_bytes = (layout.micro_batch * workload.seq_len * d_model * BYTES_PER_VALUE
                 / layout.cp)
    per_layer = costmodel.megatron_all_reduces_per_layer(
        backward=True, recompute=workload.recompute_policy in gemm.FULL_RECOMPUTE)
    estimate = all_reduce(act_bytes, group_of(cluster, layout.tp, 1))
    return microbatches * (n_layers / layout.pp) * per_layer * estimate.time_s, estimate


def _pipeline_sends_s(workload: Workload, cluster: ClusterSpec, layout: Layout,
                      microbatches: int) -> float:
    """Seconds of the pipeline's point-to-point sends, none hidden.

    Each micro-batch's activations bf16[b, s, d] go to the next stage and their gradients come
    back; with tensor parallelism each of the tp GPUs sends 1/tp of them (Megatron's
    scatter/gather), with context parallelism each GPU its s/cp tokens' of them, over the
    network when neighbouring stages are on different nodes.
    Interleaving sends v times as often.
    """
    if layout.pp == 1:
        return 0.0
    send_bytes = (layout.micro_batch * workload.seq_len * workload.shape[1] * BYTES_PER_VALUE
                  / (layout.tp * layout.cp))
    link_bytes_per_s = (cluster.network_bytes_per_gpu if _stages_cross_nodes(layout, cluster)
                        else cluster.node_link_bytes_per_s)
    return 2 * microbatches * layout.virtual_stages * send_bytes / link_bytes_per_s


def _bubble_s(work_s: float, layout: Layout, microbatches: int) -> float:
    """The pipeline bubble's seconds: the idle fraction ``f`` of the pipeline's time
    (:func:`clusterlab.analytic.costmodel.pipeline_bubble_fraction`) is ``f / (1 - f)`` of the work,
    ``(p-1)/(v m)``."""
    schedule = "interleaved" if layout.virtual_stages > 1 else "1f1b"
    idle = costmodel.pipeline_bubble_fraction(layout.pp, microbatches, schedule,
                                              virtual_stages=layout.virtual_stages)
    return work_s * idle / (1 - idle)


def _data_parallel(workload: Workload, cluster: ClusterSpec, layout: Layout,
                   assumptions: Assumptions, compute_s: float,
                   microbatches: int) -> tuple[float, float, costmodel.CollectiveEstimate | None]:
    """(exposed seconds, unhidden seconds) of the data-parallel collectives, and the estimate
    of their all-reduce.

    The all-reduce ``A``: :func:`dp_all_reduce` of the GPU's gradients (BF16, FP32 with
    ``fp32_grad_accumulation``) over the ``dp * cp`` GPUs that hold the same parameters
    (:func:`_dp_placement`), x ``dp_contention_factor`` when the group spans nodes. Expert
    parallelism: the parameters outside the experts as above; the experts' ``N_e / (tp pp ep)``
    gradients in a second all-reduce over the ``dp cp / ep`` GPUs that hold the same experts
    (:func:`_expert_dp_placement`; none when that group is one GPU), the two summed. The
    estimate kept is the first's.

    What runs, per step of ``m`` micro-batches (a reduce-scatter or an all-gather is half of
    ``A``, as in a ring), and what hides it (:func:`_exposed_reduce_s`):

    * ZeRO-0 and 1: one ``A`` (ZeRO-1's reduce-scatter and parameter all-gather, as Megatron's
      distributed optimizer runs them) in the backward pass of the last micro-batch: Megatron
      Core's ``overlap_grad_reduce`` synchronises only there (``pipeline_parallel/
      schedules.py``: the others run under ``no_sync``), bucket by bucket as the gradients
      appear, so the window is ``t_bwd / m`` and the last bucket is always exposed (``t_bwd``:
      the compute less its forward pass, 2/3 of it without recomputation, 3/4 with full);
    * ZeRO-2: that, and a reduce-scatter in each earlier micro-batch's backward: a GPU keeps
      only its shard of the gradients, so it cannot wait for the last micro-batch (DeepSpeed,
      deepspeedai/DeepSpeed#2252: "gradient reduction is required after every backward");
    * ZeRO-3: in every micro-batch an all-gather of the parameters for its forward pass, hidden
      behind that pass, and another for its backward pass with the reduce-scatter of its
      gradients, hidden behind that one (1.5 ``A`` a micro-batch, Rajbhandari et al. 2020,
      section 7; the gathers prefetched, as DeepSpeed and FSDP do).
    """
    if layout.dp * layout.cp == 1:
        return 0.0, 0.0, None
    grad_value_bytes = (memory.FP32_GRAD_BYTES if assumptions.fp32_grad_accumulation
                        else BYTES_PER_VALUE)
    groups = _params_per_gpu(workload, layout)
    (dense_params, _), *expert_group = groups
    local, nodes = _dp_placement(layout, cluster)
    estimate = dp_all_reduce(dense_params * grad_value_bytes, local, nodes, cluster)
    all_reduce_s = estimate.time_s
    if nodes > 1:     # the fabric's contention (fabric.contention_factor)
        all_reduce_s *= assumptions.dp_contention_factor
    for expert_params, _ in expert_group:
        expert_local, expert_nodes = _expert_dp_placement(layout, cluster)
        experts = dp_all_reduce(expert_params * grad_value_bytes, expert_local, expert_nodes,
                                cluster)
        if experts is not None:
            all_reduce_s += experts.time_s * (assumptions.dp_contention_factor
                                              if expert_nodes > 1 else 1.0)
    backward_s = compute_s * (1 - workload.flops_per_token / 3
                              / workload.hardware_flops_per_token) / microbatches
    forward_s = compute_s / microbatches - backward_s       # one micro-batch's passes
    params = [held for held, _ in groups]

    def exposed(seconds: float, window_s: float) -> float:
        return _exposed_reduce_s(seconds, window_s, params, layout, assumptions)

    half = all_reduce_s / 2          # one reduce-scatter, or one all-gather
    if layout.zero_stage == 3:
        return (microbatches * (exposed(half, forward_s) + exposed(all_reduce_s, backward_s)),
                microbatches * 3 * half, estimate)
    earlier = microbatches - 1 if layout.zero_stage == 2 else 0
    return (exposed(all_reduce_s, backward_s) + earlier * exposed(half, backward_s),
            all_reduce_s + earlier * half, estimate)


def _exposed_reduce_s(reduce_s: float, window_s: float, group_params: list[float],
                      layout: Layout, assumptions: Assumptions) -> float:
    """The part of ``reduce_s`` a window of compute leaves exposed
    (:func:`clusterlab.analytic.plan.step.exposed_bucketed_reduce_s`), in buckets of
    ``grad_bucket_params`` (None: Megatron's ``max(4e7, 1e6 dp)``,
    :func:`clusterlab.analytic.plan.step.megatron_bucket_params`), each parameter group (the dense
    parameters, the experts') bucketed apart as Megatron's separate expert buffers are; all of
    it without ``overlap_grad_reduce``.

    The window is the busiest stage's. Megatron gives later pipeline stages one bucket (their
    reduction runs while earlier stages drain, off the critical path, its comment says); the
    planner prices every stage as the first, which can only over-state what is exposed.
    """
    if not assumptions.overlap_grad_reduce:
        return reduce_s
    bucket = assumptions.grad_bucket_params or megatron_bucket_params(layout.dp)
    n_buckets = sum(math.ceil(params / bucket) for params in group_params)
    return exposed_bucketed_reduce_s(reduce_s, window_s, n_buckets)


def kv_all_gather_bytes(workload: Workload, layout: Layout) -> float:
    """Bytes one GPU contributes to a layer's K/V all-gather over its cp group: K and V (2) of
    its ``kv_heads / tp`` key/value heads of ``head_dim`` values for its ``s / cp`` tokens of
    each of the micro-batch's sequences, in BF16::

        2 * (kv_heads / tp) * head_dim * (s / cp) * micro_batch * 2 bytes

    (Dubey et al. 2024, section 3.3.2: Llama 3 all-gathers K and V rather than passing them
    round a ring, cheap because grouped-query attention's K and V are small.)
    """
    return (2 * (workload.kv_heads / layout.tp) * workload.head_dim
            * (workload.seq_len / layout.cp) * layout.micro_batch * BYTES_PER_VALUE)


def cp_collectives_per_layer(recompute: str) -> tuple[int, int]:
    """(all-gathers, reduce-scatters) of K and V per layer and micro-batch under context
    parallelism: the forward's all-gather; in the backward one more all-gather (the gathered K
    and V are not kept, so activation memory stays ``1/cp``: the planner's assumption) and the
    reduce-scatter of their gradients; full recomputation (:data:`clusterlab.analytic.gemm.
    FULL_RECOMPUTE`) runs the forward's all-gather once more."""
    return (3 if recompute in gemm.FULL_RECOMPUTE else 2), 1


def _context_parallel(workload: Workload, cluster: ClusterSpec, layout: Layout,
                      microbatches: int) -> tuple[float, costmodel.CollectiveEstimate | None]:
    """Seconds of context parallelism's K/V collectives and one all-gather's estimate.

    Per layer of the stage and micro-batch, :func:`cp_collectives_per_layer` all-gathers and
    reduce-scatters of :func:`kv_all_gather_bytes` per GPU (the collective's buffer, as
    nccl-tests counts it, is ``cp`` times that: the gathered K and V), each priced by
    :func:`clusterlab.analytic.costmodel.cluster_collective` on the GPUs the cp group spans
    (:func:`_cp_placement`: inside a node when ``tp * cp`` fits in one, else across nodes
    with its share of their NICs). None is hidden: the planner's only overlap,
    ``Assumptions.overlap_grad_reduce``, covers the data-parallel reduction, not these.
    """
    if layout.cp == 1:
        return 0.0, None
    n_layers, _ = workload.shape
    buffer_bytes = kv_all_gather_bytes(workload, layout) * layout.cp
    local, nodes = _cp_placement(layout, cluster)
    group = group_of(cluster, local, nodes)
    gather = collective("all_gather", buffer_bytes, group)
    scatter = collective("reduce_scatter", buffer_bytes, group)
    n_gather, n_scatter = cp_collectives_per_layer(workload.recompute_policy)
    per_layer_s = n_gather * gather.time_s + n_scatter * scatter.time_s
    return microbatches * (n_layers / layout.pp) * per_layer_s, gather


def expert_all_to_all_bytes(workload: Workload, layout: Layout) -> int:
    """Bytes of one dispatch (or combine) all-to-all per GPU: the buffer of ``E`` experts'
    ``C`` slots of ``d`` BF16 values, ``C = ceil(capacity_factor * T k / E)`` for the
    ``T = micro_batch * s / cp`` tokens a GPU routes per micro-batch
    (:func:`clusterlab.analytic.moe.all_to_all_bytes`, the buffer nccl-tests counts). Every tp GPU
    of the group sends its micro-batch's tokens whole (the experts are split over tp, so each tp
    rank's share of an expert needs them).

    Raises:
        ValueError: for a dense workload.
    """
    if workload.moe is None:
        raise ValueError("A dense workload has no all-to-all: give Workload.moe.")
    spec = workload.moe
    return moe.all_to_all_bytes(layout.micro_batch * workload.seq_len // layout.cp,
                                d_model=workload.shape[1], n_experts=spec.n_experts,
                                top_k=spec.top_k, capacity_factor=spec.capacity_factor,
                                bytes_per_element=BYTES_PER_VALUE)


def ep_all_to_alls_per_layer(recompute: str) -> int:
    """All-to-alls per MoE layer and micro-batch: dispatch and combine forward, and each one's
    transpose, another all-to-all, backward (4; JAX's rule for ``jax.lax.all_to_all``, as
    :mod:`clusterlab.device.parallel.experts` says); full recomputation
    (:data:`clusterlab.analytic.gemm.FULL_RECOMPUTE`) runs the forward's two once more (6)."""
    return 6 if recompute in gemm.FULL_RECOMPUTE else 4


def _expert_parallel(workload: Workload, cluster: ClusterSpec, layout: Layout,
                     microbatches: int) -> tuple[float, costmodel.CollectiveEstimate | None]:
    """Seconds of expert parallelism's all-to-alls and one all-to-all's estimate.

    Per MoE layer of the stage (``n_moe / pp`` on average) and micro-batch,
    :func:`ep_all_to_alls_per_layer` all-to-alls of :func:`expert_all_to_all_bytes`, each
    priced by :func:`clusterlab.analytic.costmodel.cluster_collective` (``"all_to_all"``: grouped
    send/receive, the course's estimate, not NCCL's tuning model) on the GPUs the ep group
    spans (:func:`_ep_placement`), none hidden. The estimate is marked unvalidated: no
    published MoE training row is in :func:`clusterlab.analytic.plan.validation_table`.
    """
    if layout.ep == 1:
        return 0.0, None
    local, nodes = _ep_placement(layout, cluster)
    estimate = collective("all_to_all", expert_all_to_all_bytes(workload, layout),
                          group_of(cluster, local, nodes))
    estimate = replace(estimate, validation="untested")
    per_layer = ep_all_to_alls_per_layer(workload.recompute_policy)
    return (microbatches * (workload.moe_layers / layout.pp) * per_layer * estimate.time_s,
            estimate)


def _storage(workload: Workload, cluster: ClusterSpec, rest_s: float) -> tuple[float, float]:
    """(seconds waited for storage, seconds to load a step's data): the step's ``tokens *
    bytes_per_token`` at the storage's read rate (:func:`clusterlab.analytic.storage.load_time_s`),
    prefetched, so only its excess over the rest of the step is waited for."""
    load_s = storage.load_time_s(workload.tokens_per_step * workload.bytes_per_token,
                                 cluster.storage_read_bytes_per_s)
    return max(0.0, load_s - rest_s), load_s


def predict(workload: Workload, cluster: ClusterSpec, layout: Layout,
            assumptions: Assumptions = Assumptions()) -> Plan:
    """Predict memory and step time of one layout: a sum of terms, each priced by the function
    that owns its formula.

    * memory (:func:`_memory`): ZeRO-sharded model states plus the schedule's in-flight
      activations (1F1B or interleaved);
    * compute (:func:`_compute_s`): each layer's GEMMs by shape and its element-wise kernels by
      bytes (:mod:`clusterlab.analytic.gemm`), or the step's FLOPs at a given
      ``compute_efficiency``; the last stage's, with the output layer when the workload has a
      vocabulary; an MoE layer's experts as grouped GEMMs on the busiest GPU, with its router
      and token permutations (:func:`_moe_layer_time_s`);
    * tensor parallel: Megatron's all-reduces per layer, each by
      :func:`clusterlab.analytic.costmodel.cluster_collective` on the ``tp`` GPUs of a node;
    * expert parallel (ep > 1): per MoE layer two all-to-alls forward and two backward of the
      dispatch buffers (:func:`expert_all_to_all_bytes`), unvalidated, not hidden;
    * pipeline sends: activations forward and gradients back, not hidden;
    * pipeline bubble: :func:`clusterlab.analytic.costmodel.pipeline_bubble_fraction` of the
      pipeline's time, ``(p-1)/(v m)`` of compute and tensor-parallel time;
    * data parallel: :func:`dp_all_reduce` of the gradients once a step (ZeRO-0 and 1), with a
      reduce-scatter more per micro-batch (ZeRO-2), or ZeRO-3's gathers and scatter in every
      micro-batch, less what hides behind compute (:func:`_data_parallel`);
    * optimizer step (:func:`_optimizer_s`): Adam's bytes over HBM, sharded by ZeRO;
    * storage: the step's data, prefetched: only the excess over the rest is waited for.

    Args:
        workload: what to train.
        cluster: the cluster; it needs ``storage_read_bytes_per_s``.
        layout: the split; ``dp * tp * pp * cp`` must equal ``cluster.n_gpus``.
        assumptions: software efficiencies.

    Returns:
        The :class:`Plan`.

    Raises:
        ValueError: for a layout that does not fit the cluster or the workload, or a cluster
            without storage.

    References:
        Narayanan et al. 2021, sections 2.2-3.2 (bubble, tensor-parallel communication);
        Rajbhandari et al. 2020, section 7 (ZeRO-3 moves 1.5x the data of an all-reduce).
    """
    m = _check_layout(workload, cluster, layout)
    states_bytes, activation_bytes = _memory(workload, layout, assumptions, m)
    compute_s, output_s = _compute_s(workload, cluster, layout, assumptions, m)
    tp_s, tp_estimate = _tensor_parallel(workload, cluster, layout, m)
    cp_s, cp_estimate = _context_parallel(workload, cluster, layout, m)
    ep_s, ep_estimate = _expert_parallel(workload, cluster, layout, m)
    pp_s = _pipeline_sends_s(workload, cluster, layout, m)
    bubble_s = _bubble_s(compute_s - output_s + tp_s + cp_s + ep_s, layout, m)
    dp_s, dp_reduce_s, dp_estimate = _data_parallel(workload, cluster, layout, assumptions,
                                                    compute_s, m)
    optimizer_s = _optimizer_s(workload, cluster, layout, assumptions)
    wait_s, load_s = _storage(workload, cluster, compute_s + tp_s + cp_s + ep_s + pp_s
                              + bubble_s + dp_s + optimizer_s)
    limit_bytes = cluster.gpu.memory_bytes * (1 - assumptions.activation_reserve)
    return Plan(workload, cluster, layout, assumptions,
                memory_bytes=states_bytes + activation_bytes, memory_limit_bytes=limit_bytes,
                states_bytes=states_bytes, activation_bytes=activation_bytes,
                compute_s=compute_s, tp_comm_s=tp_s, cp_comm_s=cp_s, pp_comm_s=pp_s,
                bubble_s=bubble_s,
                dp_comm_s=dp_s, dp_reduce_s=dp_reduce_s, data_wait_s=wait_s, load_s=load_s, output_layer_s=output_s,
                optimizer_s=optimizer_s,
                model_flops_per_step=workload.tokens_per_step * workload.flops_per_token,
                hardware_flops_per_step=(workload.tokens_per_step
                                         * workload.hardware_flops_per_token),
                dp_estimate=dp_estimate, tp_estimate=tp_estimate, cp_estimate=cp_estimate,
                ep_comm_s=ep_s, ep_estimate=ep_estimate)


def predict_published(run: training_runs.MfuRun, *, zero_stage: int = 1,
                      virtual_stages: int = 1, vocab_size: int | None = None) -> Plan:
    """The planner's prediction for a published MFU run (:data:`clusterlab.catalog.published.
    training_runs.LLAMA3_405B`), on its GPUs under its layout, with storage fast enough never to
    be the bottleneck (the paper's storage is not what is tested).

    Args:
        run: the published run.
        zero_stage, virtual_stages: what the paper does not pin down (Llama 3 shards the
            optimizer state and interleaves its pipeline; the defaults are the plain schedule).
        vocab_size: the vocabulary, for the output layer on the last stage (None: left out;
            :data:`clusterlab.analytic.plan.validation.LLAMA3_VOCAB` for Llama 3).
    """
    cluster_spec = plan_cluster(run.gpu, run.n_gpus, storage_read_bytes_per_s=1e12)
    workload = Workload(run.n_params, run.seq_len, run.global_batch, n_tokens=run.n_tokens,
                        n_layers=run.n_layers, d_model=run.d_model, n_heads=run.n_heads,
                        n_kv_heads=run.n_kv_heads, vocab_size=vocab_size)
    layout = Layout(dp=run.dp, tp=run.tp, pp=run.pp, zero_stage=zero_stage,
                    virtual_stages=virtual_stages)
    return predict(workload, cluster_spec, layout)
