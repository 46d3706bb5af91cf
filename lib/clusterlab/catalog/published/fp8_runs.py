"""Published FP8 training throughputs on H100, the rows the planner's FP8 pricing is held to.

Every row is from NVIDIA's Megatron-Bridge performance summary, "25.11 NeMo Container",
"System: DGX-H100" (``docs/performance-summary.md`` of NVIDIA-NeMo/Megatron-Bridge, also at
https://docs.nvidia.com/nemo/megatron-bridge/latest/performance-summary.html): Llama 3 pretraining
with FP8 current scaling ("FP8-CS"), synthetic data, the layout of each row as published. The
model shapes are Meta's (Dubey et al. 2024, Table 3): 8B, 70B and 405B.

What the table does not say, and the planner assumes: no activation recomputation; Megatron's
distributed optimizer where FSDP is 0 (ZeRO-1), FSDP over all 8 GPUs of the 8B row (ZeRO-3).

Units: tokens per second per GPU; model TFLOP/s per GPU as published (of the BF16 convention's
model FLOPs).
"""

from __future__ import annotations

from typing import NamedTuple

SOURCE = ("NVIDIA Megatron-Bridge performance summary, 25.11 NeMo Container, DGX-H100, "
          "FP8-CS (docs/performance-summary.md)")


class Fp8Run(NamedTuple):
    """One published FP8 run: the model's shape, the layout and the measured throughput."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    ffn_width: int               # the gated MLP's hidden width
    vocab_size: int
    n_gpus: int
    global_batch: int
    micro_batch: int
    seq_len: int
    tp: int
    pp: int
    cp: int
    virtual_stages: int
    zero_stage: int              # 3 where the table says FSDP; else 1 (distributed optimizer)
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    gpu: str = "H100"
    source: str = SOURCE

    @property
    def dp(self) -> int:
        """Data-parallel replicas: ``n_gpus / (tp pp cp)``."""
        return self.n_gpus // (self.tp * self.pp * self.cp)


ROWS: tuple[Fp8Run, ...] = (
    Fp8Run("Llama 3 8B", 32, 4096, 32, 8, 14336, 128256, 8, 128, 1, 8192, 1, 1, 1, 1, 3,
           14451, 744),
    Fp8Run("Llama 3 70B", 80, 8192, 64, 8, 28672, 128256, 64, 128, 1, 8192, 4, 8, 1, 5, 1,
           1602, 719),
    Fp8Run("Llama 3.1 405B", 126, 16384, 128, 8, 53248, 128256, 1024, 512, 1, 8192, 8, 8, 2, 8,
           1, 292, 737),
)
