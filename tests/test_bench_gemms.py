"""clusterlab.device.bench.time_gemms and clusterlab.analytic.gemm.group_shares: each GEMM of a (tiny) layer
compiled, costed by XLA, timed and held to the ceilings it is given; a layer's GEMM time split
into groups."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import pytest

from clusterlab.analytic import gemm
from clusterlab.device import bench
from conftest import DEVICES

DEVICE = DEVICES[0]
KIND = f"{DEVICE.platform}:{DEVICE.device_kind}"
# A tiny layer: s = 32, b = 2, d = 64, 4 heads of 16, f = 128; scores in memory (no fusion).
LAYER = gemm.transformer_layer_gemms(32, 2, 64, 4, ffn_hidden=128, recompute="none")
# Ceilings no CPU reaches, so that time_gemms keeps them as given.
UNREACHABLE = bench.Roofline(KIND, peak_flops_per_s=1e18, memory_bytes_per_s=1e15,
                             dtype="float32")


@pytest.fixture(scope="module")
def rows() -> tuple[bench.GemmOnRoofline, ...]:
    return bench.time_gemms(LAYER, UNREACHABLE, DEVICE, warmup=1, repeats=3)


def test_one_row_per_gemm_in_order(rows):
    assert len(LAYER) == 18   # six forward GEMMs, a dgrad and a wgrad of each
    assert [row.gemm for row in rows] == list(LAYER)


def test_xla_flops_are_two_batch_m_n_k(rows):
    for row in rows:
        g = row.gemm
        assert row.cost.flops == 2 * g.batch * g.m * g.n * g.k == g.flops


def test_xla_bytes_are_the_three_matrices_at_four_bytes(rows):
    for row in rows:
        g = row.gemm
        assert row.cost.bytes_accessed == 4 * g.batch * (g.m * g.k + g.k * g.n + g.m * g.n)
        assert row.cost.bytes_accessed == 2 * g.hbm_bytes   # the GPU model counts BF16's 2


def test_timings_are_positive_and_finite(rows):
    for row in rows:
        assert len(row.timing.samples_s) == 3
        assert all(0 < s < math.inf for s in row.timing.samples_s)
        assert 0 < row.of_bound < math.inf and 0 < row.of_peak < math.inf


def test_bound_is_the_larger_of_compute_and_memory_at_the_given_ceilings(rows):
    for row in rows:
        assert row.ceilings == UNREACHABLE   # no GEMM beat a peak of 1e18 FLOP/s
        compute_s = row.cost.flops / UNREACHABLE.peak_flops_per_s
        memory_s = row.cost.bytes_accessed / UNREACHABLE.memory_bytes_per_s
        assert row.compute_s == pytest.approx(compute_s, rel=1e-12)
        assert row.memory_s == pytest.approx(memory_s, rel=1e-12)
        assert row.bound_s == max(row.compute_s, row.memory_s)
        assert row.bound_by == ("compute" if compute_s >= memory_s else "memory")
        assert row.of_bound == pytest.approx(row.bound_s / row.timing.median_s, rel=1e-12)
        assert row.of_peak == pytest.approx(
            row.cost.flops / row.timing.median_s / UNREACHABLE.peak_flops_per_s, rel=1e-12)


def test_thin_attention_gemms_are_memory_bound_and_the_mlp_compute_bound():
    # Lab 08's layer (heads of width 16): in float32 the scores do 7.1 FLOPs a byte, the MLP
    # 146.3; at a ridge of 50 FLOP/byte (the order of a 2-core host's) the first is bound by
    # memory, the second by compute. Nothing runs: the costs come from the shapes.
    ridge_50 = dataclasses.replace(UNREACHABLE, peak_flops_per_s=5e11, memory_bytes_per_s=1e10)
    shape = gemm.transformer_layer_gemms(256, 4, 512, 32, ffn_hidden=2048, recompute="none")
    forward = {g.name: g for g in shape if g.pass_ == "forward"}
    for name, intensity, expected in (("scores", 7.1, "memory"), ("mlp_up", 146.3, "compute")):
        cost = bench.gemm_cost(forward[name])
        assert cost.flops_per_byte == pytest.approx(intensity, abs=0.05)
        row = bench.GemmOnRoofline(forward[name], cost, bench.Timing((1.0,)), ridge_50)
        assert row.bound_by == expected


def test_a_gemm_faster_than_the_peak_raises_it_to_its_rate():
    slow_peak = dataclasses.replace(UNREACHABLE, peak_flops_per_s=1.0)   # 1 FLOP/s
    raised = bench.time_gemms(LAYER[:3], slow_peak, DEVICE, warmup=1, repeats=2)
    fastest = max(row.flops_per_s for row in raised)
    assert all(row.ceilings.peak_flops_per_s == fastest for row in raised)
    assert max(row.of_peak for row in raised) == pytest.approx(1.0, rel=1e-12)
    assert raised[0].ceilings.memory_bytes_per_s == slow_peak.memory_bytes_per_s
    kept = bench.time_gemms(LAYER[:1], slow_peak, DEVICE, warmup=0, repeats=1,
                            peak_from_fastest=False)
    assert kept[0].ceilings == slow_peak


def test_operands_have_the_gemm_shapes_on_the_device():
    g = LAYER[1]   # forward scores: 8 heads of (32 x 16) @ (16 x 32)
    a, b = bench.gemm_operands(g, DEVICE)
    assert a.shape == (8, 32, 16) and b.shape == (8, 16, 32)
    assert a.dtype == b.dtype == jnp.float32
    assert a.devices() == b.devices() == {DEVICE}


def test_time_gemms_rejects_what_it_cannot_time():
    with pytest.raises(ValueError, match="at least one GEMM"):
        bench.time_gemms((), UNREACHABLE, DEVICE)
    fractional = gemm.Gemm("scores", 32, 32, 16, batch=2.5)   # 5 heads over 2 GPUs
    with pytest.raises(ValueError, match="fractional dimensions.*batch=2.5"):
        bench.time_gemms((fractional,), UNREACHABLE, DEVICE)
    with pytest.raises(ValueError, match="bfloat16 matmuls but the GEMMs are float32"):
        bench.time_gemms(LAYER, dataclasses.replace(UNREACHABLE, dtype="bfloat16"), DEVICE)
    with pytest.raises(ValueError, match="same device"):
        bench.time_gemms(LAYER, dataclasses.replace(UNREACHABLE, device_kind="gpu:H100"),
                         DEVICE)


# --- gemm.group_shares ---------------------------------------------------------------------


def test_group_shares_split_the_total_by_name():
    shares = gemm.group_shares(LAYER, [1.0] * len(LAYER))
    # six GEMMs a group (forward, dgrad, wgrad of two names), all 1 s: a third each
    assert list(shares) == ["attention", "MLP", "projections"]
    assert all(share == pytest.approx(1 / 3, rel=1e-12) for share in shares.values())
    seconds = [3.0 if g.name == "mlp_up" else 1.0 for g in LAYER]   # mlp_up: 3 x 3 s
    shares = gemm.group_shares(LAYER, seconds)
    assert shares["MLP"] == pytest.approx((9 + 3) / (9 + 3 + 6 + 6), rel=1e-12)
    assert sum(shares.values()) == pytest.approx(1.0, rel=1e-12)


def test_group_shares_of_flops_alone_put_little_on_thin_attention():
    # priced by FLOPs alone, attention's share is its share of the FLOPs per token (forward and
    # backward alike): 4 s d of QKV's 6 d^2, the output projection's 2 d^2, the MLP's 4 d f and
    # attention's 4 s d
    s, d, f = 32, 64, 128
    shares = gemm.group_shares(LAYER, [g.flops for g in LAYER])
    total = 6 * d**2 + 2 * d**2 + 4 * d * f + 4 * s * d
    assert shares["attention"] == pytest.approx(4 * s * d / total, rel=1e-12)
    assert shares["MLP"] == pytest.approx(4 * d * f / total, rel=1e-12)


def test_group_shares_reject_bad_groups_and_times():
    with pytest.raises(ValueError, match="one time per GEMM"):
        gemm.group_shares(LAYER, [1.0])
    with pytest.raises(ValueError, match="no group: qkv"):
        gemm.group_shares(LAYER, [1.0] * len(LAYER),
                          {"attention": ("scores", "attention_over_values"),
                           "rest": ("mlp_up", "mlp_down", "output_projection")})
    with pytest.raises(ValueError, match="two groups"):
        gemm.group_shares(LAYER, [1.0] * len(LAYER),
                          dict(gemm.LAYER_GEMM_GROUPS, extra=("qkv",)))
    with pytest.raises(ValueError, match="positive"):
        gemm.group_shares(LAYER, [0.0] * len(LAYER))
