"""Answer key of lab 11, serving (instructor-only: student copies leave keys/ out).

``lab11.4`` is the KV-cache assignment: the student's ``decode_attention(q, k, v, k_cache,
v_cache, t)`` is one layer's attention in one decode step: the new token's query, key and value
f32[B, NH, Dh], the caches f32[B, NH, S, Dh] and its position t (an i32 scalar); it returns the
heads' output f32[B, NH, Dh] and both caches with position t written. The hidden tests, on two
small decoders of ``decode.init_params``' shapes (drawn with NumPy) with sizes the lab never
shows:

1. decoding: the library's ``prefill`` fills the cache with a prompt, then the grader decodes
   greedily to the end of the cache with the student's program in every layer (the rest of the
   step written out here as ``decode`` computes it) and compares every step's logits with
   ``decode.forward`` of the whole sequence at once; writing at t + 1, attending over the whole
   cache, masking the token's own position or leaving out the 1/sqrt(Dh) fail here;
2. a reused cache: steps at the first, a middle and the last position t, whose later positions
   hold an earlier sequence's stale keys and values; the output must equal attention over
   positions 0..t (NumPy) and the caches must come back with position t, and only t, replaced.
   A mask read from the cache's zeros instead of from the positions, and a write over every
   position from t on, pass 1 and fail here.

``lab11.5`` is speculative decoding's verification by the rejection rule of Leviathan et al.
(2023) and Chen et al. (2023): the student's ``verify_draft(draft_tokens, draft_probs,
target_probs, accept_u, sample_u)`` takes the k draft tokens i32[k], the draft's distributions
f32[k, V] they were drawn from, the target's f32[k+1, V] (one more: after the last draft token),
k uniforms for the acceptances and one for the next token; it returns how many draft tokens are
accepted (i32) and the next token (i32): draft token j is accepted while accept_u[j] < p_j(x_j) /
q_j(x_j); after a rejection at n the next token is drawn from max(p_n - q_n, 0) normalised, after
k acceptances from p_k, by inverse CDF (the first token whose cumulative weight exceeds sample_u
times the total). The hidden tests draw, fresh each grading run, draft lengths and vocabularies
the lab never shows (drafts near the target, far from it and equal to it, and draft tokens the
target gives no probability) and compare both outputs with NumPy's, draw by draw, skipping draws
within rounding of a decision boundary. Accepting every draft token, or comparing the draft's
probabilities with themselves, fails the accepted count; drawing the bonus token from the last
draft position's target distribution, or the correction from the target's distribution instead
of the residual, fails the next token.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from clusterlab.analytic import memory, serving
from clusterlab.catalog import hardware
from clusterlab.course import grading, verification
from clusterlab.device import decode, models

_LLAMA = serving.LLAMA_3_70B


def _predicted_long_cache_step_s(ns):
    # from this run's own measurement: the batch-1 step's bytes by the formula over its median
    # time is the bandwidth; the batch-SEQ_BATCH step over LENGTHS[-1] positions at that bandwidth
    def step_bytes(batch, cache_len):
        return serving.decode_step_bytes(ns["weight_bytes"], memory.kv_cache_bytes(
            ns["N_LAYERS"], ns["N_HEADS"], ns["HEAD_DIM"], cache_len, batch,
            bytes_per_element=ns["BYTES_PER_VALUE"]))
    bandwidth = step_bytes(1, ns["SWEEP_LEN"]) / ns["step_s"][1]
    return step_bytes(ns["SEQ_BATCH"], ns["LENGTHS"][-1]) / bandwidth



class _Case(NamedTuple):
    """One hidden case: a decoder of n_layers blocks, batch sequences, a cache of cache_len."""

    batch: int
    n_heads: int
    head_dim: int
    cache_len: int       # S, also the decoder's max_len
    prompt_len: int      # prefilled; the steps decode positions prompt_len .. S - 1
    n_layers: int
    stale_ts: tuple[int, ...]   # the positions of the steps on a reused cache
    seed: int

    @property
    def name(self) -> str:
        return (f"{self.batch} sequence(s), {self.n_heads} heads of {self.head_dim}, a cache of "
                f"{self.cache_len}")

    def args(self) -> list[tuple[tuple[int, ...], str]]:
        token = ((self.batch, self.n_heads, self.head_dim), "float32")
        cache = ((self.batch, self.n_heads, self.cache_len, self.head_dim), "float32")
        return [token, token, token, cache, cache, ((), "int32")]


# the lab shows 4 sequences, 8 heads of 96 and a cache of 64; none of these. The steps on a
# reused cache take positions in the middle, the first and the last.
_CASES = (_Case(2, 3, 4, 10, 3, 2, (6, 0), 1101), _Case(3, 2, 8, 7, 1, 1, (2, 6), 1102))
_VOCAB, _HIDDEN = 37, 24


def _decode_step(params, attention, cache, token, t):
    """decode.decode_step with ``attention(q, k, v, k_cache, v_cache, t)`` in every layer."""
    x = params["embed"][token] + params["pos"][t]                          # f32[B, D]
    keys, values = [], []
    for block, k_cache, v_cache in zip(params["layers"], cache.k, cache.v):
        h = models.layer_norm(x, block["ln1_scale"], block["ln1_bias"])
        q, k, v = (jnp.einsum("bd,dhe->bhe", h, block[w]) for w in ("wq", "wk", "wv"))
        heads, k_cache, v_cache = attention(q, k, v, k_cache, v_cache, t)
        x = x + jnp.einsum("bhe,hed->bd", heads, block["wo"])
        h = models.layer_norm(x, block["ln2_scale"], block["ln2_bias"])
        x = x + jax.nn.relu(h @ block["w1"] + block["b1"]) @ block["w2"] + block["b2"]
        keys.append(k_cache)
        values.append(v_cache)
    logits = models.layer_norm(x, params["ln_f_scale"], params["ln_f_bias"]) @ params["unembed"]
    return logits, decode.KVCache(tuple(keys), tuple(values))


def _decoder(case: _Case) -> dict:
    """A decoder of decode.init_params' shapes, drawn with NumPy (nothing to compile per case):
    unit embeddings, weights of scale 1/sqrt(fan-in), LayerNorm scales near 1, biases near 0."""
    d_model = case.n_heads * case.head_dim
    rng = np.random.default_rng(grading.hidden_seed(case.seed))

    def draw(path, leaf):
        name, noise = jax.tree_util.keystr(path), rng.standard_normal(leaf.shape)
        if leaf.ndim == 1:                                   # LayerNorm scales, biases
            return (("scale" in name) + 0.1 * noise).astype(np.float32)
        fan_in = 1 if name in ("['embed']", "['pos']") else d_model if leaf.ndim == 3 else (
            leaf.shape[0])                                   # wq, wk, wv, wo: D; w2: H
        return (noise / np.sqrt(fan_in)).astype(np.float32)

    shapes = jax.eval_shape(lambda key: decode.init_params(
        key, vocab_size=_VOCAB, d_model=d_model, n_heads=case.n_heads, d_hidden=_HIDDEN,
        n_layers=case.n_layers, max_len=case.cache_len), jax.random.key(0))
    return jax.tree_util.tree_map_with_path(draw, shapes)


def _check_decoding(program: grading.Program, case: _Case) -> None:
    params = _decoder(case)
    prompt = np.random.default_rng(grading.hidden_seed(case.seed)).integers(
        0, _VOCAB, (case.batch, case.prompt_len), dtype=np.int32)
    with verification.fp32_matmuls():
        # the student's program, rebuilt from its export, called inside one compiled step
        step = jax.jit(lambda params, cache, token, t: _decode_step(
            params, program.exported.call, cache, token, t))
        logits, cache = decode.prefill(params, prompt)                     # f32[B, P, V]
        rows, tokens = [logits], [prompt]
        for t in range(case.prompt_len, case.cache_len):                  # greedy, to the end
            token = jnp.argmax(rows[-1][:, -1], axis=-1).astype(jnp.int32)  # i32[B]
            step_logits, cache = step(params, cache, token, jnp.int32(t))
            rows.append(step_logits[:, None])
            tokens.append(token[:, None])
        expected = jax.jit(decode.forward)(params, jnp.concatenate(tokens, axis=1))
    grading.require_close(
        f"decoding {case.name}: every step's logits against decode.forward",
        np.asarray(jnp.concatenate(rows, axis=1)), np.asarray(expected),
        hint="the token at position t must see positions 0..t, its own key and value "
             "included, and nothing after t; scores scaled by 1/sqrt(Dh) as in "
             "models.causal_attention.")


def _reference_step(q, k, v, k_cache, v_cache, t):
    """NumPy: position t of both caches replaced, then attention over positions 0..t."""
    k_cache, v_cache = k_cache.copy(), v_cache.copy()
    k_cache[:, :, t], v_cache[:, :, t] = k, v
    scores = np.einsum("bhe,bhse->bhs", q, k_cache[:, :, :t + 1]) / np.sqrt(q.shape[-1])
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    return np.einsum("bhs,bhse->bhe", weights, v_cache[:, :, :t + 1]), k_cache, v_cache


def _check_reused_cache(program: grading.Program, case: _Case) -> None:
    rng = np.random.default_rng(grading.hidden_seed(case.seed + 1))
    for t in case.stale_ts:
        q, k, v, k_cache, v_cache = (rng.standard_normal(shape, dtype=np.float32)
                                     for shape, _ in case.args()[:5])
        out, new_k, new_v = program(q, k, v, k_cache, v_cache, np.int32(t))
        expected, expected_k, expected_v = _reference_step(q, k, v, k_cache, v_cache, t)
        test = f"one step at position {t} of a reused cache ({case.name})"
        grading.require_close(
            f"{test}: its output", out, expected,
            hint="positions after t may hold anything (a reused cache keeps an earlier "
                 "sequence's keys and values): hide them by their position, not by what they "
                 "hold.")
        grading.require_close(
            f"{test}: the caches it returns", (new_k, new_v), (expected_k, expected_v),
            hint="return both caches with position t, and only position t, replaced by k and "
                 "v.")


def _check_decode_attention(programs) -> None:
    for program, case in zip(programs, _CASES):
        _check_decoding(program, case)
        _check_reused_cache(program, case)


class _Draft(NamedTuple):
    """One hidden case of lab11.5: ``draws`` target steps of k draft tokens over V tokens."""

    k: int
    vocab: int
    draws: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.draws} steps of k = {self.k} draft tokens over {self.vocab} tokens"

    def export(self) -> grading.Export:
        return grading.Export(args=[((self.k,), "int32"), ((self.k, self.vocab), "float32"),
                                    ((self.k + 1, self.vocab), "float32"),
                                    ((self.k,), "float32"), ((), "float32")], n_devices=1)


# the lab shows k = 3 over 6 tokens; none of these
_DRAFT_CASES = (_Draft(1, 7, 60, 1151), _Draft(5, 2, 60, 1152), _Draft(6, 40, 80, 1153))
_BOUNDARY = 1e-5        # draws this close to a decision are skipped (float32 rounding)


def _draw_step(rng: np.random.Generator, case: _Draft):
    """One target step's inputs: a draft near the target (mixed in at a random share, the
    target itself a quarter of the time) with one draft token the target never gives."""
    draft = rng.dirichlet(np.full(case.vocab, 0.5), case.k)                     # f64[k, V]
    share = rng.choice([0.0, rng.uniform(), 1.0], p=[0.25, 0.5, 0.25])
    target = share * np.concatenate([draft, rng.dirichlet(np.full(case.vocab, 0.5), 1)])
    target += (1 - share) * rng.dirichlet(np.full(case.vocab, 0.5), case.k + 1)
    tokens = np.array([rng.choice(case.vocab, p=row) for row in draft])
    if share < 1 and rng.uniform() < 0.3:            # the target gives this draft token nothing
        j = rng.integers(case.k)
        target[j, tokens[j]] = 0.0
        target[j] /= target[j].sum()
    return (tokens.astype(np.int32), draft.astype(np.float32), target.astype(np.float32),
            rng.uniform(size=case.k).astype(np.float32), np.float32(rng.uniform()))


def reference_verification(tokens, draft, target, accept_u, sample_u):
    """(accepted, next token, whether a decision lies within rounding of the draw), in NumPy."""
    rows = np.arange(len(tokens))
    p, q = target[rows, tokens].astype(np.float64), draft[rows, tokens].astype(np.float64)
    ratio = p / q
    accepted = accept_u < ratio
    n = int(np.argmin(accepted)) if not accepted.all() else len(tokens)
    weights = np.maximum(target[n].astype(np.float64) - (draft[n] if n < len(tokens) else 0), 0)
    cumulative = np.cumsum(weights) / weights.sum()
    token = int(np.sum(cumulative <= sample_u))
    near = (np.abs(accept_u[:n + 1] - ratio[:n + 1]) < _BOUNDARY).any() or (
        np.abs(cumulative - sample_u) < _BOUNDARY).any()
    return n, token, bool(near)


def _check_verify_draft(programs) -> None:
    for program, case in zip(programs, _DRAFT_CASES):
        rng = np.random.default_rng(grading.hidden_seed(case.seed))
        for _ in range(case.draws):
            step = _draw_step(rng, case)
            n, token, near = reference_verification(*step)
            if near:
                continue
            got_n, got_token = (int(x) for x in program(*step))
            if got_n != n:
                raise grading.Refused(
                    f"{case.name}: the accepted count: {got_n} accepted where the rule accepts "
                    f"{n}. Hint: accept draft token j while accept_u[j] < p_j(x_j) / q_j(x_j), "
                    "the target's probability of it over the draft's, and stop at the first "
                    "rejection.")
            if got_token != token:
                raise grading.Refused(
                    f"{case.name}: the next token: {got_token} where the rule draws {token} "
                    f"(after {n} of {case.k} accepted). Hint: after a rejection at j, draw from "
                    "max(p_j - q_j, 0); after k acceptances, from the target's distribution "
                    "after the last draft token, row k.")


KEY = {
    "lab11.1": grading.close(
        memory.kv_cache_bytes(_LLAMA.n_layers, _LLAMA.n_kv_heads, _LLAMA.head_dim, 8192, 16,
                              bytes_per_element=2) / 1e9,
        name="KV cache (GB)",
        hint="Keys and values, in every layer, for each key-value head (not each query head), "
             "position and sequence, 2 bytes each; then divide by 1e9."),
    "lab11.2": grading.close(
        8 * hardware.gpu("H200").hbm_bytes_per_s
        / serving.decode_step_bytes(_LLAMA.streamed_param_bytes(2),
                                    _LLAMA.kv_cache_bytes(4096, 1, 2)),
        name="tokens per second",
        hint="One step reads the weights it multiplies (all but the input embedding, which is "
             "only indexed) and the whole cache once; 8 GPUs read their eighths at the same "
             "time; one step makes one token."),
    "lab11.3": grading.close(
        _predicted_long_cache_step_s, name="predicted step time (s)",
        hint="The bandwidth is one batch-1 step's bytes (the weights plus one sequence's cache "
             "of SWEEP_LEN positions, float32) over step_s[1]; the prediction is the bytes of a "
             "step of SEQ_BATCH sequences over LENGTHS[-1] positions over that bandwidth, in "
             "seconds."),
    "lab11.4": grading.code(
        _check_decode_attention, name="decode-step attention",
        hint="Write position t of both caches before you attend, so that the token sees its "
             "own key; then keep every position after t out of the softmax.",
        exports=[grading.Export(args=case.args(), n_devices=1) for case in _CASES],
        references=["clusterlab.device.decode._attention"]),   # the library's decode attention
    "lab11.5": grading.code(
        _check_verify_draft, name="speculative verification",
        hint="Each draft token is kept with probability min(1, p / q); the next token comes "
             "from what the target wants beyond the draft, or from the target itself after k "
             "acceptances.",
        exports=[case.export() for case in _DRAFT_CASES]),
    # no references: the library's speculative decoding is analytic (serving.speculative_*),
    # with no accept-or-resample step
}
