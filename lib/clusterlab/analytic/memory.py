"""Training memory per device: model states under the ZeRO stages, and checkpoint sizes.

Mixed-precision training with Adam keeps, for every one of the ``N`` parameters:

* the parameter in 16-bit (``bytes_param = 2``),
* its gradient in 16-bit (``bytes_grad = 2``),
* the optimizer state in 32-bit: a master copy of the parameter, Adam's momentum and its
  variance, 4 + 4 + 4 = 12 bytes (``optimizer_bytes_per_param = 12``).

That is 16 bytes per parameter, the "model states" of the ZeRO paper (the default). Megatron-LM
trains in BF16 but accumulates and all-reduces gradients in FP32 ("main grads",
``fp32_grad_accumulation=True``): 2 + 4 + 12 = 18 bytes per parameter, the count of its
distributed optimizer's documentation. Plain data parallelism
replicates all of them on every device; ZeRO partitions them across the ``dp`` data-parallel
devices in three stages (optimizer state, then gradients, then parameters). Activations are
counted apart, per layer: :func:`transformer_layer_activation_bytes` (Korthikanti et al.'s
16-bit layer) and :func:`transformer_block_activation_bytes` (the course's fp32 block, as lab 15
reads it from the compiled program).
Serving keeps the weights and a key-value cache instead (:func:`kv_cache_bytes`).

Units: bytes (1 GB = 1e9 bytes, as the paper counts).

References:
    Rajbhandari, Rasley, Ruwase & He, "ZeRO: Memory Optimizations Toward Training Trillion
    Parameter Models", SC 2020. https://arxiv.org/abs/1910.02054 (section 3.1 and Figure 1).
    Megatron Core User Guide, "Distributed Optimizer": bytes per parameter, "float16 param,
    fp32 grads" 18 without the distributed optimizer, ``6 + 12/d`` with it (16-bit meaning
    FP16 or BF16).
    https://docs.nvidia.com/megatron-core/developer-guide/latest/distrib_optimizer.html
"""

from __future__ import annotations

import math

from clusterlab import _checks
from clusterlab._checks import positive as _check_positive
from clusterlab.analytic import gemm

ZERO_STAGES = (0, 1, 2, 3)

#: Bytes of an FP32 gradient ("main grad"), which Megatron-LM accumulates and all-reduces in
#: place of the 16-bit gradient (``fp32_grad_accumulation=True``).
FP32_GRAD_BYTES = 4


def training_memory_per_device(n_params: float, dp: int, zero_stage: int, *,
                               bytes_param: float = 2, bytes_grad: float = 2,
                               optimizer_bytes_per_param: float = 12,
                               fp32_grad_accumulation: bool = False) -> float:
    """Bytes of model states (parameters, gradients, optimizer state) each device holds.

    With ``N = n_params``, ``P = bytes_param``, ``G = bytes_grad``, ``K =
    optimizer_bytes_per_param``:

    * stage 0 (plain data parallelism): ``(P + G + K) N``
    * stage 1 (optimizer state sharded): ``(P + G) N + K N / dp``
    * stage 2 (and gradients): ``P N + (G + K) N / dp``
    * stage 3 (and parameters): ``(P + G + K) N / dp``

    Args:
        n_params: number of model parameters ``N``.
        dp: data-parallel degree, the number of devices the states are sharded across.
        zero_stage: 0, 1, 2 or 3.
        bytes_param: bytes per parameter as the model computes with it (2 for BF16/FP16).
        bytes_grad: bytes per gradient element (2 for BF16/FP16).
        optimizer_bytes_per_param: bytes of optimizer state per parameter (12 for mixed-precision
            Adam: FP32 master weights, momentum and variance).
        fp32_grad_accumulation: keep gradients in FP32 (``G = FP32_GRAD_BYTES``), as Megatron-LM
            does for BF16 training: 18 bytes per parameter instead of 16 at stage 0. False (the
            default): the ZeRO paper's 16-bit gradients.

    Returns:
        Bytes per device. For 7.5e9 parameters and dp = 64: 120e9, 31.4e9, 16.6e9 and 1.88e9
        for stages 0 to 3 (the paper's Figure 1).

    Raises:
        ValueError: on a bad size or stage, or ``fp32_grad_accumulation`` with a ``bytes_grad``
            other than the default (give one of the two).

    References:
        Rajbhandari et al., "ZeRO", SC 2020, section 5 and Figure 1.
        https://arxiv.org/abs/1910.02054
        Megatron-LM, "Distributed Optimizer" (18 bytes with FP32 gradients), see the module.
    """
    _check_positive("n_params", n_params)
    if fp32_grad_accumulation:
        if bytes_grad != 2:
            raise ValueError(f"fp32_grad_accumulation sets bytes_grad to {FP32_GRAD_BYTES}; got "
                             f"bytes_grad={bytes_grad!r} too. Give one of the two.")
        bytes_grad = FP32_GRAD_BYTES
    if not isinstance(dp, int) or isinstance(dp, bool) or dp < 1:
        raise ValueError(f"dp (the data-parallel degree) must be a positive integer, got {dp!r}.")
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero_stage must be one of {ZERO_STAGES}, got {zero_stage!r}.")
    _check_positive("bytes_param", bytes_param)
    _check_positive("bytes_grad", bytes_grad, allow_zero=True)
    _check_positive("optimizer_bytes_per_param", optimizer_bytes_per_param, allow_zero=True)
    if zero_stage == 0:
        replicated, sharded = bytes_param + bytes_grad + optimizer_bytes_per_param, 0.0
    elif zero_stage == 1:
        replicated, sharded = bytes_param + bytes_grad, optimizer_bytes_per_param
    elif zero_stage == 2:
        replicated, sharded = bytes_param, bytes_grad + optimizer_bytes_per_param
    else:
        replicated, sharded = 0.0, bytes_param + bytes_grad + optimizer_bytes_per_param
    return float(n_params * (replicated + sharded / dp))


def checkpoint_bytes(n_params: float, *, bytes_param: float = 2,
                     optimizer_bytes_per_param: float = 12) -> float:
    """Bytes of a full training checkpoint: parameters plus optimizer state.

    A checkpoint that training can resume from bit for bit must hold the parameters and the whole
    optimizer state (for mixed-precision Adam the FP32 master weights, momentum and variance);
    gradients are recomputed by the next step and are not saved. That is ``(P + K) N``, 14 bytes
    per parameter with the defaults. Sharded over ``dp`` devices the total is the same; each
    device writes ``1/dp`` of it. A weights-only export for inference is ``P N`` (pass
    ``optimizer_bytes_per_param=0``).

    Args:
        n_params: number of model parameters ``N``.
        bytes_param: bytes per saved parameter (2 for BF16).
        optimizer_bytes_per_param: bytes of optimizer state per parameter (12 for Adam with FP32
            master weights; 0 for weights only).

    Returns:
        Bytes; 980e9 (980 GB) for a 70e9-parameter model with the defaults.

    References:
        Rajbhandari et al., "ZeRO", SC 2020, section 3.1 (what the model states are).
        https://arxiv.org/abs/1910.02054
    """
    _check_positive("n_params", n_params)
    _check_positive("bytes_param", bytes_param)
    _check_positive("optimizer_bytes_per_param", optimizer_bytes_per_param, allow_zero=True)
    return float(n_params * (bytes_param + optimizer_bytes_per_param))


#: The policies of the course's fp32 block (:func:`transformer_block_activation_bytes`); a
#: layer (:func:`transformer_layer_activation_bytes`) takes every one of
#: :data:`clusterlab.analytic.gemm.RECOMPUTE_POLICIES`, the FlashAttention ones too.
ACTIVATION_RECOMPUTE = ("none", "selective", "full")


def transformer_layer_activation_bytes(seq_len: int, micro_batch: int, hidden: int,
                                       n_heads: int, *, tensor_parallel: int = 1,
                                       sequence_parallel: bool = False,
                                       recompute: str = "none",
                                       n_kv_heads: int | None = None) -> float:
    """Bytes of activations one transformer layer keeps for its backward pass, per device.

    With 16-bit activations (2 bytes per value, 1-byte dropout masks), sequence length ``s``,
    micro-batch ``b``, hidden size ``h``, ``a`` attention heads and tensor-parallel degree ``t``:

    * no parallelism: ``s b h (34 + 5 a s / h)``: 34 bytes per token and hidden unit for the
      attention block's and MLP's inputs, outputs and masks, and ``5 a s / h`` for the attention
      scores, their softmax and its dropout mask, which grow with ``s``;
    * tensor parallelism: ``s b h (10 + 24/t + 5 a s / (h t))``: the LayerNorms and dropouts
      outside the split layers (10) stay replicated;
    * with sequence parallelism too: ``s b h (34/t + 5 a s / (h t))``, everything split ``t`` ways;
    * ``recompute="selective"`` drops the ``5 a s / h`` attention term (recomputed in the
      backward pass). A FlashAttention kernel never stores the scores and recomputes them
      blockwise in its backward pass (it keeps only ``O(s)`` softmax statistics per head,
      Dao 2023, FlashAttention-2, arXiv:2307.08691), so ``recompute="flash"`` keeps the
      same bytes: the memory of a layer with FlashAttention, the default since 2022-23;
    * ``recompute="full"`` keeps only the layer's input, ``2 s b h`` (``/ t`` with sequence
      parallelism), Korthikanti et al.'s ``2 s b h L`` for ``L`` layers; ``"flash_full"``
      (full recomputation with a FlashAttention kernel) keeps the same input. Neither term
      has an ``s^2``: the bytes double when ``s`` doubles. The one layer being recomputed
      holds its activations again during its backward, transiently; that working set is
      not counted here (Korthikanti et al. leave it out too), although with unfused
      attention ("full") it holds that layer's ``5 a s^2 b / t`` bytes of scores;
    * grouped-query attention (``n_kv_heads`` = ``g`` < ``a``): the stored K and V, ``2 s b h``
      bytes each of the 24 split ones, shrink to ``g / a`` of that, so the 24 become
      ``24 - 4 (1 - g / a)``.

    Args:
        seq_len: s, tokens per sequence.
        micro_batch: b, sequences per micro-batch.
        hidden: h, the hidden size.
        n_heads: a, attention heads.
        tensor_parallel: t, the tensor-parallel degree.
        sequence_parallel: whether LayerNorm and dropout are split along the sequence as well.
        recompute: one of :data:`clusterlab.analytic.gemm.RECOMPUTE_POLICIES`: ``"none"``,
            ``"selective"``, ``"full"``, ``"flash"`` or ``"flash_full"``.
        n_kv_heads: g, key/value heads (grouped-query attention); None: ``a``.

    Returns:
        Bytes per device for one layer. GPT-3 (s = 2048, h = 12288, a = 96) with b = 1 and no
        parallelism: 2048 * 12288 * (34 + 80) = 2.87e9 bytes.

    References:
        Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
        MLSys 2023, Section 4 and Table 2. https://arxiv.org/abs/2205.05198
    """
    s = _checks.count("seq_len", seq_len)
    b = _checks.count("micro_batch", micro_batch)
    h = _checks.count("hidden", hidden)
    a = _checks.count("n_heads", n_heads)
    t = _checks.count("tensor_parallel", tensor_parallel)
    g = a if n_kv_heads is None else _checks.count("n_kv_heads", n_kv_heads)
    if g > a:
        raise ValueError(f"n_kv_heads ({g}) exceeds the {a} attention heads; give at most "
                         f"n_heads (n_heads: multi-head attention).")
    if recompute not in gemm.RECOMPUTE_POLICIES:
        raise ValueError(f"recompute must be one of {gemm.RECOMPUTE_POLICIES}, got "
                         f"{recompute!r}.")
    if recompute in gemm.FULL_RECOMPUTE:          # only the layer's input is kept
        return float(s * b * h * 2 / (t if sequence_parallel else 1))
    scores_kept = recompute == "none"             # "selective" and "flash" never keep them
    attention_scores = 5 * a * s / (h * t) if scores_kept else 0.0
    split = 24 - 4 * (1 - g / a)       # K and V (2 s b h bytes each) shrink to g / a
    rest = (10 + split) / t if sequence_parallel else 10 + split / t
    return float(s * b * h * (rest + attention_scores))


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, seq_len: int, batch: int,
                   bytes_per_element: float = 2, *, latent_dim: int | None = None,
                   rope_key_dim: int = 0) -> int:
    """Bytes of the key-value cache a decoder keeps while it generates.

    Every layer stores, for every token already seen and every key-value head, one key and one
    value vector of ``head_dim`` numbers, so the cache holds
    ``2 * n_layers * n_kv_heads * head_dim * seq_len * batch * bytes_per_element`` bytes. With
    grouped-query attention (GQA) several query heads share one key-value head, so
    ``n_kv_heads`` is smaller than the number of query heads, and the cache shrinks by that
    factor. An FP8 cache (``bytes_per_element=1``) halves a BF16 one.

    With multi-head latent attention (MLA, DeepSeek-V2 and V3) a layer caches, per token, one
    compressed latent of ``latent_dim`` numbers (``d_c``) from which every head's key and value
    are rebuilt, plus one decoupled RoPE key of ``rope_key_dim`` numbers (``d_h^R``) shared by
    the heads: ``(latent_dim + rope_key_dim) * n_layers * seq_len * batch * bytes_per_element``
    bytes, and ``n_kv_heads`` and ``head_dim`` drop out (they are still checked). DeepSeek-V3
    (61 layers, ``d_c = 512``, ``d_h^R = 64``) caches 576 numbers per token per layer where
    multi-head attention with its 128 heads of 128 would cache 32,768.

    Args:
        n_layers: transformer layers (integer >= 1).
        n_kv_heads: key-value heads per layer (integer >= 1; the query heads with plain
            multi-head attention, fewer with GQA, 1 with multi-query attention).
        head_dim: numbers per head (integer >= 1).
        seq_len: tokens cached per sequence, prompt plus generated so far (integer >= 0).
        batch: sequences cached (integer >= 0).
        bytes_per_element: bytes per cached number (2 for BF16/FP16, 1 for FP8).
        latent_dim: ``None`` (default) for multi-head, grouped-query or multi-query attention;
            the MLA latent width ``d_c`` (integer >= 1) to count an MLA cache.
        rope_key_dim: the MLA decoupled RoPE key width ``d_h^R`` (integer >= 0); only with
            ``latent_dim``.

    Returns:
        Bytes, rounded up to a whole byte. A Llama-3-70B-like model (80 layers, 8 KV heads,
        head_dim 128) in BF16 caches 327,680 bytes per token, 1.34e9 bytes for one 4,096-token
        sequence.

    Raises:
        ValueError: if a size is not a whole number in range, ``bytes_per_element`` is not
            positive, or ``rope_key_dim`` is given without ``latent_dim``.

    References:
        Pope et al., "Efficiently Scaling Transformer Inference", MLSys 2023, Section 2.
        https://arxiv.org/abs/2211.05102
        Ainslie et al., "GQA: Training Generalized Multi-Query Transformer Models from
        Multi-Head Checkpoints", EMNLP 2023. https://arxiv.org/abs/2305.13245
        DeepSeek-AI, "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts
        Language Model", 2024, Section 2.1 and Table 1 (MLA caches ``(d_c + d_h^R) l``
        elements per token). https://arxiv.org/abs/2405.04434
    """
    layers = _checks.count("n_layers", n_layers)
    heads = _checks.count("n_kv_heads", n_kv_heads)
    dim = _checks.count("head_dim", head_dim)
    tokens = _checks.count("seq_len", seq_len, minimum=0)
    sequences = _checks.count("batch", batch, minimum=0)
    per_value = _check_positive("bytes_per_element", bytes_per_element)
    if latent_dim is None:
        if rope_key_dim != 0:
            raise ValueError(f"rope_key_dim={rope_key_dim!r} counts only in an MLA cache: pass "
                             "latent_dim too (DeepSeek-V3: latent_dim=512, rope_key_dim=64)")
        per_token_layer = 2 * heads * dim          # a key and a value per KV head
    else:
        per_token_layer = (_checks.count("latent_dim", latent_dim)
                           + _checks.count("rope_key_dim", rope_key_dim, minimum=0))
    return math.ceil(per_token_layer * layers * tokens * sequences * per_value)


#: How :func:`transformer_block_activation_bytes` counts: ``"minimal"``, the tensors the
#: backward pass needs (Korthikanti et al.'s way), or ``"jax"``, what JAX 0.10.2's autodiff of
#: :func:`clusterlab.device.models.transformer_block` keeps in the compiled program (XLA:CPU).
ACTIVATION_COUNTS = ("minimal", "jax")


def transformer_block_activation_bytes(seq_len: int, micro_batch: int, hidden: int,
                                       n_heads: int, mlp_hidden: int, *,
                                       recompute: str = "none", bytes_per_element: float = 4,
                                       count: str = "minimal") -> float:
    """Bytes of activations the course's transformer block keeps for its backward pass.

    The block is :func:`clusterlab.device.models.transformer_block`: pre-LayerNorm, causal
    multi-head attention, a ReLU MLP of width ``H = mlp_hidden``, fp32 (``v = bytes_per_element =
    4``), no dropout. With sequence length ``s``, micro-batch ``b``, hidden size ``h`` and ``a``
    heads it counts tensor by tensor, in one of two ways: ``count="minimal"``, what the backward
    pass needs, as :func:`transformer_layer_activation_bytes` counts it
    (:func:`_minimal_block_values` derives it and compares it with Korthikanti et al.'s count), or
    ``count="jax"``, what JAX 0.10.2 keeps when it differentiates the block op by op
    (:func:`_jax_block_values`). ``recompute="full"`` keeps only the block's input, ``v sbh``, under
    either count.

    Args:
        seq_len: s, tokens per sequence.
        micro_batch: b, sequences per micro-batch.
        hidden: h, the model width.
        n_heads: a, attention heads.
        mlp_hidden: H, the MLP's hidden width (``d_hidden`` of
            :func:`clusterlab.device.models.init_transformer_block`).
        recompute: ``"none"``, ``"selective"`` (scores and softmax recomputed) or ``"full"``
            (only the block's input kept).
        bytes_per_element: v, bytes per activation value (4 for the course's fp32).
        count: ``"minimal"`` or ``"jax"`` (see above).

    Returns:
        Bytes for one block. For s = 64, b = 2, h = 32, a = 4, H = 128 in fp32: 327,680
        minimal and 547,072 as JAX keeps them, without recomputation.

    Raises:
        ValueError: on a size that is not a positive integer, an unknown ``recompute`` or
            ``count``, or a ``bytes_per_element`` that is not positive.

    References:
        Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
        MLSys 2023, Section 4. https://arxiv.org/abs/2205.05198
        Chen et al., "Training Deep Nets with Sublinear Memory Cost", 2016 (recomputation).
        https://arxiv.org/abs/1604.06174
    """
    s = _checks.count("seq_len", seq_len)
    b = _checks.count("micro_batch", micro_batch)
    h = _checks.count("hidden", hidden)
    a = _checks.count("n_heads", n_heads)
    big_h = _checks.count("mlp_hidden", mlp_hidden)
    v = _check_positive("bytes_per_element", bytes_per_element)
    if recompute not in ACTIVATION_RECOMPUTE:
        raise ValueError(f"recompute must be one of {ACTIVATION_RECOMPUTE}, got {recompute!r}.")
    if count not in ACTIVATION_COUNTS:
        raise ValueError(f"count must be one of {ACTIVATION_COUNTS}, got {count!r}.")
    if recompute == "full":
        return float(v * s * b * h)
    selective = recompute == "selective"
    if count == "minimal":
        return float(v * _minimal_block_values(s, b, h, a, big_h, selective=selective))
    return float(v * _jax_block_values(s, b, h, a, big_h, selective=selective)
                 + s * b * big_h)   # + the ReLU's 1-byte mask


def _minimal_block_values(s: int, b: int, h: int, a: int, big_h: int, *,
                          selective: bool) -> int:
    """Values the block's backward pass needs, tensor by tensor:

    * attention: the LayerNorm's input ``sbh``; its output, the Q/K/V projections' input
      ``sbh``; Q, K and V for the two attention matmuls ``3 sbh``; the softmax output, read by
      the softmax's backward and by ``weights @ V``'s, ``a s^2 b``; the heads, input of the
      output projection, ``sbh``;
    * MLP: the second LayerNorm's input ``sbh``; its output, the first matmul's input ``sbh``;
      the ReLU's output ``sbH``, the second matmul's input, which also says where the ReLU
      passed its gradient (so its input is not needed);

    in all ``8 sbh + sbH + a s^2 b``. ``selective`` (recomputation) recomputes the scores and
    softmax from the kept Q and K, dropping ``a s^2 b``.

    How this differs from Korthikanti et al.'s ``sbh (34 + 5as/h)``: their values are 16-bit
    (``v = 2``, not 4); their dropouts keep 1-byte masks (``2 sbh`` after attention and MLP,
    ``a s^2 b`` after the softmax) and the dropped-out softmax (``2 a s^2 b``), none here; their
    GeLU keeps its input and output (``2 sbH``), the ReLU only its output. With ``v = 2``,
    ``H = 4h``, those masks and a GeLU, the count above is theirs: ``2(8 + 4 + 4) sbh + 2 sbh =
    34 sbh`` and ``2 + 1 + 2 = 5 a s^2 b``.
    """
    tokens = s * b
    kept_scores = 0 if selective else a * s * s * b
    return 8 * tokens * h + tokens * big_h + kept_scores


def _jax_block_values(s: int, b: int, h: int, a: int, big_h: int, *, selective: bool) -> int:
    """Values JAX 0.10.2 keeps when it differentiates the block op by op, as the compiled
    program holds them (XLA:CPU; measured in ``tests/test_memory_recompute.py``):

    * each LayerNorm keeps ``x - mean``, twice it (the square's derivative), the normalised
      input and its output: ``4 sbh``, not 2; and its per-token ``rsqrt`` and that
      ``rsqrt``'s derivative factor, ``2 sb``, and the scale broadcast, ``h``;
    * attention: Q, K, V and the heads, ``4 sbh``; the softmax keeps its exponentials and its
      output, ``2 a s^2 b`` (JAX differentiates ``jax.nn.softmax`` through ``exp`` and the
      division), and two per-row values (the row sum and the square of its inverse) ``2 asb``;
    * the ReLU keeps its output ``sbH`` and a 1-byte mask of where its input was positive
      (``sbH`` bytes, which the caller adds: they are not ``v``-byte values).

    ``12 sbh + sbH + 2 a s^2 b + 4 sb + 2 asb + 2 h`` values in all. JAX's own list of
    residuals (``jax.ad_checkpoint.print_saved_residuals``) also names the masked scores, the
    causal mask and ReLU's zeros; the compiled program keeps none of them. Under the
    selective policy of :func:`clusterlab.device.models.recompute_policy` the ``2 a s^2 b`` go and
    the softmax's row maximum, one more ``asb``, is kept instead (``selective``).
    """
    tokens = s * b
    kept_scores = 0 if selective else 2 * a * s * s * b
    per_row = (3 if selective else 2) * a * s * b
    return 12 * tokens * h + tokens * big_h + kept_scores + 4 * tokens + per_row + 2 * h
