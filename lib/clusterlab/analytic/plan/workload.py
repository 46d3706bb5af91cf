"""The planner's inputs: what to train (:class:`Workload`, with :class:`MoE` for a mixture of
experts), on what (:func:`cluster`, a :class:`clusterlab.catalog.hardware.ClusterSpec`), split how
(:class:`Layout`), and what the datasheets cannot say (:class:`Assumptions`).

References:
    Jiang et al., "Mixtral of Experts", 2024, section 2 and Table 1 (gated SwiGLU experts, top-2
    of 8). https://arxiv.org/abs/2401.04088
    DeepSpeed, deepspeed/utils/groups.py, ``_create_expert_and_data_parallel``: with 16
    data-parallel ranks and expert-parallel size 2 the expert-parallel groups are [0, 1],
    [2, 3], ... (all-to-all), the expert-data-parallel groups [0, 2, 4, ...], [1, 3, ...]
    (the all-reduce of the experts' gradients) and the data-parallel group all 16 (the
    all-reduce of the other parameters). https://github.com/deepspeedai/DeepSpeed
    Megatron Core, "Mixture of Experts" (MoE) user guide: the expert-parallel size divides the
    data-parallel size and the number of experts; expert tensor parallelism defaults to the
    tensor-parallel size (Megatron Core 0.x; the planner follows it, the guide was not re-read
    for this change).
    https://docs.nvidia.com/megatron-core/developer-guide/latest/api-guide/moe.html
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from clusterlab._checks import count, number, positive
from clusterlab.analytic import flops, memory
from clusterlab.analytic.gemm import Recompute, RECOMPUTE_POLICIES
from clusterlab.analytic.plan.step import model_shape
from clusterlab.catalog import hardware
from clusterlab.catalog.hardware import ClusterSpec


#: The recomputation policies, :data:`clusterlab.analytic.gemm.RECOMPUTE_POLICIES` (one tuple):
#: "flash" (the default, ``recompute=False``), "none", "selective", "full" (``recompute=True``)
#: and "flash_full" (full recomputation with FlashAttention); a "selective" step runs one more
#: forward of attention's ``4 L s d`` FLOPs per token, a "full" or "flash_full" one one more
#: forward of everything.


#: Weight matrices of one expert MLP: gated (SwiGLU: gate, up and down, each d x f), as in
#: Mixtral (Jiang et al. 2024, section 2.1) and DeepSeek-V3.
EXPERT_MATRICES = 3


@dataclass(frozen=True)
class MoE:
    """The mixture-of-experts part of a :class:`Workload`: in each MoE layer the MLP is
    ``n_experts`` gated expert MLPs of width ``expert_mlp_width`` (``3 d f`` parameters each,
    :data:`EXPERT_MATRICES`), of which a router picks ``top_k`` per token.

    Mixtral 8x7B (Jiang et al. 2024, Table 1): ``MoE(n_experts=8, top_k=2,
    expert_mlp_width=14336)``, every one of its 32 layers of width 4096.
    """

    n_experts: int                   # E, experts per MoE layer
    top_k: int                       # k, experts each token runs
    expert_mlp_width: int            # f, hidden width of one expert MLP
    #: layers whose MLP is a mixture of experts; None: every layer
    n_moe_layers: int | None = None
    #: slots per expert, C = ceil(capacity_factor * T k / E) of a device's T tokens: the size
    #: of the dispatch buffers the all-to-alls carry (clusterlab.device.parallel.experts)
    capacity_factor: float = 1.0
    #: the busiest expert's tokens over the mean (max / mean, >= 1): the GPU that holds it
    #: computes its experts at that many times the mean rows and sets the layer's pace. 1.0:
    #: balanced, as the published benchmarks force it (Megatron-Bridge's performance summary:
    #: "we force-balance the token distribution among experts"); a run whose router is balanced
    #: only by an auxiliary loss gives the max / mean its paper measured. The all-to-all's
    #: buffers stay ``capacity_factor``'s (a dropless run with imbalance needs one >= it).
    load_imbalance: float = 1.0
    #: the gated activation clamps its two halves first, in eager kernels, as GPT-OSS does
    #: (its clamp at 7; Megatron Core 0.15's fused_bias_geglu): their bytes are priced
    #: (clusterlab.analytic.gemm.clamp_bytes_per_row)
    activation_clamp: bool = False
    #: the experts' output projection has a bias, added expert by expert in eager kernels
    #: (GPT-OSS; Megatron Core 0.15's experts.TEGroupedMLP._apply_bias): priced by its bytes
    #: (clusterlab.analytic.gemm.expert_bias_bytes_per_row). Mixtral and DeepSeek-V3 have none
    expert_bias: bool = False
    #: the experts' activation (and its clamp) is discarded after the forward and run again in
    #: the backward (Megatron Core's recompute_modules=["moe_act"]); full recomputation
    #: already runs it again, so it adds nothing there
    recompute_activation: bool = False

    def __post_init__(self) -> None:
        for flag in ("activation_clamp", "expert_bias", "recompute_activation"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"MoE.{flag} is True or False; got {getattr(self, flag)!r}.")
        count("n_experts", self.n_experts)
        count("top_k", self.top_k)
        count("expert_mlp_width", self.expert_mlp_width)
        if self.n_moe_layers is not None:
            count("n_moe_layers", self.n_moe_layers)
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds the {self.n_experts} experts: a "
                             f"token cannot run more experts than there are; give top_k <= "
                             f"n_experts.")
        positive("capacity_factor", self.capacity_factor)
        if not number("load_imbalance", self.load_imbalance) >= 1:
            raise ValueError(f"load_imbalance is the busiest expert's tokens over the mean, at "
                             f"least 1 (1.0: balanced); got {self.load_imbalance}.")


@dataclass(frozen=True)
class Workload:
    """What to train: a decoder-only transformer, dense or with a mixture of experts (``moe``),
    and its data.

    A mixture-of-experts workload gives ``n_params`` as every parameter, the experts' included
    (Mixtral 8x7B: 46.7e9); its MoE layers hold attention and the experts, its other layers
    attention and a dense MLP (:attr:`mlp_width`).

    Give ``n_tokens`` (time to train is predicted), ``time_budget_s`` (tokens trainable in the
    budget are predicted), both (:func:`clusterlab.analytic.plan.gpus_needed` sizes the cluster
    to the budget) or neither (only the step is predicted).
    """

    n_params: float                      # N, model parameters
    seq_len: int                         # tokens per training sequence
    global_batch: int                    # sequences per optimizer step, all replicas together
    n_tokens: float | None = None        # D, training tokens
    time_budget_s: float | None = None   # wall-clock budget for the run, seconds
    n_layers: int | None = None          # transformer layers; None: default_shape(n_params)
    d_model: int | None = None           # model (and attention) width; None: default_shape
    n_heads: int | None = None           # attention heads; None: d_model / 128
    #: key/value heads (grouped-query attention: Llama 3 has 8); None: n_heads (multi-head).
    #: It sizes context parallelism's K/V all-gather and the K and V activations kept; the
    #: GEMMs keep clusterlab.analytic.gemm's multi-head shapes (the layer's FLOPs come from
    #: n_params, so the K/V projections' saving goes to the MLP width)
    n_kv_heads: int | None = None
    bytes_per_token: float = 4.0         # bytes storage delivers per token (4: uint32 ids)
    #: the vocabulary V: the output layer (logits, d x V, and the cross-entropy) is priced on the
    #: last pipeline stage, as Megatron-LM places it, on top of the layers that hold n_params;
    #: None: no output layer priced (its FLOPs are then left out of the step)
    vocab_size: int | None = None
    #: a Recompute policy; True means "full" and False "flash" (see RECOMPUTE_POLICIES)
    recompute: bool | Recompute = False
    #: the mixture of experts; None: a dense model (priced exactly as before MoE existed)
    moe: MoE | None = None
    #: "bf16", or "fp8": the layers' linear GEMMs (QKV, output projection, MLP) at the GPU's
    #: FP8 peak, as Transformer Engine runs them; attention's two GEMMs, the element-wise
    #: kernels, the output layer and the optimizer stay BF16/FP32 (prediction._layer_time_s)
    precision: hardware.Precision = "bf16"

    def __post_init__(self) -> None:
        positive("n_params", self.n_params)
        count("seq_len", self.seq_len)
        count("global_batch", self.global_batch)
        if self.n_tokens is not None:
            positive("n_tokens", self.n_tokens)
        if self.time_budget_s is not None:
            positive("time_budget_s", self.time_budget_s)
        model_shape(self.n_params, self.n_layers, self.d_model)
        if self.n_heads is not None:
            count("n_heads", self.n_heads)
        if self.n_kv_heads is not None:
            count("n_kv_heads", self.n_kv_heads)
            if self.heads % self.n_kv_heads:
                raise ValueError(f"n_kv_heads ({self.n_kv_heads}) must divide the {self.heads} "
                                 f"attention heads (each key/value head serves a group of query "
                                 f"heads); use a divisor of {self.heads}.")
        positive("bytes_per_token", self.bytes_per_token)
        if self.vocab_size is not None:
            count("vocab_size", self.vocab_size)
        if not isinstance(self.recompute, bool) and self.recompute not in RECOMPUTE_POLICIES:
            raise ValueError(f"recompute must be True, False or one of {RECOMPUTE_POLICIES}, "
                             f"got {self.recompute!r}.")
        if self.precision not in ("bf16", "fp8"):
            raise ValueError(f"precision is 'bf16' or 'fp8', got {self.precision!r}.")
        if self.moe is not None:
            if not isinstance(self.moe, MoE):
                raise ValueError(f"moe must be a plan.MoE (or None for a dense model), got "
                                 f"{self.moe!r}.")
            n_layers = self.shape[0]
            if self.moe.n_moe_layers is not None and self.moe.n_moe_layers > n_layers:
                raise ValueError(f"moe.n_moe_layers ({self.moe.n_moe_layers}) exceeds the "
                                 f"{n_layers} layers; give at most n_layers (or None: every "
                                 f"layer).")
            if self.expert_params >= self.n_params:
                raise ValueError(f"The {self.moe_layers} x {self.moe.n_experts} experts hold "
                                 f"{self.expert_params:.4g} parameters, not fewer than the "
                                 f"{self.n_params:.4g} given: n_params counts every parameter, "
                                 f"the experts' included (Mixtral 8x7B: 46.7e9).")
            self.flops_per_token          # checks the MoE shape once more (flops' own rules)
            if self.moe_layers < n_layers:
                self.mlp_width            # raises when the dense layers have no MLP left

    @property
    def recompute_policy(self) -> Recompute:
        """The recomputation policy: ``recompute``, with True read as "full" and False as
        "flash"."""
        if isinstance(self.recompute, bool):
            return "full" if self.recompute else "flash"
        return self.recompute

    @property
    def shape(self) -> tuple[int, int]:
        """``(n_layers, d_model)``, given or estimated by :func:`default_shape`."""
        return model_shape(self.n_params, self.n_layers, self.d_model)

    @property
    def mlp_width(self) -> float:
        """The MLP width ``f`` that gives a layer its share of the parameters: ``N/L`` less
        attention's ``4 d^2``, over the MLP's two ``d x f`` matrices (``4 d`` for a GPT-style
        model of ``12 L d^2``), so that a layer's GEMMs (:func:`clusterlab.analytic.gemm.
        transformer_layer_gemms`) count :attr:`hardware_flops_per_token`.

        With experts, the dense layers' MLP: the parameters outside the experts less every
        layer's attention, over the ``L - n_moe`` dense layers' two ``d x f`` matrices."""
        n_layers, d_model = self.shape
        if self.moe is None:
            width = (self.n_params / n_layers - 4.0 * d_model**2) / (2.0 * d_model)
        else:
            dense_layers = n_layers - self.moe_layers
            if dense_layers == 0:
                raise ValueError("Every layer is a mixture of experts: the workload has no "
                                 "dense MLP (the experts' width is moe.expert_mlp_width).")
            width = ((self.n_params - self.expert_params - 4.0 * d_model**2 * n_layers)
                     / (2.0 * d_model * dense_layers))
        if width <= 0:
            raise ValueError(f"{self.n_params:.3g} parameters over {n_layers} layers leave no "
                             f"MLP beside attention's 4 d^2 (d = {d_model})"
                             + ("" if self.moe is None else " and the experts")
                             + "; give fewer layers or a narrower d_model.")
        return width

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts: 0 for a dense model, ``n_layers`` when
        ``moe.n_moe_layers`` is None."""
        if self.moe is None:
            return 0
        return self.moe.n_moe_layers if self.moe.n_moe_layers is not None else self.shape[0]

    @property
    def params_per_expert(self) -> float:
        """Parameters of one expert MLP: ``EXPERT_MATRICES * d * f`` (0 for a dense model)."""
        if self.moe is None:
            return 0.0
        return float(EXPERT_MATRICES * self.shape[1] * self.moe.expert_mlp_width)

    @property
    def expert_params(self) -> float:
        """Parameters of all experts: ``n_moe_layers * E * params_per_expert`` (0 dense)."""
        if self.moe is None:
            return 0.0
        return self.moe_layers * self.moe.n_experts * self.params_per_expert

    @property
    def heads(self) -> int:
        """Attention heads, given or ``max(1, d_model // 128)`` (heads of 128)."""
        return self.n_heads if self.n_heads is not None else max(1, self.shape[1] // 128)

    @property
    def kv_heads(self) -> int:
        """Key/value heads, given or :attr:`heads` (multi-head attention)."""
        return self.n_kv_heads if self.n_kv_heads is not None else self.heads

    @property
    def head_dim(self) -> float:
        """Width of one attention head: ``d_model / heads``."""
        return self.shape[1] / self.heads

    @property
    def tokens_per_step(self) -> int:
        """Tokens in one global batch: ``global_batch * seq_len``."""
        return self.global_batch * self.seq_len

    @property
    def flops_per_token(self) -> float:
        """Model FLOPs per trained token, attention included (PaLM's accounting); with experts,
        of the parameters a token uses (:func:`clusterlab.analytic.flops.moe_flops_per_token`)."""
        n_layers, d_model = self.shape
        if self.moe is None:
            return flops.transformer_flops_per_token(self.n_params, n_layers, self.seq_len,
                                                     d_model)
        return flops.moe_flops_per_token(self.n_params, n_layers, self.seq_len, d_model,
                                         n_moe_layers=self.moe_layers,
                                         n_experts=self.moe.n_experts, top_k=self.moe.top_k,
                                         params_per_expert=self.params_per_expert)

    @property
    def hardware_flops_per_token(self) -> float:
        """FLOPs the GPUs run per token, recomputation included: the model's ``6N + 12 L s d``
        plus one more forward of attention's ``4 L s d`` ("selective") or of everything,
        ``2N + 4 L s d`` ("full" and "flash_full", 4/3 of the model's: Korthikanti et al. 2022,
        section 4)."""
        n_layers, d_model = self.shape
        extra = {"flash": 0.0, "none": 0.0, "selective": 4.0 * n_layers * self.seq_len * d_model,
                 "full": self.flops_per_token / 3,
                 "flash_full": self.flops_per_token / 3}[self.recompute_policy]
        return self.flops_per_token + extra


def shape_params(n_layers: int, d_model: int, *, n_heads: int, n_kv_heads: int | None = None,
                 ffn_width: int | None = None, vocab_size: int | None = None,
                 moe: MoE | None = None) -> float:
    """Parameters of a model given by its shape (what ``Workload.n_params`` takes):
    :func:`clusterlab.analytic.flops.transformer_params` (grouped-query attention, a gated MLP
    of ``ffn_width``, untied embeddings), with every MoE layer's MLP replaced by its
    ``n_experts`` gated experts of ``expert_mlp_width`` (:data:`EXPERT_MATRICES` ``d f`` each).

    Raises:
        ValueError: when a dense layer is left without ``ffn_width``.
    """
    moe_layers = 0 if moe is None else (moe.n_moe_layers or n_layers)
    if ffn_width is None and moe_layers < n_layers:
        raise ValueError("Counting the parameters from the shape needs the MLP width (--ffn, "
                         "ffn_width) of the dense layers; or give the parameter count "
                         "(--params).")
    ffn = ffn_width if ffn_width is not None else 1    # every MLP is experts: replaced below
    total = flops.transformer_params(n_layers, d_model, n_heads=n_heads,
                                     n_kv_heads=n_heads if n_kv_heads is None else n_kv_heads,
                                     ffn_width=ffn, vocab_size=vocab_size)
    if moe is not None:
        total += moe_layers * EXPERT_MATRICES * d_model * (moe.n_experts * moe.expert_mlp_width
                                                           - ffn)
    return total


def cluster(gpu: str, n_gpus: int, *, storage_read_bytes_per_s: float, gpus_per_node: int = 8,
            node_link: str | None = None, fabric_link: str = "IB-NDR",
            nics_per_node: int | None = None, nvlink_domain_gpus: int | None = None,
            name: str = "") -> ClusterSpec:
    """A :class:`clusterlab.catalog.hardware.ClusterSpec` from names in
    :mod:`clusterlab.catalog.hardware`, counted in GPUs rather than nodes.

    Args:
        gpu: a key of ``hardware.GPUS`` (case-insensitive), e.g. ``"H100"``.
        n_gpus: GPUs in the cluster, a multiple of ``gpus_per_node``.
        storage_read_bytes_per_s: sustained read throughput of the shared storage.
        gpus_per_node: GPUs in one node.
        node_link: a key of ``hardware.LINKS`` for the node interconnect; None: the GPU's own
            NVLink (``gpu.nvlink_bytes_per_s``).
        fabric_link: a key of ``hardware.LINKS``: one NIC port between nodes.
        nics_per_node: fabric NICs per node; None: one per GPU (rail-optimized, as in DGX).
        nvlink_domain_gpus: GPUs of one NVLink domain that spans hosts (an NVL72 rack of 4-GPU
            hosts: 72, or the share of it a run used); None: the domain ends at the node.
        name: a label; empty: ``"<n_gpus> x <GPU>, <fabric_link>"``.

    Returns:
        The cluster spec.

    Raises:
        ValueError: for unknown names (listing the known ones), GPUs that are not whole nodes
            or a storage rate that is not positive.
    """
    spec = hardware.gpu(gpu)
    per_node = count("gpus_per_node", gpus_per_node)
    n_gpus = count("n_gpus", n_gpus)
    if n_gpus % per_node:
        raise ValueError(f"n_gpus ({n_gpus}) must be whole nodes of {per_node} GPUs; use "
                         f"{per_node * math.ceil(n_gpus / per_node)}.")
    nic = hardware.link(fabric_link).name
    return ClusterSpec(spec, n_nodes=n_gpus // per_node, gpus_per_node=per_node, nic=nic,
                       nics_per_node=nics_per_node, intra_node_link=node_link,
                       nvlink_domain_gpus=nvlink_domain_gpus,
                       storage_read_bytes_per_s=positive("storage_read_bytes_per_s",
                                                         storage_read_bytes_per_s),
                       name=name or f"{n_gpus} x {spec.name}, {nic}")


@dataclass(frozen=True)
class Layout:
    """How the GPUs split the work: ``dp * tp * pp * cp`` GPUs (expert parallelism uses no
    GPUs of its own: its ``ep`` ranks are data-parallel ranks).

    Placement, innermost first: tensor parallelism (its GPUs share a node), then context
    parallelism, then data, then pipeline. Tensor, data and pipeline keep Megatron-LM's order
    (the planner's numbers without cp are those of that order). The cp group sits right outside
    tp, as in Llama 3, which orders its groups [TP, CP, PP, DP] from the innermost (Dubey et al.
    2024, section 3.3.2 [dubey2024]): a cp group shares the node's NVLink when ``tp * cp`` GPUs
    fit in one node. Llama 3 puts pp inside dp; the planner keeps dp inside pp, so that a layout
    without cp is priced exactly as before.

    Context parallelism (``cp`` > 1) splits every sequence into ``cp`` parts: each GPU of the
    group holds ``s / cp`` tokens of each sequence (zig-zag: chunks ``i`` and ``2 cp - 1 - i`` of
    ``2 cp``, so the causal attention work is the same on every GPU), and replicates the
    parameters and optimizer state of its tp/pp shard; see :func:`clusterlab.analytic.plan.predict`.

    Expert parallelism (``ep`` > 1, a workload with ``moe``) follows DeepSpeed's groups and
    Megatron Core (see the module's references): the ``ep`` GPUs of an expert-parallel group are
    ``ep`` consecutive data-parallel ranks (same tp, cp and pp ranks), so ``ep`` divides ``dp`` and
    the number of experts, and each GPU holds ``E / ep`` experts of every MoE layer of its stage.
    The experts are also split over tp as the dense MLP is (Megatron Core's expert tensor
    parallelism at its default, the tp size): a GPU holds ``1 / (tp pp ep)`` of the experts'
    parameters. Their gradients are reduced over the ``dp cp / ep`` GPUs that hold the same
    experts; the dense parameters' over ``dp cp`` as before. Per MoE layer two all-to-alls run
    forward (dispatch, combine) and two backward; see :func:`clusterlab.analytic.plan.predict`.
    """

    dp: int = 1                  # data-parallel replicas
    tp: int = 1                  # tensor-parallel GPUs, inside one node
    pp: int = 1                  # pipeline stages
    zero_stage: int = 0          # 0 (plain data parallel) to 3 (parameters sharded too)
    micro_batch: int = 1         # sequences per micro-batch in each replica
    virtual_stages: int = 1      # interleaved schedule: model chunks per GPU (bubble / v)
    #: LayerNorm and dropout split along the sequence over the tp GPUs (Korthikanti et al. 2022);
    #: only memory changes: its all-gather and reduce-scatter cost what the all-reduce did
    sequence_parallel: bool = True
    #: context-parallel GPUs: each holds s / cp tokens of every sequence (1: none)
    cp: int = 1
    #: expert-parallel GPUs, carved from the dp ranks: each holds E / ep experts (1: none)
    ep: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "micro_batch", "virtual_stages", "cp", "ep"):
            count(name, getattr(self, name))
        if self.zero_stage not in memory.ZERO_STAGES:
            raise ValueError(f"zero_stage must be one of {memory.ZERO_STAGES}, got "
                             f"{self.zero_stage!r}.")

    @property
    def n_gpus(self) -> int:
        """GPUs the layout uses: ``dp * tp * pp * cp``."""
        return self.dp * self.tp * self.pp * self.cp

    def __str__(self) -> str:
        chunks = f" v{self.virtual_stages}" if self.virtual_stages > 1 else ""
        context = f" cp{self.cp}" if self.cp > 1 else ""
        experts = f" ep{self.ep}" if self.ep > 1 else ""
        return (f"dp{self.dp} tp{self.tp} pp{self.pp}{context}{experts}{chunks} "
                f"ZeRO-{self.zero_stage}")


@dataclass(frozen=True)
class Assumptions:
    """What the planner cannot know from datasheets: the software's efficiency.

    The defaults are round assumptions, not fits to the published runs that
    ``tests/test_planner_validation.py`` compares with; calibrate them with measurements (the
    lab on utilization measures the first).
    """

    #: None: compute priced per GEMM by shape (clusterlab.analytic.gemm: waves over the SMs, a
    # published
    #: matmul benchmark's ceiling, the memory-bound regime); a number: the fraction of peak
    #: FLOP/s every kernel reaches, a calibration from a measurement (lab 08's)
    compute_efficiency: float | None = None
    #: Megatron Core's overlap_grad_reduce: gradients reduced bucket by bucket during the
    #: backward pass of a step's last micro-batch (ZeRO-2 and 3: every micro-batch's collectives
    #: behind its own passes; prediction._data_parallel); False: none of them hidden. Megatron
    #: Core's own default is False; its training recipes (and Megatron-Bridge's) turn it on, as
    #: the planner does.
    overlap_grad_reduce: bool = True
    #: parameters per gradient bucket; None: Megatron Core's max(4e7, 1e6 dp)
    #: (step.megatron_bucket_params)
    grad_bucket_params: int | None = None
    activation_reserve: float = 0.1   # fraction of GPU memory kept free (workspace, fragments)
    #: Gradients kept and all-reduced in FP32 (Megatron-LM's BF16 default: 18 bytes of model
    #: states per parameter, memory.training_memory_per_device); False: the ZeRO paper's 16.
    fp32_grad_accumulation: bool = False
    #: Multiplies the data-parallel all-reduce when it crosses the fabric (>= 1; 1: a
    #: non-blocking fabric without collisions, as cluster_collective assumes). Take it from
    #: clusterlab.analytic.fabric.contention_factor for the job's topology, placement and routing.
    dp_contention_factor: float = 1.0

    def __post_init__(self) -> None:
        factor = number("dp_contention_factor", self.dp_contention_factor)
        if not factor >= 1:
            raise ValueError(f"dp_contention_factor multiplies the all-reduce time and is >= 1 "
                             f"(1 = no contention), got {factor}; compute it with "
                             f"clusterlab.analytic.fabric.contention_factor.")
        if self.compute_efficiency is not None:
            efficiency = positive("compute_efficiency", self.compute_efficiency)
            if efficiency > 1:
                raise ValueError(f"compute_efficiency is a fraction of peak, at most 1 (or None "
                                 f"for the per-GEMM model); got {efficiency}.")
        if not isinstance(self.overlap_grad_reduce, bool):
            raise ValueError(f"overlap_grad_reduce is True or False; got "
                             f"{self.overlap_grad_reduce!r}.")
        if self.grad_bucket_params is not None:
            count("grad_bucket_params", self.grad_bucket_params)
        reserve = number("activation_reserve", self.activation_reserve)
        if not 0 <= reserve < 1:
            raise ValueError(f"activation_reserve is a fraction in [0, 1); got {reserve}.")
