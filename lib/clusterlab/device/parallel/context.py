"""Context parallelism: attention over a sequence split across devices (ring and Ulysses).

A long sequence's activations do not fit one device, so the sequence axis is split over a mesh
axis of p devices (``n_devices`` in the code; shapes in comments write p). Everything in a transformer layer but attention is token-wise and needs no
communication; attention needs every key and value. Two ways to get them, both here beside the
single-device reference they must match (:func:`reference_attention`):

* **Ring attention** (:func:`ring_attention`, Liu et al. 2023): each device keeps its queries and
  passes its key/value block around a ring with ``jax.lax.ppermute``, p-1 steps, folding each
  block it receives into an *online softmax* accumulator (running max, running sum, unnormalised
  output; Milakov & Gimelshein 2018), so no device ever holds the whole sequence's scores.
* **Ulysses** (:func:`ulysses_attention`, Jacobs et al. 2023): one all-to-all turns the
  sequence-sharded q, k, v into head-sharded ones (every device: the whole sequence, H/p heads),
  attention runs locally, and a second all-to-all turns the output back.

With a causal mask, a contiguous split is uneven: device i's queries see i+1 of the p key blocks,
so the last device works p times as long as the first. The *zig-zag* placement of Llama 3's
context parallelism (Dubey et al. 2024: cut the sequence into 2p chunks, give device i chunks i
and 2p-1-i; Brandon et al. 2023 stripe tokens round-robin for the same end) gives every device
the same work:
:func:`causal_blocks_per_device` counts it, and :func:`ring_attention` skips the masked blocks
and counts what it computed, so the two can be compared.

Layout: q, k, v are ``f32[B, S, H, Dh]`` (batch, sequence, heads, head size) globally, split
along the sequence axis (axis 1); inside ``shard_map`` each device holds ``f32[B, S/p, H, Dh]``.
The sequence's order on the devices is a *placement* (``"contiguous"`` or ``"zigzag"``):
:func:`to_placement` reorders a global array so that ``P(None, axis)`` gives each device its
tokens, :func:`from_placement` undoes it.

Communication: ``jax.lax.ppermute`` and ``jax.lax.all_to_all`` directly
(``clusterlab.device.collectives`` has no ring-shift or all-to-all wrapper yet). Their transposes
(JAX 0.10.2) are the reverse ``ppermute`` and the inverse ``all_to_all``, so gradients need no
hand-written backward.

References:
    Liu, Zaharia & Abbeel, "Ring Attention with Blockwise Transformers for Near-Infinite
    Context", 2023, https://arxiv.org/abs/2310.01889 (``liu2023ring``).
    Jacobs et al., "DeepSpeed Ulysses", 2023, https://arxiv.org/abs/2309.14509
    (``jacobs2023ulysses``).
    Brandon et al., "Striped Attention: Faster Ring Attention for Causal Transformers", 2023,
    https://arxiv.org/abs/2311.09431 (``brandon2023striped``).
    Dubey et al., "The Llama 3 Herd of Models", 2024, section 3.3.2 (``dubey2024``).
    Milakov & Gimelshein, "Online normalizer calculation for softmax", 2018,
    https://arxiv.org/abs/1805.02867 (``milakov2018online``).
"""

from __future__ import annotations

import functools
from typing import Callable, Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from clusterlab.device.devices import axis_size
from clusterlab.device.parallel._common import varying

Placement = Literal["contiguous", "zigzag"]
PLACEMENTS = get_args(Placement)
SEQ_AXIS = 1          # q, k, v: f32[B, S, H, Dh]
HEAD_AXIS = 2
_MASKED = -1e30       # a masked score: finite, so no inf - inf in the running max


class Accumulator(NamedTuple):
    """The online-softmax state of one block of queries (Milakov & Gimelshein 2018).

    Attributes:
        max: f32[B, H, Sq], the largest score seen so far per query (``_MASKED`` before any).
        sum: f32[B, H, Sq], the sum of ``exp(score - max)`` over the keys seen so far.
        out: f32[B, Sq, H, Dh], the sum of ``exp(score - max) * v`` (not yet divided by ``sum``).
    """

    max: jax.Array
    sum: jax.Array
    out: jax.Array


# update(acc, scores, mask, v) -> acc: folds one block of scores into the accumulator.
BlockUpdate = Callable[[Accumulator, jax.Array, jax.Array, jax.Array], Accumulator]


class Traffic(NamedTuple):
    """The collectives one forward pass of an attention layer makes, per device.

    Attributes:
        kind: the XLA opcode, ``"collective-permute"`` (ring) or ``"all-to-all"`` (Ulysses).
        n_ops: how many of them.
        result_bytes: bytes of each one's result per device (as :mod:`clusterlab.device.hlo`
        counts). total_bytes: their sum.
        sent_bytes_per_device: bytes that leave each device: a ring step sends its whole
            buffer, an all-to-all keeps 1/p of its own and sends (p-1)/p.
    """

    kind: str
    n_ops: int
    result_bytes: tuple[int, ...]
    total_bytes: int
    sent_bytes_per_device: float


# --- checks and placement -------------------------------------------------------------------

def check_placement(placement: str) -> None:
    """Raise a ValueError unless ``placement`` is ``"contiguous"`` or ``"zigzag"``."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}; got {placement!r}.")


def chunks_per_device(placement: Placement) -> int:
    """How many chunks of the sequence one device holds: 1 contiguous, 2 zig-zag."""
    check_placement(placement)
    return 1 if placement == "contiguous" else 2


def check_sequence(seq_len: int, n_devices: int, placement: Placement) -> None:
    """Raise a ValueError unless a sequence of ``seq_len`` splits into the placement's chunks.

    Contiguous needs ``seq_len`` divisible by p; zig-zag by 2p (two chunks per device).
    """
    parts = chunks_per_device(placement) * n_devices
    if seq_len % parts:
        raise ValueError(
            f"A {placement} placement on {n_devices} devices cuts the sequence into {parts} equal "
            f"chunks, but its length {seq_len} is not a multiple of {parts}; pad or trim it to "
            f"{(seq_len // parts + 1) * parts} (or {seq_len // parts * parts}) tokens.")


def check_heads(n_heads: int, n_devices: int) -> None:
    """Raise a ValueError unless ``n_heads`` splits over p devices (Ulysses' head sharding)."""
    if n_heads % n_devices:
        divisors = [d for d in range(1, n_devices + 1) if n_heads % d == 0]
        raise ValueError(
            f"Ulysses gives each of the {n_devices} devices n_heads/p whole heads, but {n_heads} heads "
            f"do not split {n_devices} ways; use a device count that divides the heads (at most "
            f"{max(divisors)} here) or ring attention, which splits the sequence only.")


def chunk_order(n_devices: int, placement: Placement) -> np.ndarray:
    """The sequence's chunks in device order: device d holds entries ``c*d .. c*d + c-1``.

    Contiguous: ``[0, 1, ..., p-1]``. Zig-zag (2p chunks): device i holds chunks i and
    2p-1-i, so ``[0, 2p-1, 1, 2p-2, ...]``.

    Returns:
        int[c * p], chunk indices, c = :func:`chunks_per_device`.
    """
    if chunks_per_device(placement) == 1:
        return np.arange(n_devices)
    return np.stack([np.arange(n_devices), 2 * n_devices - 1 - np.arange(n_devices)], axis=1).reshape(-1)


def token_order(seq_len: int, n_devices: int, placement: Placement) -> np.ndarray:
    """Original token positions in device order: ``x[:, token_order(...)]`` is placed.

    Returns:
        int[S]: entry j is the position in the sequence of the j-th token laid out.
    """
    check_sequence(seq_len, n_devices, placement)
    n_chunks = chunks_per_device(placement) * n_devices
    chunk = seq_len // n_chunks
    return (chunk_order(n_devices, placement)[:, None] * chunk + np.arange(chunk)).reshape(-1)


def to_placement(x: jax.typing.ArrayLike, n_devices: int, placement: Placement) -> jax.Array:
    """Reorder a global ``f32[B, S, ...]`` so that splitting axis 1 p ways gives the placement.

    Run it before placing the array on the mesh (on the host or one device): reordering an
    already sharded array makes the compiler move tokens between devices.
    """
    return jnp.take(jnp.asarray(x), token_order(jnp.shape(x)[SEQ_AXIS], n_devices, placement),
                    axis=SEQ_AXIS)


def from_placement(x: jax.typing.ArrayLike, n_devices: int, placement: Placement) -> jax.Array:
    """The inverse of :func:`to_placement`: tokens back in sequence order."""
    order = token_order(jnp.shape(x)[SEQ_AXIS], n_devices, placement)
    return jnp.take(jnp.asarray(x), np.argsort(order), axis=SEQ_AXIS)


# --- the single-device reference and the online softmax --------------------------------------

def reference_attention(q: jax.typing.ArrayLike, k: jax.typing.ArrayLike,
                        v: jax.typing.ArrayLike, *, causal: bool) -> jax.Array:
    """Softmax attention on one device, the whole score matrix at once.

    Args:
        q, k, v: f32[B, S, H, Dh].
        causal: whether position s sees only positions t <= s.

    Returns:
        f32[B, S, H, Dh]: ``softmax(q k^T / sqrt(Dh)) v`` per head.
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    scores = jnp.einsum("bshe,bthe->bhst", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    if causal:
        seq = q.shape[SEQ_AXIS]
        scores = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), scores, _MASKED)
    weights = jax.nn.softmax(scores, axis=-1)                   # f32[B, H, S, S]
    return jnp.einsum("bhst,bthe->bshe", weights, v)


def empty_accumulator(q: jax.Array) -> Accumulator:
    """The accumulator of queries ``q`` (f32[B, Sq, H, Dh]) before any key is seen."""
    b, sq, h, _ = q.shape
    return Accumulator(jnp.full((b, h, sq), _MASKED, q.dtype), jnp.zeros((b, h, sq), q.dtype),
                       jnp.zeros_like(q))


def online_softmax_update(acc: Accumulator, scores: jax.Array, mask: jax.Array,
                          v: jax.Array) -> Accumulator:
    """Fold one block of keys into the accumulator (Milakov & Gimelshein 2018).

    The new running max ``m' = max(m, max_t s_t)``; the old sum and output were computed
    against ``m``, so both are rescaled by ``exp(m - m')`` before the block's terms
    ``exp(s_t - m')`` are added. The max only keeps ``exp`` in range: the result does not
    depend on it, so it is held out of differentiation (``stop_gradient``).

    Args:
        acc: the accumulator of the block's queries.
        scores: f32[B, H, Sq, Sk], ``q k^T / sqrt(Dh)``.
        mask: bool[Sq, Sk], True where query s may see key t.
        v: f32[B, Sk, H, Dh], the block's values.

    Returns:
        The updated accumulator.
    """
    scores = jnp.where(mask, scores, _MASKED)
    new_max = jax.lax.stop_gradient(jnp.maximum(acc.max, scores.max(axis=-1)))  # f32[B, H, Sq]
    weights = jnp.where(mask, jnp.exp(scores - new_max[..., None]), 0.0)      # f32[B,H,Sq,Sk]
    rescale = jnp.exp(acc.max - new_max)                                       # f32[B, H, Sq]
    out = (acc.out * jnp.transpose(rescale, (0, 2, 1))[..., None]
           + jnp.einsum("bhst,bthe->bshe", weights, v))
    return Accumulator(new_max, acc.sum * rescale + weights.sum(axis=-1), out)


def finish(acc: Accumulator) -> jax.Array:
    """The attention output of an accumulator: ``out / sum``, f32[B, Sq, H, Dh]."""
    return acc.out / jnp.transpose(acc.sum, (0, 2, 1))[..., None]


# --- ring attention (inside shard_map) -------------------------------------------------------

def _positions(device: jax.Array, chunk: int, n_devices: int, placement: Placement) -> jax.Array:
    """int[c, chunk]: the sequence positions of device ``device``'s c chunks."""
    if placement == "contiguous":
        starts = device[None] * chunk
    else:
        starts = jnp.stack([device, 2 * n_devices - 1 - device]) * chunk
    return starts[:, None] + jnp.arange(chunk)[None, :]


def _varying_accumulator(acc: Accumulator, axis_name: str) -> Accumulator:
    """The accumulator typed as varying over ``axis_name`` (``lax.cond`` needs both branches'
    types equal, and an update makes the max and sum per-device values)."""
    return acc._replace(max=varying(acc.max, axis_name), sum=varying(acc.sum, axis_name))


def ring_attention(q: jax.Array, k: jax.Array, v: jax.Array, axis_name: str, *, causal: bool,
                   placement: Placement = "contiguous",
                   update: BlockUpdate = online_softmax_update
                   ) -> tuple[jax.Array, jax.Array]:
    """Ring attention on this device's queries, inside ``shard_map`` over ``axis_name``.

    Step s = 0 .. p-1: device i holds the key/value block of device (i - s) mod p, folds it
    into its accumulator, and (for s < p-1) passes it to device i+1 with one ``ppermute`` of
    k and v stacked. Each device's tokens are c chunks (1 contiguous, 2 zig-zag); every pair of
    a query chunk and a key chunk is a *score block*, computed under ``jax.lax.cond`` only when
    the causal mask leaves some of it visible, and counted.

    Args:
        q, k, v: f32[B, S/p, H, Dh], this device's tokens in the placement's order.
        axis_name: the mesh axis the sequence is split over (p devices).
        causal: whether position s sees only positions t <= s.
        placement: how the sequence was laid out (:func:`to_placement`).
        update: folds a block into the accumulator (default :func:`online_softmax_update`;
            a lab passes a broken one as a negative control).

    Returns:
        ``(out, blocks)``: out f32[B, S/p, H, Dh], this device's attention output; blocks
        int32[1], how many score blocks of (S/(c p))^2 this device computed.
    """
    p = jax.lax.axis_size(axis_name)
    c = chunks_per_device(placement)
    chunk = q.shape[SEQ_AXIS] // c
    if q.shape[SEQ_AXIS] % c:
        raise ValueError(f"A zig-zag block holds 2 chunks; its {q.shape[SEQ_AXIS]} tokens do "
                         "not split in two (the sequence must be a multiple of 2p).")
    me = jax.lax.axis_index(axis_name)
    q_pos = _positions(me, chunk, p, placement)                         # int[c, chunk]
    q_chunks = [q[:, a * chunk:(a + 1) * chunk] / jnp.sqrt(jnp.float32(q.shape[-1]))
                for a in range(c)]                                       # f32[B, chunk, H, Dh]
    accs = [_varying_accumulator(empty_accumulator(qc), axis_name) for qc in q_chunks]
    kv = jnp.stack([k, v])                                               # f32[2, B, S/p, H, Dh]
    blocks = jnp.zeros((1,), jnp.int32)
    ring = [(i, (i + 1) % p) for i in range(p)]
    for step in range(p):
        source = (me - step) % p                       # whose keys and values this device holds
        k_pos = _positions(source, chunk, p, placement)                 # int[c, chunk]
        for a in range(c):
            for b in range(c):
                k_b, v_b = (kv[i][:, b * chunk:(b + 1) * chunk] for i in (0, 1))
                mask = (q_pos[a][:, None] >= k_pos[b][None, :] if causal
                        else jnp.ones((chunk, chunk), bool))             # bool[chunk, chunk]
                visible = mask.any()

                def compute(acc, q_a=q_chunks[a], k_b=k_b, v_b=v_b, mask=mask):
                    scores = jnp.einsum("bshe,bthe->bhst", q_a, k_b)   # f32[B, H, chunk, chunk]
                    return update(acc, scores, mask, v_b)

                accs[a] = jax.lax.cond(visible, compute, lambda acc: acc, accs[a])
                blocks = blocks + visible.astype(jnp.int32)
        if step < p - 1:
            kv = jax.lax.ppermute(kv, axis_name, ring)                  # to device i + 1
    return jnp.concatenate([finish(acc) for acc in accs], axis=SEQ_AXIS), blocks


# --- Ulysses (inside shard_map) --------------------------------------------------------------

def ulysses_attention(q: jax.Array, k: jax.Array, v: jax.Array, axis_name: str, *,
                      causal: bool) -> jax.Array:
    """DeepSpeed-Ulysses attention on this device's tokens, inside ``shard_map``.

    One all-to-all of q, k, v stacked turns sequence sharding into head sharding (every
    device: all S tokens of H/p heads), attention runs with no communication, and a second
    all-to-all turns the output back to sequence sharding. Needs the sequence laid out
    contiguously (the attention sees it in order) and H divisible by p.

    Args:
        q, k, v: f32[B, S/p, H, Dh], this device's contiguous block of tokens.
        axis_name: the mesh axis the sequence is split over (p devices).
        causal: whether position s sees only positions t <= s.

    Returns:
        f32[B, S/p, H, Dh], this device's tokens of the attention output.
    """
    p = jax.lax.axis_size(axis_name)
    check_heads(q.shape[HEAD_AXIS], p)
    qkv = jnp.stack([q, k, v])                                           # f32[3, B, S/p, H, Dh]
    qkv = jax.lax.all_to_all(qkv, axis_name, split_axis=1 + HEAD_AXIS,
                             concat_axis=1 + SEQ_AXIS, tiled=True)       # f32[3, B, S, H/p, Dh]
    out = reference_attention(qkv[0], qkv[1], qkv[2], causal=causal)    # f32[B, S, H/p, Dh]
    return jax.lax.all_to_all(out, axis_name, split_axis=SEQ_AXIS, concat_axis=HEAD_AXIS,
                              tiled=True)                                # f32[B, S/p, H, Dh]


# --- whole programs over a mesh --------------------------------------------------------------

def _check_inputs(q: jax.Array, k: jax.Array, v: jax.Array, n_devices: int,
                  placement: Placement) -> None:
    if not (q.ndim == 4 and q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v must be f32[B, S, H, Dh] of one shape; got {q.shape}, "
                         f"{k.shape}, {v.shape}.")
    check_sequence(q.shape[SEQ_AXIS], n_devices, placement)


def make_ring_attention(mesh: Mesh, axis_name: str, *, causal: bool,
                        placement: Placement = "contiguous",
                        update: BlockUpdate = online_softmax_update
                        ) -> Callable[..., tuple[jax.Array, jax.Array]]:
    """The jitted ring-attention program over ``mesh``'s axis ``axis_name``.

    Args:
        mesh: a mesh with the axis ``axis_name`` (p devices).
        axis_name: the axis the sequence is split over.
        causal: whether the attention is causal.
        placement: the layout the inputs arrive in (:func:`to_placement`).
        update: as in :func:`ring_attention`.

    Returns:
        ``f(q, k, v) -> (out, blocks)``: q, k, v, out f32[B, S, H, Dh] in the placement's
        order, split along S; blocks int32[p], the score blocks each device computed. It has
        ``.lower`` (for :mod:`clusterlab.device.hlo` and ``memory_analysis``).

    Raises:
        ValueError: (when called) for inputs of different shapes or a sequence that does not
            split into the placement's chunks.
    """
    check_placement(placement)
    p = axis_size(mesh, axis_name)
    spec = P(None, axis_name)
    body = jax.shard_map(functools.partial(ring_attention, axis_name=axis_name, causal=causal,
                                           placement=placement, update=update),
                         mesh=mesh, in_specs=(spec, spec, spec),
                         out_specs=(spec, P(axis_name)))

    def program(q, k, v):  # global f32[B, S, H, Dh]; checked when traced
        _check_inputs(q, k, v, p, placement)
        return body(q, k, v)

    return jax.jit(program)


def make_ulysses_attention(mesh: Mesh, axis_name: str, *, causal: bool
                           ) -> Callable[..., jax.Array]:
    """The jitted Ulysses program over ``mesh``'s axis ``axis_name``.

    Returns:
        ``f(q, k, v) -> out``, all f32[B, S, H, Dh] in sequence order, split along S.

    Raises:
        ValueError: (when called) for a sequence not divisible by p or heads not divisible
            by p.
    """
    p = axis_size(mesh, axis_name)
    spec = P(None, axis_name)
    body = jax.shard_map(functools.partial(ulysses_attention, axis_name=axis_name,
                                           causal=causal),
                         mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec)

    def program(q, k, v):  # global f32[B, S, H, Dh]; checked when traced
        _check_inputs(q, k, v, p, "contiguous")
        check_heads(q.shape[HEAD_AXIS], p)
        return body(q, k, v)

    return jax.jit(program)


# --- the formulas ----------------------------------------------------------------------------

def causal_blocks_per_device(n_devices: int, placement: Placement, *, causal: bool = True
                             ) -> list[int]:
    """Score blocks device i computes, in blocks of (S/(c p))^2 scores (c chunks per device).

    Contiguous, causal: device i's queries see key blocks 0..i, so ``i + 1`` blocks; p(p+1)/2
    in all, the last device p times the first. Zig-zag, causal: device i's chunks i and
    2p-1-i see i+1 and 2p-i of the 2p key chunks, ``2p + 1`` for every device. Without the
    mask every device computes all ``(c p) * c`` of its blocks.

    Args:
        n_devices: devices on the ring.
        placement: ``"contiguous"`` or ``"zigzag"``.
        causal: whether the attention is causal.

    Returns:
        One count per device, device 0 first.
    """
    if n_devices < 1:
        raise ValueError(f"A ring needs at least one device; got n_devices = {n_devices}.")
    c = chunks_per_device(placement)
    if not causal:
        return [c * c * n_devices] * n_devices
    if placement == "contiguous":
        return [i + 1 for i in range(n_devices)]
    return [2 * n_devices + 1] * n_devices


def score_elements_per_device(seq_len: int, n_devices: int, placement: Placement, *,
                              causal: bool = True) -> list[int]:
    """Scores computed per device (per batch row and head): blocks x (S/(c p))^2."""
    check_sequence(seq_len, n_devices, placement)
    side = seq_len // (chunks_per_device(placement) * n_devices)
    return [n * side * side for n in causal_blocks_per_device(n_devices, placement, causal=causal)]


def ring_attention_traffic(batch: int, seq_len: int, n_heads: int, head_dim: int, n_devices: int, *,
                           bytes_per_element: int = 4) -> Traffic:
    """The ring's forward collectives: p-1 collective-permutes of k and v stacked.

    Each carries this device's block, ``2 B (S/p) H Dh`` values, and sends all of it: per
    device ``2 B S H Dh (p-1)/p`` values in all, the keys and values of the other devices.
    """
    check_sequence(seq_len, n_devices, "contiguous")
    block = 2 * batch * (seq_len // n_devices) * n_heads * head_dim * bytes_per_element
    n_ops = n_devices - 1
    return Traffic("collective-permute", n_ops, (block,) * n_ops, block * n_ops,
                   float(block * n_ops))


def ulysses_traffic(batch: int, seq_len: int, n_heads: int, head_dim: int, n_devices: int, *,
                    bytes_per_element: int = 4) -> Traffic:
    """Ulysses' forward collectives: an all-to-all of q, k, v (3 B (S/p) H Dh values) and one
    of the output (B (S/p) H Dh); each sends (p-1)/p of its buffer off the device."""
    check_sequence(seq_len, n_devices, "contiguous")
    check_heads(n_heads, n_devices)
    block = batch * (seq_len // n_devices) * n_heads * head_dim * bytes_per_element
    sizes = (3 * block, block)
    return Traffic("all-to-all", 2, sizes, sum(sizes), sum(sizes) * (n_devices - 1) / n_devices)


def ring_overlap_min_block_tokens(flops_per_s: float, link_bytes_per_s: float, *,
                                  n_heads: int, n_kv_heads: int | None = None,
                                  bytes_per_element: int = 2, causal_fraction: float = 1.0
                                  ) -> float:
    """The fewest tokens per device for which a ring step's transfer hides behind its compute.

    One ring step computes a block of (S/p)^2 scores and its product with the values, forward
    ``4 B (S/p)^2 H Dh`` FLOPs (times ``causal_fraction``, the share of the block a causal
    mask leaves), while it sends the next key/value block, ``2 B (S/p) H_kv Dh`` values. The
    transfer hides when compute time >= transfer time, that is when

        S/p >= flops_per_s * H_kv * bytes_per_element / (2 * H * link_bytes_per_s * fraction).

    Batch and head size cancel. At peak FLOP/s this is a lower bound: a GPU below its peak
    computes longer, and hides more. Liu et al. (2023) state the same condition (block size
    at least FLOPs over bandwidth).

    Args:
        flops_per_s: the device's attention FLOP/s (its peak, for the bound).
        link_bytes_per_s: the ring's per-direction bandwidth per device.
        n_heads: query heads H.
        n_kv_heads: key/value heads (grouped-query attention); ``n_heads`` when None.
        bytes_per_element: of the keys and values sent (2 for bf16).
        causal_fraction: the share of a score block computed (1; about 1/2 for zig-zag
            causal steps, which compute two of four chunk blocks).

    Returns:
        Tokens per device (S/p), a float.
    """
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if min(flops_per_s, link_bytes_per_s, n_heads, n_kv_heads, bytes_per_element) <= 0:
        raise ValueError("FLOP/s, bandwidth, head counts and bytes per element must be "
                         "positive.")
    if not 0 < causal_fraction <= 1:
        raise ValueError(f"causal_fraction is a share of a block, in (0, 1]; got "
                         f"{causal_fraction}.")
    return (flops_per_s * n_kv_heads * bytes_per_element
            / (2 * n_heads * link_bytes_per_s * causal_fraction))


def ring_attention_backward_traffic(batch: int, seq_len: int, n_heads: int, head_dim: int,
                                    n_devices: int, *, bytes_per_element: int = 2,
                                    grad_bytes_per_element: int = 4,
                                    keeps_blocks: bool = False) -> Traffic:
    """The ring's backward collectives, per device, for one attention layer.

    A memory-saving ring (``keeps_blocks=False``) keeps only its own key/value block after the
    forward pass. Its backward passes the blocks round again, p-1 collective-permutes of
    ``2 B (S/p) H Dh`` values, and with each block its gradient accumulator dK, dV: every
    device adds its share and passes it on, p permutes in ``grad_bytes_per_element`` (the last
    brings each block's gradient home). That is the backward of Liu et al. (2023) and of
    ring-flash-attention (zhuzilin/ring-flash-attention, commit 0fc25b4, which accumulates dK
    and dV in FP32). Backward over forward bytes:
    ``((p-1) b + p b_grad) / ((p-1) b)``, so 2 + 1/(p-1) with 16-bit gradients and
    3 + 2/(p-1) with FP32 ones, against bf16 keys and values.

    A ring differentiated as written (``keeps_blocks=True``: JAX's transpose of
    :func:`ring_attention`, JAX 0.10.2) keeps every block it received, p times the memory,
    and sends only the p-1 reverse permutes of the dK, dV partial sums.

    Args:
        batch, seq_len, n_heads, head_dim, n_devices: as in :func:`ring_attention_traffic`
            (``n_heads``: the key/value heads).
        bytes_per_element: of the keys and values (2 for bf16).
        grad_bytes_per_element: of the dK, dV accumulators sent.
        keeps_blocks: whether the forward kept every block it received.
    """
    check_sequence(seq_len, n_devices, "contiguous")
    if min(bytes_per_element, grad_bytes_per_element) <= 0:
        raise ValueError("bytes_per_element and grad_bytes_per_element must be positive "
                         "(2 for bf16, 4 for FP32).")
    values = 2 * batch * (seq_len // n_devices) * n_heads * head_dim
    if keeps_blocks:
        sizes = (values * grad_bytes_per_element,) * (n_devices - 1)
    else:
        sizes = ((values * bytes_per_element,) * (n_devices - 1)
                 + (values * grad_bytes_per_element,) * n_devices)
    return Traffic("collective-permute", len(sizes), sizes, sum(sizes), float(sum(sizes)))


def ulysses_backward_traffic(batch: int, seq_len: int, n_heads: int, head_dim: int,
                             n_devices: int, *, grad_bytes_per_element: int = 2) -> Traffic:
    """Ulysses' backward collectives: the forward's two all-to-alls transposed, in reverse.

    The output's gradient goes back from heads to tokens (``B (S/p) H Dh`` values), then the
    gradients of q, k and v (``3 B (S/p) H Dh``): the forward's bytes in the gradients'
    precision, each sending (p-1)/p of its buffer.
    """
    forward = ulysses_traffic(batch, seq_len, n_heads, head_dim, n_devices,
                              bytes_per_element=grad_bytes_per_element)
    return forward._replace(result_bytes=forward.result_bytes[::-1])


def ring_backward_overlap_min_block_tokens(flops_per_s: float, link_bytes_per_s: float, *,
                                           n_heads: int, n_kv_heads: int | None = None,
                                           bytes_per_element: int = 2,
                                           grad_bytes_per_element: int = 4,
                                           backward_flops_ratio: float = 2.5,
                                           causal_fraction: float = 1.0) -> float:
    """The fewest tokens per device for which a backward ring step's transfers hide.

    A backward step of a memory-saving ring sends a key/value block and a dK, dV block,
    ``2 B (S/p) H_kv Dh`` values each, while it runs ``backward_flops_ratio`` times the
    forward step's FLOPs: 2.5 for FlashAttention's backward, five matmuls (the scores
    recomputed, dV, dP, dQ, dK) against the forward's two (Dao 2023). The condition is
    :func:`ring_overlap_min_block_tokens`'s with ``b + b_grad`` bytes per value sent and the
    FLOPs scaled by the ratio:

        S/p >= F H_kv (b + b_grad) / (2 * ratio * H * W * fraction).

    Its ratio to the forward's bound is ``(b + b_grad) / (ratio b)``: 0.8 with 16-bit
    gradients, 1.2 with FP32 ones. The last permute (each gradient going home) has no compute
    after it to hide behind.

    Args:
        flops_per_s, link_bytes_per_s, n_heads, n_kv_heads, bytes_per_element,
            causal_fraction: as in :func:`ring_overlap_min_block_tokens`.
        grad_bytes_per_element: of the dK, dV accumulators sent.
        backward_flops_ratio: a backward step's FLOPs over the forward step's (> 0).
    """
    if not backward_flops_ratio > 0 or not grad_bytes_per_element > 0:
        raise ValueError("backward_flops_ratio and grad_bytes_per_element must be positive "
                         "(2.5 for FlashAttention's backward; 2 or 4 bytes).")
    return ring_overlap_min_block_tokens(
        flops_per_s, link_bytes_per_s, n_heads=n_heads, n_kv_heads=n_kv_heads,
        bytes_per_element=bytes_per_element + grad_bytes_per_element,
        causal_fraction=causal_fraction) / backward_flops_ratio
