"""A mixture-of-experts model's parameters counted from its shapes (clusterlab.analytic.moe):
Mixtral 8x7B and DeepSeek-V3 against their published totals, the counts against sums written
out matrix by matrix, the FLOPs of the active parameters against flops.moe_flops_per_token, the
model-state bytes per GPU under expert parallelism, and the input errors."""

from __future__ import annotations

import pytest

from clusterlab.analytic import flops, moe

MIXTRAL = dict(n_layers=32, n_dense_layers=0, d_model=4096, dense_mlp_width=None,
               expert_mlp_width=14336, n_experts=8, top_k=2, n_shared_experts=0,
               vocab_size=32000)          # Jiang et al. 2024, Table 1
DEEPSEEK_V3 = dict(n_layers=61, n_dense_layers=3, d_model=7168, dense_mlp_width=18432,
                   expert_mlp_width=2048, n_experts=256, top_k=8, n_shared_experts=1,
                   vocab_size=129280)     # DeepSeek-AI 2024, section 4.2; config.json
DEEPSEEK_MLA = dict(n_heads=128, q_rank=1536, kv_rank=512, nope_head_dim=128,
                    rope_head_dim=64, v_head_dim=128)


def _mixtral() -> moe.MoeParameterCount:
    attention = moe.grouped_query_attention_parameters(4096, n_heads=32, n_kv_heads=8,
                                                       head_dim=128)
    return moe.moe_transformer_parameters(attention_per_layer=attention, **MIXTRAL)


def _deepseek_v3() -> moe.MoeParameterCount:
    attention = moe.latent_attention_parameters(7168, **DEEPSEEK_MLA)
    return moe.moe_transformer_parameters(attention_per_layer=attention, **DEEPSEEK_V3)


@pytest.mark.parametrize("model, total, active, rtol", [
    (_mixtral, 46.7e9, 12.9e9, 0.005),       # Mistral AI's 46.7B and 12.9B
    (_deepseek_v3, 671e9, 37e9, 0.02),       # the technical report's 671B and 37B
])
def test_counts_match_the_published_totals(model, total, active, rtol):
    counts = model()
    assert counts.total == pytest.approx(total, rel=rtol)
    assert counts.active == pytest.approx(active, rel=rtol)
    print(f"{model.__name__}: {counts.total / 1e9:.2f}B total, {counts.active / 1e9:.2f}B "
          f"active (published {total / 1e9:.1f}B, {active / 1e9:.1f}B)")


def test_mixtral_written_out_matrix_by_matrix():
    d, f, layers, vocab = 4096, 14336, 32, 32000
    attention = d * d + 2 * d * 1024 + d * d                  # q, k, v (8 heads of 128), o
    layer = attention + 8 * 3 * d * f + 8 * d + 2 * d          # experts, router, two norms
    counts = _mixtral()
    assert counts.total == layers * layer + 2 * vocab * d + d
    assert counts.active == counts.total - layers * 6 * 3 * d * f
    assert counts.routed_expert == layers * 8 * 3 * d * f


def test_latent_attention_written_out_matrix_by_matrix():
    d, a = 7168, 128
    expected = (d * 1536 + 1536 + 1536 * a * 192                 # q_a, its norm, q_b
                + d * 576 + 512 + 512 * a * 256                  # kv_a (latent + rope), norm, kv_b
                + a * 128 * d)                                   # o
    assert moe.latent_attention_parameters(d, **DEEPSEEK_MLA) == expected == 187_107_328


def test_active_flops_agree_with_flops_module():
    # flops.moe_flops_per_token takes the total and removes the unchosen experts itself
    counts = _mixtral()
    with_attention = flops.moe_flops_per_token(
        counts.total, 32, 4096, 4096, n_moe_layers=32, n_experts=8, top_k=2,
        params_per_expert=moe.gated_mlp_parameters(4096, 14336))
    assert with_attention == pytest.approx(6 * counts.active + 12 * 32 * 4096 * 4096)


def test_expert_parallel_state_bytes():
    counts = _deepseek_v3()
    rest = counts.total - counts.routed_expert
    assert moe.expert_parallel_state_bytes(counts, ep=1) == 16 * counts.total
    assert moe.expert_parallel_state_bytes(counts, ep=64, pp=16) == pytest.approx(
        16 * (rest + counts.routed_expert / 64) / 16)
    # more expert parallelism only ever shrinks the experts' share; the rest stays
    by_ep = [moe.expert_parallel_state_bytes(counts, ep=ep) for ep in (1, 8, 64, 256, 10**6)]
    assert by_ep == sorted(by_ep, reverse=True)
    assert by_ep[-1] == pytest.approx(16 * rest, rel=1e-4)


def test_bad_inputs_name_the_fix():
    attention = moe.grouped_query_attention_parameters(64, n_heads=4, n_kv_heads=2, head_dim=16)
    shape = dict(MIXTRAL, d_model=64, vocab_size=100, attention_per_layer=attention)
    with pytest.raises(ValueError, match="must divide n_heads"):
        moe.grouped_query_attention_parameters(64, n_heads=4, n_kv_heads=3, head_dim=16)
    with pytest.raises(ValueError, match="top_k must be between 1"):
        moe.moe_transformer_parameters(**dict(shape, top_k=9))
    with pytest.raises(ValueError, match="at least one MoE layer"):
        moe.moe_transformer_parameters(**dict(shape, n_dense_layers=32))
    with pytest.raises(ValueError, match="need dense_mlp_width"):
        moe.moe_transformer_parameters(**dict(shape, n_dense_layers=1))
    with pytest.raises(ValueError, match="d_model must be a positive integer"):
        moe.gated_mlp_parameters(0, 128)
    with pytest.raises(ValueError, match="ep must be a positive integer"):
        moe.expert_parallel_state_bytes(_mixtral(), ep=0)
    with pytest.raises(ValueError, match="mixed-precision Adam"):
        moe.expert_parallel_state_bytes(_mixtral(), ep=8, bytes_per_parameter=0)
