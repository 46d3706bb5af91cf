"""Generating text with a small decoder-only transformer: prefill, decode and the KV cache.

A decoder makes one token at a time, each conditioned on all before it. Recomputing the whole
sequence for every new token costs a full forward pass per token; a **KV cache** keeps every
layer's keys and values of the tokens already seen, so that each new token (a **decode step**)
only computes its own query, key and value and attends over the cache. **Prefill** runs the
prompt through the model at once and fills the cache.

The model is :mod:`clusterlab.device.models`' pre-LN transformer block stacked ``L`` times, between
a token and a learned position embedding and an (untied) unembedding to ``V`` logits; fp32
throughout. The cache has a fixed size, ``max_len`` positions, so one compiled decode step
serves every position (no recompilation per token); a mask hides the positions not yet
written. :func:`forward` is the reference without a cache, built on
:func:`clusterlab.device.models.transformer_block`.

Tensor parallelism (Megatron style): every function takes ``axis_name`` (``None`` on one device)
and Megatron's operators ``ops`` (:data:`clusterlab.device.parallel.tensor.MEGATRON`). Inside
``jax.shard_map`` each device holds whole heads of the attention weights and of the cache, and a
slice of the MLP's hidden units; one all-reduce (``g``) completes attention's output projection
and one the MLP's second matmul: ``2 L`` all-reduces per generated token
(:func:`clusterlab.analytic.serving.tensor_parallel_all_reduces_per_token`).

Shapes: ``B`` sequences, ``T`` tokens given at once, ``S`` = ``max_len`` cache positions, ``D``
model width, ``NH`` heads of width ``Dh``, ``H`` MLP hidden width, ``V`` vocabulary.

References:
    Pope et al., "Efficiently Scaling Transformer Inference", MLSys 2023.
    https://arxiv.org/abs/2211.05102
    Shoeybi et al., "Megatron-LM", 2019, Section 3. https://arxiv.org/abs/1909.08053
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from clusterlab import _checks
from clusterlab.device import devices, models
from clusterlab.device.parallel import tensor

Params = dict  # {"embed", "pos", "layers", "ln_f_scale", "ln_f_bias", "unembed"}


class KVCache(NamedTuple):
    """The keys and values of every layer for every cached position.

    Attributes:
        k: one f32[B, NH, S, Dh] array per layer (a tuple of ``L``), the keys.
        v: one f32[B, NH, S, Dh] array per layer, the values.

    Inside a tensor-parallel ``shard_map`` each device holds ``NH/tp`` of the heads. One array
    per layer (rather than one stacked f32[L, ...]) lets XLA update each in place.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]


def init_params(key: jax.Array, *, vocab_size: int, d_model: int, n_heads: int, d_hidden: int,
                n_layers: int, max_len: int) -> Params:
    """Parameters of a decoder-only transformer with ``n_layers`` pre-LN blocks.

    Args:
        key: a ``jax.random`` key; the same key gives the same parameters.
        vocab_size: V, the number of token ids.
        d_model: D, the model width; a multiple of ``n_heads``.
        n_heads: NH, attention heads per layer.
        d_hidden: H, the MLP's hidden width.
        n_layers: L, transformer blocks.
        max_len: S, the most positions a sequence (prompt plus generated tokens) can have; the
            size of the position embedding and of the KV cache.

    Returns:
        ``{"embed": f32[V, D], "pos": f32[S, D], "layers": [L blocks of
        models.init_transformer_block], "ln_f_scale": f32[D], "ln_f_bias": f32[D],
        "unembed": f32[D, V]}``.
    """
    vocab_size = _checks.count("vocab_size", vocab_size)
    d_model = _checks.count("d_model", d_model)
    n_layers = _checks.count("n_layers", n_layers)
    max_len = _checks.count("max_len", max_len)
    k_embed, k_pos, k_out, *k_layers = jax.random.split(key, 3 + n_layers)
    return {
        # Unit-size embeddings, so that attention's output (also of unit size) can change the
        # next token: the cache is then visible in what the model generates.
        "embed": jax.random.normal(k_embed, (vocab_size, d_model), jnp.float32),
        "pos": jax.random.normal(k_pos, (max_len, d_model), jnp.float32),
        "layers": [models.init_transformer_block(k, d_model=d_model, n_heads=n_heads,
                                                 d_hidden=d_hidden) for k in k_layers],
        "ln_f_scale": jnp.ones((d_model,), jnp.float32),
        "ln_f_bias": jnp.zeros((d_model,), jnp.float32),
        # Untied: with the embedding reused, each token would mostly predict itself.
        "unembed": jax.random.normal(k_out, (d_model, vocab_size), jnp.float32)
        / jnp.sqrt(jnp.float32(d_model)),
    }


def max_len_of(params: Params) -> int:
    """S, the positions the model (and its KV cache) can hold."""
    return int(params["pos"].shape[0])


def _embed(params: Params, tokens: jax.Array, start) -> jax.Array:
    # tokens: i32[B, T] at positions start .. start+T-1 -> x: f32[B, T, D]
    positions = jax.lax.dynamic_slice_in_dim(params["pos"], start, tokens.shape[1], axis=0)
    return params["embed"][tokens] + positions


def _logits(params: Params, x: jax.Array) -> jax.Array:
    # x: f32[B, T, D] -> f32[B, T, V]
    return models.layer_norm(x, params["ln_f_scale"], params["ln_f_bias"]) @ params["unembed"]


def forward(params: Params, tokens: jax.Array) -> jax.Array:
    """The whole sequence at once, no cache: the reference every cached run must equal.

    Args:
        params: from :func:`init_params`.
        tokens: i32[B, T], T <= S.

    Returns:
        f32[B, T, V]: at each position, the logits of the next token.
    """
    x = _embed(params, tokens, 0)  # x: f32[B, T, D]
    for block in params["layers"]:
        x = models.transformer_block(block, x)
    return _logits(params, x)


def _copy(x, axis_name, ops):  # Megatron's f where there is a model axis; identity otherwise
    return x if axis_name is None else ops.copy(x, axis_name)


def _reduce(x, axis_name, ops):  # Megatron's g: the all-reduce that completes a partial sum
    return x if axis_name is None else ops.reduce(x, axis_name)


def _attention(block: dict, x: jax.Array, k_cache: jax.Array, v_cache: jax.Array, start,
               axis_name: str | None, ops: tensor.MegatronOps):
    """Attention of T new tokens at positions start.. over the cache, after writing theirs.

    x: f32[B, T, D] normalised; k_cache, v_cache: f32[B, NH(/tp), S, Dh] (this device's heads).
    Returns (f32[B, T, D] replicated, k_cache, v_cache).
    """
    x_in = _copy(x, axis_name, ops)
    q = jnp.einsum("btd,dhe->bhte", x_in, block["wq"])  # q: f32[B, NH/tp, T, Dh]
    k = jnp.einsum("btd,dhe->bhte", x_in, block["wk"])
    v = jnp.einsum("btd,dhe->bhte", x_in, block["wv"])
    k_cache = jax.lax.dynamic_update_slice(k_cache, k, (0, 0, start, 0))
    v_cache = jax.lax.dynamic_update_slice(v_cache, v, (0, 0, start, 0))
    scores = jnp.einsum("bhte,bhse->bhts", q, k_cache) / jnp.sqrt(jnp.float32(q.shape[-1]))
    query_pos = start + jnp.arange(x.shape[1])  # i32[T]
    visible = jnp.arange(k_cache.shape[2])[None, :] <= query_pos[:, None]  # bool[T, S]
    scores = jnp.where(visible, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1)  # weights: f32[B, NH/tp, T, S]
    heads = jnp.einsum("bhts,bhse->bhte", weights, v_cache)  # heads: f32[B, NH/tp, T, Dh]
    partial = jnp.einsum("bhte,hed->btd", heads, block["wo"])  # this device's heads' share
    return _reduce(partial, axis_name, ops), k_cache, v_cache  # g: all-reduce 1 of 2


def _mlp(block: dict, x: jax.Array, axis_name: str | None, ops: tensor.MegatronOps):
    # x: f32[B, T, D] normalised -> f32[B, T, D], hidden units split over the model axis
    hidden = jax.nn.relu(_copy(x, axis_name, ops) @ block["w1"] + block["b1"])  # f32[B,T,H/tp]
    return _reduce(hidden @ block["w2"], axis_name, ops) + block["b2"]  # g: all-reduce 2 of 2


def _run(params: Params, cache: KVCache, tokens: jax.Array, start, axis_name: str | None,
         ops: tensor.MegatronOps) -> tuple[jax.Array, KVCache]:
    """T tokens at positions start.. through every layer, reading and writing the cache."""
    x = _embed(params, tokens, start)  # x: f32[B, T, D], replicated
    keys, values = [], []
    for block, k_cache, v_cache in zip(params["layers"], cache.k, cache.v):
        normed = models.layer_norm(x, block["ln1_scale"], block["ln1_bias"])
        attended, k_cache, v_cache = _attention(block, normed, k_cache, v_cache, start,
                                                axis_name, ops)
        x = x + attended
        x = x + _mlp(block, models.layer_norm(x, block["ln2_scale"], block["ln2_bias"]),
                     axis_name, ops)
        keys.append(k_cache)
        values.append(v_cache)
    return _logits(params, x), KVCache(tuple(keys), tuple(values))


def empty_cache(params: Params, batch: int, cache_len: int | None = None) -> KVCache:
    """A zero KV cache for ``batch`` sequences, with the heads of ``params`` (all, or a shard's).

    Args:
        params: from :func:`init_params` (or one device's shard of them).
        batch: B, sequences.
        cache_len: S, positions to hold, at most ``max_len_of(params)`` (the default).

    Returns:
        A :class:`KVCache` of ``L`` pairs of f32[B, NH, S, Dh] zeros:
        ``memory.kv_cache_bytes(L, NH, Dh, S, B, bytes_per_element=4)`` bytes.
    """
    batch = _checks.count("batch", batch)
    length = _cache_len(params, cache_len)
    zeros = tuple(jnp.zeros((batch, block["wk"].shape[1], length, block["wk"].shape[2]),
                            jnp.float32) for block in params["layers"])  # wk: f32[D, NH, Dh]
    return KVCache(zeros, zeros)


def _cache_len(params: Params, cache_len: int | None) -> int:
    if cache_len is None:
        return max_len_of(params)
    cache_len = _checks.count("cache_len", cache_len)
    if cache_len > max_len_of(params):
        raise ValueError(f"cache_len ({cache_len}) is longer than the model's position "
                         f"embedding (max_len {max_len_of(params)}); use at most that, or "
                         "init_params(max_len=...).")
    return cache_len


def _prefill(params, tokens, cache_len=None, axis_name=None, ops=tensor.MEGATRON):
    # Checked while tracing (shapes are static), so the tensor-parallel programs check too.
    cache = empty_cache(params, tokens.shape[0], _check_tokens(tokens, params, cache_len))
    return _run(params, cache, tokens, 0, axis_name, ops)


def _decode_step(params, cache, token, position, axis_name=None, ops=tensor.MEGATRON):
    logits, cache = _run(params, cache, token[:, None], position, axis_name, ops)
    return logits[:, 0], cache  # f32[B, V]


def _decode_loop(params, cache, token, position, n_steps: int, axis_name=None,
                 ops=tensor.MEGATRON):
    """``n_steps`` greedy decode steps in one ``fori_loop``: i32[B, n_steps] tokens, the cache."""
    tokens = jnp.zeros((token.shape[0], n_steps), jnp.int32)

    def step(i, carry):
        tokens, cache, token = carry
        logits, cache = _decode_step(params, cache, token, position + i, axis_name, ops)
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)  # greedy: i32[B]
        return tokens.at[:, i].set(token), cache, token

    tokens, cache, _ = jax.lax.fori_loop(0, n_steps, step, (tokens, cache, token))
    return tokens, cache


def _generate(params, prompt, n_new: int, cache_len=None, axis_name=None,
              ops=tensor.MEGATRON):
    length = _check_tokens(prompt, params, cache_len)  # before reading prompt.shape[1]
    n_new = _check_room(prompt.shape[1], n_new, length)
    logits, cache = _prefill(params, prompt, cache_len, axis_name, ops)
    first = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)  # i32[B], from the prompt
    if n_new == 1:
        return first[:, None]
    rest, _ = _decode_loop(params, cache, first, prompt.shape[1], n_new - 1, axis_name, ops)
    return jnp.concatenate([first[:, None], rest], axis=1)


def _check_tokens(tokens, params: Params, cache_len: int | None = None) -> int:
    """Check a prompt's shape and dtype and that it fits the cache; return the cache length."""
    length = _cache_len(params, cache_len)
    if jnp.ndim(tokens) != 2 or not jnp.issubdtype(jnp.result_type(tokens), jnp.integer):
        raise ValueError(f"The tokens must be an integer array of shape [batch, length], got "
                         f"shape {jnp.shape(tokens)} and dtype {jnp.result_type(tokens)}.")
    if tokens.shape[1] > length:
        raise ValueError(f"{tokens.shape[1]} tokens are more than the cache holds ({length}); "
                         "use a shorter prompt or a longer cache_len/max_len.")
    return length


def _check_room(length: int, n_new: int, cache_len: int) -> int:
    n_new = _checks.count("n_new", n_new)
    if length + n_new - 1 > cache_len:
        raise ValueError(f"A prompt of {length} tokens and {n_new} new ones need "
                         f"{length + n_new - 1} cache positions, more than the cache's "
                         f"{cache_len}; generate fewer tokens or use a longer cache.")
    return n_new


_jit_prefill = jax.jit(_prefill, static_argnames="cache_len")
_jit_decode_step = jax.jit(_decode_step)
_jit_decode_loop = jax.jit(_decode_loop, static_argnames="n_steps")
_jit_generate = jax.jit(_generate, static_argnames=("n_new", "cache_len"))


def prefill(params: Params, tokens: jax.Array, *,
            cache_len: int | None = None) -> tuple[jax.Array, KVCache]:
    """Run a prompt through the model at once and fill a fresh KV cache with it.

    Args:
        params: from :func:`init_params`.
        tokens: i32[B, T], the prompts (all of the same length T <= S).
        cache_len: S, the cache's positions (default the model's ``max_len``): shorter caches
            for shorter sequences, with the same weights.

    Returns:
        ``(logits, cache)``: f32[B, T, V] (equal to :func:`forward`'s), and a :class:`KVCache`
        whose positions 0..T-1 hold the prompt's keys and values (the rest zeros).
    """
    return _jit_prefill(params, tokens, cache_len=cache_len)


def decode_step(params: Params, cache: KVCache, token: jax.Array,
                position) -> tuple[jax.Array, KVCache]:
    """One decode step: the next token of every sequence from its last token and the cache.

    The step writes the token's keys and values at ``position`` and attends over positions
    0..position; it reads every weight once and the whole cache (all S positions, masked).

    Args:
        params: from :func:`init_params`.
        cache: the :class:`KVCache` of :func:`prefill` or of the previous step.
        token: i32[B], each sequence's latest token.
        position: its position, the same for every sequence (i32 scalar, 0 <= position < S).

    Returns:
        ``(logits, cache)``: f32[B, V] for the token after ``token``, and the updated cache.
    """
    length = cache.k[0].shape[2]
    if isinstance(position, int) and not 0 <= position < length:
        raise ValueError(f"position {position} is outside the cache (0 to {length - 1}); "
                         "use a longer cache (prefill's cache_len, init_params' max_len).")
    return _jit_decode_step(params, cache, jnp.asarray(token, jnp.int32),
                            jnp.asarray(position, jnp.int32))


def decode_loop(params: Params, cache: KVCache, token: jax.Array, position,
                n_steps: int) -> tuple[jax.Array, KVCache]:
    """``n_steps`` greedy decode steps compiled into one loop (what :func:`generate` runs).

    Args:
        params: from :func:`init_params`.
        cache: a :class:`KVCache` holding positions 0..position-1.
        token: i32[B], the token at ``position``.
        position: i32 scalar.
        n_steps: decode steps, each making one token per sequence.

    Returns:
        ``(tokens, cache)``: i32[B, n_steps], the tokens after ``token``, and the cache.
    """
    n_steps = _checks.count("n_steps", n_steps)
    return _jit_decode_loop(params, cache, jnp.asarray(token, jnp.int32),
                            jnp.asarray(position, jnp.int32), n_steps=n_steps)


def generate(params: Params, prompt: jax.Array, n_new: int, *,
             cache_len: int | None = None) -> jax.Array:
    """Greedy generation with the KV cache: prefill, then ``n_new - 1`` decode steps.

    Compiled once for a prompt shape and ``n_new``: the decode steps run in a ``fori_loop`` over
    a fixed-size cache.

    Args:
        params: from :func:`init_params`.
        prompt: i32[B, T].
        n_new: tokens to generate per sequence, with T + n_new - 1 <= S.
        cache_len: S, as in :func:`prefill`.

    Returns:
        i32[B, n_new], each the argmax of the logits after the tokens before it.
    """
    return _jit_generate(params, prompt, n_new=n_new, cache_len=cache_len)


@functools.partial(jax.jit, static_argnames="n_new")
def _generate_without_cache(params, prompt, n_new):
    positions = _check_tokens(prompt, params)  # before reading prompt.shape[1]
    n_new = _check_room(prompt.shape[1], n_new, positions)
    length = prompt.shape[1]
    buffer = jnp.zeros((prompt.shape[0], length + n_new), jnp.int32).at[:, :length].set(prompt)

    def step(i, buffer):
        # The whole buffer each time; the causal mask keeps the unwritten tail out of position
        # length+i-1, whose logits choose the next token.
        logits = forward(params, buffer[:, :length + n_new - 1])
        last = jax.lax.dynamic_index_in_dim(logits, length + i - 1, axis=1, keepdims=False)
        return buffer.at[:, length + i].set(jnp.argmax(last, axis=-1).astype(jnp.int32))

    return jax.lax.fori_loop(0, n_new, step, buffer)[:, length:]


def generate_without_cache(params: Params, prompt: jax.Array, n_new: int) -> jax.Array:
    """Greedy generation by recomputing the whole sequence for every token: the reference.

    Args:
        params: from :func:`init_params`.
        prompt: i32[B, T].
        n_new: tokens to generate, with T + n_new - 1 <= S.

    Returns:
        i32[B, n_new], what :func:`generate` must return.
    """
    return _generate_without_cache(params, prompt, n_new=n_new)


# --- Tensor parallelism ---------------------------------------------------------------------


def model_specs(params: Params, axis_name: str) -> Params:
    """PartitionSpecs of :func:`init_params`' parameters split Megatron's way over ``axis_name``.

    Each layer as :func:`clusterlab.device.parallel.tensor.param_specs` splits a transformer block
    (heads of ``wq``, ``wk``, ``wv``, ``wo``; ``w1`` by columns, ``w2`` by rows); embeddings,
    final LayerNorm and unembedding replicated.
    """
    specs = {name: P() for name in params if name != "layers"}
    specs["layers"] = [tensor.param_specs(block, axis_name) for block in params["layers"]]
    return specs


def cache_specs(params: Params, axis_name: str) -> KVCache:
    """PartitionSpecs of the KV cache: every layer's keys and values split by heads."""
    spec = tuple(P(None, axis_name, None, None) for _ in params["layers"])
    return KVCache(spec, spec)


def check_mesh(params: Params, mesh: Mesh, axis_name: str) -> int:
    """The tensor-parallel degree, after checking it divides the heads and the hidden width.

    Raises:
        ValueError: when ``axis_name`` is not in ``mesh``, or its size does not divide the
            number of heads or the MLP's hidden width (the message names a size that would).
    """
    tp = devices.axis_size(mesh, axis_name)
    tensor.check_params(params["layers"][0], tp)  # one layer's heads and hidden width
    return tp


def shard_model(params: Params, mesh: Mesh, axis_name: str) -> Params:
    """Place ``params`` on ``mesh`` split as :func:`model_specs` says, after :func:`check_mesh`."""
    check_mesh(params, mesh, axis_name)
    return jax.tree.map(lambda leaf, spec: devices.shard(leaf, mesh, spec), params,
                        model_specs(params, axis_name))


def _shard_mapped(fn, params: Params, mesh: Mesh, axis_name: str, in_specs, out_specs,
                  check_vma: bool):
    check_mesh(params, mesh, axis_name)
    # On one device f and g are identities and nothing is replicated across it (tensor.py).
    check = check_vma and devices.axis_size(mesh, axis_name) > 1
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                 check_vma=check))


def make_tp_generate(params: Params, mesh: Mesh, axis_name: str, *, n_new: int,
                     cache_len: int | None = None, ops: tensor.MegatronOps = tensor.MEGATRON,
                     check_vma: bool = True):
    """Greedy generation with the heads and the MLP split over ``axis_name`` (``jax.shard_map``).

    Args:
        params: the (unsharded) parameters, to read shapes.
        mesh: the mesh; ``axis_name`` is the tensor-parallel axis.
        axis_name: the tensor-parallel axis.
        n_new: tokens to generate per sequence.
        cache_len: S, as in :func:`prefill`.
        ops: Megatron's ``f`` and ``g``; swap ``g`` for an identity to leave the all-reduces
            out and see the checks catch it.
        check_vma: shard_map's replication checking; with it on, logits left partial (not
            all-reduced) are refused at trace time, since the output is declared replicated.

    Returns:
        ``generate(sharded_params, prompt) -> i32[B, n_new]``: ``sharded_params`` from
        :func:`shard_model`, ``prompt`` i32[B, T] replicated.
    """
    n_new = _checks.count("n_new", n_new)
    body = functools.partial(_generate, n_new=n_new, cache_len=_cache_len(params, cache_len),
                             axis_name=axis_name, ops=ops)
    return _shard_mapped(body, params, mesh, axis_name, (model_specs(params, axis_name), P()),
                         P(), check_vma)


def make_tp_decode_step(params: Params, mesh: Mesh, axis_name: str, *,
                        ops: tensor.MegatronOps = tensor.MEGATRON, check_vma: bool = True):
    """One tensor-parallel decode step, the program whose all-reduces a generated token costs.

    Returns:
        ``step(sharded_params, cache, token, position) -> (logits, cache)``: the cache split by
        heads (:func:`cache_specs`), ``token`` i32[B] and ``position`` i32[] replicated,
        ``logits`` f32[B, V] replicated.
    """
    body = functools.partial(_decode_step, axis_name=axis_name, ops=ops)
    specs = cache_specs(params, axis_name)
    return _shard_mapped(body, params, mesh, axis_name,
                         (model_specs(params, axis_name), specs, P(), P()), (P(), specs),
                         check_vma)


def make_tp_prefill(params: Params, mesh: Mesh, axis_name: str, *,
                    cache_len: int | None = None, ops: tensor.MegatronOps = tensor.MEGATRON,
                    check_vma: bool = True):
    """Tensor-parallel prefill: ``prefill(sharded_params, tokens) -> (logits, cache)``.

    ``tokens`` i32[B, T] replicated; ``logits`` f32[B, T, V] replicated; the cache of
    ``cache_len`` positions (default ``max_len``) split by heads (:func:`cache_specs`), each
    device holding ``1/tp`` of it. Options as in :func:`make_tp_generate`.
    """
    body = functools.partial(_prefill, cache_len=_cache_len(params, cache_len),
                             axis_name=axis_name, ops=ops)
    return _shard_mapped(body, params, mesh, axis_name, (model_specs(params, axis_name), P()),
                         (P(), cache_specs(params, axis_name)), check_vma)
