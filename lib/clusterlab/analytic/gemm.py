"""The time of one BF16 matrix multiplication (GEMM) on one GPU, and of one transformer layer's.

A GEMM ``(m x k) @ (k x n)`` is priced as a roofline, the larger of two times [nvidia_gemm_guide]:

* compute: the output is cut into tiles of ``TILE_M x TILE_N`` and the tiles run in *waves* of
  one tile per SM, ``waves = ceil(tiles / sm_count)``; a wave takes one tile's FLOPs,
  ``2 TILE_M TILE_N k``, at the SM's share of the GPU's achievable matmul rate (the ceiling,
  :func:`matmul_ceiling`, times the BF16 peak). A partial last wave costs a whole wave (wave
  quantization), a partial tile a whole tile (tile quantization); a dimension smaller than a
  tile gets a tile of its own size (cuBLAS picks smaller tiles for small problems). A GPU
  without ``sm_count`` in :mod:`clusterlab.catalog.hardware` is priced at the ceiling alone, without
  quantization;
* memory: the bytes of A, B and C (2 bytes a value) over the datasheet's HBM bandwidth, which
  is what a thin matmul (a matrix-vector product) is limited by.

Attention's two GEMMs inside a fused kernel (FlashAttention) are priced as the kernel runs
them: the causal mask's unmasked half, the scores recomputed in the backward pass, at the
kernel's measured rate where it was measured (:func:`fused_attention_time_s`).

:func:`transformer_layer_gemms` lists the GEMMs of one GPT-style layer for one micro-batch on
one tensor-parallel GPU, forward, backward and recomputed; :func:`transformer_layer_elementwise`
the element-wise work (LayerNorm, GeLU, softmax, dropout, residuals), priced by its bytes over
HBM bandwidth; :func:`transformer_layer_time_s` sums both. :func:`output_layer_time_s` prices
the output layer (the logits GEMM, ``d x V``) and its cross-entropy, which Megatron-LM runs on
the last pipeline stage. :func:`group_shares` splits a layer's GEMM time into attention, MLP
and projections (:data:`LAYER_GEMM_GROUPS`), whether priced here or measured on a device
(``clusterlab.device.bench.time_gemms``). A mixture-of-experts layer's experts are priced as a
grouped GEMM of the tokens each expert receives (:func:`expert_mlp_gemms`,
:func:`grouped_gemm_time_s`), beside its router (:func:`router_gemms`) and its token
permutations and gated activation (:func:`moe_elementwise`).

References:
    [nvidia_gemm_guide] NVIDIA, "Matrix Multiplication Background User's Guide" (tile and wave
    quantization, the 256x128 tile, arithmetic intensity of a GEMM).
    [bekman_mamf] Bekman, Machine Learning Engineering Open Book, "Maximum Achievable Matmul
    FLOPS comparison table" (BF16 MAMF per accelerator).
    [korthikanti2022] Korthikanti et al., "Reducing Activation Recomputation in Large
    Transformer Models", MLSys 2023 (the layer's activations, selective recomputation).
    [narayanan2021] Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
    Clusters Using Megatron-LM", SC 2021 (the output layer's FLOPs, ``6 B s h V``).
    [dao2023] Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work
    Partitioning", ICLR 2024, arXiv:2307.08691 (the fused attention kernel: the ``s x s`` scores
    stay on chip, its backward recomputes them from the softmax's row statistics).
    [shah2024] Shah et al., "FlashAttention-3: Fast and Accurate Attention with Asynchrony
    and Low-precision", NeurIPS 2024, arXiv:2407.08608 (section 4.1: the BF16 forward and
    backward speed of FlashAttention-2, cuDNN and FlashAttention-3 on an H100 80GB SXM5, by
    sequence length, head dimension and causal mask).
    [te_multi_stream] NVIDIA Transformer Engine, ``transformer_engine/common/util/
    multi_stream.cpp`` (``get_num_compute_streams()``: 4) and ``GroupedLinear``, which runs a
    grouped GEMM on Hopper as one cuBLAS GEMM per group over those streams (Transformer Engine
    2.x; the source was read for the constant, not at the release of a published run).
    https://github.com/NVIDIA/TransformerEngine
    [megatron_moe_dispatcher] Megatron Core, ``megatron/core/transformer/moe/
    token_dispatcher.py`` (``MoEAlltoAllTokenDispatcher``: permutation 1 by the routing map,
    the all-to-all, permutation 2 ``sort_chunks_by_idxs`` when a GPU holds more than one
    expert, and their mirrors in the combine) and ``moe_utils.py``.
    https://github.com/NVIDIA/Megatron-LM
    [megatron_core_0_15_experts] Megatron Core 0.15 (``core_dev_r0.15.0``, commit 0d8e071, the
    Megatron-LM that Megatron-Bridge 0.2.0, NeMo 25.11, pins): ``megatron/core/transformer/
    moe/experts.py`` (``TEGroupedMLP``: ``linear_fc2`` built with ``skip_bias_add=True``, its
    bias then added expert by expert in ``_apply_bias``: ``t + b * p`` per expert and a
    ``torch.cat``) and ``megatron/core/fusions/fused_bias_geglu.py``
    (``weighted_bias_quick_geglu_impl``: with ``activation_func_clamp_value`` set, the two
    halves are clamped and concatenated in eager PyTorch before the fused activation).
    https://github.com/NVIDIA/Megatron-LM/tree/0d8e0714cd29c01e164fe6de9f532182bdffa942
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal, Mapping, NamedTuple, Sequence

from clusterlab import _checks
from clusterlab.catalog.hardware import GPU

#: The output tile of one thread block, rows x columns: the largest cuBLAS tile the GEMM guide
#: lists (256x128) [nvidia_gemm_guide].
TILE_M, TILE_N = 256, 128
BYTES_PER_VALUE = 2  # BF16 operands and outputs
MASK_BYTES = 1       # a dropout mask: one byte a value [korthikanti2022]

#: Maximum achievable matmul FLOPS (MAMF) over the dense BF16 peak, the best shape of
#: mamf-finder.py's search [bekman_mamf]: A100 SXM 271.2 / 312 TFLOPS, H100 SXM 794.5 / 989
#: (its note: "H200 is the same"), B200 SXM 1745.0 / 2250, GB200 1822.0 / 2500.
MAMF_FRACTION: dict[str, float] = {
    "A100": 271.2 / 312, "H100": 794.5 / 989, "H200": 794.5 / 989,
    "B200": 1745.0 / 2250, "GB200": 1822.0 / 2500,
}
#: The ceiling of a GPU without a MAMF row: the lowest NVIDIA row above (GB200's 72.9%), so
#: that an unmeasured GPU is not assumed better than every measured one.
UNMEASURED_CEILING = min(MAMF_FRACTION.values())

#: Activation recomputation policies (Korthikanti et al. 2022, sections 4-5), the one tuple the
#: GEMM model, the planner's workload (``plan.workload.RECOMPUTE_POLICIES``) and its search read:
#: ``"flash"``: attention by a FlashAttention kernel, which never stores the scores and
#: recomputes them inside its backward kernel (the FLOPs of the model only; the planner's
#: default); ``"none"``: every activation stored, the attention scores too, nothing recomputed;
#: ``"selective"``: Megatron's selective recomputation, scores and softmax dropped and
#: recomputed; ``"full"``: only each layer's input kept, one more forward of everything, its
#: attention unfused (the ``s x s`` scores through HBM again); ``"flash_full"``: full
#: recomputation with FlashAttention, what long-context runs use: each layer's input kept, the
#: whole forward run once more (4/3 of the model's GEMM FLOPs [korthikanti2022]), attention
#: fused as with "flash" in the recomputed forward and the backward [dao2023], so no ``s x s``
#: tensor is stored or written to HBM.
Recompute = Literal["flash", "none", "selective", "full", "flash_full"]
RECOMPUTE_POLICIES: tuple[Recompute, ...] = ("flash", "none", "selective", "full", "flash_full")
#: The policies whose attention is one fused kernel (its scores on chip, softmax and dropout in
#: it) [dao2023].
FUSED_ATTENTION: tuple[Recompute, ...] = ("flash", "flash_full")
#: The policies that keep only each layer's input and run its whole forward again in the
#: backward pass (Korthikanti et al. 2022, section 4 [korthikanti2022]).
FULL_RECOMPUTE: tuple[Recompute, ...] = ("full", "flash_full")

Pass = Literal["forward", "dgrad", "wgrad", "recompute"]
Operand = Literal["a", "b", "c"]


@dataclass(frozen=True)
class Gemm:
    """One matrix multiplication ``C[m, n] = A[m, k] @ B[k, n]``, ``batch`` times (per head;
    a fraction where heads do not divide evenly over the tensor-parallel GPUs, on average).

    ``on_chip`` names operands that never touch HBM (a fused attention kernel keeps the
    ``s x s`` scores in shared memory).
    """

    name: str
    m: float
    n: float
    k: float
    batch: float = 1
    pass_: Pass = "forward"
    on_chip: tuple[Operand, ...] = ()

    def __post_init__(self) -> None:
        for dim in ("m", "n", "k"):
            _checks.positive(dim, getattr(self, dim))
        _checks.positive("batch", self.batch)
        if any(operand not in ("a", "b", "c") for operand in self.on_chip):
            raise ValueError(f"on_chip names operands 'a', 'b' or 'c', got {self.on_chip!r}.")

    @property
    def flops(self) -> float:
        """``2 m n k`` per multiplication, times ``batch``."""
        return 2.0 * self.m * self.n * self.k * self.batch

    @property
    def hbm_bytes(self) -> float:
        """Bytes of A, B and C that cross HBM (operands in ``on_chip`` left out)."""
        sizes = {"a": self.m * self.k, "b": self.k * self.n, "c": self.m * self.n}
        return BYTES_PER_VALUE * self.batch * sum(v for key, v in sizes.items()
                                                  if key not in self.on_chip)


@dataclass(frozen=True)
class Elementwise:
    """One element-wise kernel of a layer and the HBM bytes it reads and writes."""

    name: str
    hbm_bytes: float
    pass_: Pass = "forward"


def matmul_ceiling(gpu: GPU) -> float:
    """The largest fraction of the BF16 peak a GEMM reaches on ``gpu`` (:data:`MAMF_FRACTION`;
    :data:`UNMEASURED_CEILING` for a GPU without a published MAMF row)."""
    return MAMF_FRACTION.get(gpu.name, UNMEASURED_CEILING)


def gemm_compute_s(gemm: Gemm, gpu: GPU) -> float:
    """Seconds of ``gemm``'s tiles in waves over the SMs at the ceiling (no memory limit)."""
    rate_flops = gpu.bf16_flops * matmul_ceiling(gpu)
    if gpu.sm_count is None:
        return gemm.flops / rate_flops
    tile_m, tile_n = min(TILE_M, gemm.m), min(TILE_N, gemm.n)
    tiles = math.ceil(gemm.batch * math.ceil(gemm.m / tile_m) * math.ceil(gemm.n / tile_n))
    waves = math.ceil(tiles / gpu.sm_count)
    return waves * 2.0 * tile_m * tile_n * gemm.k / (rate_flops / gpu.sm_count)


def gemm_time_s(gemm: Gemm, gpu: GPU) -> float:
    """Seconds of one GEMM on one GPU: the larger of its compute (tiles in waves at the
    ceiling, :func:`gemm_compute_s`) and its HBM traffic at the datasheet bandwidth. One of a
    fused attention kernel's GEMMs is priced by :func:`fused_attention_time_s`.

    Example: an 8192-cubed GEMM on an H100 runs 2,048 tiles in 16 waves of 132 SMs, 97% of the
    ceiling's rate; a matrix-vector product runs at HBM bandwidth.
    """
    if is_fused_attention(gemm):
        return fused_attention_time_s(gemm, gpu)
    return max(gemm_compute_s(gemm, gpu), gemm.hbm_bytes / gpu.hbm_bytes_per_s)


# --- Fused causal attention: the masked half skipped, the scores recomputed backward ----------

#: The share of the ``s x s`` score tiles a fused kernel computes under a causal mask: each
#: query sees the keys before it, and the kernel skips the tiles above the diagonal. Counted as
#: FlashAttention's benchmarks count it: "With causal mask, we divide this number by 2"
#: [dao2023], section 4.1 (the diagonal's tiles add ``1 / (2 n)`` for ``n`` tiles a row).
CAUSAL_SHARE = 0.5
#: A fused kernel's backward pass recomputes the scores before its four gradient matmuls: 5
#: matmuls where the model counts 4, "we multiply the forward pass FLOPs by 2.5 (since there
#: are 2 matmuls in the forward pass and 5 matmuls in the backward pass, due to
#: recomputation)" [dao2023], section 4.1.
FUSED_BACKWARD_MATMULS = 5 / 4
#: The rate of a fused causal attention kernel where its authors measured it, in FLOP/s as
#: FlashAttention counts them (:data:`CAUSAL_SHARE`, :data:`FUSED_BACKWARD_MATMULS`), by
#: sequence length: cuDNN's kernel, BF16, head dimension 128, on an H100 80GB SXM5, read from
#: the bar labels of FlashAttention-3's BF16 speed figures [shah2024] (section 4.1): forward
#: with the causal mask; backward without it (the paper shows no masked backward, so these
#: rates are an upper bound for a causal one). At 1,024 tokens and more, FlashAttention-3's
#: kernel is 3-14% faster than cuDNN's there, and FlashAttention-2's far slower.
FUSED_ATTENTION_RATES: dict[str, tuple[tuple[int, float], ...]] = {
    "forward": ((512, 315e12), (1024, 410e12), (2048, 484e12), (4096, 518e12),
                (8192, 529e12), (16384, 539e12)),
    "backward": ((512, 305e12), (1024, 408e12), (2048, 465e12), (4096, 499e12),
                 (8192, 518e12), (16384, 516e12)),
}
#: The head dimension and the GPUs of :data:`FUSED_ATTENTION_RATES`: the H100's, and the
#: H200's, whose SMs and clocks are the H100's (as :data:`MAMF_FRACTION` takes them).
FUSED_ATTENTION_HEAD_DIM = 128
FUSED_ATTENTION_GPUS = ("H100", "H200")


def is_fused_attention(gemm: Gemm) -> bool:
    """Whether ``gemm`` is one of attention's two GEMMs inside a fused kernel (its ``s x s``
    operand on chip: :data:`FUSED_ATTENTION` policies)."""
    return gemm.name in LAYER_GEMM_GROUPS["attention"] and bool(gemm.on_chip)


def _direction(gemm: Gemm) -> Literal["forward", "backward"]:
    """The kernel pass a fused attention GEMM belongs to: a recomputed forward runs forward."""
    return "forward" if gemm.pass_ in ("forward", "recompute") else "backward"


def fused_attention_rate(gpu: GPU, direction: Literal["forward", "backward"], seq_len: float,
                         head_dim: float = FUSED_ATTENTION_HEAD_DIM) -> float | None:
    """:data:`FUSED_ATTENTION_RATES`' rate on ``gpu`` for ``direction`` at the longest
    tabulated sequence not above ``seq_len`` (the shortest for a shorter one); None where
    nothing was measured (another GPU or head dimension)."""
    if gpu.name not in FUSED_ATTENTION_GPUS or head_dim != FUSED_ATTENTION_HEAD_DIM:
        return None
    table = FUSED_ATTENTION_RATES[direction]
    return max((entry for entry in table if entry[0] <= seq_len), default=table[0])[1]


def measured_attention_rate(gemm: Gemm, gpu: GPU) -> float | None:
    """:func:`fused_attention_rate` for a fused attention GEMM on ``gpu``: its pass, its
    sequence (its longest side) and head dimension (its shortest)."""
    return fused_attention_rate(gpu, _direction(gemm), max(gemm.m, gemm.n, gemm.k),
                                head_dim=min(gemm.m, gemm.n, gemm.k))


def fused_attention_time_s(gemm: Gemm, gpu: GPU) -> float:
    """Seconds of one of a fused causal attention kernel's GEMMs: its FLOPs times
    :data:`CAUSAL_SHARE`, and times :data:`FUSED_BACKWARD_MATMULS` in the backward pass, at
    the kernel's measured rate (:func:`measured_attention_rate`), else at the GEMM model's
    (:func:`gemm_compute_s`); never below its HBM traffic.

    Example: on an H100 at 8,192 tokens and head dimension 128 the forward's score GEMM runs
    half its FLOPs at 529 TFLOP/s, 53% of the BF16 peak, where the GEMM model's ceiling is 80%.
    """
    work = CAUSAL_SHARE * (1.0 if _direction(gemm) == "forward" else FUSED_BACKWARD_MATMULS)
    rate = measured_attention_rate(gemm, gpu)
    compute_s = gemm_compute_s(gemm, gpu) if rate is None else gemm.flops / rate
    return max(work * compute_s, gemm.hbm_bytes / gpu.hbm_bytes_per_s)


def _backward(forward: Gemm) -> tuple[Gemm, Gemm]:
    """dgrad ``dA[m, k] = dC[m, n] @ B^T`` and wgrad ``dB[k, n] = A^T @ dC``: the forward's FLOPs
    each; an operand kept on chip forward stays on chip (its gradient too)."""
    f = forward
    swap_dgrad = {"a": "c", "b": "b", "c": "a"}   # dgrad: (A, B, C) -> (dC, B^T, dA)
    swap_wgrad = {"a": "a", "b": "c", "c": "b"}   # wgrad: (A, B, C) -> (A^T, dC, dB)
    return (Gemm(f.name, f.m, f.k, f.n, f.batch, "dgrad",
                 tuple(swap_dgrad[o] for o in f.on_chip)),
            Gemm(f.name, f.k, f.n, f.m, f.batch, "wgrad",
                 tuple(swap_wgrad[o] for o in f.on_chip)))


def _recompute_policy(recompute: str) -> str:
    if recompute not in RECOMPUTE_POLICIES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_POLICIES} "
                         f"(gemm.RECOMPUTE_POLICIES), got {recompute!r}.")
    return recompute


def _recomputed(ops: list, recompute: str, attention: set[str]) -> list:
    """The forward ops run again: all of them (:data:`FULL_RECOMPUTE`), attention's score ops
    ("selective")."""
    again = [op for op in ops if recompute in FULL_RECOMPUTE
             or (recompute == "selective" and op.name in attention)]
    return [type(op)(**(vars(op) | {"pass_": "recompute"})) for op in again]


def _layer_shape(seq_len, micro_batch, d_model, n_heads, ffn_hidden, tensor_parallel,
                 recompute) -> tuple[int, int, int, int, int, float, str]:
    """A layer's arguments checked: ``(s, b, d, a, t, f, policy)``, ``f`` = ``4 d`` when None."""
    s, b = _checks.count("seq_len", seq_len), _checks.count("micro_batch", micro_batch)
    d, a = _checks.count("d_model", d_model), _checks.count("n_heads", n_heads)
    t = _checks.count("tensor_parallel", tensor_parallel)
    f = 4.0 * d if ffn_hidden is None else _checks.positive("ffn_hidden", ffn_hidden)
    return s, b, d, a, t, f, _recompute_policy(recompute)


def transformer_layer_gemms(seq_len: int, micro_batch: int, d_model: int, n_heads: int, *,
                            ffn_hidden: float | None = None, tensor_parallel: int = 1,
                            recompute: str = "flash") -> tuple[Gemm, ...]:
    """The GEMMs of one GPT-style transformer layer, one micro-batch, one tensor-parallel GPU.

    With ``T = b s`` tokens, width ``d``, MLP width ``f``, ``a`` heads of ``d/a`` and ``t``
    tensor-parallel GPUs (Megatron's split: columns of QKV and the first MLP matmul, rows of
    the output projection and the second): forward ``qkv`` ``(T x d) @ (d x 3d/t)``,
    ``scores`` ``(s x d/a) @ (d/a x s)`` and ``attention_over_values`` ``(s x s) @ (s x d/a)``
    for each of ``b a / t`` heads, ``output_projection`` ``(T x d/t) @ (d/t x d)``, ``mlp_up``
    ``(T x d) @ (d x f/t)``, ``mlp_down`` ``(T x f/t) @ (f/t x d)``; each with its dgrad and
    wgrad (the forward's FLOPs each), and the forwards recomputed: none ("flash", "none"),
    the two attention GEMMs ("selective"), all six ("full", "flash_full": Korthikanti et al.'s
    full recomputation, 4/3 of the forward and backward's FLOPs [korthikanti2022]). With
    "flash" and "flash_full" the two attention GEMMs are one fused kernel whose ``s x s`` scores
    stay on chip [dao2023], in every pass. These GEMMs are the model's FLOPs; the time of a
    fused kernel's (:func:`fused_attention_time_s`) prices what it executes: the causal mask's
    unmasked half, and the scores recomputed in its backward.

    Their FLOPs per token are ``(24 d^2 + 4 s d + 4 d (f - 4d)) / t`` forward, times 3 with the
    backward: ``Workload.hardware_flops_per_token / (L t)`` for ``f = N/(2 L d) - 2 d``.

    Args:
        seq_len, micro_batch, d_model, n_heads: s, b, d, a.
        ffn_hidden: f; None: ``4 d``.
        tensor_parallel: t (Megatron needs it to divide ``n_heads``; here a GPU's share of
            heads may be fractional, an average).
        recompute: one of :data:`RECOMPUTE_POLICIES`.

    Returns:
        The GEMMs, forward first.
    """
    s, b, d, a, t, f, recompute = _layer_shape(seq_len, micro_batch, d_model, n_heads,
                                               ffn_hidden, tensor_parallel, recompute)
    tokens, head_dim, heads = b * s, d / a, b * a / t
    fused = recompute in FUSED_ATTENTION
    forward = [
        Gemm("qkv", tokens, 3 * d / t, d),
        Gemm("scores", s, s, head_dim, heads, on_chip=("c",) if fused else ()),
        Gemm("attention_over_values", s, head_dim, s, heads, on_chip=("a",) if fused else ()),
        Gemm("output_projection", tokens, d, d / t),
        Gemm("mlp_up", tokens, f / t, d),
        Gemm("mlp_down", tokens, d, f / t),
    ]
    backward = [g for gemm in reversed(forward) for g in _backward(gemm)]
    recomputed = _recomputed(forward, recompute, {"scores", "attention_over_values"})
    return tuple(forward + recomputed + backward)


def transformer_layer_elementwise(seq_len: int, micro_batch: int, d_model: int, n_heads: int,
                                  *, ffn_hidden: float | None = None, tensor_parallel: int = 1,
                                  sequence_parallel: bool = False,
                                  recompute: str = "flash") -> tuple[Elementwise, ...]:
    """The element-wise kernels of one layer, one micro-batch, one tensor-parallel GPU, with
    the HBM bytes each moves (2 bytes a value, 1 a dropout mask; the tensors are those of
    Korthikanti et al.'s activation count [korthikanti2022], ``sbh`` = ``s b d`` values).

    Forward: two LayerNorms (read and write ``sbh``: 4 ``sbh`` bytes each), two dropouts with
    their residual add (read x and the residual, write the sum and a mask: 7), GeLU on the
    ``s b f`` MLP activations (read and write: 4 ``sbf``), and unless a fused policy
    (:data:`FUSED_ATTENTION`) runs them inside the attention kernel, the softmax (4 bytes a
    score) and the attention dropout (5) on the ``b a s^2`` scores. Backward: each reads the
    output's gradient and what it saved and writes the input's gradient: LayerNorm 6 ``sbh``,
    dropout and residual 5, GeLU 6 ``sbf``, softmax 6 and dropout 5 a score. LayerNorm and dropout-residual are replicated on the ``t`` GPUs
    unless ``sequence_parallel`` splits them; the rest is split ``t`` ways. Recomputation runs
    the forward kernels again: all ("full"; "flash_full": all of "flash"'s, no score kernels)
    or the score ones ("selective").

    Args: as :func:`transformer_layer_gemms`, and ``sequence_parallel``.

    Returns:
        The kernels, forward first.
    """
    s, b, d, a, t, f, recompute = _layer_shape(seq_len, micro_batch, d_model, n_heads,
                                               ffn_hidden, tensor_parallel, recompute)
    sbh = s * b * d / (t if sequence_parallel else 1)   # replicated unless sequence parallel
    sbf = s * b * f / t
    scores = b * a * s * s / t
    v, mask = BYTES_PER_VALUE, MASK_BYTES
    forward = [Elementwise("layernorm", 2 * 2 * v * sbh),
               Elementwise("dropout_residual", 2 * (3 * v + mask) * sbh),
               Elementwise("gelu", 2 * v * sbf)]
    backward = [Elementwise("layernorm", 2 * 3 * v * sbh, "dgrad"),
                Elementwise("dropout_residual", 2 * (2 * v + mask) * sbh, "dgrad"),
                Elementwise("gelu", 3 * v * sbf, "dgrad")]
    if recompute not in FUSED_ATTENTION:
        forward += [Elementwise("softmax", 2 * v * scores),
                    Elementwise("attention_dropout", (2 * v + mask) * scores)]
        backward += [Elementwise("softmax", 3 * v * scores, "dgrad"),
                     Elementwise("attention_dropout", (2 * v + mask) * scores, "dgrad")]
    recomputed = _recomputed(forward, recompute, {"softmax", "attention_dropout"})
    return tuple(forward + recomputed + backward)


@functools.lru_cache(maxsize=4096)   # a layout search prices the same layer many times
def transformer_layer_time_s(gpu: GPU, seq_len: int, micro_batch: int, d_model: int,
                             n_heads: int, *, ffn_hidden: float | None = None,
                             tensor_parallel: int = 1, sequence_parallel: bool = False,
                             recompute: str = "flash") -> float:
    """Seconds of one layer's forward, backward and recomputation for one micro-batch on one
    tensor-parallel GPU: :func:`gemm_time_s` of each of :func:`transformer_layer_gemms` plus
    the bytes of :func:`transformer_layer_elementwise` over HBM bandwidth (kernels run one
    after another, none overlapped)."""
    shape = dict(ffn_hidden=ffn_hidden, tensor_parallel=tensor_parallel, recompute=recompute)
    gemms = transformer_layer_gemms(seq_len, micro_batch, d_model, n_heads, **shape)
    elementwise = transformer_layer_elementwise(seq_len, micro_batch, d_model, n_heads,
                                                sequence_parallel=sequence_parallel, **shape)
    return (sum(gemm_time_s(g, gpu) for g in gemms)
            + sum(e.hbm_bytes for e in elementwise) / gpu.hbm_bytes_per_s)


#: Bytes a logit moves through the cross-entropy, forward and backward: Megatron Core's
#: vocabulary-parallel cross-entropy (``megatron/core/tensor_parallel/cross_entropy.py`` as of
#: 2024: ``.float()`` on the logits first) computes in FP32 and keeps the softmax for the backward.
# Counted at one
#: fused pass each way, a lower bound: forward reads the BF16 logit and writes the FP32
#: softmax (2 + 4), backward reads the softmax and writes the BF16 logit gradient (4 + 2).
CROSS_ENTROPY_BYTES_PER_LOGIT = {"forward": 2 + 4, "dgrad": 4 + 2}


def output_layer_gemms(seq_len: int, micro_batch: int, d_model: int, vocab_size: int, *,
                       tensor_parallel: int = 1) -> tuple[Gemm, ...]:
    """The output layer's GEMMs for one micro-batch on one tensor-parallel GPU: the logits
    ``(T x d) @ (d x V/t)`` of ``T = b s`` tokens (Megatron splits the vocabulary over the
    ``t`` GPUs, column-parallel), its dgrad and wgrad. No recomputation: Megatron's full
    recomputation re-runs the transformer layers, not the output layer.

    Their FLOPs per token are ``6 d V / t``, the ``V/(16 l h)`` term of Narayanan et al.'s
    per-iteration count ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` [narayanan2021].

    Raises:
        ValueError: on a size that is not a positive integer.
    """
    s, b = _checks.count("seq_len", seq_len), _checks.count("micro_batch", micro_batch)
    d, vocab = _checks.count("d_model", d_model), _checks.count("vocab_size", vocab_size)
    t = _checks.count("tensor_parallel", tensor_parallel)
    logits = Gemm("logits", b * s, vocab / t, d)
    return (logits, *_backward(logits))


def output_layer_elementwise(seq_len: int, micro_batch: int, vocab_size: int, *,
                             tensor_parallel: int = 1) -> tuple[Elementwise, ...]:
    """The cross-entropy on one tensor-parallel GPU's ``b s V / t`` logits, forward and
    backward (:data:`CROSS_ENTROPY_BYTES_PER_LOGIT`). Its two all-reduces of ``b s`` FP32 values
    (the maximum and the sum over the vocabulary) are left out: 4 bytes a token."""
    s, b = _checks.count("seq_len", seq_len), _checks.count("micro_batch", micro_batch)
    vocab = _checks.count("vocab_size", vocab_size)
    logits = b * s * vocab / _checks.count("tensor_parallel", tensor_parallel)
    return tuple(Elementwise("cross_entropy", per_logit * logits, pass_)
                 for pass_, per_logit in CROSS_ENTROPY_BYTES_PER_LOGIT.items())


@functools.lru_cache(maxsize=1024)
def output_layer_time_s(gpu: GPU, seq_len: int, micro_batch: int, d_model: int,
                        vocab_size: int, *, tensor_parallel: int = 1) -> float:
    """Seconds of the output layer (logits GEMMs, :func:`output_layer_gemms`) and the
    cross-entropy (:func:`output_layer_elementwise`, by bytes over HBM bandwidth) for one
    micro-batch on one tensor-parallel GPU, forward and backward."""
    gemms = output_layer_gemms(seq_len, micro_batch, d_model, vocab_size,
                               tensor_parallel=tensor_parallel)
    elementwise = output_layer_elementwise(seq_len, micro_batch, vocab_size,
                                           tensor_parallel=tensor_parallel)
    return (sum(gemm_time_s(g, gpu) for g in gemms)
            + sum(e.hbm_bytes for e in elementwise) / gpu.hbm_bytes_per_s)


class LayerShape(NamedTuple):
    """The shape of one transformer layer, as :func:`transformer_layer_gemms` takes it."""

    seq_len: int
    micro_batch: int
    d_model: int
    n_heads: int
    ffn_hidden: int


#: The layer labs 08 and 10 time on a host CPU: s 256, b 4, d 512, 32 heads of width 16 (thin
#: enough for attention's GEMMs to be memory-bound there), MLP width 2048.
HOST_LAYER = LayerShape(seq_len=256, micro_batch=4, d_model=512, n_heads=32, ffn_hidden=2048)


#: The GEMMs of :func:`transformer_layer_gemms` in three groups, by name (every pass of each):
#: attention's per-head matmuls, whose ``d/a`` dimension makes them thin at a small head width;
#: the MLP's two; QKV and the output projection.
LAYER_GEMM_GROUPS: dict[str, tuple[str, ...]] = {
    "attention": ("scores", "attention_over_values"),
    "MLP": ("mlp_up", "mlp_down"),
    "projections": ("qkv", "output_projection"),
}


def group_shares(gemms: Sequence[Gemm], seconds: Sequence[float],
                 groups: Mapping[str, Sequence[str]] = LAYER_GEMM_GROUPS) -> dict[str, float]:
    """Each group's share of the GEMMs' total time: how a layer's GEMM time splits.

    The seconds can be measured (``bench.time_gemms``' medians), priced by a roofline, or
    priced by :func:`gemm_time_s` on a GPU; the split is then compared between them.

    Args:
        gemms: the GEMMs, e.g. :func:`transformer_layer_gemms`.
        seconds: one time per GEMM, in the same order (seconds, positive).
        groups: group name -> GEMM names (:data:`LAYER_GEMM_GROUPS` by default); every GEMM's
            name must be in exactly one group.

    Returns:
        group name -> share of the total, in the order of ``groups``; the shares sum to 1.

    Raises:
        ValueError: when the lengths differ, a time is not positive, or a GEMM is in no group
            or in more than one.
    """
    if len(gemms) != len(seconds):
        raise ValueError(f"group_shares needs one time per GEMM: got {len(gemms)} GEMMs and "
                         f"{len(seconds)} times.")
    if not gemms:
        raise ValueError("group_shares needs at least one GEMM.")
    for g, s in zip(gemms, seconds):
        _checks.positive(f"the seconds of {g.pass_} {g.name}", s)
    group_of: dict[str, str] = {}
    for group, names in groups.items():
        for name in names:
            if name in group_of:
                raise ValueError(f"GEMM {name!r} is in two groups, {group_of[name]!r} and "
                                 f"{group!r}: put it in one.")
            group_of[name] = group
    ungrouped = sorted({g.name for g in gemms} - set(group_of))
    if ungrouped:
        raise ValueError(f"GEMMs in no group: {', '.join(ungrouped)}; add them to `groups` "
                         f"(groups now: {', '.join(groups)}).")
    total_s = math.fsum(seconds)
    return {group: math.fsum(s for g, s in zip(gemms, seconds) if group_of[g.name] == group)
            / total_s for group in groups}


# --- Mixture-of-experts layers: grouped expert GEMMs, the router, the token permutations ------

#: Compute streams Transformer Engine spreads a grouped GEMM's per-expert GEMMs over on Hopper
#: in BF16 [te_multi_stream]: ``GroupedLinear`` launches one cuBLAS GEMM per expert, round
#: robin over ``get_num_compute_streams()`` streams (``transformer_engine/common/util/
#: multi_stream.cpp``: 4), so four experts' GEMMs share the SMs at a time.
GROUPED_GEMM_STREAMS = 4


def expert_mlp_gemms(rows: int, d_model: int, expert_mlp_width: int, *,
                     tensor_parallel: int = 1, recompute: str = "flash") -> tuple[Gemm, ...]:
    """The GEMMs of one gated expert MLP over the ``rows`` tokens routed to it, on one
    tensor-parallel GPU: ``expert_fc1`` ``(rows x d) @ (d x 2f/t)`` (gate and up projections
    in one weight, as Megatron Core's grouped experts hold them) and ``expert_fc2``
    ``(rows x f/t) @ (f/t x d)``, each with its dgrad and wgrad; full recomputation
    (:data:`FULL_RECOMPUTE`) runs both forwards again.

    Their FLOPs are ``rows * 6 d f / t`` forward (a gated MLP's three ``d x f`` matrices).

    Raises:
        ValueError: on a size that is not a positive integer or an unknown policy.
    """
    m = _checks.count("rows", rows)
    d, f = _checks.count("d_model", d_model), _checks.count("expert_mlp_width", expert_mlp_width)
    t = _checks.count("tensor_parallel", tensor_parallel)
    policy = _recompute_policy(recompute)
    forward = [Gemm("expert_fc1", m, 2 * f / t, d), Gemm("expert_fc2", m, d, f / t)]
    backward = [g for gemm in reversed(forward) for g in _backward(gemm)]
    return tuple(forward + _recomputed(forward, policy, set()) + backward)


def grouped_gemm_time_s(gemm: Gemm, n_gemms: int, gpu: GPU,
                        streams: int = GROUPED_GEMM_STREAMS) -> float:
    """Seconds of ``n_gemms`` GEMMs of ``gemm``'s shape run as a grouped GEMM: ``streams`` of
    them at a time share the SMs (:data:`GROUPED_GEMM_STREAMS`), so each round is priced as
    one GEMM of ``streams`` times the batch, its tiles in waves together
    (:func:`gemm_time_s`); ``ceil(n_gemms / streams)`` rounds run one after another.

    With one stream this is ``n_gemms`` separate GEMMs, each with its own partial last wave;
    with as many streams as GEMMs, one GEMM of all their tiles.

    Raises:
        ValueError: when ``n_gemms`` or ``streams`` is not a positive integer.
    """
    full_rounds, rest = divmod(_checks.count("n_gemms", n_gemms),
                               _checks.count("streams", streams))

    def round_s(concurrent: int) -> float:
        return gemm_time_s(Gemm(gemm.name, gemm.m, gemm.n, gemm.k, gemm.batch * concurrent,
                                gemm.pass_, gemm.on_chip), gpu)

    return full_rounds * round_s(streams) + (round_s(rest) if rest else 0.0)


def router_gemms(tokens: int, d_model: int, n_experts: int) -> tuple[Gemm, ...]:
    """The router's GEMMs for ``tokens`` tokens: the logits ``(tokens x d) @ (d x E)``, its
    dgrad and wgrad (Megatron Core's ``TopKRouter``: one linear layer, replicated on every
    expert-parallel rank)."""
    logits = Gemm("router", _checks.count("tokens", tokens), _checks.count("n_experts", n_experts),
                  _checks.count("d_model", d_model))
    return (logits, *_backward(logits))


def clamp_bytes_per_row(expert_mlp_width: int, tensor_parallel: int = 1) -> dict[str, float]:
    """HBM bytes a received row moves through a clamped gated activation's clamp, by pass
    [megatron_core_0_15_experts]: ``weighted_bias_quick_geglu_impl`` clamps the gate half and
    the linear half of the ``2f/t`` fc1 output (each read and written, ``2 * 2f/t`` values) and
    concatenates them (read and written again, ``2 * 2f/t``): ``8f/t`` values forward. The
    backward runs each clamp's gradient (read the gradient and the input, write the input's
    gradient: ``3f/t`` each) and the concatenation's, which joins the halves' gradients
    (``2 * 2f/t``): ``10f/t`` values. GPT-OSS clamps at 7 (``activation_func_clamp_value``)."""
    half = _checks.count("expert_mlp_width", expert_mlp_width) / _checks.count(
        "tensor_parallel", tensor_parallel)
    return {"forward": BYTES_PER_VALUE * 8 * half, "dgrad": BYTES_PER_VALUE * 10 * half}


def expert_bias_bytes_per_row(d_model: int) -> dict[str, float]:
    """HBM bytes a received row moves through Megatron Core's expert output bias, by pass
    [megatron_core_0_15_experts]: ``TEGroupedMLP._apply_bias`` adds each expert's fc2 bias
    weighted by the router's probability, ``t + b * p``, in eager PyTorch (BF16 when the router
    runs in BF16, its default): ``b * p`` writes ``d`` values, the sum reads ``2d`` and writes
    ``d``, the ``torch.cat`` of the experts reads and writes ``d``: ``6d`` forward. Backward,
    the gradients of ``b`` and ``p`` each multiply (read ``d``, write ``d``) and reduce (read
    ``d``): ``6d``. A model without expert biases (Mixtral, DeepSeek-V3) has none of it."""
    d = _checks.count("d_model", d_model)
    return {"forward": BYTES_PER_VALUE * 6 * d, "dgrad": BYTES_PER_VALUE * 6 * d}


def moe_elementwise(tokens: int, d_model: int, expert_mlp_width: int, *, top_k: int,
                    n_experts: int, received_rows: int, local_experts: int,
                    tensor_parallel: int = 1, recompute: str = "flash",
                    activation_clamp: bool = False, expert_bias: bool = False,
                    recompute_activation: bool = False) -> tuple[Elementwise, ...]:
    """The memory-bound kernels of one MoE layer on one GPU, with the HBM bytes each moves
    (2 bytes a value; the router's probabilities in FP32, 4): Megatron Core's all-to-all token
    dispatcher [megatron_moe_dispatcher] and its experts' activation.

    Forward: the router's softmax and top-k over ``tokens x E`` logits (read, write: 8 bytes a
    logit); permutation 1, the ``k`` copies of each of the GPU's ``tokens`` gathered in expert
    order before the all-to-all (read ``tokens d``, write ``tokens k d``); permutation 2, with
    more than one local expert, the ``received_rows`` that arrived sorted by local expert
    (read and write ``received_rows d``); the gated activation (SwiGLU) on the received rows'
    ``2f/t`` values, writing ``f/t``; and the combine's mirror of both permutations (sort back,
    read and write ``received_rows d``; un-permute, read ``tokens k d``, write ``tokens d``).
    Backward: each moves the same bytes as its forward, the activation's reading its output's
    gradient and input and writing the input's gradient (``f/t + 2 * 2f/t`` a row). Full
    recomputation (:data:`FULL_RECOMPUTE`) runs the forwards again.

    Args:
        tokens: tokens the GPU routes (a micro-batch's, sequence-split over tp when sequence
            parallel).
        d_model, expert_mlp_width: d and f of one expert.
        top_k, n_experts: k and E.
        received_rows: token copies the GPU's experts compute (the busiest GPU's).
        local_experts: experts the GPU holds (``E / ep``): permutation 2 runs only for > 1.
        tensor_parallel: t, the experts' f split over t GPUs.
        recompute: one of :data:`RECOMPUTE_POLICIES`.
        activation_clamp: the gated activation clamps its input first (GPT-OSS), in eager
            kernels: :func:`clamp_bytes_per_row` a received row.
        expert_bias: the experts' fc2 has a bias, added expert by expert
            (:func:`expert_bias_bytes_per_row` a received row).
        recompute_activation: Megatron Core's ``recompute_modules=["moe_act"]``: the
            activation (and its clamp) discarded after the forward and run again in the
            backward [megatron_core_0_15_experts]. Already counted under full recomputation.

    Returns:
        The kernels, forward first.
    """
    n, rows = _checks.count("tokens", tokens), _checks.count("received_rows", received_rows)
    d, f = _checks.count("d_model", d_model), _checks.count("expert_mlp_width", expert_mlp_width)
    k, e = _checks.count("top_k", top_k), _checks.count("n_experts", n_experts)
    t = _checks.count("tensor_parallel", tensor_parallel)
    local = _checks.count("local_experts", local_experts)
    policy = _recompute_policy(recompute)
    v, prob = BYTES_PER_VALUE, 4
    permute = v * (n * d + n * k * d)
    sort = 2 * v * rows * d if local > 1 else 0.0
    kernels = {"router_softmax_topk": 2 * prob * n * e, "permute": permute + sort,
               "unpermute": permute + sort}
    forward = [Elementwise(name, nbytes) for name, nbytes in kernels.items() if nbytes]
    forward.append(Elementwise("expert_activation", v * rows * 3 * f / t))
    backward = [Elementwise(kernel.name, kernel.hbm_bytes, "dgrad") for kernel in forward[:-1]]
    backward.append(Elementwise("expert_activation", v * rows * 5 * f / t, "dgrad"))
    for name, present, per_row in (
            ("expert_activation_clamp", activation_clamp, clamp_bytes_per_row(f, t)),
            ("expert_bias", expert_bias, expert_bias_bytes_per_row(d))):
        if present:
            forward.append(Elementwise(name, rows * per_row["forward"]))
            backward.append(Elementwise(name, rows * per_row["dgrad"], "dgrad"))
    recomputed = _recomputed(forward, policy, set())
    if recompute_activation and policy not in FULL_RECOMPUTE:
        # "full" marks every op given as recomputed: here only the activation's
        recomputed += _recomputed([k for k in forward if k.name in _ACTIVATION_KERNELS], "full",
                                  set())
    return tuple(forward + recomputed + backward)


#: The kernels Megatron Core's ``moe_act`` recomputation runs again: the gated activation and
#: its clamp (``TEGroupedMLP.forward``'s ``bias_act_func`` [megatron_core_0_15_experts]).
_ACTIVATION_KERNELS = frozenset({"expert_activation", "expert_activation_clamp"})
