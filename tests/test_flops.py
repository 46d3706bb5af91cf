"""Unit tests of clusterlab.analytic.flops against hand-derived and published values."""

import math

import pytest

from clusterlab.analytic import flops
from clusterlab.catalog import hardware


def test_training_flops_gpt3_matches_published_total():
    # Brown et al. 2020: 175e9 parameters, 300e9 tokens -> 6 * N * D = 3.15e23 FLOPs
    # (their Table D.1 lists 3.14e23 for GPT-3 175B).
    assert flops.training_flops(175e9, 300e9) == pytest.approx(3.15e23, rel=1e-12)
    assert flops.training_flops(175e9, 300e9) == pytest.approx(3.14e23, rel=5e-3)


def test_training_flops_is_linear_in_both_arguments():
    base = flops.training_flops(1e9, 1e12)
    assert base == pytest.approx(6e21)
    assert flops.training_flops(2e9, 1e12) == pytest.approx(2 * base)
    assert flops.training_flops(1e9, 3e12) == pytest.approx(3 * base)


def test_transformer_flops_per_token_hand_computed():
    # 6 * 100 + 12 * 2 * 8 * 4 = 600 + 768
    assert flops.transformer_flops_per_token(100, 2, 8, 4) == pytest.approx(1368.0)


def test_transformer_flops_per_token_palm_540b_attention_share():
    # PaLM 540B: L=118, H=48 heads of Q=256, T=2048 (Chowdhery et al. 2022, Table 1 and App. B).
    # The attention term 12*L*H*Q*T is about 3.56e10 per token, about 1% of 6N = 3.24e12.
    per_token = flops.transformer_flops_per_token(540.35e9, 118, 2048, 48 * 256)
    attention = per_token - 6 * 540.35e9
    assert attention == pytest.approx(12 * 118 * 2048 * 48 * 256)
    assert 0.005 < attention / per_token < 0.02


def test_mfu_palm_540b_reported_value():
    # PaLM (Chowdhery et al. 2022, Sec. 4.1 and App. B): 238.3K tokens/s on 6144 TPU v4 chips
    # at 275 TFLOP/s peak each, 6N + 12LHQT = 6*540.35e9 + 12*118*48*256*2048 FLOPs/token;
    # the paper reports 46.2% MFU.
    # PaLM counts 12*L*H*Q*T with H*Q = 48*256 = 12288 (its attention width).
    per_token = flops.transformer_flops_per_token(540.35e9, 118, 2048, 48 * 256)
    value = flops.mfu(238.3e3 * per_token, 6144, 275e12)
    assert value == pytest.approx(0.462, abs=0.002)


def test_mfu_simple_ratio():
    assert flops.mfu(400e12, 1, 1000e12) == pytest.approx(0.4)
    assert flops.mfu(0.0, 8, 1e15) == 0.0
    assert flops.mfu(8 * 0.5e15, 8, 1e15) == pytest.approx(0.5)


def test_time_to_train_inverts_mfu():
    total = flops.training_flops(70e9, 2e12)
    h100 = hardware.gpu("H100").bf16_flops
    seconds = flops.time_to_train_s(total, 2048, h100, 0.4)
    assert seconds == pytest.approx(total / (2048 * h100 * 0.4))
    # running at that speed for that long reproduces the MFU
    assert flops.mfu(total / seconds, 2048, h100) == pytest.approx(0.4)
    # twice the devices, half the time
    assert flops.time_to_train_s(total, 4096, h100, 0.4) == pytest.approx(seconds / 2)


@pytest.mark.parametrize("args", [(0, 1e12), (-1, 1e12), (1e9, 0), (math.nan, 1), (math.inf, 1)])
def test_training_flops_rejects_non_positive(args):
    with pytest.raises(ValueError, match="positive"):
        flops.training_flops(*args)


@pytest.mark.parametrize("args,name", [
    ((1e9, 0, 8, 4), "n_layers"), ((1e9, 2, 2.5, 4), "seq_len"), ((1e9, 2, 8, -4), "d_model"),
    ((0, 2, 8, 4), "n_params"),
])
def test_transformer_flops_per_token_rejects_bad_sizes(args, name):
    with pytest.raises(ValueError, match=name):
        flops.transformer_flops_per_token(*args)


def test_mfu_rejects_impossible_inputs():
    with pytest.raises(ValueError, match="at most 1"):
        flops.mfu(2e15, 1, 1e15)
    with pytest.raises(ValueError, match="model_flops_per_s"):
        flops.mfu(-1.0, 1, 1e15)
    with pytest.raises(ValueError, match="n_devices"):
        flops.mfu(1.0, 0, 1e15)
    with pytest.raises(ValueError, match="peak_flops_per_device"):
        flops.mfu(1.0, 1, 0)
    with pytest.raises(ValueError, match="model_flops_per_s"):
        flops.mfu("fast", 1, 1e15)


@pytest.mark.parametrize("bad_mfu", [0.0, -0.1, 1.5])
def test_time_to_train_rejects_mfu_outside_unit_interval(bad_mfu):
    with pytest.raises(ValueError, match="mfu"):
        flops.time_to_train_s(1e20, 8, 1e15, bad_mfu)


def test_time_to_train_rejects_bad_device_count():
    with pytest.raises(ValueError, match="n_devices"):
        flops.time_to_train_s(1e20, 0, 1e15, 0.4)


def test_causal_flops_per_token_hand_computed():
    # forward: 2*100 + 2*2*4*(8+1) = 200 + 144; training triples it
    assert flops.causal_flops_per_token(100, 2, 8, 4, backward=False) == pytest.approx(344.0)
    assert flops.causal_flops_per_token(100, 2, 8, 4) == pytest.approx(3 * 344.0)


def test_causal_count_is_the_sum_over_positions():
    # token i attends over i tokens: 4*i*d per layer forward; the mean over T positions
    n, layers, seq, width = 1e6, 3, 16, 8
    summed = sum(2 * n + 4 * layers * i * width for i in range(1, seq + 1)) / seq
    assert flops.causal_flops_per_token(n, layers, seq, width, backward=False) == pytest.approx(
        summed)


def test_mfu_convention_over_causal_short_and_long_context():
    # PaLM 540B at 2048 tokens: the conventions agree to about half a percent
    short = flops.mfu_convention_over_causal(540.35e9, 118, 2048, 48 * 256)
    assert 1.0 < short < 1.01
    # a 405B model (126 layers, width 16384) at 131,072 tokens: about 1.4 (review M7.1)
    long = flops.mfu_convention_over_causal(405e9, 126, 131072, 16384)
    assert long == pytest.approx(1.40, abs=0.01)
    # 12 L s d of the convention is 3.25 TFLOP per token there, against 6N = 2.43 TFLOP
    attention = flops.transformer_flops_per_token(405e9, 126, 131072, 16384) - 6 * 405e9
    assert attention == pytest.approx(3.25e12, rel=2e-3)


def test_transformer_params_counts_llama_3_shapes():
    # Dubey et al. 2024, Table 3 shapes; Meta's model cards: 8.03B and 405B (405.8e9 counted)
    assert flops.transformer_params(32, 4096, n_heads=32, n_kv_heads=8, ffn_width=14336,
                                    vocab_size=128256) == pytest.approx(8.030e9, rel=1e-3)
    assert flops.transformer_params(126, 16384, n_heads=128, n_kv_heads=8, ffn_width=53248,
                                    vocab_size=128256) == pytest.approx(405.85e9, rel=1e-4)
    # multi-head, no vocabulary: 4 d^2 + 3 d f per layer
    assert flops.transformer_params(2, 8, n_heads=2, n_kv_heads=2, ffn_width=16) == 2 * (
        4 * 64 + 3 * 8 * 16)
    with pytest.raises(ValueError, match="must divide n_heads"):
        flops.transformer_params(2, 8, n_heads=4, n_kv_heads=3, ffn_width=16)
