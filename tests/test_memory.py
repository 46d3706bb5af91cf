"""Tests of clusterlab.analytic.memory against the ZeRO paper's worked example and hand-derived values."""

from __future__ import annotations

import pytest

from clusterlab.analytic import memory


@pytest.mark.parametrize("stage, expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.88)])
def test_zero_paper_figure_1(stage, expected_gb):
    # Rajbhandari et al. 2020, Figure 1: 7.5B parameters, K = 12, N_d = 64.
    got_gb = memory.training_memory_per_device(7.5e9, 64, stage) / 1e9
    assert got_gb == pytest.approx(expected_gb, abs=0.05 if stage else 1e-9)


def test_stages_exact_formulas():
    n, dp = 1e9, 8
    assert memory.training_memory_per_device(n, dp, 0) == pytest.approx(16e9)
    assert memory.training_memory_per_device(n, dp, 1) == pytest.approx(4e9 + 12e9 / 8)
    assert memory.training_memory_per_device(n, dp, 2) == pytest.approx(2e9 + 14e9 / 8)
    assert memory.training_memory_per_device(n, dp, 3) == pytest.approx(16e9 / 8)


def test_dp_one_means_no_saving_and_stages_decrease():
    n = 3e9
    assert {memory.training_memory_per_device(n, 1, s) for s in range(4)} == {16 * n}
    values = [memory.training_memory_per_device(n, 16, s) for s in range(4)]
    assert values == sorted(values, reverse=True) and len(set(values)) == 4


def test_custom_bytes():
    # FP32 everything with SGD + momentum: 4 + 4 + 4 bytes, stage 3 over 4 devices.
    got = memory.training_memory_per_device(1e6, 4, 3, bytes_param=4, bytes_grad=4,
                                            optimizer_bytes_per_param=4)
    assert got == pytest.approx(3e6)


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_params=0, dp=8, zero_stage=1), "n_params"),
    (dict(n_params=1e9, dp=0, zero_stage=1), "dp"),
    (dict(n_params=1e9, dp=2.5, zero_stage=1), "dp"),
    (dict(n_params=1e9, dp=8, zero_stage=4), "zero_stage"),
    (dict(n_params=1e9, dp=8, zero_stage=1, bytes_param=-2), "bytes_param"),
])
def test_invalid_inputs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        memory.training_memory_per_device(**kwargs)


def test_checkpoint_bytes():
    assert memory.checkpoint_bytes(70e9) == pytest.approx(980e9)  # 14 bytes per parameter
    assert memory.checkpoint_bytes(70e9, optimizer_bytes_per_param=0) == pytest.approx(140e9)
    with pytest.raises(ValueError, match="n_params"):
        memory.checkpoint_bytes(-1)
