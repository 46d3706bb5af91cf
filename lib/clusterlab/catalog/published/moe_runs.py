"""Published mixture-of-experts training throughputs in BF16 on H100, the rows the planner's
expert terms are held to.

Both rows are GPT-OSS 120B pretraining on 64 H100 (DGX-H100) in NVIDIA's Megatron-Bridge
performance summary (``docs/performance-summary-archive.md`` of NVIDIA-NeMo/Megatron-Bridge,
https://docs.nvidia.com/nemo/megatron-bridge/latest/performance-summary-archive.html): the
"25.11 NeMo Container" and "26.02 NeMo Container" tables, BF16, synthetic data, the token
distribution force-balanced over the experts and no token dropped (the page's note).

The model (OpenAI's gpt-oss-120b config.json): 36 layers of width 2880, 64 query heads and 8
key/value heads of 64, 128 experts of a 2880-wide gated MLP, top 4, vocabulary 201,088. Two
things the planner cannot express: attention 4096 wide (64 x 64) against the 2880-wide
residual stream (the planner takes attention as wide as ``d_model``), and a 128-token sliding
window on every other layer (the planner prices full causal attention).

Units: tokens per second per GPU.
"""

from __future__ import annotations

from typing import NamedTuple

SOURCE = ("NVIDIA Megatron-Bridge performance summary archive, DGX-H100, BF16 "
          "(docs/performance-summary-archive.md)")


class MoeRun(NamedTuple):
    """One published mixture-of-experts run: release, layout and measured throughput."""

    name: str
    release: str                 # the NeMo container of the table
    n_gpus: int
    global_batch: int
    micro_batch: int
    seq_len: int
    tp: int
    pp: int
    ep: int
    tokens_per_s_per_gpu: float
    gpu: str = "H100"
    source: str = SOURCE

    @property
    def dp(self) -> int:
        """Data-parallel replicas: ``n_gpus / (tp pp)`` (ep is carved from them)."""
        return self.n_gpus // (self.tp * self.pp)


#: GPT-OSS 120B's shape: (layers, width, heads, K/V heads, experts, top-k, expert MLP, vocab)
GPT_OSS_120B_SHAPE = (36, 2880, 64, 8, 128, 4, 2880, 201_088)

ROWS: tuple[MoeRun, ...] = (
    MoeRun("GPT-OSS 120B", "25.11", 64, 512, 4, 4096, 1, 4, 8, 5630),
    MoeRun("GPT-OSS 120B", "26.02", 64, 1280, 1, 4096, 1, 4, 8, 5993),
)
