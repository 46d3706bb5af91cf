"""Lab 08's checks of the library's own models and of XLA's counts, held here so that the lab keeps
one check per idea. Nothing here is timed: each test compiles programs and reads their cost.

- XLA's cost analysis of an n x n float32 matmul: 2 n^3 FLOPs on 3 matrices of 4 n^2 bytes, and
  of the element-wise 2x + 1: 0.25 FLOP/byte.
- The 18 GEMMs of the lab's host layer (``gemm.HOST_LAYER``): XLA's FLOPs and bytes of each equal
  the GPU model's (bytes at 4 bytes a value, where the model counts BF16's 2), and their sum is
  3 T (8 d^2 + 4 d f + 4 s d); the GPU model prices every attention GEMM at a smaller share of an
  H100's peak than every MLP GEMM.
- The lab's training step (residual MLP, width 512, hidden 2048, two blocks, batch 256): XLA's
  FLOPs within 10% of the 6N rule; the gradients alone are 6N less the first block's input
  gradient, which never runs.

The trace's parts adding up to its wall time, which the lab printed beside a check, are held in
tests/test_profile.py (test_captured_parts_add_up_to_the_wall_time).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from clusterlab.analytic import flops, gemm
from clusterlab.catalog import hardware
from clusterlab.device import bench, models

SQUARE_SIZES = (16, 32, 64, 128, 256, 512, 1024)
D_MODEL, D_HIDDEN, N_BLOCKS, BATCH = 512, 2048, 2, 256


def _matrix(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.float32)


@pytest.mark.parametrize("n", SQUARE_SIZES)
def test_lab08_square_matmul_costs_two_n_cubed_flops_on_twelve_n_squared_bytes(n):
    cost = bench.program_cost(jax.jit(jnp.matmul), _matrix(n, n), _matrix(n, n))
    assert (cost.flops, cost.bytes_accessed) == (2 * n**3, 12 * n**2)
    assert cost.flops_per_byte == pytest.approx(n / 6, rel=1e-12)


def test_lab08_elementwise_stream_does_a_quarter_flop_per_byte():
    cost = bench.program_cost(jax.jit(lambda v: v * 2.0 + 1.0), _matrix(2**20))
    assert cost.flops_per_byte == 0.25          # 2 FLOPs per 4 bytes read and 4 written


@pytest.fixture(scope="module")
def host_layer():
    seq, micro_batch, width, heads, ffn = gemm.HOST_LAYER
    gemms = gemm.transformer_layer_gemms(seq, micro_batch, width, heads, ffn_hidden=ffn,
                                         recompute="none")
    return gemms, [bench.gemm_cost(g) for g in gemms]


def test_lab08_xla_counts_each_layer_gemm_as_the_gpu_model(host_layer):
    gemms, costs = host_layer
    assert len(gemms) == 18
    assert [c.flops for c in costs] == [g.flops for g in gemms]
    assert [c.bytes_accessed for c in costs] == [2 * g.hbm_bytes for g in gemms]


def test_lab08_layer_gemm_flops_are_three_t_times_the_forward_per_token(host_layer):
    gemms, _ = host_layer
    seq, micro_batch, width, _, ffn = gemm.HOST_LAYER
    tokens = micro_batch * seq   # forward per token: QKV 6 d^2, projection 2 d^2, MLP 4 d f, attention 4 s d
    assert sum(g.flops for g in gemms) == pytest.approx(
        3 * tokens * (8 * width**2 + 4 * width * ffn + 4 * seq * width), rel=1e-12)


def test_lab08_h100_model_prices_every_attention_gemm_below_every_mlp_gemm(host_layer):
    gemms, _ = host_layer
    h100 = hardware.gpu("H100")
    share = {group: [g.flops / gemm.gemm_time_s(g, h100) / h100.bf16_flops
                     for g in gemms if g.name in names]
             for group, names in gemm.LAYER_GEMM_GROUPS.items() if group in ("attention", "MLP")}
    assert len(share["attention"]) == len(share["MLP"]) == 6
    assert max(share["attention"]) < min(share["MLP"])


def test_lab08_training_step_flops_against_the_six_n_rule():
    params = models.init_mlp(jax.random.key(0), d_model=D_MODEL, d_hidden=D_HIDDEN,
                             n_blocks=N_BLOCKS)
    optimizer = models.make_optimizer()
    x, y = models.synthetic_regression(jax.random.key(1), n_samples=BATCH, d_model=D_MODEL)
    model_flops = flops.training_flops(models.param_count(params), BATCH)
    step_flops = bench.program_cost(models.make_train_step(models.mse_loss, optimizer), params,
                                    optimizer.init(params), x, y).flops
    assert 0.9 <= step_flops / model_flops <= 1.1
    gradient_flops = bench.program_cost(jax.jit(jax.value_and_grad(models.mse_loss)),
                                        params, x, y).flops
    first_input_gradient_flops = 2 * BATCH * D_MODEL * D_HIDDEN   # charged by 6N, never run
    assert gradient_flops == pytest.approx(model_flops - first_input_gradient_flops, rel=1e-3)
