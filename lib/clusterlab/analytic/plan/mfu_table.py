"""Published MFU beside the planner's prediction: the table of chapter 07c.

Every row comes from the catalog (:mod:`clusterlab.catalog.published.mfu_records`' ``RECORDS`` and
``PUBLISHED_RUNS``, :data:`clusterlab.catalog.published.training_runs.LLAMA3_405B`) with its
source. Where the planner can express the run (a dense model on catalog GPUs under a stated
layout), the row carries the planner's MFU under its default assumptions and the signed error.
Where a source states GPU-hours instead of an MFU (DeepSeek-V3), :func:`gpu_hours_mfu` computes
one with the course's MFU numerator; the row says it is computed, not published.

Nothing here sets a planner parameter; :func:`run_plan` prices a run as
:func:`clusterlab.analytic.plan.validation.llama3_plan` does (storage never the bottleneck, the
DGX node's NIC per GPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from clusterlab.analytic import flops
from clusterlab.analytic.plan import validation
from clusterlab.analytic.plan.prediction import Plan
from clusterlab.catalog.published import mfu_records, training_runs

#: One NIC port per GPU, as in the catalog's DGX nodes: HDR on A100 (DGX A100), NDR on H100
#: (DGX H100); the fabric validation.korthikanti_plan and llama3_plan assume.
FABRIC_BY_GPU = {"A100": "IB-HDR", "H100": "IB-NDR"}
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class PublishedMfuRow:
    """One row of the table: a published run, its MFU and the course's numbers for it.

    Attributes:
        model, system: what ran, and on which software.
        gpus: the GPUs as the source gives them ("12288 A100", "up to 6144 H100").
        precision: "BF16" or "FP8".
        layout: the parallel layout ("dp192 tp8 pp8 v6 ZeRO-1"), or what the source states.
        published: the published MFU (None: the source states none).
        computed: the course's MFU from the source's GPU-hours (None: not needed).
        predicted: the planner's MFU (None: the planner cannot express the run).
        plan: the planner's prediction behind ``predicted`` (None with it).
        note: why a number is missing, or what to keep in mind.
        source: where the published numbers are.
    """

    model: str
    system: str
    gpus: str
    precision: str
    layout: str
    published: float | None
    computed: float | None
    predicted: float | None
    plan: Plan | None
    note: str
    source: str

    @property
    def error(self) -> float | None:
        """Signed error of the prediction, ``(predicted - published) / published``; None
        without both."""
        if self.published is None or self.predicted is None:
            return None
        return (self.predicted - self.published) / self.published


def run_plan(run: mfu_records.PublishedRun) -> Plan:
    """The planner's prediction of a published run under its layout and the planner's default
    assumptions (:func:`clusterlab.analytic.plan.validation.published_run_plan` on its GPU's
    fabric, :data:`FABRIC_BY_GPU`): ZeRO-1, FlashAttention without recomputation.

    Raises:
        ValueError: for a run the planner cannot express here: a mixture of experts (``ep`` >
            1) or GPUs without a fabric in :data:`FABRIC_BY_GPU`.
    """
    if run.ep > 1:
        raise ValueError(f"{run.model} is a mixture of experts (ep = {run.ep}); run_plan prices "
                         f"dense runs only: use validation.moe_plan's route for MoE rows.")
    if run.gpu not in FABRIC_BY_GPU:
        raise ValueError(f"{run.model} ran on {run.gpu}, which has no fabric in FABRIC_BY_GPU "
                         f"({sorted(FABRIC_BY_GPU)}); add its DGX node's NIC there first.")
    return validation.published_run_plan(run, fabric_link=FABRIC_BY_GPU[run.gpu])


def gpu_hours_mfu(run: mfu_records.PublishedRun, peak_flops_per_gpu: float) -> float:
    """The MFU a run's GPU-hours imply: its tokens times the course's model FLOPs per token
    (``6 N + 12 L s d_attn``, :func:`clusterlab.analytic.flops.transformer_flops_per_token`)
    over its GPU-seconds times the peak.

    The GPU-hours of a whole run include restarts, evaluation and every pause, so this is the
    run's average, at most the MFU of its steps.

    Args:
        run: a run with ``gpu_hours`` and ``n_tokens``.
        peak_flops_per_gpu: the dense peak of the precision its matmuls ran in, FLOP/s.

    Raises:
        ValueError: a run without GPU-hours or tokens, or an MFU above 1.
    """
    if run.gpu_hours is None or run.n_tokens is None:
        raise ValueError(f"{run.model} states no GPU-hours and tokens; use its published MFU.")
    per_token = flops.transformer_flops_per_token(run.n_params, run.n_layers, run.seq_len,
                                                  run.d_attn)
    gpu_seconds = run.gpu_hours * SECONDS_PER_HOUR
    return flops.mfu(run.n_tokens * per_token / gpu_seconds, 1, peak_flops_per_gpu)


def _layout_text(run: mfu_records.PublishedRun) -> str:
    """The layout of a run the planner does not price, as its source states it."""
    parts = [f"pp{run.pp}", f"ep{run.ep}" if run.ep > 1 else "", f"dp{run.dp}", "ZeRO-1"]
    return " ".join(part for part in parts if part)


def _record_rows() -> list[PublishedMfuRow]:
    """The rows of ``mfu_records.RECORDS``: PaLM and the Megatron-LM 1T run priced as the
    validation table prices them; Megatron Core's H100 figure is a range over many runs."""
    one_t = next(r for r in training_runs.ROWS if r.name == "1T" and r.recompute == "selective")
    plans = {"TPU v4": (validation.palm_plan, "6144 TPU v4"),
             "A100": (lambda: validation.korthikanti_plan(one_t), "512 A100")}
    rows = []
    for record in mfu_records.RECORDS:
        if record.gpu in plans:
            make_plan, gpus = plans[record.gpu]
            plan = make_plan()
            rows.append(PublishedMfuRow(record.run, "", gpus, "BF16",
                                        str(plan.layout), record.mfu, None, plan.mfu, plan, "",
                                        record.source))
        else:
            rows.append(PublishedMfuRow(record.run, "", record.gpu, "BF16", "several",
                                        record.mfu, None, None, None,
                                        "a maximum over many runs, not one run", record.source))
    return rows


def published_mfu_rows(*, stand_in_peak_flops: float | None = None) -> list[PublishedMfuRow]:
    """Every row of the table: ``RECORDS``, Llama 3 405B's Table 4 and ``PUBLISHED_RUNS``.

    Args:
        stand_in_peak_flops: the peak to compute a GPU-hours row's MFU against when its GPU is
            not in the catalog (DeepSeek-V3's H800); None leaves ``computed`` empty.

    Returns:
        Rows in that order.
    """
    rows = _record_rows()
    for run in training_runs.LLAMA3_405B:
        plan = validation.llama3_plan(run)
        rows.append(PublishedMfuRow(run.name, "Meta", f"{run.n_gpus} {run.gpu}", "BF16",
                                    str(plan.layout), run.mfu, None, plan.mfu, plan,
                                    validation.llama3_memory_note(plan) and "does not fit "
                                    "the planner's memory model", run.source))
    for run in mfu_records.PUBLISHED_RUNS:
        gpus, precision = f"{run.n_gpus} {run.gpu}", run.precision.upper()
        if run.gpu_hours is not None:
            computed = (None if stand_in_peak_flops is None
                        else gpu_hours_mfu(run, stand_in_peak_flops))
            rows.append(PublishedMfuRow(run.model, run.system, gpus, precision,
                                        _layout_text(run), run.mfu, computed, None, None,
                                        "no MFU published; the planner has no MLA or DualPipe",
                                        run.source))
            continue
        plan = run_plan(run)
        note = "" if plan.fits else "does not fit the planner's memory model"
        rows.append(PublishedMfuRow(run.model, run.system, gpus, precision, str(plan.layout),
                                    run.mfu, None, plan.mfu, plan, note, run.source))
    return rows


def step_shares_removed(mfus: Sequence[float]) -> list[float]:
    """What each change of a sequence removed from the step, as a share of the first step.

    The rows must do the same work per step (same model, same batch, same GPUs): then the step
    time is inversely proportional to the MFU, ``t_k = W / (n peak MFU_k)``, and change ``k``
    removed ``(1/MFU_k - 1/MFU_{k+1}) / (1/MFU_0)`` of the first step.

    Args:
        mfus: successive MFUs (fractions in (0, 1]), at least two.

    Returns:
        One share per change (``len(mfus) - 1``), negative where a change slowed the step.

    Raises:
        ValueError: fewer than two MFUs, or one outside (0, 1].
    """
    if len(mfus) < 2:
        raise ValueError(f"give at least two MFUs (a before and an after), got {len(mfus)}.")
    bad = [m for m in mfus if not 0 < m <= 1]
    if bad:
        raise ValueError(f"MFUs are fractions in (0, 1] (0.533 for 53.3%), got {bad}.")
    first_step = 1.0 / mfus[0]
    return [(1.0 / before - 1.0 / after) / first_step for before, after in zip(mfus, mfus[1:])]
