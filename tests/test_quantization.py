"""Quantized decode steps (clusterlab.analytic.quantization) against serving.decode_step."""

from __future__ import annotations

import pytest

from clusterlab.analytic import quantization, serving
from clusterlab.catalog import hardware

LLAMA = serving.LLAMA_3_70B


@pytest.mark.parametrize("tp, batch", [(1, 1), (8, 1), (8, 500)])
def test_bf16_matches_serving(tp, batch):
    if tp == 1:
        args = dict(gpu="B200")  # BF16 Llama 3 70B fits one B200's HBM
    else:
        args = dict(gpu="H200")
    ours = quantization.quantized_decode_step(LLAMA, batch, 4096, tp=tp, **args)
    theirs = serving.decode_step(LLAMA, batch, 4096, tp=tp, **args)
    assert ours.time_s == pytest.approx(theirs.time_s, rel=1e-12)


def test_fp8_halves_the_bytes_and_keeps_bf16_all_reduces():
    base = quantization.quantized_decode_step(LLAMA, 700, 4096, gpu="H200", tp=8)
    both = quantization.quantized_decode_step(LLAMA, 700, 4096, gpu="H200", tp=8,
                                              weights="fp8", kv_cache="fp8")
    assert both.hbm_bytes == pytest.approx(base.hbm_bytes / 2)
    assert both.communication_s == base.communication_s       # activations stay BF16
    # serving.decode_step would price the all-reduces at one byte per activation: cheaper.
    coupled = serving.decode_step(LLAMA, 700, 4096, gpu="H200", tp=8, bytes_per_param=1,
                                  bytes_per_element=1, precision="fp8")
    assert coupled.communication_s < both.communication_s
    # FP8 weights use the FP8 roof; INT8 (weight-only) keeps BF16's.
    fp8 = quantization.quantized_decode_step(LLAMA, 700, 4096, gpu="H200", tp=8, weights="fp8")
    int8 = quantization.quantized_decode_step(LLAMA, 700, 4096, gpu="H200", tp=8, weights="int8")
    assert fp8.hbm_bytes == int8.hbm_bytes
    ratio = hardware.peak_flops("H200", precision="fp8") / hardware.peak_flops("H200")
    assert int8.compute_s == pytest.approx(ratio * fp8.compute_s)


def test_unknown_format_names_the_known_ones():
    with pytest.raises(ValueError, match="'bf16', 'fp8'"):
        quantization.quantized_decode_step(LLAMA, 1, 16, gpu="H200", tp=8, kv_cache="int4")
