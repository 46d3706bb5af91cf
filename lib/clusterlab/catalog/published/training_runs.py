"""Published training runs the planner (:mod:`clusterlab.analytic.plan`) is held to, each with its
source.

Every row is one run of Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", MLSys 2023, https://arxiv.org/abs/2205.05198): its configuration (Table 3:
heads, hidden size, layers, tensor and pipeline parallel degrees, GPUs, global and micro-batch,
sequence 2048, on DGX A100 80 GB nodes of Selene, 8 HDR InfiniBand NICs each) and what the paper
measured: the iteration time of Table 5 and, for the two policies Figure 1 shows, the memory
per GPU of model states and activations.

The 175B and 530B runs use the interleaved schedule with three model chunks per GPU; the 22B
(one stage) and 1T (two layers per stage) runs do not. The configurations, the interleaving and
Figure 1's bars read in GiB are as Calculon's validation transcribes them
(calculon-ai/calculon, ``validation/seqsel/`` and ``calculon/llm/validation.py``); Calculon
validates against the same rows.

What a row is for (``role``): every row is ``"test"``: nothing in the planner is fitted to it;
the tests in ``tests/test_planner_validation.py`` predict each row from the planner's default
assumptions and assert the error found. No row sets a parameter.

Policies (``recompute``): ``"full"`` is Table 5's "full recompute" (no sequence parallelism);
``"selective"`` its "present work", sequence parallelism plus selective recomputation; in
Figure 1 ``"none"`` is the baseline without either (tensor parallelism only).

Units: seconds, bytes (``*_gib`` in GiB, 2**30 bytes, as transcribed).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Policy = Literal["none", "selective", "full"]
SOURCE = "Korthikanti et al. 2022, arXiv:2205.05198"


class TrainingRun(NamedTuple):
    """One published run: a model, its layout, its recomputation policy and what was measured.

    Attributes:
        name: the paper's model name ("22B", "175B", "530B", "1T").
        n_heads, hidden, n_layers: the model's shape (Table 3); sequence length ``seq_len``.
        tp, pp, virtual_stages, n_gpus: the layout (dp = n_gpus / (tp pp) = 1 in every row).
        global_batch, micro_batch: sequences per step and per micro-batch.
        recompute: the policy; ``sequence_parallel`` whether it is on.
        iteration_s: Table 5's time per iteration (None: the paper gives none for the policy).
        states_gib, activations_gib: Figure 1's memory per GPU (None: not in Figure 1).
        source: where the numbers are; ``role``: ``"test"`` (see the module).
    """

    name: str
    n_heads: int
    hidden: int
    n_layers: int
    tp: int
    pp: int
    virtual_stages: int
    n_gpus: int
    global_batch: int
    micro_batch: int
    recompute: Policy
    sequence_parallel: bool
    iteration_s: float | None
    states_gib: float | None
    activations_gib: float | None
    seq_len: int = 2048
    gpu: str = "A100"
    source: str = SOURCE
    role: str = "test"

    @property
    def n_params(self) -> float:
        """Parameters of the layers, ``12 L h^2`` (Korthikanti's count without embeddings)."""
        return 12.0 * self.n_layers * self.hidden**2

    @property
    def size_class(self) -> str:
        """"<= 175B" or "> 175B": the regimes the planner's error is reported by."""
        return "<= 175B" if self.n_params <= 200e9 else "> 175B"


# (name, heads, hidden, layers, tp, pp, v, GPUs, batch, micro-batch): Table 3.
_MODELS = {
    "22B": ("22B", 64, 6144, 48, 8, 1, 1, 8, 4, 4),
    "175B": ("175B", 96, 12288, 96, 8, 8, 3, 64, 64, 1),
    "530B": ("530B", 128, 20480, 105, 8, 35, 3, 280, 280, 1),
    "1T": ("1T", 160, 25600, 128, 8, 64, 1, 512, 512, 1),
}
# name: (Table 5 full, Table 5 selective), (Figure 1 states, activations none, selective)
_TABLE_5 = {"22B": (1.42, 1.10), "175B": (18.13, 13.75), "530B": (49.05, 37.83),
            "1T": (94.42, 71.49)}
_FIGURE_1 = {"22B": (45.5625, 59.25, 9.5625), "175B": (45.5625, 66.84375, 12.3515625),
             "530B": (31.640625, 114.0234375, 23.076171875),
             "1T": (32.958984375, 131.25, 26.5625)}


def _rows() -> tuple[TrainingRun, ...]:
    rows = []
    for name, model in _MODELS.items():
        full_s, selective_s = _TABLE_5[name]
        states, act_none, act_selective = _FIGURE_1[name]
        rows += [TrainingRun(*model, "full", False, full_s, None, None),
                 TrainingRun(*model, "selective", True, selective_s, states, act_selective),
                 TrainingRun(*model, "none", False, None, states, act_none)]
    return tuple(rows)


#: Every row: per model, Table 5's two policies and Figure 1's baseline.
ROWS: tuple[TrainingRun, ...] = _rows()


def rows(*, timed: bool | None = None, with_memory: bool | None = None) -> list[TrainingRun]:
    """The rows, optionally only those with an iteration time or with Figure 1's memory.

    Args:
        timed: True: rows with ``iteration_s``; False: rows without; None: either.
        with_memory: True: rows with Figure 1's memory; False: without; None: either.

    Returns:
        Rows in :data:`ROWS`' order.
    """
    return [r for r in ROWS
            if (timed is None or (r.iteration_s is not None) == timed)
            and (with_memory is None or (r.activations_gib is not None) == with_memory)]


DUBEY_2024 = "Dubey et al. 2024 (The Llama 3 Herd of Models, arXiv:2407.21783), Table 4"


class MfuRun(NamedTuple):
    """A published run reported by its MFU (BF16 model FLOPs over peak) rather than a step time.

    Attributes:
        name: the model; n_params, n_layers, d_model: its size and shape.
        seq_len: tokens per sequence; global_batch: sequences per step; n_tokens: training tokens.
        gpu, n_gpus, tp, pp: the cluster and the layout (``dp`` = n_gpus / (tp pp)).
        mfu: the published MFU; source: where it is; role: ``"test"`` (no parameter is set
            from it).
        n_heads, n_kv_heads: attention and key/value heads (None: not given, d_model / 128
            heads of multi-head attention).
    """

    name: str
    n_params: float
    n_layers: int
    d_model: int
    seq_len: int
    global_batch: int
    n_tokens: float
    gpu: str
    n_gpus: int
    tp: int
    pp: int
    mfu: float
    source: str = DUBEY_2024
    role: str = "test"
    n_heads: int | None = None
    n_kv_heads: int | None = None

    @property
    def dp(self) -> int:
        """Data-parallel replicas."""
        return self.n_gpus // (self.tp * self.pp)


#: Llama 3 405B (126 layers, width 16384, 128 attention heads and 8 key/value heads (Table 3),
#: sequences of 8192, 16M tokens per batch, tensor 8 x pipeline 16) on 8192 and 16384 H100: 43%
#: and 41% BF16 MFU.
LLAMA3_405B: tuple[MfuRun, ...] = tuple(
    MfuRun("Llama 3 405B", 405e9, 126, 16384, 8192, 2048, 15.6e12, "H100", n_gpus, 8, 16, mfu,
           n_heads=128, n_kv_heads=8)
    for n_gpus, mfu in ((8192, 0.43), (16384, 0.41)))
