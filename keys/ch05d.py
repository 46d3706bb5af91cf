"""Answer key of chapter 05d's exercises (instructor-only: student copies leave keys/ out).

Each expected value is computed here as the chapter's solution computes it.
"""

import numpy as np

from clusterlab.analytic import moe
from clusterlab.course import grading

# DeepSeek-V3's shapes (DeepSeek-AI 2024, section 4.2; its released config.json)
DEEPSEEK_V3 = moe.moe_transformer_parameters(
    n_layers=61, n_dense_layers=3, d_model=7168,
    attention_per_layer=moe.latent_attention_parameters(
        7168, n_heads=128, q_rank=1536, kv_rank=512, nope_head_dim=128, rope_head_dim=64,
        v_head_dim=128),
    dense_mlp_width=18432, expert_mlp_width=2048, n_experts=256, top_k=8, n_shared_experts=1,
    vocab_size=129280)


def _expert_parallel_memory(pp: int = 16) -> tuple[float, ...]:
    return tuple(moe.expert_parallel_state_bytes(DEEPSEEK_V3, ep=ep, pp=pp) / 1e9
                 for ep in (8, 32, 64))


def _capacity(n_experts: int = 16, k: int = 2, tokens: int = 480) -> tuple[int, int, float]:
    to_hot = tokens * k // 4                                   # a quarter of the assignments
    cold = 1 + np.arange(tokens * k - to_hot) % (n_experts - 1)  # the rest cycle over 1..15
    routed = np.concatenate([np.stack([np.zeros(to_hot, int), cold[:to_hot]], axis=1),
                             cold[to_hot:].reshape(-1, k)])
    dropped, slots = [], []
    for factor in (1.0, 1.5):
        capacity = moe.expert_capacity(tokens, n_experts=n_experts, top_k=k,
                                       capacity_factor=factor)
        dropped.append(moe.predicted_dropped(routed, capacity, n_experts))
        slots.append(n_experts * capacity)
    return dropped[0], dropped[1], slots[1] / slots[0]


KEY = {
    "ch05d.1": grading.close(
        _expert_parallel_memory(), rtol=1e-2,
        name="(GB of model states per GPU at 8-, 32- and 64-way expert parallelism)",
        hint="16 bytes per parameter times (everything but the routed experts, plus the "
             "routed experts over the expert-parallel degree), over the 16 pipeline stages."),
    "ch05d.2": grading.close(
        _capacity(), rtol=1e-3,    # tight enough to pin the counts
        name="(assignments dropped at factor 1.0, dropped at 1.5, buffer growth factor)",
        hint="Capacity is ceil(gamma T k / E) per expert; only expert 0 overflows, by its "
             "assignments beyond capacity; each buffer holds E times capacity slots."),
}
