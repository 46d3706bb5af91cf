"""Answer key of chapter 05c's exercise (instructor-only: student copies leave keys/ out).

The expected value is computed here as the chapter's solution computes it.
"""

from clusterlab.analytic import costmodel, flops
from clusterlab.catalog import hardware
from clusterlab.course import grading

# Llama 3 70B (Dubey et al. 2024, Table 3): the chapter's model shape.
N = flops.transformer_params(80, 8192, n_heads=64, n_kv_heads=8, ffn_width=28672,
                             vocab_size=128256)


def _smallest_hiding_tokens(gpu: str, server: str, dp: int = 64) -> float:
    """Tokens per replica at which the backward pass (4N FLOPs a token) lasts as long as the BF16
    gradient all-reduce over the server's NICs, at peak FLOP/s."""
    comm_s = costmodel.data_parallel_bytes_per_step(N, 2, dp) / hardware.scale_out_bytes_per_s(
        server)
    return comm_s * hardware.peak_flops(gpu) / (4 * N)


KEY = {
    "ch05c.1": grading.close(
        (_smallest_hiding_tokens("H100", "DGX H100"), _smallest_hiding_tokens("B200", "DGX B200")),
        rtol=1e-2, name="(tokens per replica on H100, tokens per replica on B200)",
        hint="Set the backward pass's time, 4 N T / peak FLOP/s, equal to the all-reduce's, "
             "costmodel.data_parallel_bytes_per_step(N, 2, 64) over "
             "hardware.scale_out_bytes_per_s(server), and solve for T; N cancels."),
}
