"""Small models in plain JAX, and the single-device training run every parallel form must equal.

Two models, both fp32, both seeded and deterministic:

* a stack of residual MLP blocks, ``block(x) = x + relu(x @ w1 + b1) @ w2 + b2``, the model of
  the data, tensor, pipeline and sharded-data-parallel labs;
* one pre-LayerNorm transformer block (causal multi-head self-attention, then an MLP), whose
  attention heads tensor parallelism splits across devices.

Parameters are plain pytrees (lists and dicts of arrays), so ``jax.tree`` functions, shardings
and ``optax`` apply to them directly. :func:`reference_train` trains on one device with
``optax.adam``; :mod:`clusterlab.device.parallel` holds the parallel versions and checks them
against it.

References:
    He et al., "Deep Residual Learning for Image Recognition", CVPR 2016 (residual blocks).
    Vaswani et al., "Attention Is All You Need", NeurIPS 2017 (multi-head attention).
    Xiong et al., "On Layer Normalization in the Transformer Architecture", ICML 2020 (pre-LN).
    Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
import optax

from clusterlab import _checks

# A pytree of arrays (dicts and lists of jax.Array or NumPy arrays). Any, because JAX has no
# static pytree type; the docstrings give each tree's structure and shapes.
Params: TypeAlias = Any
LossFn = Callable[..., jax.Array]

_LAYER_NORM_EPS = 1e-5


def _normal(key: jax.Array, shape: Sequence[int], fan_in: int) -> jax.Array:
    return jax.random.normal(key, shape, jnp.float32) / jnp.sqrt(jnp.float32(fan_in))


def init_mlp(key: jax.Array, *, d_model: int, d_hidden: int, n_blocks: int) -> list[dict]:
    """Parameters of ``n_blocks`` residual MLP blocks.

    Weights are drawn from N(0, 1/fan_in); ``w2`` is scaled down by ``sqrt(n_blocks)`` so the
    residual stream keeps its size however deep the stack; biases start at zero.

    Args:
        key: a ``jax.random`` key; the same key gives the same parameters.
        d_model: D, the width of the residual stream.
        d_hidden: H, the hidden width of each block.
        n_blocks: how many blocks.

    Returns:
        A list of ``n_blocks`` dicts ``{"w1": f32[D, H], "b1": f32[H], "w2": f32[H, D],
        "b2": f32[D]}``: ``n_blocks * (2*D*H + H + D)`` parameters in all.
    """
    d_model = _checks.count("d_model", d_model)
    d_hidden = _checks.count("d_hidden", d_hidden)
    n_blocks = _checks.count("n_blocks", n_blocks)
    blocks = []
    for block_key in jax.random.split(key, n_blocks):
        k1, k2 = jax.random.split(block_key)
        blocks.append({
            "w1": _normal(k1, (d_model, d_hidden), d_model),
            "b1": jnp.zeros((d_hidden,), jnp.float32),
            "w2": _normal(k2, (d_hidden, d_model), d_hidden) / jnp.sqrt(jnp.float32(n_blocks)),
            "b2": jnp.zeros((d_model,), jnp.float32),
        })
    return blocks


def mlp_block(block: dict, x: jax.Array) -> jax.Array:
    """One residual MLP block: ``x + relu(x @ w1 + b1) @ w2 + b2``.

    Args:
        block: ``{"w1": f32[D, H], "b1": f32[H], "w2": f32[H, D], "b2": f32[D]}``.
        x: f32[..., D].

    Returns:
        f32[..., D].
    """
    hidden = jax.nn.relu(x @ block["w1"] + block["b1"])  # hidden: f32[..., H]
    return x + hidden @ block["w2"] + block["b2"]


def mlp_forward(params: Sequence[dict], x: jax.Array) -> jax.Array:
    """The MLP stack: the blocks of :func:`init_mlp` applied in order.

    Args:
        params: a list of blocks from :func:`init_mlp`.
        x: f32[B, D].

    Returns:
        f32[B, D].
    """
    for block in params:
        x = mlp_block(block, x)
    return x


def mse_loss(params: Params, x: jax.Array, y: jax.Array, *,
             forward: Callable[[Params, jax.Array], jax.Array] = mlp_forward) -> jax.Array:
    """Mean squared error of ``forward(params, x)`` against ``y``, averaged over all elements.

    A mean over the batch is what makes data parallelism exact: with equal shards, the mean of
    the per-device means is the mean over the whole batch, and so are the gradients.

    Args:
        params: the model's parameters.
        x: f32[B, ...] inputs.
        y: f32[B, ...] targets, shaped like ``forward``'s output.
        forward: the model (default :func:`mlp_forward`; :func:`transformer_block` works too).

    Returns:
        f32[] scalar loss.
    """
    return jnp.mean((forward(params, x) - y) ** 2)


def init_transformer_block(key: jax.Array, *, d_model: int, n_heads: int,
                           d_hidden: int) -> dict:
    """Parameters of one pre-LN transformer block (causal self-attention, then an MLP).

    The attention weights keep the head as its own axis, so splitting heads across devices is
    slicing one axis (``wq[:, h0:h1]`` and ``wo[h0:h1]``), and :func:`transformer_block` reads the
    number of heads from the shapes.

    Args:
        key: a ``jax.random`` key.
        d_model: D, the model width; a multiple of ``n_heads``.
        n_heads: NH, the number of attention heads; each has width Dh = D / NH.
        d_hidden: H, the MLP's hidden width.

    Returns:
        ``{"ln1_scale": f32[D], "ln1_bias": f32[D], "wq", "wk", "wv": f32[D, NH, Dh],
        "wo": f32[NH, Dh, D], "ln2_scale": f32[D], "ln2_bias": f32[D], "w1": f32[D, H],
        "b1": f32[H], "w2": f32[H, D], "b2": f32[D]}``.
    """
    d_model = _checks.count("d_model", d_model)
    n_heads = _checks.count("n_heads", n_heads)
    d_hidden = _checks.count("d_hidden", d_hidden)
    if d_model % n_heads:
        raise ValueError(f"d_model ({d_model}) must be a multiple of n_heads ({n_heads}), so "
                         f"every head has the same width; pick d_model = n_heads * head width.")
    d_head = d_model // n_heads
    kq, kk, kv, ko, k1, k2 = jax.random.split(key, 6)
    ones = jnp.ones((d_model,), jnp.float32)
    zeros = jnp.zeros((d_model,), jnp.float32)
    return {
        "ln1_scale": ones, "ln1_bias": zeros,
        "wq": _normal(kq, (d_model, n_heads, d_head), d_model),
        "wk": _normal(kk, (d_model, n_heads, d_head), d_model),
        "wv": _normal(kv, (d_model, n_heads, d_head), d_model),
        "wo": _normal(ko, (n_heads, d_head, d_model), d_model),
        "ln2_scale": ones, "ln2_bias": zeros,
        "w1": _normal(k1, (d_model, d_hidden), d_model),
        "b1": jnp.zeros((d_hidden,), jnp.float32),
        "w2": _normal(k2, (d_hidden, d_model), d_hidden),
        "b2": zeros,
    }


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    """LayerNorm over the last axis: f32[..., D] with f32[D] scale and bias."""
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + _LAYER_NORM_EPS) * scale + bias


def causal_attention(params: dict, x: jax.Array) -> jax.Array:
    """Causal multi-head self-attention with the heads in ``params`` (all, or a slice of them).

    With only some heads' weights (a tensor-parallel shard), it returns those heads'
    contribution to the output; the contributions of all heads sum to the full attention.

    Args:
        params: ``{"wq", "wk", "wv": f32[D, NH, Dh], "wo": f32[NH, Dh, D]}`` (other keys ignored).
        x: f32[B, S, D], already normalised.

    Returns:
        f32[B, S, D].
    """
    q = jnp.einsum("bsd,dhe->bhse", x, params["wq"])  # q: f32[B, NH, S, Dh]
    k = jnp.einsum("bsd,dhe->bhse", x, params["wk"])
    v = jnp.einsum("bsd,dhe->bhse", x, params["wv"])
    d_head = q.shape[-1]
    scores = jnp.einsum("bhse,bhte->bhst", q, k) / jnp.sqrt(jnp.float32(d_head))
    seq = x.shape[1]
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))  # position s sees t <= s
    scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1)  # weights: f32[B, NH, S, S]
    heads = jnp.einsum("bhst,bhte->bhse", weights, v)  # heads: f32[B, NH, S, Dh]
    return jnp.einsum("bhse,hed->bsd", heads, params["wo"])


def transformer_block(params: dict, x: jax.Array) -> jax.Array:
    """One pre-LN transformer block: ``h = x + attn(ln1(x))``, ``out = h + mlp(ln2(h))``.

    Args:
        params: from :func:`init_transformer_block`.
        x: f32[B, S, D].

    Returns:
        f32[B, S, D].
    """
    h = x + causal_attention(params, layer_norm(x, params["ln1_scale"], params["ln1_bias"]))
    normed = layer_norm(h, params["ln2_scale"], params["ln2_bias"])
    hidden = jax.nn.relu(normed @ params["w1"] + params["b1"])  # hidden: f32[B, S, H]
    return h + hidden @ params["w2"] + params["b2"]


def synthetic_regression(key: jax.Array, *, n_samples: int,
                         d_model: int) -> tuple[jax.Array, jax.Array]:
    """A regression task a small MLP can learn: ``y = tanh(x @ W) + 0.1 x`` for a random W.

    Args:
        key: a ``jax.random`` key; the same key gives the same data.
        n_samples: N, the number of examples.
        d_model: D, the input and output width.

    Returns:
        ``(x, y)``: f32[N, D] each.
    """
    n_samples = _checks.count("n_samples", n_samples)
    d_model = _checks.count("d_model", d_model)
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (n_samples, d_model), jnp.float32)
    teacher = _normal(kw, (d_model, d_model), d_model) * 2.0  # teacher: f32[D, D]
    return x, jnp.tanh(x @ teacher) + 0.1 * x


def make_batches(x: jax.Array, y: jax.Array, *, batch_size: int,
                 n_steps: int) -> list[tuple[jax.Array, jax.Array]]:
    """``n_steps`` consecutive batches of ``batch_size`` examples, wrapping around the data.

    Args:
        x: f32[N, ...] inputs.
        y: f32[N, ...] targets.
        batch_size: B, examples per step (the global batch, over all devices).
        n_steps: how many batches.

    Returns:
        A list of ``(x_batch, y_batch)``, each f32[B, ...].
    """
    batch_size = _checks.count("batch_size", batch_size)
    n_steps = _checks.count("n_steps", n_steps)
    n = x.shape[0]
    if y.shape[0] != n:
        raise ValueError(f"x and y must have the same number of examples, got {n} and "
                         f"{y.shape[0]}.")
    if batch_size > n:
        raise ValueError(f"batch_size ({batch_size}) is larger than the data ({n} examples); "
                         "use a smaller batch or more samples.")
    batches = []
    for step in range(n_steps):
        idx = (jnp.arange(batch_size) + step * batch_size) % n
        batches.append((x[idx], y[idx]))
    return batches


def make_optimizer(learning_rate: float = 1e-3) -> optax.GradientTransformation:
    """Adam with a constant learning rate, the optimizer of every lab.

    Args:
        learning_rate: the step size.

    Returns:
        ``optax.adam(learning_rate)``.
    """
    return optax.adam(_checks.positive("learning_rate", learning_rate))


def make_train_step(loss_fn: LossFn, optimizer: optax.GradientTransformation) -> Callable:
    """A jitted single-device training step: loss, gradients, one optimizer update.

    Args:
        loss_fn: ``loss_fn(params, x, y) -> f32[]``.
        optimizer: an ``optax`` gradient transformation.

    Returns:
        ``step(params, opt_state, x, y) -> (params, opt_state, loss)``.
    """
    @jax.jit
    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def run_steps(step: Callable, params, opt_state, batches: Iterable[tuple], *,
              place: Callable = lambda x, y: (x, y),
              loss_value: Callable = np.asarray) -> tuple:
    """Apply a training step to each batch in turn: the loop every strategy's ``train`` shares.

    Args:
        step: ``step(params, opt_state, x, y) -> (params, opt_state, loss)``.
        params: parameters as ``step`` takes them (placed or sharded already).
        opt_state: optimizer state as ``step`` takes it.
        batches: ``(x, y)`` pairs, one per step, each the global batch.
        place: puts one batch where ``step`` expects it (a device, a sharding).
        loss_value: turns ``step``'s loss into one number (e.g. a mean over devices).

    Returns:
        ``(params, opt_state, losses)``, the losses a NumPy f32[n_steps] on the host.

    Raises:
        ValueError: when ``batches`` is empty.
    """
    losses = []
    for x, y in batches:
        params, opt_state, loss = step(params, opt_state, *place(x, y))
        losses.append(np.asarray(loss_value(loss), dtype=np.float32))
    if not losses:
        raise ValueError("training got no batches; pass at least one (x, y) pair.")
    return params, opt_state, np.stack(losses)


def reference_train(params: Params, batches: Iterable[tuple[jax.Array, jax.Array]], *,
                    loss_fn: LossFn = mse_loss,
                    optimizer: optax.GradientTransformation | None = None,
                    ) -> tuple[Params, jax.Array]:
    """Train on one device: the run every parallel strategy must reproduce.

    Args:
        params: initial parameters.
        batches: ``(x, y)`` pairs, one per step, each the global batch.
        loss_fn: ``loss_fn(params, x, y) -> f32[]`` (default :func:`mse_loss`).
        optimizer: default ``make_optimizer()`` (Adam, learning rate 1e-3).

    Returns:
        ``(params, losses)``: the trained parameters and the loss before each update, a NumPy
        f32[n_steps] on the host.
    """
    optimizer = make_optimizer() if optimizer is None else optimizer
    device = jax.devices()[0]
    params = jax.device_put(params, device)
    opt_state = optimizer.init(params)
    step = make_train_step(loss_fn, optimizer)
    params, _, losses = run_steps(step, params, opt_state, batches,
                                  place=lambda x, y: jax.device_put((x, y), device))
    return params, losses


def reference_gradients(params: Params, x: jax.Array, y: jax.Array, *,
                        loss_fn: LossFn = mse_loss) -> Params:
    """The gradient of the loss on the whole batch, on one device: what parallel steps must apply.

    Checking a parallel step's gradients against this one sees the bugs Adam hides: Adam
    divides each update by the gradient's running size, so a gradient ``p`` times too large
    (summed instead of averaged over ``p`` devices) trains to almost the same parameters, while
    the gradients themselves differ by a factor of ``p``.

    Args:
        params: the model's parameters (one copy).
        x: f32[B, ...], the global batch.
        y: f32[B, ...], its targets.
        loss_fn: ``loss_fn(params, x, y) -> f32[]`` (default :func:`mse_loss`).

    Returns:
        The gradient, a pytree shaped like ``params``, as NumPy arrays on the host.
    """
    device = jax.devices()[0]
    grads = jax.jit(jax.grad(loss_fn))(*jax.device_put((params, x, y), device))
    return jax.tree.map(np.asarray, jax.device_get(grads))


def stack_copies(tree: Params, n: int) -> Params:
    """``n`` copies of every leaf stacked along a new leading axis: f32[...] -> f32[n, ...].

    What ``n`` devices that all hold ``tree`` hold together; compare a parallel step's per-device
    gradients (one row per device) with ``stack_copies(reference_gradients(...), p)``.

    Args:
        tree: a pytree of arrays.
        n: how many copies, at least 1.

    Returns:
        The pytree of NumPy arrays, each leaf ``[n, *leaf.shape]`` (read-only broadcast views).
    """
    n = _checks.count("n", n)
    return jax.tree.map(lambda leaf: np.broadcast_to(np.asarray(leaf), (n, *np.shape(leaf))),
                        tree)


def param_count(params: Params) -> int:
    """The number of scalars in a parameter pytree."""
    return sum(int(leaf.size) for leaf in jax.tree.leaves(params))


def param_bytes(params: Params) -> int:
    """The bytes of a parameter pytree (what one full gradient of it weighs, too)."""
    return sum(int(leaf.size) * leaf.dtype.itemsize for leaf in jax.tree.leaves(params))


def max_abs_diff(a: Params, b: Params) -> float:
    """The largest absolute difference between two pytrees of the same structure.

    Computed on the host, so the two may live on different devices or shardings.
    """
    diffs = jax.tree.leaves(jax.tree.map(
        lambda u, v: float(np.max(np.abs(np.asarray(u) - np.asarray(v)), initial=0.0)), a, b))
    return max(diffs, default=0.0)


#: The recomputation policies of :func:`recompute_policy`, as
#: :func:`clusterlab.analytic.memory.transformer_block_activation_bytes` names them.
RECOMPUTE = ("none", "selective", "full")


def _output_avals(primitive, avals, params) -> list:
    """The abstract outputs of one jaxpr equation, from its inner jaxpr or abstract evaluation."""
    for key in ("call_jaxpr", "jaxpr", "fun_jaxpr"):
        inner = params.get(key)
        if inner is not None and hasattr(inner, "out_avals"):
            return list(inner.out_avals)
    out = primitive.abstract_eval(*avals, **params)
    if isinstance(out, tuple) and len(out) == 2 and not hasattr(out[1], "shape"):
        out = out[0]  # (avals, effects)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def recompute_policy(recompute: str, *, seq_len: int) -> Callable[..., bool]:
    """The ``jax.checkpoint`` policy of a recomputation level for :func:`transformer_block`.

    * ``"none"``: ``jax.checkpoint_policies.everything_saveable``, as if no checkpoint;
    * ``"selective"``: save every intermediate except those shaped like the attention scores
      (last two axes ``seq_len x seq_len``: the scores, the mask applied to them, their
      exponentials and softmax), so the backward pass recomputes the scores and the softmax
      from the kept Q and K, Korthikanti et al.'s selective recomputation. A policy by shape,
      because ``causal_attention`` names none of its values (``checkpoint_name``);
      ``dots_with_no_batch_dims_saveable`` would also recompute the LayerNorms, the ReLU and
      the heads;
    * ``"full"``: ``jax.checkpoint_policies.nothing_saveable``, only the block's input kept.

    Args:
        recompute: ``"none"``, ``"selective"`` or ``"full"``.
        seq_len: S, the sequence length, which makes a value an attention-score tensor.

    Returns:
        A policy for ``jax.checkpoint(..., policy=...)``.

    References:
        JAX, "Gradient checkpointing with jax.checkpoint" (policies), JAX 0.10.2.
        Korthikanti et al., MLSys 2023, Section 5 (selective recomputation).
        https://arxiv.org/abs/2205.05198
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}.")
    seq = _checks.count("seq_len", seq_len)
    if recompute == "none":
        return jax.checkpoint_policies.everything_saveable
    if recompute == "full":
        return jax.checkpoint_policies.nothing_saveable

    def save_all_but_scores(primitive, *avals, **params) -> bool:
        outs = _output_avals(primitive, avals, params)
        return not any(tuple(getattr(o, "shape", ()))[-2:] == (seq, seq) for o in outs)

    return save_all_but_scores


def init_transformer_stack(key: jax.Array, *, n_blocks: int, d_model: int, n_heads: int,
                           d_hidden: int) -> dict:
    """``n_blocks`` transformer blocks' parameters stacked on a leading axis, for a scan.

    Returns:
        The dict of :func:`init_transformer_block` with every leaf ``f32[L, ...]``.
    """
    n_blocks = _checks.count("n_blocks", n_blocks)
    blocks = [init_transformer_block(k, d_model=d_model, n_heads=n_heads, d_hidden=d_hidden)
              for k in jax.random.split(key, n_blocks)]
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *blocks)


def transformer_stack_loss(stacked: dict, x: jax.Array, y: jax.Array, *,
                           recompute: str = "none") -> jax.Array:
    """Mean squared error of L transformer blocks run in a ``jax.lax.scan``, each checkpointed.

    Each block is ``jax.checkpoint(transformer_block, policy=recompute_policy(recompute))``.
    The scan matters: the backward pass is its own loop, so XLA cannot merge the recomputed
    forward with the original one (in an unrolled program on XLA:CPU, JAX 0.10.2, its common
    subexpression elimination did, and the memory saving vanished).

    Args:
        stacked: from :func:`init_transformer_stack`, leaves ``f32[L, ...]``.
        x: f32[B, S, D] inputs.
        y: f32[B, S, D] targets.
        recompute: ``"none"``, ``"selective"`` or ``"full"`` (:func:`recompute_policy`).

    Returns:
        f32[] scalar loss.
    """
    block = jax.checkpoint(transformer_block,
                           policy=recompute_policy(recompute, seq_len=x.shape[1]))
    out, _ = jax.lax.scan(lambda h, params: (block(params, h), None), x, stacked)
    return jnp.mean((out - y) ** 2)
