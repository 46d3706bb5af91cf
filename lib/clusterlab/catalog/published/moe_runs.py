"""Published mixture-of-experts training throughputs in BF16, the rows the planner's expert
terms are held to.

Every row is GPT-OSS 120B pretraining on 64 GPUs in NVIDIA's Megatron-Bridge performance
summary (``docs/performance-summary-archive.md`` of NVIDIA-NeMo/Megatron-Bridge,
https://docs.nvidia.com/nemo/megatron-bridge/latest/performance-summary-archive.html), BF16,
synthetic data, the token distribution force-balanced over the experts and no token dropped
(the page's note: "we force-balance the token distribution among experts and all benchmarks
are token-dropless"): on DGX-H100 in the "25.11 NeMo Container" and "26.02 NeMo Container"
tables, and on DGX-B200, DGX-GB200 and DGX-GB300 in the 25.11 table (its per-system
sub-tables). The H100 rows of the 26.02.01, 26.04 and 26.04.01 tables repeat the 26.02 layout
(5,984, 5,810 and 5,824 tokens/s per GPU) and are left out as repeats.

A DGX-GB200 or DGX-GB300 is an NVL72 rack of 4-GPU compute trays in one NVLink domain; the
page does not say where its 64 GPUs sat. The rows take them as 16 trays of one rack, one
NVLink domain of 64 (what their expert parallelism of 64, one expert group over the whole job,
suggests).

The model (OpenAI's gpt-oss-120b config.json): 36 layers of width 2880, 64 query heads and 8
key/value heads of 64, 128 experts of a 2880-wide gated MLP, top 4, vocabulary 201,088. Two
things the planner cannot express: attention 4096 wide (64 x 64) against the 2880-wide
residual stream (the planner takes attention as wide as ``d_model``), and a 128-token sliding
window on every other layer (the planner prices full causal attention).

What the release ran (Megatron-Bridge 0.2.0, the 25.11 container's, which pins Megatron Core
0.15 at commit 0d8e071 and Transformer Engine 2.9; ``src/megatron/bridge/models/gpt_oss/
gpt_oss_provider.py``, ``src/megatron/bridge/recipes/gpt_oss/gpt_oss.py`` and
``scripts/performance/configs/gpt_oss/``): the all-to-all dispatcher with fused permutations,
Transformer Engine's grouped GEMM, no auxiliary loss (``moe_router_load_balancing_type
"none"``) and random router logits to force the balance (``moe_router_force_load_balancing``),
biases on every linear layer (``add_bias_linear``), a gated quick-GELU clamped at 7 with an
offset of 1 on its linear half, learned attention sinks (``softmax_type "learnable"``, fused by
Transformer Engine from 2.8 on) and a 128-token window on every other layer. BF16 pads
nothing (the expert inputs are padded only in FP8 and FP4). The configuration recomputes
``layernorm`` and ``moe_act`` on H100, B200 and GB200, and on GB300 captures ``attn``,
``moe_router`` and ``moe_preprocess`` in CUDA graphs instead.

The table and that configuration file disagree on some layouts: H100 micro-batch 1 in the file
(4 in the table), B200 expert parallelism 64 (8), GB200 and GB300 a batch of 512 sequences of
4,096 at micro-batch 4 (1,280 of 8,192 at 1 and 2). The 26.02 table's rows match the 26.02
release's file (Megatron-Bridge 0.3.0). The rows keep the tables' layouts: they are what was
measured.

Units: tokens per second per GPU.
"""

from __future__ import annotations

from typing import NamedTuple

SOURCE = ("NVIDIA Megatron-Bridge performance summary archive, BF16 "
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
    gpus_per_node: int = 8       # GPUs of one host (a DGX node, or a 4-GPU NVL72 tray)
    #: GPUs of one NVLink domain spanning hosts (an NVL72 rack's share the run used); None:
    #: the domain ends at the host
    nvlink_domain_gpus: int | None = None
    fabric_link: str = "IB-NDR"  # the NIC between hosts (hardware.LINKS)
    #: Megatron Core's recompute_modules in the release's performance configuration
    #: (scripts/performance/configs/gpt_oss/ of Megatron-Bridge 0.2.0 and 0.3.0)
    recompute_modules: tuple[str, ...] = ()

    @property
    def dp(self) -> int:
        """Data-parallel replicas: ``n_gpus / (tp pp)`` (ep is carved from them)."""
        return self.n_gpus // (self.tp * self.pp)


#: GPT-OSS 120B's shape: (layers, width, heads, K/V heads, experts, top-k, expert MLP, vocab)
GPT_OSS_120B_SHAPE = (36, 2880, 64, 8, 128, 4, 2880, 201_088)

#: what the H100, B200 and GB200 configurations recompute (GB300's uses CUDA graphs instead)
NORMS_AND_EXPERT_ACTIVATION = ("layernorm", "moe_act")

ROWS: tuple[MoeRun, ...] = (
    MoeRun("GPT-OSS 120B", "25.11", 64, 512, 4, 4096, 1, 4, 8, 5630,
           recompute_modules=NORMS_AND_EXPERT_ACTIVATION),
    MoeRun("GPT-OSS 120B", "26.02", 64, 1280, 1, 4096, 1, 4, 8, 5993,
           recompute_modules=NORMS_AND_EXPERT_ACTIVATION),
    MoeRun("GPT-OSS 120B", "25.11", 64, 512, 4, 4096, 1, 1, 8, 8213, gpu="B200",
           recompute_modules=NORMS_AND_EXPERT_ACTIVATION),
    MoeRun("GPT-OSS 120B", "25.11", 64, 1280, 1, 8192, 1, 1, 64, 15876, gpu="GB200",
           gpus_per_node=4, nvlink_domain_gpus=64,
           recompute_modules=NORMS_AND_EXPERT_ACTIVATION),
    MoeRun("GPT-OSS 120B", "25.11", 64, 1280, 2, 8192, 1, 1, 64, 18347, gpu="GB300",
           gpus_per_node=4, nvlink_domain_gpus=64, fabric_link="IB-XDR"),
)
