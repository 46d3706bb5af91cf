"""clusterlab.analytic.gemm: waves over the SMs, the memory-bound regime, the benchmark's ceiling, and a
transformer layer's GEMMs counting exactly the planner's FLOPs."""

from __future__ import annotations

import dataclasses

import pytest

from clusterlab.analytic import gemm, plan
from clusterlab.catalog import hardware

A100, H100 = hardware.gpu("A100"), hardware.gpu("H100")


def test_one_tile_more_than_a_wave_takes_two_waves():
    # 108 tiles of 256 x 128 fill one wave of the A100's 108 SMs; one tile more needs a second
    # wave, which costs a whole wave (wave quantization). k is large enough to be compute-bound.
    one_wave = gemm.Gemm("full wave", gemm.TILE_M, gemm.TILE_N * A100.sm_count, 16384)
    one_more = dataclasses.replace(one_wave, n=gemm.TILE_N * (A100.sm_count + 1))
    ratio = gemm.gemm_time_s(one_more, A100) / gemm.gemm_time_s(one_wave, A100)
    assert ratio == pytest.approx(2.0, rel=0.01)
    assert one_more.flops / one_wave.flops == pytest.approx(109 / 108)


def test_matrix_vector_product_runs_at_hbm_bandwidth():
    matvec = gemm.Gemm("matvec", 1, 8192, 8192)
    seconds = gemm.gemm_time_s(matvec, H100)
    assert matvec.hbm_bytes / seconds == pytest.approx(H100.hbm_bytes_per_s, rel=1e-9)
    assert gemm.gemm_compute_s(matvec, H100) < 0.01 * seconds


@pytest.mark.parametrize("gpu", [A100, H100], ids=lambda g: g.name)
def test_large_square_gemm_reaches_the_ceiling(gpu):
    square = gemm.Gemm("square", 16384, 16384, 16384)
    fraction = square.flops / gemm.gemm_time_s(square, gpu) / gpu.bf16_flops
    ceiling = gemm.matmul_ceiling(gpu)
    # 8,192 tiles: 76 waves of 108 (A100) or 63 of 132 (H100), the last partly full
    assert ceiling * 0.98 < fraction <= ceiling
    assert ceiling == {"A100": 271.2 / 312, "H100": 794.5 / 989}[gpu.name]


def test_gpu_without_sm_count_runs_at_the_ceiling_alone():
    unsourced = dataclasses.replace(A100, name="A100 without SMs", sm_count=None)
    odd = gemm.Gemm("one tile more", gemm.TILE_M, gemm.TILE_N * 109, 16384)
    assert gemm.gemm_compute_s(odd, unsourced) == pytest.approx(
        odd.flops / (unsourced.bf16_flops * gemm.UNMEASURED_CEILING))


def test_flash_keeps_the_scores_off_hbm():
    shape = dict(seq_len=4096, micro_batch=1, d_model=8192, n_heads=64)
    fused = {(g.name, g.pass_): g for g in gemm.transformer_layer_gemms(**shape)}
    unfused = {(g.name, g.pass_): g for g in gemm.transformer_layer_gemms(**shape,
                                                                          recompute="none")}
    scores_bytes = 2 * 64 * 4096**2     # bf16[a, s, s]
    for key in [("scores", "forward"), ("attention_over_values", "dgrad")]:
        assert unfused[key].hbm_bytes - fused[key].hbm_bytes == scores_bytes
    assert fused[("qkv", "forward")] == unfused[("qkv", "forward")]


@pytest.mark.parametrize("recompute", gemm.RECOMPUTE_POLICIES)
@pytest.mark.parametrize("n_params, n_layers, d_model, tp", [
    (12 * 48 * 6144**2, 48, 6144, 8),   # Korthikanti's 22B, MLP 4d
    (405e9, 126, 16384, 8),             # Llama 3 405B: its MLP width from N
    (7e9, None, None, 1),               # the planner's default shape
])
def test_layer_gemms_count_the_planners_flops(recompute, n_params, n_layers, d_model, tp):
    workload = plan.Workload(n_params, 2048, 8, n_tokens=1e9, n_layers=n_layers,
                             d_model=d_model, recompute=recompute)
    layers, width = workload.shape
    micro_batch = 2
    gemms = gemm.transformer_layer_gemms(workload.seq_len, micro_batch, width, workload.heads,
                                         ffn_hidden=workload.mlp_width, tensor_parallel=tp,
                                         recompute=recompute)
    per_token = sum(g.flops for g in gemms) * layers * tp / (micro_batch * workload.seq_len)
    assert per_token == pytest.approx(workload.hardware_flops_per_token, rel=1e-12)


def test_recomputation_adds_forward_kernels():
    shape = dict(seq_len=2048, micro_batch=1, d_model=4096, n_heads=32)
    passes = {policy: [g.name for g in gemm.transformer_layer_gemms(**shape, recompute=policy)
                       if g.pass_ == "recompute"] for policy in ("none", "selective", "full")}
    assert passes["none"] == []
    assert passes["selective"] == ["scores", "attention_over_values"]
    assert len(passes["full"]) == 6
    elementwise = gemm.transformer_layer_elementwise(**shape, recompute="selective")
    assert {e.name for e in elementwise if e.pass_ == "recompute"} == {"softmax",
                                                                       "attention_dropout"}


def test_sequence_parallel_splits_layernorm_and_dropout():
    shape = dict(seq_len=2048, micro_batch=1, d_model=4096, n_heads=32, tensor_parallel=8)
    replicated = gemm.transformer_layer_elementwise(**shape)
    split = gemm.transformer_layer_elementwise(**shape, sequence_parallel=True)
    for whole, part in zip(replicated, split):
        expected = 8 if whole.name in ("layernorm", "dropout_residual") else 1
        assert whole.hbm_bytes / part.hbm_bytes == pytest.approx(expected)


def test_planner_default_is_the_per_gemm_model():
    workload = plan.Workload(7e9, 4096, 64, n_tokens=1e9)
    cluster = plan.cluster("H100", 8, storage_read_bytes_per_s=1e12)
    layout = plan.Layout(dp=8, micro_batch=1)
    predicted = plan.predict(workload, cluster, layout)
    layers, width = workload.shape
    layer_s = gemm.transformer_layer_time_s(H100, 4096, 1, width, workload.heads,
                                            ffn_hidden=workload.mlp_width)
    assert predicted.compute_s == pytest.approx(layer_s * layers * 64 / 8)
    constant = plan.predict(workload, cluster, layout, plan.Assumptions(compute_efficiency=0.6))
    assert constant.compute_s == pytest.approx(
        workload.tokens_per_step * workload.hardware_flops_per_token / (8 * 989e12 * 0.6))


@pytest.mark.parametrize("make, message", [
    (lambda: gemm.Gemm("bad", 0, 8, 8), "m must be a positive"),
    (lambda: gemm.Gemm("bad", 8, 8, 8, batch=-1), "batch must be a positive"),
    (lambda: gemm.Gemm("bad", 8, 8, 8, on_chip=("d",)), "on_chip names operands"),
    (lambda: gemm.transformer_layer_gemms(2048, 1, 4096, 32, recompute="some"),
     "recompute must be"),
    (lambda: gemm.transformer_layer_gemms(2048, 0, 4096, 32), "micro_batch must be"),
    (lambda: plan.Workload(1e9, 2048, 8, n_tokens=1e9, n_layers=64, d_model=4096).mlp_width,
     "leave no MLP"),
    (lambda: plan.Assumptions(compute_efficiency=1.5), "at most 1"),
])
def test_bad_input_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("tp", [1, 8])
def test_output_layer_counts_narayanans_logit_flops(tp):
    # 6 d V / t FLOPs per token (forward, dgrad, wgrad), never recomputed; the cross-entropy
    # moves 12 bytes a logit on the GPU's V / t share; its time is the sum of both
    s, b, d, vocab = 2048, 2, 6144, 51200
    gemms = gemm.output_layer_gemms(s, b, d, vocab, tensor_parallel=tp)
    assert [g.pass_ for g in gemms] == ["forward", "dgrad", "wgrad"]
    assert sum(g.flops for g in gemms) / (b * s) == pytest.approx(6 * d * vocab / tp)
    elementwise = gemm.output_layer_elementwise(s, b, vocab, tensor_parallel=tp)
    assert sum(e.hbm_bytes for e in elementwise) == pytest.approx(12 * b * s * vocab / tp)
    seconds = gemm.output_layer_time_s(A100, s, b, d, vocab, tensor_parallel=tp)
    assert seconds == pytest.approx(sum(gemm.gemm_time_s(g, A100) for g in gemms)
                                    + 12 * b * s * vocab / tp / A100.hbm_bytes_per_s)


def test_vocabulary_puts_the_output_layer_on_the_last_stage():
    # with pp = 4, every micro-batch passes the last stage: its output layer adds m times one
    # micro-batch's output_layer_time_s to the compute, and nothing to the bubble
    base = plan.Workload(7e9, 2048, 64, n_tokens=1e9, n_layers=32, d_model=4096)
    cluster = plan.cluster("H100", 32, storage_read_bytes_per_s=1e12)
    layout = plan.Layout(dp=8, pp=4)
    without = plan.predict(base, cluster, layout)
    with_vocab = plan.predict(dataclasses.replace(base, vocab_size=32000), cluster, layout)
    m = 64 // 8
    one = gemm.output_layer_time_s(H100, 2048, 1, 4096, 32000)
    assert with_vocab.output_layer_s == pytest.approx(m * one)
    assert with_vocab.compute_s == pytest.approx(without.compute_s + m * one)
    assert with_vocab.bubble_s == pytest.approx(without.bubble_s)
    assert without.output_layer_s == 0


def test_h100_model_prices_thin_attention_above_its_flops_and_flash_or_wide_heads_lower():
    # lab 10's host-sized layer (heads of 16) against FlashAttention and a 70B layer (heads of 128)
    seq, micro_batch, width, heads, ffn = gemm.HOST_LAYER

    def attention_share(layer):
        return gemm.group_shares(layer, [gemm.gemm_time_s(g, H100) for g in layer])["attention"]

    thin = gemm.transformer_layer_gemms(seq, micro_batch, width, heads, ffn_hidden=ffn,
                                        recompute="none")
    flash = gemm.transformer_layer_gemms(seq, micro_batch, width, heads, ffn_hidden=ffn,
                                         recompute="flash")
    wide = gemm.transformer_layer_gemms(4096, 1, 8192, 64, ffn_hidden=28672, tensor_parallel=8)
    flops_share = gemm.group_shares(thin, [g.flops for g in thin])["attention"]
    assert attention_share(thin) > 2 * flops_share
    assert attention_share(flash) < attention_share(thin)
    assert attention_share(wide) < attention_share(thin)


# --- fused causal attention (gemm.fused_attention_time_s) ----------------------------------

def _fused_attention(seq_len: int, head_dim: int) -> dict[tuple[str, str], gemm.Gemm]:
    """The attention GEMMs of a one-head layer under "flash", by (name, pass)."""
    return {(g.name, g.pass_): g
            for g in gemm.transformer_layer_gemms(seq_len, 1, head_dim, 1)
            if g.name in gemm.LAYER_GEMM_GROUPS["attention"]}


def test_a_fused_kernel_runs_the_unmasked_half_at_its_measured_rate():
    # FlashAttention's accounting [dao2023]: half the scores under a causal mask, and 5
    # matmuls in the backward for the model's 4; the rates are cuDNN's on an H100 at head
    # dimension 128 [shah2024]: 529 TFLOP/s forward and 518 backward at 8,192 tokens
    h100 = hardware.gpu("H100")
    ops = _fused_attention(8192, 128)
    scores, d_scores = ops["scores", "forward"], ops["scores", "dgrad"]
    assert gemm.is_fused_attention(scores)
    assert gemm.gemm_time_s(scores, h100) == pytest.approx(0.5 * scores.flops / 529e12)
    assert gemm.gemm_time_s(d_scores, h100) == pytest.approx(
        0.5 * 1.25 * d_scores.flops / 518e12)
    # a layer's fused attention: 0.5 x (2 + 5) / (2 + 4) = 58% of the model's FLOPs
    model_flops = sum(g.flops for g in ops.values())
    assert sum(g.flops * (0.5 if g.pass_ == "forward" else 0.625)
               for g in ops.values()) / model_flops == pytest.approx(7 / 12)


@pytest.mark.parametrize("seq_len, row", [(256, 512), (3000, 2048), (8192, 8192),
                                          (131072, 16384)])
def test_the_rate_is_the_longest_measured_sequence_not_above_it(seq_len, row):
    scores = _fused_attention(seq_len, 128)["scores", "forward"]
    rates = dict(gemm.FUSED_ATTENTION_RATES["forward"])
    assert gemm.measured_attention_rate(scores, hardware.gpu("H100")) == rates[row]


def test_unmeasured_kernels_keep_the_gemm_model_and_unfused_ones_the_whole_matrix():
    # another GPU or head dimension: the causal half at the GEMM model's rate
    for gpu, head_dim in (("A100", 128), ("H100", 64)):
        scores = _fused_attention(8192, head_dim)["scores", "forward"]
        device = hardware.gpu(gpu)
        assert gemm.measured_attention_rate(scores, device) is None
        assert gemm.gemm_time_s(scores, device) == pytest.approx(
            0.5 * gemm.gemm_compute_s(scores, device))
    # negative control: an unfused kernel (Megatron's baddbmm, then the mask) computes every
    # score, so "none" keeps the whole matrix and the roofline of its bytes
    unfused = next(g for g in gemm.transformer_layer_gemms(8192, 1, 128, 1, recompute="none")
                   if g.name == "scores")
    h100 = hardware.gpu("H100")
    assert not gemm.is_fused_attention(unfused)
    assert gemm.gemm_time_s(unfused, h100) == max(gemm.gemm_compute_s(unfused, h100),
                                                  unfused.hbm_bytes / h100.hbm_bytes_per_s)
