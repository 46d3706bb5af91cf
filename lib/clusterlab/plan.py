"""Putting the models together: size a cluster and predict a training step for a workload.

Two levels:

* :func:`data_parallel_step`: the data-parallel step that the chapters use to compare clusters:
  compute from :mod:`clusterlab.flops`, the gradient all-reduce priced by
  :mod:`clusterlab.costmodel`, and the part of it that is not hidden behind the backward pass.
* The planner: a :class:`Workload` (model size, tokens or a time budget, sequence length, global
  batch) on :class:`Hardware` (GPU, GPUs per node, node interconnect, fabric, storage) under a
  :class:`Layout` (data, tensor and pipeline parallel degrees, ZeRO stage) gives a :class:`Plan`:
  memory per device, a step split into compute, tensor-parallel all-reduces (inside a node),
  the pipeline bubble, the data-parallel all-reduce
  (:func:`clusterlab.costmodel.cluster_collective`) and waiting
  for storage; MFU, time to train and the bottleneck. :func:`predict` prices one layout,
  :func:`rank_layouts` all layouts that fit, :func:`gpus_needed` the smallest cluster that meets
  a deadline.

Memory per GPU is the model states (:func:`clusterlab.memory.training_memory_per_device`) plus
the activations the busiest pipeline stage keeps (:func:`clusterlab.memory.
transformer_layer_activation_bytes`, with sequence parallelism whenever tp > 1). Every
all-reduce (tensor- and data-parallel) is priced by :func:`clusterlab.costmodel.cluster_collective`,
latency included. What the planner leaves out, on purpose: failures (see
:mod:`clusterlab.reliability`).

Units: bytes, seconds, FLOPs, bytes/s per direction (1 GB = 1e9 bytes).

References:
    Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
    Megatron-LM", SC 2021, sections 2-3 (the three-dimensional layout, the bubble
    ``(p-1)/(m+p-1)``, the tensor-parallel all-reduces). https://arxiv.org/abs/2104.04473
    Rajbhandari et al., "ZeRO", SC 2020 (memory and communication of the stages).
    https://arxiv.org/abs/1910.02054
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from clusterlab import costmodel, flops, hardware, memory, storage
from clusterlab._checks import count, number, positive
from clusterlab.hardware import GPU


@dataclass(frozen=True)
class StepTime:
    """One training step, split into compute and exposed communication.

    Attributes:
        compute_s: seconds of forward and backward computation.
        communication_s: seconds of communication not hidden behind the computation.
        model_flops: FLOPs of the step (6 N B).
        n_devices: devices taking part.
        peak_flops_per_device: each device's peak FLOP/s.
        all_reduce: the gradient all-reduce's :class:`clusterlab.costmodel.CollectiveEstimate`
            when :func:`fabric_step` priced it (its ``validated`` flag says whether published
            rows back that regime, ``nccl_release`` which NCCL's rules priced it); None when
            the caller gave the time.
    """

    compute_s: float
    communication_s: float
    model_flops: float
    n_devices: int
    peak_flops_per_device: float
    all_reduce: costmodel.CollectiveEstimate | None = field(default=None, compare=False)

    @property
    def validated(self) -> bool | None:
        """Whether the all-reduce's regime has published rows (None: no estimate attached)."""
        return None if self.all_reduce is None else self.all_reduce.validated

    @property
    def step_s(self) -> float:
        return self.compute_s + self.communication_s

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization of the whole step, communication included."""
        return flops.mfu(self.model_flops / self.step_s, self.n_devices,
                         self.peak_flops_per_device)


#: The backward pass's share of a step's compute: 4 N B of the 6 N B FLOPs (Kaplan et al.
#: 2020, section 2.1); with full recomputation the backward pass also recomputes the forward
#: pass, 6 of 8 N B. Gradient reduction can only overlap the backward pass, so at most this
#: much of the compute can hide it.
BACKWARD_FRACTION = 2 / 3
BACKWARD_FRACTION_RECOMPUTE = 3 / 4


def hidden_all_reduce_s(all_reduce_s: float, overlap: float, backward_s: float) -> float:
    """The part of an all-reduce hidden behind the backward pass: ``min(overlap t, backward)``.

    The gradients of a layer exist only once its backward pass has run, so their reduction can
    overlap at most the rest of the backward pass: however large the fraction ``overlap`` a
    framework could hide, a step never hides more communication than ``backward_s``.
    """
    return min(overlap * all_reduce_s, backward_s)


def data_parallel_step(n_params: float, tokens_per_step: float, n_devices: int, gpu: GPU, *,
                       compute_efficiency: float, all_reduce_s: float,
                       overlap: float = 0.0,
                       all_reduce: costmodel.CollectiveEstimate | None = None) -> StepTime:
    """A data-parallel step: ``6 N B / (n peak e)`` of compute plus the exposed all-reduce.

    The exposed all-reduce is ``t_AR - min(overlap t_AR, t_bwd)``: the backward pass
    (``BACKWARD_FRACTION`` of the compute) is all a gradient all-reduce can hide behind, so a
    communication-bound step (``t_AR`` above ``t_bwd``) keeps at least ``t_AR - t_bwd`` of it
    exposed whatever the overlap.

    Args:
        n_params: model parameters N.
        tokens_per_step: tokens B in one global batch.
        n_devices: data-parallel devices.
        gpu: the device, for its peak BF16 FLOP/s.
        compute_efficiency: e, the fraction of peak the matrix multiplications reach.
        all_reduce_s: time of the gradient all-reduce, e.g. from
            :func:`clusterlab.costmodel.all_reduce_time` (the one model across nodes).
        overlap: the fraction of the all-reduce the framework would hide behind the backward
            pass, in [0, 1], capped at the backward pass's time.
        all_reduce: the estimate ``all_reduce_s`` came from, carried into the result.

    Returns:
        The :class:`StepTime`.
    """
    n_devices = count("n_devices", n_devices)
    efficiency = positive("compute_efficiency", compute_efficiency)
    if efficiency > 1:
        raise ValueError(f"compute_efficiency is a fraction of peak, at most 1; got {efficiency}.")
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap is the hidden fraction of the all-reduce, in [0, 1]; got "
                         f"{overlap}.")
    model_flops = flops.training_flops(n_params, tokens_per_step)
    compute_s = model_flops / (n_devices * gpu.bf16_flops * efficiency)
    all_reduce_s = positive("all_reduce_s", all_reduce_s, allow_zero=True)
    exposed_s = all_reduce_s - hidden_all_reduce_s(all_reduce_s, overlap,
                                                   BACKWARD_FRACTION * compute_s)
    return StepTime(compute_s, exposed_s, model_flops, n_devices, gpu.bf16_flops, all_reduce)


# ---------------------------------------------------------------------------------------------
# The planner
# ---------------------------------------------------------------------------------------------

BYTES_PER_VALUE = 2  # BF16: parameters, gradients and activations as they travel (2 bytes)

# Tensor-parallel all-reduces per transformer layer and micro-batch (Megatron-LM): two in the
# forward pass (after attention, after the MLP) and two in the backward pass; a full
# recomputation of the forward pass adds its two again (Narayanan et al. 2021, section 3.2).
TP_ALL_REDUCES_PER_LAYER = 4
TP_ALL_REDUCES_PER_LAYER_RECOMPUTE = 6


def default_shape(n_params: float) -> tuple[int, int]:
    """A plausible ``(n_layers, d_model)`` for a dense transformer of ``n_params`` parameters.

    A transformer layer holds about ``12 d^2`` parameters (4 d^2 in attention, 8 d^2 in an MLP
    of width 4d), so ``N = 12 L d^2``; with GPT-3's aspect ratio ``d = 128 L`` (96 layers of
    width 12288) that gives ``L = (N / (12 * 128^2))^(1/3)``. Used only when a workload gives no
    shape; Llama 2 70B (80 x 8192) comes out as 71 x 9088.

    Args:
        n_params: parameters N (> 0).

    Returns:
        ``(n_layers, d_model)``, ``d_model`` a multiple of 128.

    References:
        Kaplan et al. 2020, section 2.1 (``N = 12 L d^2``), https://arxiv.org/abs/2001.08361;
        Brown et al. 2020, Table 2.1 (GPT-3's shapes), https://arxiv.org/abs/2005.14165.
    """
    n = positive("n_params", n_params)
    n_layers = max(1, round((n / (12 * 128**2)) ** (1 / 3)))
    d_model = max(128, 128 * round(math.sqrt(n / (12 * n_layers)) / 128))
    return n_layers, d_model


@dataclass(frozen=True)
class Workload:
    """What to train: a dense decoder-only transformer and its data.

    Give ``n_tokens`` (time to train is predicted), ``time_budget_s`` (tokens trainable in the
    budget are predicted), or both (:func:`gpus_needed` sizes the cluster to the budget).
    """

    n_params: float                      # N, model parameters
    seq_len: int                         # tokens per training sequence
    global_batch: int                    # sequences per optimizer step, all replicas together
    n_tokens: float | None = None        # D, training tokens
    time_budget_s: float | None = None   # wall-clock budget for the run, seconds
    n_layers: int | None = None          # transformer layers; None: default_shape(n_params)
    d_model: int | None = None           # model (and attention) width; None: default_shape
    n_heads: int | None = None           # attention heads; None: d_model / 128
    bytes_per_token: float = 4.0         # bytes storage delivers per token (4: uint32 ids)
    recompute: bool = False              # full activation recomputation (one more forward)

    def __post_init__(self) -> None:
        positive("n_params", self.n_params)
        count("seq_len", self.seq_len)
        count("global_batch", self.global_batch)
        if self.n_tokens is None and self.time_budget_s is None:
            raise ValueError("A workload needs n_tokens (tokens to train on) or time_budget_s "
                             "(a wall-clock budget), or both.")
        if self.n_tokens is not None:
            positive("n_tokens", self.n_tokens)
        if self.time_budget_s is not None:
            positive("time_budget_s", self.time_budget_s)
        if (self.n_layers is None) != (self.d_model is None):
            raise ValueError("Give both n_layers and d_model, or neither (then default_shape "
                             "estimates them from n_params).")
        if self.n_layers is not None:
            count("n_layers", self.n_layers)
            count("d_model", self.d_model)
        if self.n_heads is not None:
            count("n_heads", self.n_heads)
        positive("bytes_per_token", self.bytes_per_token)

    @property
    def shape(self) -> tuple[int, int]:
        """``(n_layers, d_model)``, given or estimated by :func:`default_shape`."""
        if self.n_layers is None:
            return default_shape(self.n_params)
        return self.n_layers, self.d_model

    @property
    def heads(self) -> int:
        """Attention heads, given or ``max(1, d_model // 128)`` (heads of 128)."""
        return self.n_heads if self.n_heads is not None else max(1, self.shape[1] // 128)

    @property
    def tokens_per_step(self) -> int:
        """Tokens in one global batch: ``global_batch * seq_len``."""
        return self.global_batch * self.seq_len

    @property
    def flops_per_token(self) -> float:
        """Model FLOPs per trained token, attention included (PaLM's accounting)."""
        n_layers, d_model = self.shape
        return flops.transformer_flops_per_token(self.n_params, n_layers, self.seq_len, d_model)


@dataclass(frozen=True)
class Hardware:
    """A cluster: its GPUs, how they are connected, and its storage.

    Build one from catalog names with :func:`cluster`. Bandwidths are per GPU, per direction.
    """

    gpu: GPU                              # the accelerator (clusterlab.hardware.GPUS)
    n_gpus: int                           # GPUs in the cluster, whole nodes
    gpus_per_node: int                    # GPUs sharing the node interconnect
    intra_node_bytes_per_s: float         # node interconnect (NVLink) per GPU
    fabric_bytes_per_s: float             # network between nodes: the NICs' share per GPU
    storage_read_bytes_per_s: float       # shared storage, sustained read for the whole cluster
    intra_node_latency_s: float = 0.0     # kept for callers; all-reduces use NCCL's latencies
    fabric_latency_s: float = 0.0         # (costmodel.cluster_collective), not these
    name: str = ""                        # a label for tables
    #: The NIC's name in hardware.LINKS (e.g. "IB-NDR"): which fabric the data-parallel
    #: all-reduce crosses, for the validation regime of its estimate; None: unknown (the
    #: estimate is then reported unvalidated).
    fabric_link: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.gpu, GPU):
            raise ValueError(f"gpu must be a clusterlab.hardware.GPU (e.g. hardware.gpu('H100')), "
                             f"got {self.gpu!r}.")
        count("n_gpus", self.n_gpus)
        count("gpus_per_node", self.gpus_per_node)
        if self.n_gpus % self.gpus_per_node:
            raise ValueError(f"n_gpus ({self.n_gpus}) must be whole nodes of {self.gpus_per_node} "
                             f"GPUs; use {self.gpus_per_node * math.ceil(self.n_gpus / self.gpus_per_node)}.")
        positive("intra_node_bytes_per_s", self.intra_node_bytes_per_s)
        positive("fabric_bytes_per_s", self.fabric_bytes_per_s)
        positive("storage_read_bytes_per_s", self.storage_read_bytes_per_s)
        positive("intra_node_latency_s", self.intra_node_latency_s, allow_zero=True)
        positive("fabric_latency_s", self.fabric_latency_s, allow_zero=True)

    @property
    def n_nodes(self) -> int:
        return self.n_gpus // self.gpus_per_node


def cluster(gpu: str, n_gpus: int, *, storage_read_bytes_per_s: float, gpus_per_node: int = 8,
            node_link: str | None = None, fabric_link: str = "IB-NDR",
            nics_per_node: int | None = None, name: str = "") -> Hardware:
    """A :class:`Hardware` from names in :mod:`clusterlab.hardware`.

    Args:
        gpu: a key of ``hardware.GPUS`` (case-insensitive), e.g. ``"H100"``.
        n_gpus: GPUs in the cluster, a multiple of ``gpus_per_node``.
        storage_read_bytes_per_s: sustained read throughput of the shared storage.
        gpus_per_node: GPUs in one node.
        node_link: a key of ``hardware.LINKS`` for the node interconnect; None: the GPU's own
            NVLink (``gpu.nvlink_bytes_per_s``).
        fabric_link: a key of ``hardware.LINKS``: one NIC port between nodes.
        nics_per_node: fabric NICs per node; None: one per GPU (rail-optimized, as in DGX).
        name: a label.

    Returns:
        The hardware; unknown names raise a ValueError that lists the known ones.
    """
    spec = hardware.gpu(gpu)
    per_node = count("gpus_per_node", gpus_per_node)
    intra = (spec.nvlink_bytes_per_s if node_link is None
             else hardware.link(node_link).bytes_per_s)
    nics = per_node if nics_per_node is None else count("nics_per_node", nics_per_node)
    fabric = hardware.link(fabric_link).bytes_per_s * nics / per_node
    return Hardware(spec, n_gpus, per_node, intra, fabric, storage_read_bytes_per_s,
                    name=name or f"{n_gpus} x {spec.name}, {fabric_link}",
                    fabric_link=hardware.link(fabric_link).name)


@dataclass(frozen=True)
class Layout:
    """How the GPUs split the work: ``dp * tp * pp`` GPUs.

    Tensor parallelism is innermost (its GPUs share a node), then data, then pipeline, as in
    Megatron-LM.
    """

    dp: int = 1                  # data-parallel replicas
    tp: int = 1                  # tensor-parallel GPUs, inside one node
    pp: int = 1                  # pipeline stages
    zero_stage: int = 0          # 0 (plain data parallel) to 3 (parameters sharded too)
    micro_batch: int = 1         # sequences per micro-batch in each replica
    virtual_stages: int = 1      # interleaved schedule: model chunks per GPU (bubble / v)

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "micro_batch", "virtual_stages"):
            count(name, getattr(self, name))
        if self.zero_stage not in memory.ZERO_STAGES:
            raise ValueError(f"zero_stage must be one of {memory.ZERO_STAGES}, got "
                             f"{self.zero_stage!r}.")

    @property
    def n_gpus(self) -> int:
        return self.dp * self.tp * self.pp

    def __str__(self) -> str:
        chunks = f" v{self.virtual_stages}" if self.virtual_stages > 1 else ""
        return f"dp{self.dp} tp{self.tp} pp{self.pp}{chunks} ZeRO-{self.zero_stage}"


@dataclass(frozen=True)
class Assumptions:
    """What the planner cannot know from datasheets: the software's efficiency.

    The defaults are round assumptions, not fits to the published runs that
    ``tests/test_planner_validation.py`` compares with; calibrate them with measurements (the
    lab on utilization measures the first).
    """

    compute_efficiency: float = 0.6   # fraction of peak FLOP/s the kernels reach while computing
    dp_overlap: float = 0.5           # fraction of the data-parallel all-reduce hidden, at most
    #                                   the backward pass's time (hidden_all_reduce_s)
    activation_reserve: float = 0.1   # fraction of GPU memory kept free (workspace, fragments)
    #: Multiplies the data-parallel all-reduce when it crosses the fabric (>= 1; 1: a
    #: non-blocking fabric without collisions, as cluster_collective assumes). Take it from
    #: clusterlab.fabric.contention_factor for the job's topology, placement and routing.
    dp_contention_factor: float = 1.0

    def __post_init__(self) -> None:
        factor = number("dp_contention_factor", self.dp_contention_factor)
        if not factor >= 1:
            raise ValueError(f"dp_contention_factor multiplies the all-reduce time and is >= 1 "
                             f"(1 = no contention), got {factor}; compute it with "
                             f"clusterlab.fabric.contention_factor.")
        efficiency = positive("compute_efficiency", self.compute_efficiency)
        if efficiency > 1:
            raise ValueError(f"compute_efficiency is a fraction of peak, at most 1; got "
                             f"{efficiency}.")
        overlap = number("dp_overlap", self.dp_overlap)
        if not 0 <= overlap <= 1:
            raise ValueError(f"dp_overlap is a fraction in [0, 1]; got {overlap}.")
        reserve = number("activation_reserve", self.activation_reserve)
        if not 0 <= reserve < 1:
            raise ValueError(f"activation_reserve is a fraction in [0, 1); got {reserve}.")


@dataclass(frozen=True)
class Plan:
    """A layout's prediction: memory, the step and its parts, MFU, time to train.

    The step is ``compute + tensor-parallel all-reduce + pipeline sends + pipeline bubble + exposed
    data-parallel all-reduce + data wait``; storage prefetches, so it only adds the part of its
    load time that exceeds the rest of the step.
    """

    workload: Workload
    hardware: Hardware
    layout: Layout
    assumptions: Assumptions
    memory_bytes: float          # model states + activations per GPU
    memory_limit_bytes: float    # GPU memory less the reserve
    states_bytes: float          # parameters, gradients, optimizer state (ZeRO-sharded)
    activation_bytes: float      # activations kept for the backward pass, busiest stage
    compute_s: float             # forward + backward (+ recomputation) at compute_efficiency
    tp_comm_s: float             # tensor-parallel all-reduces, node interconnect, not hidden
    pp_comm_s: float             # pipeline sends of activations and their gradients, not hidden
    bubble_s: float              # pipeline bubble: (p-1)/(v m) of compute + tp
    dp_comm_s: float             # data-parallel all-reduce (or ZeRO's collectives), exposed
    data_wait_s: float           # waiting for storage beyond the rest of the step
    load_s: float                # storage time for one step's tokens (prefetched)
    model_flops_per_step: float  # tokens_per_step * flops_per_token (no recomputation)
    #: cluster_collective's estimates of one data-parallel all-reduce (the gradients, before
    #: ZeRO-3's factor, contention and overlap) and of one tensor-parallel all-reduce; None
    #: where there is none. Their ``validated`` flags say whether published rows back them.
    dp_estimate: costmodel.CollectiveEstimate | None = field(default=None, compare=False)
    tp_estimate: costmodel.CollectiveEstimate | None = field(default=None, compare=False)

    @property
    def validated(self) -> bool:
        """Whether every all-reduce the plan prices lies in a regime with published rows
        (``costmodel.validation_by_regime``); False: some of its network time is unvalidated."""
        return all(e.validated for e in (self.dp_estimate, self.tp_estimate) if e is not None)

    @property
    def network_model(self) -> str:
        """"validated" or "unvalidated", for tables: see :attr:`validated`."""
        return "validated" if self.validated else "unvalidated"

    @property
    def step_s(self) -> float:
        return (self.compute_s + self.tp_comm_s + self.pp_comm_s + self.bubble_s
                + self.dp_comm_s + self.data_wait_s)

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.memory_limit_bytes

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization of the whole step (recomputation not counted)."""
        return flops.mfu(self.model_flops_per_step / self.step_s, self.hardware.n_gpus,
                         self.hardware.gpu.bf16_flops)

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilization: recomputed FLOPs counted too."""
        return self.mfu * (4 / 3 if self.workload.recompute else 1.0)

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
        """Seconds per step by what the GPUs are doing or waiting for."""
        return {"compute": self.compute_s, "tensor-parallel all-reduce": self.tp_comm_s,
                "pipeline send/receive": self.pp_comm_s, "pipeline bubble": self.bubble_s, "data-parallel all-reduce": self.dp_comm_s,
                "storage": self.data_wait_s}

    @property
    def bottleneck(self) -> str:
        """The resource the step spends most time on: compute, node interconnect, pipeline
        bubble, fabric or storage (the data-parallel all-reduce inside one node counts as the
        node interconnect)."""
        if self.data_wait_s > 0:
            return "storage"
        parts = self.breakdown()
        largest = max(parts, key=parts.get)
        dp_nodes = _dp_placement(self.layout, self.hardware)[1]
        stages_apart = _stages_cross_nodes(self.layout, self.hardware)
        return {"compute": "compute", "tensor-parallel all-reduce": "node interconnect",
                "pipeline send/receive": "fabric" if stages_apart else "node interconnect",
                "pipeline bubble": "pipeline bubble",
                "data-parallel all-reduce": "fabric" if dp_nodes > 1 else "node interconnect",
                "storage": "storage"}[largest]


def dp_all_reduce(nbytes: float, local: int, nodes: int,
                  hw: Hardware) -> costmodel.CollectiveEstimate | None:
    """:func:`clusterlab.costmodel.cluster_collective`'s estimate of the data-parallel
    all-reduce (see :func:`dp_all_reduce_s`), with its regime and ``validated`` flag; None for
    a group of one GPU. The regime's fabric comes from ``hw.fabric_link``; without it the
    estimate is marked unvalidated."""
    if local * nodes == 1:
        return None
    where = None if nodes == 1 or hw.fabric_link is None else costmodel.fabric_of(
        hw.fabric_link, nodes)
    network = {}
    if nodes > 1:
        # NCCL's search sees the group's real NICs (one 100G port is one channel path at 12
        # GB/s, not eight NICs of 1.56); only a fractional share falls back to a rate.
        nics = None
        if hw.fabric_link is not None:
            share = (hw.fabric_bytes_per_s * local
                     / hardware.link(hw.fabric_link).bytes_per_s)
            nics = round(share) if abs(share - round(share)) < 1e-9 and share >= 1 else None
        network = ({"nic": hw.fabric_link, "nics_per_node": nics} if nics else
                   {"network_bytes_per_s": hw.fabric_bytes_per_s * local})
    estimate = costmodel.cluster_collective(
        "all_reduce", nbytes, gpu=hw.gpu, n_nodes=nodes, gpus_per_node=local,
        intra_node_bytes_per_s=hw.intra_node_bytes_per_s, fabric=where, **network)
    if (nodes > 1 and hw.fabric_link is None) or not _nccl_knows(hw.gpu):
        estimate = replace(estimate, validated=False)
    return estimate


def _nccl_knows(gpu: GPU) -> bool:
    """Whether ``gpu`` is one of the catalog's GPUs, whose NCCL rules and published rows the
    network model has; another accelerator (a TPU in the validation tests) is priced as if NCCL
    ran on it, which nothing validates."""
    return hardware.GPUS.get(gpu.name.upper()) == gpu or gpu in hardware.GPUS.values()


def dp_all_reduce_s(nbytes: float, local: int, nodes: int, hw: Hardware) -> float:
    """Seconds of the data-parallel all-reduce of ``nbytes`` per GPU on the cluster ``hw``.

    One data-parallel group has ``local`` GPUs in each of ``nodes`` nodes; it uses their share
    of the node's NICs (``local * fabric_bytes_per_s``). Priced by
    :func:`clusterlab.costmodel.cluster_collective`, the one model of NCCL across nodes
    (NVLink and network pipelined, all NICs in parallel, NVLS where NCCL picks it, latency by
    protocol); ``hw.intra_node_latency_s`` and ``hw.fabric_latency_s`` are not used by it.

    Args:
        nbytes: the gradient bytes each GPU all-reduces.
        local: GPUs of the group in one node.
        nodes: nodes the group spans.
        hw: the cluster.

    Returns:
        Seconds; 0 for a group of one GPU.
    """
    estimate = dp_all_reduce(nbytes, local, nodes, hw)
    return 0.0 if estimate is None else estimate.time_s


def _dp_placement(layout: Layout, hw: Hardware) -> tuple[int, int]:
    """(replicas of one data-parallel group inside a node, nodes the group spans)."""
    local = math.gcd(layout.dp, max(1, hw.gpus_per_node // layout.tp))
    return local, layout.dp // local


def _stages_cross_nodes(layout: Layout, hw: Hardware) -> bool:
    """Whether neighbouring pipeline stages sit on different nodes (stages are outermost)."""
    return layout.pp > 1 and layout.tp * layout.dp >= hw.gpus_per_node


def _check_layout(workload: Workload, hw: Hardware, layout: Layout) -> int:
    """Validate a layout for a workload on hardware; return micro-batches per replica."""
    if layout.n_gpus != hw.n_gpus:
        raise ValueError(
            f"Layout {layout} uses dp*tp*pp = {layout.n_gpus} GPUs but the cluster has "
            f"{hw.n_gpus}; the product must equal the GPU count (e.g. dp = "
            f"{hw.n_gpus / (layout.tp * layout.pp):g} for tp={layout.tp}, pp={layout.pp}).")
    if layout.tp > hw.gpus_per_node or hw.gpus_per_node % layout.tp:
        raise ValueError(f"tp={layout.tp} must divide the {hw.gpus_per_node} GPUs of a node: "
                         f"tensor parallelism stays on the node interconnect.")
    n_layers, _ = workload.shape
    if layout.pp * layout.virtual_stages > n_layers:
        raise ValueError(f"pp * virtual_stages = {layout.pp * layout.virtual_stages} exceeds the "
                         f"{n_layers} layers; each stage needs at least one layer.")
    if workload.global_batch % layout.dp:
        raise ValueError(f"The global batch of {workload.global_batch} sequences does not divide "
                         f"over dp={layout.dp} replicas; choose dp dividing it.")
    per_replica = workload.global_batch // layout.dp
    if per_replica % layout.micro_batch:
        raise ValueError(f"Each replica's {per_replica} sequences do not divide into "
                         f"micro-batches of {layout.micro_batch}.")
    return per_replica // layout.micro_batch


def predict(workload: Workload, hw: Hardware, layout: Layout,
            assumptions: Assumptions = Assumptions()) -> Plan:
    """Predict memory and step time of one layout.

    * memory: :func:`clusterlab.memory.training_memory_per_device` of the ``N/(tp pp)``
      parameters each GPU holds, ZeRO-sharded over ``dp``;
    * compute: ``F (4/3 with recomputation) / (n peak e)`` for the step's model FLOPs ``F``;
    * tensor parallel: ``m (L/pp) k`` all-reduces of ``b s d`` BF16 values over ``tp`` GPUs of
      one node (``k`` = 4, or 6 with recomputation), each priced by
      :func:`clusterlab.costmodel.cluster_collective` (ring or NVLS, latency by protocol);
    * pipeline sends: each of the ``v m`` micro-batches' activations ``b s d`` (1/tp of them
      per GPU) forward and their gradients back, over the fabric when neighbouring stages are
      on different nodes, not hidden;
    * pipeline bubble: ``(p-1)/(v m)`` of compute and tensor-parallel time, i.e. the fraction
      ``(p-1)/(v m + p - 1)`` of the pipeline's time;
    * data parallel: :func:`dp_all_reduce_s` (:func:`clusterlab.costmodel.cluster_collective`)
      of the GPU's BF16 gradients, x 1.5 for ZeRO-3 (its extra parameter all-gather), x
      ``dp_contention_factor`` when the group spans nodes, of which
      ``min(dp_overlap t, t_bwd)`` is hidden (:func:`hidden_all_reduce_s`; ``t_bwd``: the
      backward pass, ``BACKWARD_FRACTION`` of the compute, 3/4 with recomputation);
    * storage: the step's ``tokens * bytes_per_token`` at the storage's read throughput,
      prefetched: only the excess over the rest of the step is waited for.

    Args:
        workload: what to train.
        hw: the cluster.
        layout: the split; ``dp * tp * pp`` must equal ``hw.n_gpus``.
        assumptions: software efficiencies.

    Returns:
        The :class:`Plan`.

    References:
        Narayanan et al. 2021, sections 2.2-3.2 (bubble, tensor-parallel communication);
        Rajbhandari et al. 2020, section 7 (ZeRO-3 moves 1.5x the data of an all-reduce).
    """
    m = _check_layout(workload, hw, layout)
    n_layers, d_model = workload.shape
    gpu = hw.gpu
    params_per_gpu = workload.n_params / (layout.tp * layout.pp)
    states_bytes = memory.training_memory_per_device(params_per_gpu, layout.dp,
                                                     layout.zero_stage)
    limit_bytes = gpu.memory_bytes * (1 - assumptions.activation_reserve)
    # 1F1B: the first stage holds min(pp, m) micro-batches of its L/pp layers at once.
    # Without full recomputation, attention scores are recomputed (FlashAttention-style,
    # "selective" in Korthikanti et al.).
    layer_activation_bytes = memory.transformer_layer_activation_bytes(
        workload.seq_len, layout.micro_batch, d_model, workload.heads,
        tensor_parallel=layout.tp, sequence_parallel=layout.tp > 1,
        recompute="full" if workload.recompute else "selective")
    activation_bytes = (layer_activation_bytes * math.ceil(n_layers / layout.pp)
                        * min(layout.pp, m))

    model_flops = workload.tokens_per_step * workload.flops_per_token
    hardware_flops = model_flops * (4 / 3 if workload.recompute else 1.0)
    compute_s = hardware_flops / (hw.n_gpus * gpu.bf16_flops * assumptions.compute_efficiency)

    tp_s, tp_estimate, dp_estimate = 0.0, None, None
    if layout.tp > 1:
        # act: bf16[micro_batch, seq_len, d_model], one all-reduce of a layer
        act_bytes = layout.micro_batch * workload.seq_len * d_model * BYTES_PER_VALUE
        per_layer = (TP_ALL_REDUCES_PER_LAYER_RECOMPUTE if workload.recompute
                     else TP_ALL_REDUCES_PER_LAYER)
        tp_estimate = costmodel.cluster_collective(
            "all_reduce", act_bytes, gpu=gpu, n_nodes=1, gpus_per_node=layout.tp,
            intra_node_bytes_per_s=hw.intra_node_bytes_per_s)
        if not _nccl_knows(gpu):
            tp_estimate = replace(tp_estimate, validated=False)
        tp_s = m * (n_layers / layout.pp) * per_layer * tp_estimate.time_s

    pp_s = 0.0
    if layout.pp > 1:
        # Each micro-batch's activations bf16[b, s, d] go to the next stage and their gradients
        # come back; with tensor parallelism each of the tp GPUs sends 1/tp of them (Megatron's
        # scatter/gather). Interleaving sends v times as often.
        send_bytes = (layout.micro_batch * workload.seq_len * d_model * BYTES_PER_VALUE
                      / layout.tp)
        link_bytes_per_s = (hw.fabric_bytes_per_s if _stages_cross_nodes(layout, hw)
                            else hw.intra_node_bytes_per_s)
        pp_s = 2 * m * layout.virtual_stages * send_bytes / link_bytes_per_s

    bubble_s = (compute_s + tp_s) * (layout.pp - 1) / (layout.virtual_stages * m)

    dp_s = 0.0
    if layout.dp > 1:
        grad_bytes = params_per_gpu * BYTES_PER_VALUE
        local, nodes = _dp_placement(layout, hw)
        dp_estimate = dp_all_reduce(grad_bytes, local, nodes, hw)
        all_reduce_s = dp_estimate.time_s
        if nodes > 1:     # the fabric's contention (fabric.contention_factor)
            all_reduce_s *= assumptions.dp_contention_factor
        dp_s = (1.5 if layout.zero_stage == 3 else 1.0) * all_reduce_s
        backward_s = compute_s * (BACKWARD_FRACTION_RECOMPUTE if workload.recompute
                                  else BACKWARD_FRACTION)
        dp_s -= hidden_all_reduce_s(dp_s, assumptions.dp_overlap, backward_s)

    load_s = storage.load_time_s(workload.tokens_per_step * workload.bytes_per_token,
                                 hw.storage_read_bytes_per_s)
    rest_s = compute_s + tp_s + pp_s + bubble_s + dp_s
    wait_s = max(0.0, load_s - rest_s)
    return Plan(workload, hw, layout, assumptions, states_bytes + activation_bytes, limit_bytes,
                states_bytes, activation_bytes, compute_s, tp_s,
                pp_s, bubble_s, dp_s, wait_s, load_s, model_flops, dp_estimate, tp_estimate)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_layouts(workload: Workload, hw: Hardware) -> list[Layout]:
    """Every layout the planner considers: tp dividing a node, pp up to the layer count, dp
    dividing the global batch, ZeRO stages 0-3 (only 0 when dp = 1), micro-batches of one
    sequence, no interleaving."""
    n_layers, _ = workload.shape
    layouts = []
    for tp in _divisors(hw.gpus_per_node):
        if hw.n_gpus % tp:
            continue
        for pp in _divisors(hw.n_gpus // tp):
            dp = hw.n_gpus // (tp * pp)
            if pp > n_layers or workload.global_batch % dp:
                continue
            for stage in (memory.ZERO_STAGES if dp > 1 else (0,)):
                layouts.append(Layout(dp=dp, tp=tp, pp=pp, zero_stage=stage))
    return layouts


def rank_layouts(workload: Workload, hw: Hardware, assumptions: Assumptions = Assumptions(),
                 *, limit: int | None = None) -> list[Plan]:
    """The layouts that fit in memory, fastest step first.

    Args:
        workload: what to train.
        hw: the cluster.
        assumptions: software efficiencies.
        limit: keep only the first ``limit`` plans.

    Returns:
        Plans sorted by step time (ties: lower ZeRO stage, fewer stages, less tensor
        parallelism).

    Raises:
        ValueError: when no layout fits, naming the smallest memory found and what to change.
    """
    plans = [predict(workload, hw, layout, assumptions)
             for layout in candidate_layouts(workload, hw)]
    if not plans:
        raise ValueError(f"No layout of {hw.n_gpus} GPUs divides the global batch of "
                         f"{workload.global_batch} sequences; use a GPU count or batch that "
                         f"share powers of two.")
    fitting = [p for p in plans if p.fits]
    if not fitting:
        least = min(plans, key=lambda p: p.memory_bytes)
        raise ValueError(
            f"No layout fits: the smallest, {least.layout}, needs {least.memory_bytes / 1e9:.1f} "
            f"GB of model states per GPU against {least.memory_limit_bytes / 1e9:.1f} GB usable "
            f"on a {hw.gpu.name}; use more GPUs or GPUs with more memory.")
    fitting.sort(key=lambda p: (p.step_s, p.layout.zero_stage, p.layout.pp, p.layout.tp))
    return fitting[:limit] if limit else fitting


def best_plan(workload: Workload, hw: Hardware,
              assumptions: Assumptions = Assumptions()) -> Plan:
    """The fastest layout that fits (the first of :func:`rank_layouts`)."""
    return rank_layouts(workload, hw, assumptions, limit=1)[0]


def gpus_needed(workload: Workload, hw: Hardware, assumptions: Assumptions = Assumptions(),
                *, max_gpus: int = 2**20) -> Plan:
    """The smallest cluster, in a power of two of whole nodes, that trains within the budget.

    ``hw`` gives everything but the GPU count (its ``n_gpus`` is replaced). The storage is
    the same shared system for every size, so a larger cluster can end up waiting for it.

    Args:
        workload: needs both ``n_tokens`` and ``time_budget_s``.
        hw: the cluster design.
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
    while nodes * hw.gpus_per_node <= max_gpus:
        sized = replace(hw, n_gpus=nodes * hw.gpus_per_node)
        try:
            plan = best_plan(workload, sized, assumptions)
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
              f"{'dp':>7} {'data':>7} {'step s':>8} {'MFU':>6} {'days':>7}  {'network model':<13}  "
              f"bottleneck")
    lines = [header]
    for p in plans:
        days = p.time_to_train_s / 86400 if p.time_to_train_s is not None else float("nan")
        lines.append(
            f"{str(p.layout):<24} {p.memory_bytes / 1e9:7.1f} {p.compute_s:8.3f} "
            f"{p.tp_comm_s:7.3f} {p.pp_comm_s:7.3f} {p.bubble_s:7.3f} {p.dp_comm_s:7.3f} {p.data_wait_s:7.3f} "
            f"{p.step_s:8.3f} {100 * p.mfu:5.1f}% {days:7.1f}  {p.network_model:<13}  "
            f"{p.bottleneck}")
    release = costmodel.NCCL_RELEASE
    lines.append(f"# all-reduces priced by NCCL {release}'s tuning model "
                 f"(costmodel.cluster_collective); 'unvalidated': no published rows in that "
                 f"regime (costmodel.validation_by_regime)")
    return "\n".join(lines)


def describe_plan(plan: Plan) -> str:
    """Several lines that summarize one plan for a reader."""
    w, hw = plan.workload, plan.hardware
    n_layers, d_model = w.shape
    lines = [
        f"workload: {w.n_params:.3g} parameters ({n_layers} layers x {d_model}), "
        f"{w.global_batch} x {w.seq_len} = {w.tokens_per_step:,} tokens per step",
        f"hardware: {hw.n_gpus} x {hw.gpu.name} ({hw.n_nodes} nodes of {hw.gpus_per_node}); "
        f"node {hw.intra_node_bytes_per_s / 1e9:.0f} GB/s, fabric "
        f"{hw.fabric_bytes_per_s / 1e9:.1f} GB/s per GPU; storage "
        f"{hw.storage_read_bytes_per_s / 1e9:.1f} GB/s",
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


# ---------------------------------------------------------------------------------------------
# The course's fabric comparison (chapters 01 and 08, lab 10): one configuration, one model
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DataParallelJob:
    """A data-parallel training job as the fabric comparison prices it (no pipeline, no TP).

    Attributes mirror :func:`data_parallel_step`; the gradients travel in BF16.
    """

    n_params: float                 # N, parameters
    n_tokens: float                 # D, tokens to train on
    tokens_per_step: float          # B, tokens in one global batch
    compute_efficiency: float = 0.5  # fraction of peak the matrix multiplications reach
    bytes_per_grad: int = 2          # BF16 gradients (2 bytes per value)

    def __post_init__(self) -> None:
        for name in ("n_params", "n_tokens", "tokens_per_step"):
            positive(name, getattr(self, name))
        count("bytes_per_grad", self.bytes_per_grad)

    @property
    def gradient_bytes(self) -> float:
        """Bytes each GPU all-reduces per step: ``bytes_per_grad * n_params``."""
        return self.bytes_per_grad * self.n_params

    @property
    def steps(self) -> float:
        """Steps to train: ``n_tokens / tokens_per_step``."""
        return self.n_tokens / self.tokens_per_step


@dataclass(frozen=True)
class FabricCluster:
    """Nodes of GPUs and the NICs that join them, by names in :mod:`clusterlab.hardware`."""

    name: str                # a label, e.g. "A"
    gpu: str                 # key of hardware.GPUS
    n_gpus: int              # GPUs, whole nodes
    nic: str                 # key of hardware.LINKS: one NIC port between nodes
    nics_per_node: int       # NIC ports per node (8: one per GPU, as in a DGX H100)
    gpus_per_node: int = 8   # GPUs sharing the node's NVLink

    def __post_init__(self) -> None:
        hardware.gpu(self.gpu)
        hardware.link(self.nic)
        count("n_gpus", self.n_gpus)
        count("nics_per_node", self.nics_per_node)
        per_node = count("gpus_per_node", self.gpus_per_node)
        if self.n_gpus % per_node:
            raise ValueError(f"n_gpus ({self.n_gpus}) must be whole nodes of {per_node} GPUs; "
                             f"use {per_node * math.ceil(self.n_gpus / per_node)}.")

    @property
    def n_nodes(self) -> int:
        return self.n_gpus // self.gpus_per_node

    @property
    def network_bytes_per_s(self) -> float:
        """Line rate of all of a node's NICs together, per direction (bytes/s)."""
        return hardware.link(self.nic).bytes_per_s * self.nics_per_node

    def describe(self) -> str:
        """One line, e.g. ``256 x H100 (32 nodes), 8 x IB-NDR (400 Gb/s per port) per node``."""
        link = hardware.link(self.nic)
        return (f"{self.n_gpus} x {self.gpu} ({self.n_nodes} nodes), {self.nics_per_node} x "
                f"{link.name} ({link.quoted}) per node")


def fabric_step(job: DataParallelJob, cluster: FabricCluster, *, overlap: float = 0.0,
                network_bytes_per_s: float | None = None) -> StepTime:
    """One data-parallel step of ``job`` on ``cluster``: compute plus the exposed all-reduce.

    The gradient all-reduce is :func:`clusterlab.costmodel.all_reduce_time` (the one model of
    NCCL across nodes) over ``cluster.n_nodes x cluster.gpus_per_node`` GPUs and the node's NICs;
    the step is :func:`data_parallel_step`.

    Args:
        job: the workload.
        cluster: the GPUs and NICs.
        overlap: the fraction of the all-reduce hidden behind the backward pass, in [0, 1],
            capped at the backward pass's time (:func:`data_parallel_step`).
        network_bytes_per_s: replaces the node's NICs by this line rate per node (bytes/s per
            direction), e.g. to sweep the fabric; None: ``cluster.nic x cluster.nics_per_node``.

    Returns:
        The :class:`StepTime`; ``job.steps * step.step_s`` is the time to train;
        ``step.all_reduce`` is the estimate (``step.validated``: whether published rows back
        its regime).
    """
    if not isinstance(job, DataParallelJob) or not isinstance(cluster, FabricCluster):
        raise ValueError("fabric_step(job, cluster) takes a plan.DataParallelJob and a "
                         "plan.FabricCluster, e.g. plan.FABRIC_JOB, plan.FABRIC_CLUSTERS['A'].")
    network = ({} if network_bytes_per_s is None or cluster.n_nodes == 1
               else {"network_bytes_per_s": positive("network_bytes_per_s", network_bytes_per_s)})
    if not network and cluster.n_nodes > 1:
        network = {"nic": cluster.nic, "nics_per_node": cluster.nics_per_node}
    if "network_bytes_per_s" in network:
        network["fabric"] = costmodel.fabric_of(cluster.nic, cluster.n_nodes)
    estimate = costmodel.cluster_collective("all_reduce", job.gradient_bytes, gpu=cluster.gpu,
                                            n_nodes=cluster.n_nodes,
                                            gpus_per_node=cluster.gpus_per_node, **network)
    return data_parallel_step(job.n_params, job.tokens_per_step, cluster.n_gpus,
                              hardware.gpu(cluster.gpu),
                              compute_efficiency=job.compute_efficiency,
                              all_reduce_s=estimate.time_s, overlap=overlap,
                              all_reduce=estimate)


def network_to_match(job: DataParallelJob, cluster: FabricCluster, step_s: float, *,
                     overlap: float = 0.0, max_bytes_per_s: float = 1e13) -> float:
    """The smallest per-node network line rate at which ``cluster`` steps within ``step_s``.

    Bisects :func:`fabric_step` over ``network_bytes_per_s`` (the step time does not grow with
    the network's rate) to a relative precision of 1e-6.

    Args:
        job: the workload.
        cluster: GPUs and nodes (its own NICs are replaced by the swept rate).
        step_s: the step time to match, e.g. another cluster's ``fabric_step(...).step_s``.
        overlap: as in :func:`fabric_step`.
        max_bytes_per_s: the largest rate tried.

    Returns:
        Bytes/s per node, per direction; ``math.inf`` when even ``max_bytes_per_s`` is too slow
        (compute or NVLink alone exceed ``step_s``); 0.0 on one node (no network).
    """
    step_s = positive("step_s", step_s)
    if cluster.n_nodes == 1:
        return 0.0 if fabric_step(job, cluster, overlap=overlap).step_s <= step_s else math.inf

    def step_at(rate: float) -> float:
        return fabric_step(job, cluster, overlap=overlap, network_bytes_per_s=rate).step_s

    high = positive("max_bytes_per_s", max_bytes_per_s)
    if step_at(high) > step_s:
        return math.inf
    low = high
    while step_at(low) <= step_s:
        low /= 2
        if low < 1.0:
            return low
    while high / low > 1 + 1e-6:
        middle = math.sqrt(low * high)
        low, high = (low, middle) if step_at(middle) <= step_s else (middle, high)
    return high


#: The job of the course's fabric comparison: a 7B model on 2T tokens in 4M-token steps, at 50%
#: of peak while computing (chapters 01 and 08, lab 10).
FABRIC_JOB = DataParallelJob(n_params=7e9, n_tokens=2e12, tokens_per_step=2**22,
                             compute_efficiency=0.5)
#: The clusters it compares: A, 256 H100 with one 400G NDR port per GPU (a DGX H100's 8 per
#: node); B, twice the GPUs with one 100 GbE port per node; B2, the same with 2 x 200 GbE.
FABRIC_CLUSTERS = {
    "A": FabricCluster("A", "H100", 256, "IB-NDR", 8),
    "B": FabricCluster("B", "H100", 512, "Ethernet-100G", 1),
    "B2": FabricCluster("B2", "H100", 512, "Ethernet-200G", 2),
}


# --- Power ------------------------------------------------------------------------------------

#: Industry-average power usage effectiveness, flat near this value since about 2020 (Uptime
#: Institute, Global Data Center Survey 2023: 1.58) [uptime_pue2023].
PUE_INDUSTRY_AVERAGE = 1.58
#: A modern hyperscale fleet: Google's fleet-wide trailing twelve-month PUE, 1.10 [google_pue].
PUE_HYPERSCALE = 1.10

def facility_power_w(it_power_w: float, *, pue: float) -> float:
    """Power a data centre draws to run an IT load: ``it_power_w * pue``.

    The power usage effectiveness (PUE) is total facility power over IT power; the excess is
    cooling, power conversion and distribution, lighting.

    Args:
        it_power_w: power of the IT equipment (servers, switches, storage), in W (>= 0).
        pue: power usage effectiveness (>= 1; 1 would be a facility with no overhead at all).

    Returns:
        Facility power in W.

    Raises:
        ValueError: if the IT power is negative or the PUE is below 1 or not finite.

    References:
        The Green Grid, "PUE: a comprehensive examination of the metric", White Paper 49, 2012.
        Uptime Institute, Global Data Center Survey (industry average PUE 1.58 in 2023).
    """
    it_w = positive("it_power_w", it_power_w, allow_zero=True)
    ratio = positive("pue", pue)
    if ratio < 1.0:
        raise ValueError(f"pue must be >= 1 (total facility power over IT power), got {pue!r}.")
    return it_w * ratio


def cluster_power_w(system: hardware.Node | hardware.Rack | str, n_gpus: int, *, pue: float,
                    other_it_fraction: float = 0.0) -> float:
    """Facility power of a cluster of ``n_gpus`` GPUs built from whole servers or racks.

    ``ceil(n_gpus / g)`` units of ``g`` GPUs (8 per DGX server, 72 per NVL72 rack), each at its
    catalogued full-load power (:func:`clusterlab.hardware.power_per_gpu_w` per GPU), plus
    ``other_it_fraction`` of that for the IT the catalogue's figure leaves out (switches,
    storage, management), times the PUE.

    Args:
        system: a server or rack of :mod:`clusterlab.hardware` or its name ("DGX H100",
            "GB200 NVL72").
        n_gpus: GPUs in the cluster (integer >= 1), rounded up to whole units.
        pue: the facility's power usage effectiveness (>= 1).
        other_it_fraction: IT power outside the servers or racks, as a fraction of theirs (>= 0).

    Returns:
        Facility power in W.

    Raises:
        ValueError: if the system is unknown or has no power figure, or an argument is out of
            range.

    References:
        NVIDIA DGX H100 datasheet (10.2 kW per server); NVIDIA DGX SuperPOD GB200 reference
        architecture (1.2 MW per scalable unit of 8 racks).
    """
    per_unit = hardware.nvlink_domain_gpus(system)
    gpus = per_unit * math.ceil(count("n_gpus", n_gpus) / per_unit)
    extra = positive("other_it_fraction", other_it_fraction, allow_zero=True)
    return facility_power_w(gpus * hardware.power_per_gpu_w(system) * (1.0 + extra), pue=pue)


def gpus_within_power(system: hardware.Node | hardware.Rack | str, facility_budget_w: float, *,
                      pue: float, other_it_fraction: float = 0.0) -> int:
    """The most GPUs, in whole servers or racks, whose facility power fits a power budget.

    The inverse of :func:`cluster_power_w`: ``floor(budget / (unit power * (1 + other) * PUE))``
    units of ``g`` GPUs.

    Args:
        system: a server or rack of :mod:`clusterlab.hardware` or its name.
        facility_budget_w: power the site can deliver to the cluster, in W (>= 0).
        pue: the facility's power usage effectiveness (>= 1).
        other_it_fraction: IT power outside the servers or racks, as a fraction of theirs (>= 0).

    Returns:
        The number of GPUs (a multiple of the unit's GPU count; 0 if not one unit fits).

    Raises:
        ValueError: as :func:`cluster_power_w`, or on a negative budget.
    """
    budget = positive("facility_budget_w", facility_budget_w, allow_zero=True)
    per_unit = hardware.nvlink_domain_gpus(system)
    unit_w = cluster_power_w(system, per_unit, pue=pue, other_it_fraction=other_it_fraction)
    # A tiny relative slack so that an exact fit is not rounded down by floating point.
    return int(math.floor(budget / unit_w * (1 + 1e-12))) * per_unit


def peak_flops_per_facility_w(system: hardware.Node | hardware.Rack | str, *,
                              precision: str = "bf16", pue: float,
                              other_it_fraction: float = 0.0) -> float:
    """Dense peak FLOP/s a server or rack design delivers per watt the facility draws.

    One GPU's dense peak at ``precision`` over its share of the facility's power: the system's
    power per GPU (:func:`clusterlab.hardware.power_per_gpu_w`), plus ``other_it_fraction`` for
    IT outside it, times the PUE. Within a fixed power envelope this, not the GPU count, sets the
    compute a site can hold.

    Args:
        system: a server or rack of :mod:`clusterlab.hardware` or its name.
        precision: ``"bf16"`` or ``"fp8"`` (see :func:`clusterlab.hardware.peak_flops`).
        pue: the facility's power usage effectiveness (>= 1).
        other_it_fraction: IT power outside the servers or racks, as a fraction of theirs (>= 0).

    Returns:
        FLOP/s per facility watt (multiply by 1e6 / 1e15 for PFLOP/s per MW).

    Raises:
        ValueError: as :func:`cluster_power_w`, or for a precision the GPU lacks.
    """
    per_unit = hardware.nvlink_domain_gpus(system)        # also rejects unknown systems
    unit_w = cluster_power_w(system, per_unit, pue=pue, other_it_fraction=other_it_fraction)
    return per_unit * hardware.peak_flops(_system_gpu(system), precision=precision) / unit_w


def _system_gpu(system: hardware.Node | hardware.Rack | str) -> str:
    """The GPU name of a server or rack given as a spec or a (known) name."""
    if isinstance(system, (hardware.Node, hardware.Rack)):
        return system.gpu
    racks = {name.lower(): spec for name, spec in hardware.RACKS.items()}
    spec = racks.get(str(system).lower()) or hardware.node(system)
    return spec.gpu
