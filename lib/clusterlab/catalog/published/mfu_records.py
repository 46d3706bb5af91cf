"""The highest model FLOPs utilization (MFU) a published training run reached, per class of run.

The planner's headline MFU is held against these (``clusterlab.analytic.plan.mfu_ceiling``): a
prediction above the best published run of its class is flagged, since no one has shown it.

A class is the accelerator, whether the model is dense or a mixture of experts, and the
training precision. Every row is BF16; a class without a row (FP8 training among them) has no
published maximum here, and nothing is flagged for it.

Units: MFU is a fraction of the dense BF16 peak.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Kind = Literal["dense", "moe"]


class MfuRecord(NamedTuple):
    """The best published MFU of one class of training run.

    Attributes:
        gpu: the accelerator (a ``clusterlab.catalog.hardware`` name).
        kind: "dense" or "moe".
        mfu: the published maximum, a fraction of the BF16 peak.
        run: what reached it.
        source: where it is stated.
    """

    gpu: str
    kind: Kind
    mfu: float
    run: str
    source: str


RECORDS: tuple[MfuRecord, ...] = (
    MfuRecord("A100", "dense", 0.563, "Megatron-LM 1T parameters, 512 A100, dp = 1",
              "Korthikanti et al. 2022 (arXiv:2205.05198); Megatron-LM README, 'MFU and HFU "
              "of 56.3% and 57.0%' for the 1T model"),
    MfuRecord("H100", "dense", 0.47, "Megatron Core, 2B to 462B parameters, up to 6144 H100",
              "NVIDIA/Megatron-LM README (release 0.12.0): 'up to 47% Model FLOP "
              "Utilization (MFU) on H100 clusters'"),
    MfuRecord("TPU v4", "dense", 0.462, "PaLM 540B, 6144 TPU v4",
              "Chowdhery et al. 2022 (arXiv:2204.02311), Table 3"),
)


def record(gpu: str, kind: Kind, precision: str = "bf16") -> MfuRecord | None:
    """The record for ``gpu`` (case-insensitive), ``kind`` and ``precision``; None where none is
    published here (every record is BF16)."""
    if kind not in ("dense", "moe"):
        raise ValueError(f"kind is 'dense' or 'moe', got {kind!r}.")
    if precision != "bf16":
        return None
    for row in RECORDS:
        if row.gpu.lower() == gpu.lower() and row.kind == kind:
            return row
    return None


# Published runs with their layouts, for the table of published MFU (chapter 07c,
# clusterlab.analytic.plan.mfu_table). record() never reads them: the planner's flag stays
# what RECORDS says.

JIANG_2024 = ("Jiang et al. 2024 (MegaScale, NSDI '24, arXiv:2402.15627), Table 2 (strong "
              "scaling of the 175B model, batch 6144) and Table 1 (its shape and layout); "
              "section 6.1: interleaved schedule with 6 stages, sequence 2048, vocabulary 64,000; "
              "section 6: 'NVIDIA Ampere GPUs'")
DEEPSEEK_V3 = ("DeepSeek-AI 2024 (DeepSeek-V3 Technical Report, arXiv:2412.19437): Table 1 and "
               "section 1 (2664K H800 GPU hours of pre-training on 14.8T tokens, 180K per "
               "trillion), section 3.1 (2048 H800), section 3.2 (PP 16, EP 64, ZeRO-1 DP), "
               "section 3.3 (FP8 GEMMs), section 4.2 (61 layers of 7168, 128 heads of 128 plus "
               "64 rotary dimensions, 37B activated parameters, sequence 4096); no MFU is stated")


class PublishedRun(NamedTuple):
    """One published training run: its model, its layout and the utilization its source states.

    Attributes:
        model: the model as its source names it.
        system: the software that ran it ("Megatron-LM", "MegaScale", ...).
        gpu: the accelerator: a ``clusterlab.catalog.hardware`` name, or the source's name
            where the catalog has none ("H800").
        n_gpus: GPUs in the job.
        precision: what the matrix multiplications run in, "bf16" or "fp8".
        tp, pp, cp, ep, virtual_stages: the layout (``dp = n_gpus / (tp pp cp)``; ``ep`` is
            carved from the data-parallel ranks).
        n_params: parameters a token uses (the activated ones of a mixture of experts).
        n_layers, d_model, n_heads, n_kv_heads: the shape (query and key/value heads);
            ``d_attn`` the attention width of the MFU convention (``12 L s d_attn``).
        seq_len, global_batch: tokens per sequence, sequences per step.
        vocab_size: the vocabulary (None: not stated).
        mfu: the published MFU, a fraction of the dense BF16 peak; None where the source states
            none.
        iteration_s: the published time per step (None: not stated).
        gpu_hours, n_tokens: what a source states instead of an MFU (None otherwise).
        source: where, with the table or section.
    """

    model: str
    system: str
    gpu: str
    n_gpus: int
    precision: str
    tp: int
    pp: int
    cp: int
    ep: int
    virtual_stages: int
    n_params: float
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_attn: int
    seq_len: int
    global_batch: int
    vocab_size: int | None
    mfu: float | None
    iteration_s: float | None
    gpu_hours: float | None
    n_tokens: float | None
    source: str

    @property
    def dp(self) -> int:
        """Data-parallel replicas: ``n_gpus / (tp pp cp)``."""
        return self.n_gpus // (self.tp * self.pp * self.cp)


#: Megatron-LM's GPT-3 175B shape in MegaScale's Table 1: 96 layers of 12288, 128 heads,
#: 12 L h^2 = 173.9B layer parameters (Korthikanti's count, as training_runs).
_MEGASCALE_175B = dict(n_params=12 * 96 * 12288**2, n_layers=96, d_model=12288, n_heads=128,
                       n_kv_heads=128, d_attn=12288, seq_len=2048, global_batch=6144,
                       vocab_size=64_000, gpu="A100", n_gpus=12288, precision="bf16", tp=8,
                       pp=8, cp=1, ep=1, virtual_stages=6, gpu_hours=None, n_tokens=None,
                       source=JIANG_2024)

PUBLISHED_RUNS: tuple[PublishedRun, ...] = (
    # Dubey et al. 2024, Table 4, third row: 16,384 H100, TP 8, CP 16, PP 16, DP 8, sequences
    # of 131,072 tokens, 16M tokens per batch (128 sequences), 380 TFLOP/s per GPU, 38% BF16
    # MFU. The two 8K-token rows are training_runs.LLAMA3_405B.
    PublishedRun("Llama 3 405B, 131,072-token context", "Meta", "H100", 16384, "bf16",
                 8, 16, 16, 1, 1, 405e9, 126, 16384, 128, 8, 16384, 131072, 128, 128_256, 0.38,
                 None, None, None,
                 "Dubey et al. 2024 (The Llama 3 Herd of Models, arXiv:2407.21783), Table 4"),
    PublishedRun("GPT-3 175B", "Megatron-LM (MegaScale's baseline)", mfu=0.412,
                 iteration_s=8.57, **_MEGASCALE_175B),
    PublishedRun("GPT-3 175B", "MegaScale", mfu=0.552, iteration_s=6.34, **_MEGASCALE_175B),
    # 2048 H800 = PP 16 x DP 128 (EP 64 carved from DP); d_attn averages the 192-wide query-key
    # heads (128 + 64 rotary) and the 128-wide value heads: (192 + 128) / 2 x 128 heads.
    PublishedRun("DeepSeek-V3 (671B, 37B activated)", "HAI-LLM", "H800", 2048, "fp8",
                 1, 16, 1, 64, 1, 37e9, 61, 7168, 128, 128, 160 * 128, 4096, 15360, None, None,
                 None, 2664e3, 14.8e12, DEEPSEEK_V3),
)

MEGASCALE_ABLATION_SOURCE = ("Jiang et al. 2024 (MegaScale, NSDI '24, arXiv:2402.15627), Table 3: "
                             "MFU improvement breakdown, 175B model, 256 GPUs, batch 256")

#: MegaScale's Table 3: the MFU of the 175B model on 256 GPUs after each optimization, applied
#: in this order (what was added, MFU). The last row also triples the batch (LAMB), so it does
#: other work per step than the rows before it.
MEGASCALE_ABLATION: tuple[tuple[str, float], ...] = (
    ("baseline (Megatron-LM)", 0.477), ("parallel transformer block", 0.523),
    ("sliding window attention", 0.533), ("tensor-parallel overlap", 0.555),
    ("pipeline-parallel overlap", 0.580), ("data-parallel overlap", 0.595),
    ("efficient operators", 0.612), ("other optimizations", 0.623),
    ("LAMB, batch x3", 0.653))

#: The job of MEGASCALE_ABLATION's baseline: the 175B model on 256 GPUs (dp 4), batch 256.
MEGASCALE_ABLATION_RUN = PublishedRun(
    "GPT-3 175B", "Megatron-LM (MegaScale's Table 3 baseline)", mfu=0.477, iteration_s=None,
    **{**_MEGASCALE_175B, "n_gpus": 256, "global_batch": 256,
       "source": MEGASCALE_ABLATION_SOURCE})
