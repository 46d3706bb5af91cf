"""Tests of clusterlab.analytic.serving and memory.kv_cache_bytes: hand-derived values and error paths."""

from __future__ import annotations

import math

import pytest

from clusterlab.analytic import costmodel, flops, memory, serving
from clusterlab.catalog import hardware

# Llama-3-70B-like: 80 layers, 8 KV heads of 128 (Meta's config.json); 64 query heads x 128.
L, KV_HEADS, HEAD_DIM, D_ATTN, N_70B = 80, 8, 128, 8192, 70e9


def test_kv_cache_bytes_formula():
    per_token = memory.kv_cache_bytes(L, KV_HEADS, HEAD_DIM, 1, 1)
    assert per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert memory.kv_cache_bytes(L, KV_HEADS, HEAD_DIM, 4096, 3) == 3 * 4096 * per_token
    fp8 = memory.kv_cache_bytes(L, KV_HEADS, HEAD_DIM, 4096, 1, bytes_per_element=1)
    assert fp8 == 4096 * per_token // 2
    assert isinstance(memory.kv_cache_bytes(L, KV_HEADS, HEAD_DIM, 3, 1, bytes_per_element=0.5), int)
    assert memory.kv_cache_bytes(L, KV_HEADS, HEAD_DIM, 0, 8) == 0
    # Multi-head attention (64 KV heads) caches 8x what GQA with 8 KV heads does.
    mha = memory.kv_cache_bytes(L, 64, HEAD_DIM, 10, 1)
    assert mha == 8 * memory.kv_cache_bytes(L, 8, HEAD_DIM, 10, 1)


@pytest.mark.parametrize("args, kwargs, match", [
    ((0, 8, 128, 1, 1), {}, "n_layers"),
    ((80, 0, 128, 1, 1), {}, "n_kv_heads"),
    ((80, 8, 12.5, 1, 1), {}, "head_dim"),
    ((80, 8, 128, -1, 1), {}, "seq_len"),
    ((80, 8, 128, 1, -2), {}, "batch"),
    ((80, 8, 128, 1, 1), {"bytes_per_element": 0}, "bytes_per_element"),
])
def test_kv_cache_bytes_errors(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        memory.kv_cache_bytes(*args, **kwargs)


def test_decode_step_bytes():
    assert serving.decode_step_bytes(140e9, 0) == 140e9
    assert serving.decode_step_bytes(140e9, 10e9) == 150e9
    with pytest.raises(ValueError, match="param_bytes"):
        serving.decode_step_bytes(0, 1e9)
    with pytest.raises(ValueError, match="kv_cache_bytes"):
        serving.decode_step_bytes(1e9, -1)


def test_decode_flops_per_token():
    assert serving.decode_flops_per_token(N_70B) == 140e9
    with_attention = serving.decode_flops_per_token(N_70B, n_layers=L, seq_len=4096, d_attn=D_ATTN)
    assert with_attention == 140e9 + 4 * 80 * 4096 * 8192
    assert serving.decode_flops_per_token(N_70B, n_layers=L, seq_len=0, d_attn=D_ATTN) == 140e9


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_params=0), "n_params"),
    (dict(n_params=1e9, n_layers=-1, d_attn=8), "n_layers"),
    (dict(n_params=1e9, n_layers=2), "together"),
    (dict(n_params=1e9, d_attn=8, seq_len=4), "together"),
    (dict(n_params=1e9, seq_len=4), "together"),
])
def test_decode_flops_per_token_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        serving.decode_flops_per_token(**kwargs)


def test_decode_arithmetic_intensity_rises_with_batch():
    kv = memory.kv_cache_bytes(L, KV_HEADS, HEAD_DIM, 1024, 1)
    # Batch 1, BF16 weights, no cache: 2N FLOPs over 2N bytes = 1 FLOP/byte.
    assert serving.decode_arithmetic_intensity(1, 2 * N_70B, 0, N_70B) == pytest.approx(1.0)
    values = [serving.decode_arithmetic_intensity(b, 2 * N_70B, kv, N_70B) for b in (1, 8, 64, 512)]
    assert values == sorted(values) and len(set(values)) == 4
    assert values[2] == pytest.approx(64 * 2 * N_70B / (2 * N_70B + 64 * kv))
    # The limit with a huge batch: 2N FLOPs per sequence over one sequence's cache.
    big = serving.decode_arithmetic_intensity(10**9, 2 * N_70B, kv, N_70B)
    assert big == pytest.approx(2 * N_70B / kv, rel=1e-3)
    with pytest.raises(ValueError, match="batch"):
        serving.decode_arithmetic_intensity(0, 2 * N_70B, kv, N_70B)
    with pytest.raises(ValueError, match="kv_cache_bytes_per_sequence"):
        serving.decode_arithmetic_intensity(1, 2 * N_70B, -5, N_70B)


def test_tensor_parallel_all_reduces_per_token():
    assert serving.tensor_parallel_all_reduces_per_token(80) == 160
    assert serving.tensor_parallel_all_reduces_per_token(1) == 2
    with pytest.raises(ValueError, match="n_layers"):
        serving.tensor_parallel_all_reduces_per_token(0)


# --- the serving model: Model, roofline steps, capacity, disaggregation, sizing -------------

M = serving.LLAMA_3_70B


def test_llama_3_70b_shape_and_parameter_count():
    assert (M.d_attn, M.n_layers, M.n_kv_heads, M.head_dim) == (8192, 80, 8, 128)
    # Hand count: embeddings 2 x 128256 x 8192; per layer Q and O 8192^2 each, K and V
    # 8192 x 1024 each, MLP 3 x 8192 x 28672. Meta calls it 70B.
    per_layer = 2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672
    assert M.n_params == 2 * 128256 * 8192 + 80 * per_layer
    assert 70e9 < M.n_params < 71e9
    assert M.matmul_params == M.n_params - 128256 * 8192
    assert M.param_bytes() == 2 * M.n_params and M.param_bytes(1) == M.n_params
    assert M.streamed_param_bytes() == 2 * M.matmul_params
    assert M.kv_cache_bytes(4096, 2) == memory.kv_cache_bytes(80, 8, 128, 4096, 2)


def test_model_rejects_bad_shapes():
    with pytest.raises(ValueError, match="divide"):
        serving.Model("x", 2, 64, n_heads=6, n_kv_heads=4, head_dim=8, d_ff=128, vocab=10,
                      source="test")
    with pytest.raises(ValueError, match="d_ff"):
        serving.Model("x", 2, 64, 8, 8, 8, d_ff=0, vocab=10, source="test")


def test_roofline_step_takes_the_slower_roof_and_splits_over_tp():
    h200 = serving.hardware.gpu("H200")
    step = serving.roofline_step(989e12, 4.8e12, gpu="H200")
    assert step.compute_s == pytest.approx(1.0) and step.memory_s == pytest.approx(1.0)
    memory_bound = serving.roofline_step(1e12, 9.6e12, gpu=h200, tp=2, communication_s=0.5)
    assert memory_bound.memory_s == pytest.approx(1.0) and memory_bound.bound == "memory"
    assert memory_bound.time_s == pytest.approx(1.5)
    derated = serving.roofline_step(989e12, 0, gpu="H200", flops_efficiency=0.5)
    assert derated.time_s == pytest.approx(2.0) and derated.bound == "compute"
    for kwargs, match in [(dict(tp=0), "tp"), (dict(flops_efficiency=1.5), "flops_efficiency"),
                          (dict(bandwidth_efficiency=0), "bandwidth_efficiency"),
                          (dict(communication_s=-1), "communication_s")]:
        with pytest.raises(ValueError, match=match):
            serving.roofline_step(1.0, 1.0, gpu="H200", **kwargs)
    with pytest.raises(ValueError, match="Unknown GPU"):
        serving.roofline_step(1.0, 1.0, gpu="Z100")


def test_fp8_raises_the_compute_roof_only():
    bf16 = serving.decode_step(M, 512, 0, gpu="H200", tp=8)
    fp8 = serving.decode_step(M, 512, 0, gpu="H200", tp=8, precision="fp8", bytes_per_param=1)
    assert fp8.compute_s == pytest.approx(bf16.flops / serving.hardware.gpu("H200").fp8_flops)
    assert fp8.memory_s == pytest.approx(bf16.memory_s / 2)
    fp8_b_star = serving.crossover_batch(M, 0, gpu="H200", precision="fp8", bytes_per_param=1)
    ridge_fp8 = serving.hardware.ridge_point("H200", precision="fp8")
    assert fp8_b_star == pytest.approx(ridge_fp8 / 2)
    with pytest.raises(ValueError, match="FP8"):
        serving.prefill_step(M, 128, gpu="A100", tp=8, precision="fp8")


def test_prefill_flops_is_the_sum_of_decode_flops_over_positions():
    tokens = 37
    summed = sum(serving.decode_flops_per_token(M.matmul_params, n_layers=M.n_layers, seq_len=i,
                                                d_attn=M.d_attn) for i in range(1, tokens + 1))
    assert serving.prefill_flops(M, tokens) == pytest.approx(summed)
    assert serving.prefill_flops(M, tokens, batch=3) == pytest.approx(3 * summed)
    with pytest.raises(ValueError, match="prompt_tokens"):
        serving.prefill_flops(M, 0)


def test_prefill_is_compute_bound_and_decode_memory_bound():
    pre = serving.prefill_step(M, 2048, gpu="H200", tp=8)
    assert pre.bound == "compute" and pre.communication_s > 0
    assert pre.compute_s == pytest.approx(serving.prefill_flops(M, 2048) / 8 / 989e12)
    one = serving.decode_step(M, 1, 2048, gpu="H200", tp=2)
    assert one.bound == "memory"
    assert one.memory_s == pytest.approx(
        (M.streamed_param_bytes() + M.kv_cache_bytes(2048)) / 2 / 4.8e12)
    alone = serving.decode_step(M, 1, 2048, gpu="H200")
    assert alone.communication_s == 0 and one.communication_s > 0


def test_tensor_parallel_communication_is_the_costmodel_all_reduce():
    step = serving.decode_step(M, 16, 1024, gpu="H200", tp=8)
    node = hardware.ClusterSpec(gpu="H200", n_nodes=1, gpus_per_node=8)
    per_call = costmodel.cluster_collective("all_reduce", 16 * 8192 * 2, node).time_s
    assert step.communication_s == pytest.approx(160 * per_call)
    assert serving.tensor_parallel_all_reduce_bytes(M, 16) == 16 * 8192 * 2
    assert serving.tensor_parallel_all_reduce_bytes(M, 16, bytes_per_element=4) == 16 * 8192 * 4
    with pytest.raises(ValueError, match="tokens"):
        serving.tensor_parallel_all_reduce_bytes(M, 0)


def test_batching_raises_throughput_and_latency():
    batches = (1, 4, 16, 64, 256)
    steps = [serving.decode_step(M, b, 1024, gpu="H200", tp=4).time_s for b in batches]
    rates = [serving.decode_tokens_per_s(M, b, 1024, gpu="H200", tp=4) for b in batches]
    assert steps == sorted(steps) and rates == sorted(rates)
    assert rates[-1] / rates[0] > 50  # weights are read once for the whole batch
    assert rates[2] == pytest.approx(16 / steps[2])
    with pytest.raises(ValueError, match="batch"):
        serving.decode_tokens_per_s(M, 0, 1024, gpu="H200", tp=4)
    with pytest.raises(ValueError, match="batch"):
        serving.prefill_step(M, 1024, gpu="H200", tp=4, batch=0)


@pytest.mark.parametrize("seq_len", [0, 512])
def test_crossover_batch_separates_memory_and_compute_bound(seq_len):
    b_star = serving.crossover_batch(M, seq_len, gpu="H200")
    assert math.isfinite(b_star)
    below = serving.decode_step(M, math.floor(b_star), seq_len, gpu="H200")
    above = serving.decode_step(M, math.ceil(b_star), seq_len, gpu="H200")
    assert below.bound == "memory" and above.bound == "compute"
    if seq_len == 0:  # weights only: exactly the ridge point
        assert b_star == pytest.approx(serving.hardware.ridge_point("H200"))


def test_crossover_batch_is_infinite_when_the_cache_dominates():
    assert serving.crossover_batch(M, 4096, gpu="H200") == math.inf
    assert serving.decode_step(M, 100_000, 4096, gpu="H200").bound == "memory"
    with pytest.raises(ValueError, match="flops_efficiency"):
        serving.crossover_batch(M, 0, gpu="H200", flops_efficiency=2)


def test_max_batch_fills_memory_after_the_weights():
    b = serving.max_batch(M, 4096, gpu="H200", tp=2)
    free = 0.9 * 2 * 143771 * 2**20 - M.param_bytes()   # the H200 as nvidia-smi reports it
    assert b == int(free // M.kv_cache_bytes(4096))
    assert b * M.kv_cache_bytes(4096) <= free < (b + 1) * M.kv_cache_bytes(4096)
    assert serving.max_batch(M, 4096, gpu="H200", tp=1, bytes_per_param=1) > 0
    with pytest.raises(ValueError, match="raise tp"):
        serving.max_batch(M, 4096, gpu="H200", tp=1)
    with pytest.raises(ValueError, match="usable_fraction"):
        serving.max_batch(M, 4096, gpu="H200", tp=2, usable_fraction=1.2)
    with pytest.raises(ValueError, match="seq_len"):
        serving.max_batch(M, 0, gpu="H200", tp=2)


def test_kv_transfer_time():
    nbytes = M.kv_cache_bytes(2048, 4)
    assert serving.kv_transfer_time_s(M, 2048, link="IB-NDR", batch=4) == pytest.approx(
        nbytes / 50e9)
    assert serving.kv_transfer_time_s(M, 2048, link=serving.hardware.link("IB-NDR"), batch=4,
                                      n_links=8) == pytest.approx(nbytes / 400e9)
    with pytest.raises(ValueError, match="Unknown link"):
        serving.kv_transfer_time_s(M, 2048, link="carrier-pigeon")
    with pytest.raises(ValueError, match="n_links"):
        serving.kv_transfer_time_s(M, 2048, link="IB-NDR", n_links=0)


def test_serving_options_and_size_serving():
    kwargs = dict(target_tokens_per_s=1e5, max_tpot_s=0.05, seq_len=4096, gpu="H200")
    plans = serving.serving_options(M, **kwargs)
    assert [p.tp for p in plans] == [2, 4, 8]  # tp = 1: the BF16 weights do not fit
    for plan in plans:
        assert plan.tpot_s <= 0.05
        assert plan.batch <= serving.max_batch(M, 4096, gpu="H200", tp=plan.tp)
        assert plan.replicas * plan.replica_tokens_per_s >= 1e5
        assert (plan.replicas - 1) * plan.replica_tokens_per_s < 1e5
        assert plan.gpus == plan.replicas * plan.tp
        bigger = plan.batch + 1
        if bigger <= serving.max_batch(M, 4096, gpu="H200", tp=plan.tp):
            assert serving.decode_step(M, bigger, 4096, gpu="H200", tp=plan.tp).time_s > 0.05
    best = serving.size_serving(M, **kwargs)
    assert best.gpus == min(p.gpus for p in plans)
    # A tighter latency target forces smaller batches and so more GPUs.
    tight = serving.size_serving(M, **{**kwargs, "max_tpot_s": 0.025})
    assert tight.gpus > best.gpus and tight.tpot_s <= 0.025
    with pytest.raises(ValueError, match="max_tpot_s"):
        serving.size_serving(M, **{**kwargs, "max_tpot_s": 1e-3})
    with pytest.raises(ValueError, match="target_tokens_per_s"):
        serving.serving_options(M, **{**kwargs, "target_tokens_per_s": 0})
    with pytest.raises(ValueError, match="tp"):
        serving.serving_options(M, **kwargs, tp_options=(0, 8))
    # FP8 weights fit one H200, so tp = 1 becomes an option.
    assert serving.serving_options(M, **kwargs, bytes_per_param=1)[0].tp == 1


def test_prefill_flops_is_the_causal_forward_count_of_flops():
    tokens = 512
    expected = tokens * flops.causal_flops_per_token(M.matmul_params, M.n_layers, tokens,
                                                     M.d_attn, backward=False)
    assert serving.prefill_flops(M, tokens) == pytest.approx(expected)


def test_all_reduce_s_overrides_the_cost_model():
    model = serving.LLAMA_3_70B
    priced = serving.decode_step(model, 1, 4096, gpu="H200", tp=8)
    given = serving.decode_step(model, 1, 4096, gpu="H200", tp=8, all_reduce_s=10e-6)
    assert given.communication_s == pytest.approx(2 * model.n_layers * 10e-6)
    assert given.memory_s == priced.memory_s and given.compute_s == priced.compute_s
    assert serving.decode_step(model, 1, 4096, gpu="H200", tp=1,
                               all_reduce_s=10e-6).communication_s == 0.0
    with pytest.raises(ValueError, match="all_reduce_s"):
        serving.decode_step(model, 1, 4096, gpu="H200", tp=8, all_reduce_s=-1.0)


def test_decode_all_reduces_are_megatrons_forward_pass():
    forward = costmodel.megatron_all_reduces_per_layer(backward=False)
    assert serving.tensor_parallel_all_reduces_per_token(80) == 80 * forward == 160
    step = serving.decode_step(M, 1, 0, gpu="H200")
    assert isinstance(step, serving.RooflineStep) and step.bound == "memory"


# --- speculative decoding (Leviathan et al. 2023, arXiv 2211.17192) ---------------------------

@pytest.mark.parametrize("alpha, k", [(0.0, 4), (0.5, 1), (0.6, 3), (0.8, 5), (0.9, 7), (1.0, 4)])
def test_speculative_tokens_per_step_matches_paper_equation_1(alpha, k):
    # Equation (1): E[# generated tokens] = (1 - alpha^(gamma+1)) / (1 - alpha); a geometric sum.
    expected = sum(alpha ** i for i in range(k + 1))
    assert serving.speculative_tokens_per_step(alpha, k) == pytest.approx(expected, rel=1e-12)
    if alpha < 1:
        assert serving.speculative_tokens_per_step(alpha, k) == pytest.approx(
            (1 - alpha ** (k + 1)) / (1 - alpha), rel=1e-12)


def test_speculative_limits():
    assert serving.speculative_tokens_per_step(0.0, 6) == 1.0
    assert serving.speculative_tokens_per_step(1.0, 6) == 7.0
    assert serving.speculative_tokens_per_step(0.7, 0) == 1.0
    assert serving.speculative_speedup(0.7, 0, 0.1) == 1.0


def test_speculative_speedup_theorem_3_8():
    # Theorem 3.8: improvement factor (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)).
    alpha, k, c = 0.8, 5, 0.05
    expected = (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))
    assert serving.speculative_speedup(alpha, k, c) == pytest.approx(expected, rel=1e-12)
    # A free draft gives the tokens per step; a draft as slow as the target loses for alpha < 1.
    assert serving.speculative_speedup(alpha, k, 0) == serving.speculative_tokens_per_step(alpha, k)
    assert serving.speculative_speedup(alpha, k, 1.0) < 1


@pytest.mark.parametrize("alpha, k", [(0.3, 2), (0.75, 4), (0.9, 8)])
def test_speculative_formula_against_brute_simulation(alpha, k):
    steps = 200_000
    simulated = serving.simulate_speculative_tokens_per_step(alpha, k, steps, seed=1)
    formula = serving.speculative_tokens_per_step(alpha, k)
    # Tokens per step lie in [1, k + 1]: the standard error is below k / (2 sqrt(steps)).
    margin = 5 * k / (2 * math.sqrt(steps))
    assert abs(simulated - formula) < margin, (simulated, formula, margin)
    print(f"alpha={alpha}, k={k}: simulated {simulated:.4f}, formula {formula:.4f}: holds")


def test_speculative_simulation_negative_control():
    # A simulation that forgets the target's own token is one token short: the check catches it.
    alpha, k, steps = 0.75, 4, 200_000
    wrong = serving.simulate_speculative_tokens_per_step(alpha, k, steps, seed=1) - 1
    assert abs(wrong - serving.speculative_tokens_per_step(alpha, k)) > 5 * k / (2 * math.sqrt(steps))


@pytest.mark.parametrize("call, match", [
    (lambda: serving.speculative_tokens_per_step(1.2, 3), "alpha"),
    (lambda: serving.speculative_tokens_per_step(0.5, -1), "k"),
    (lambda: serving.speculative_speedup(0.5, 3, -0.1), "cost_ratio"),
    (lambda: serving.simulate_speculative_tokens_per_step(0.5, 3, 0), "steps"),
])
def test_speculative_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_float32_decode_at_batch_1_does_half_a_flop_per_byte_whatever_the_cache():
    # lab 11's claim: attention over the cache does 4 L S d FLOPs on its 8 L S d float32 bytes,
    # the same 1/2 FLOP per byte as the weights' 2N FLOPs on 4N bytes
    n_params, n_layers, d_model, heads = 14e6, 2, 768, 8
    for cache_len in (1, 64, 2048):
        kv = memory.kv_cache_bytes(n_layers, heads, d_model // heads, cache_len, 1,
                                   bytes_per_element=4)
        step_flops = serving.decode_flops_per_token(n_params, n_layers=n_layers,
                                                    seq_len=cache_len, d_attn=d_model)
        assert step_flops / serving.decode_step_bytes(4 * n_params, kv) == pytest.approx(0.5)
