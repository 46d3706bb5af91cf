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
