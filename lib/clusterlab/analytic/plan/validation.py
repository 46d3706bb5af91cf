"""The planner's validation table: published training runs, each predicted from its paper's
configuration under the planner's default assumptions, with the error.

:func:`validation_table` is the one function behind ``tests/test_planner_validation.py`` (which
asserts every row's error), chapter 08 and lab 10 (which show the table and its summary,
:func:`format_validation_table`, :func:`regime_summary`). No row sets a parameter
(``ValidationRow.sets_parameter`` is False for every row): nothing in the planner is fitted to
them, so every row counts in the error figures. Every row is also held to the planner's own
memory model (``ValidationRow.fits``); a published layout that does not fit carries a note on
what the published run did differently (``ValidationRow.memory_note``, :func:`memory_notes`).
:func:`source_summary` gives the signed errors per source, dense and mixture-of-experts apart.

The rows:

* Korthikanti et al. 2022, Table 5 [korthikanti2022]: iteration times of four GPT models on
  A100s, full recomputation and sequence parallelism with selective recomputation
  (:mod:`clusterlab.catalog.published.training_runs`); Megatron-LM's FP32 gradients (18 bytes per
  parameter).
* Narayanan et al. 2021, Table 1 [narayanan2021]: the 1T model on 3072 A100, 52% HFU.
* Chowdhery et al. 2022 [chowdhery2022]: PaLM 540B on 6144 TPU v4, 46.2% MFU.
* Dubey et al. 2024, Table 4 [dubey2024]: Llama 3 405B on 8192 and 16384 H100, 43% and 41% MFU
  (sequences of 8192), and on 16384 H100 with sequences of 131,072 over 16-way context
  parallelism, 38% MFU (:func:`published_run_plan`).

FP8 training is held apart (:func:`fp8_validation_table`): three Llama 3 runs on H100 from
NVIDIA's Megatron-Bridge performance summary (:mod:`clusterlab.catalog.published.fp8_runs`).
Mixtures of experts too (:func:`moe_validation_table`): GPT-OSS 120B on 64 H100, B200,
GB200 and GB300 in BF16 (:mod:`clusterlab.catalog.published.moe_runs`);
:func:`unpriced_s_per_layer_pass` says how much time per layer pass a throughput row leaves
unexplained.

Vocabularies (the output layer, priced on the last pipeline stage): Megatron-LM's GPT models
51,200 (Narayanan et al. 2021, section 5.1; Korthikanti et al. train the same models), PaLM
256k (Chowdhery et al. 2022, section 2), Llama 3 128,256 (Meta's config.json; Table 3 of the
paper rounds it to 128,000). The planner prices the output layer on top of the layers that hold
``n_params``: exact for Korthikanti's ``12 L h^2``, which leaves the embeddings out; for the
other runs, whose published counts include the embeddings, their 0.1-1% of the parameters is
counted twice (:func:`embedding_share` gives it per row).
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass, replace

from clusterlab.analytic.plan.prediction import Plan, predict, predict_published
from clusterlab.analytic.plan.workload import (Assumptions, cluster, Layout, MoE, Workload,
                                               shape_params)
from clusterlab.catalog import hardware
from clusterlab.catalog.published import fp8_runs, mfu_records, moe_runs, training_runs

#: The metric of the FP8 rows (fp8_validation_table)
TOKENS_METRIC = "tokens/s per GPU"
MEGATRON_GPT_VOCAB = 51_200   # Narayanan et al. 2021, section 5.1 [narayanan2021]
PALM_VOCAB = 256_000          # Chowdhery et al. 2022, section 2 [chowdhery2022]
LLAMA3_VOCAB = 128_256        # Meta-Llama-3 config.json [meta_llama3_70b_config]

#: Megatron-LM keeps and all-reduces FP32 gradients: 18 bytes of model states per parameter
#: [megatron_core_distrib_optimizer]; the Korthikanti rows use it.
MEGATRON = Assumptions(fp32_grad_accumulation=True)

#: A TPU v4 chip as a planner GPU: no SM count and no matmul benchmark row, so its GEMMs run at
#: clusterlab.analytic.gemm's unmeasured ceiling; nvlink_generation 4 lets cluster_collective price
# the
#: pod's all-reduces as NCCL would on NVLink4 (it has no model of ICI).
TPU_V4 = hardware.GPU(
    "TPU v4", memory_bytes=32 * 2**30, hbm_bytes_per_s=1.2e12, bf16_flops=275e12,
    nvlink_bytes_per_s=1.1e15 / 4096, nvlink_generation=4,
    source="Google Cloud TPU v4 documentation: 275 TFLOP/s bf16, 32 GiB HBM2 at 1200 GB/s, "
           "1.1 PB/s all-reduce bandwidth per 4096-chip pod [google_tpu_v4]")


@dataclass(frozen=True)
class ValidationRow:
    """One published figure, the planner's prediction of it and the error.

    Attributes:
        run: what ran ("Korthikanti 175B, selective").
        metric: "iteration time (s)", "MFU" or "HFU".
        published, predicted: the figure and the planner's value (seconds or a fraction).
        regime: the group the summary reports it in (:func:`regime_summary`).
        source: the reference (a references.bib key).
        sets_parameter: whether a planner parameter was set from this row (none is).
        plan: the prediction, for its breakdown and its memory (:attr:`fits`).
        memory_note: why the published run ran where the planner's memory model says it does
            not fit (empty where it fits).
    """

    run: str
    metric: str
    published: float
    predicted: float
    regime: str
    source: str
    sets_parameter: bool
    plan: Plan
    memory_note: str = ""

    @property
    def error(self) -> float:
        """``(predicted - published) / published``."""
        return (self.predicted - self.published) / self.published

    @property
    def fits(self) -> bool:
        """Whether the published layout fits the planner's own memory model (:attr:`Plan.fits`:
        model states and in-flight activations within the GPU's memory less the reserve)."""
        return self.plan.fits


def korthikanti_plan(run: training_runs.TrainingRun) -> Plan:
    """The planner's prediction of one Korthikanti et al. run (Table 3's layout, dp = 1)."""
    workload = Workload(run.n_params, run.seq_len, run.global_batch, n_tokens=1e12,
                        n_layers=run.n_layers, d_model=run.hidden, n_heads=run.n_heads,
                        recompute=run.recompute, vocab_size=MEGATRON_GPT_VOCAB)
    spec = cluster(run.gpu, run.n_gpus, storage_read_bytes_per_s=1e12, fabric_link="IB-HDR")
    layout = Layout(dp=1, tp=run.tp, pp=run.pp, micro_batch=run.micro_batch,
                    virtual_stages=run.virtual_stages, sequence_parallel=run.sequence_parallel)
    return predict(workload, spec, layout, MEGATRON)


def megatron_1t_plan() -> Plan:
    """Narayanan et al. 2021, Table 1: 1008B parameters, 128 layers of 25600, sequence 2048,
    batch 3072, tp 8 x pp 64 x dp 6 on 3072 A100 (8 HDR NICs a node), full recomputation."""
    workload = Workload(1008e9, 2048, 3072, n_tokens=1e12, n_layers=128, d_model=25600,
                        recompute=True, vocab_size=MEGATRON_GPT_VOCAB)
    spec = cluster("A100", 3072, storage_read_bytes_per_s=100e9, fabric_link="IB-HDR")
    return predict(workload, spec, Layout(dp=6, tp=8, pp=64))


def palm_plan() -> Plan:
    """Chowdhery et al. 2022, sections 4-5: 540B parameters, 118 layers of 18432, sequence 2048,
    batch 2048, two pods of 3072 TPU v4, 12-way model parallel and 256-way fully sharded data
    parallel (ZeRO-3) in a pod, 2 pods data parallel, rematerialization (full recomputation in
    the planner's terms). One pod is one "node" whose ICI gives each chip 1.1 PB/s / 4096; the
    data-centre network between the pods is 81 Tb/s per pod."""
    spec = hardware.ClusterSpec(TPU_V4, n_nodes=2, gpus_per_node=3072,
                                intra_node_bytes_per_s=1.1e15 / 4096,
                                network_bytes_per_s=81e12 / 8, storage_read_bytes_per_s=1e12,
                                name="PaLM: 2 pods of 3072 TPU v4")
    workload = Workload(540e9, 2048, 2048, n_tokens=780e9, n_layers=118, d_model=18432,
                        recompute=True, vocab_size=PALM_VOCAB)
    return predict(workload, spec, Layout(dp=512, tp=12, pp=1, zero_stage=3, micro_batch=4))


def one_layer_fewer_first_stage_bytes(plan: Plan) -> float:
    """The plan's memory per GPU with one transformer layer fewer on the first pipeline stage,
    as Llama 3 balances its pipeline (Dubey et al. 2024, section 3.3.2 [dubey2024]: "we reduce
    one Transformer layer each from the first and the last stages"): the first stage's
    activations scaled by ``(n - 1) / n`` for its ``n = ceil(L / pp)`` layers; its model states
    kept at the average stage's (an over-estimate by one layer's states)."""
    n_layers, _ = plan.workload.shape
    per_stage = -(-n_layers // plan.layout.pp)
    return plan.states_bytes + plan.activation_bytes * (per_stage - 1) / per_stage


def llama3_memory_note(plan: Plan) -> str:
    """Why a Llama 3 405B layout ran although the planner's memory model does not fit it; empty
    when it fits."""
    if plan.fits:
        return ""
    balanced = one_layer_fewer_first_stage_bytes(plan)
    verdict = "fits" if balanced <= plan.memory_limit_bytes else "still does not fit"
    first_stage_layers = -(-plan.workload.shape[0] // plan.layout.pp)
    return (f"needs {plan.memory_bytes / 2**30:.1f} GiB of {plan.memory_limit_bytes / 2**30:.1f} "
            f"GiB usable in the planner's model (first stage: {first_stage_layers} "
            f"layers, {plan.activation_bytes / 2**30:.1f} GiB of activations). Llama 3 put one "
            f"layer fewer on its first stage and freed each stage's input and output tensors "
            f"early (Dubey et al. 2024, section 3.3.2); with one layer fewer the planner's "
            f"model gives {balanced / 2**30:.1f} GiB, which {verdict}")


def llama3_plan(run: training_runs.MfuRun, *, virtual_stages: int = 1) -> Plan:
    """A Llama 3 405B row of Dubey et al. 2024, Table 4, with its vocabulary: the plain 1F1B
    schedule unless ``virtual_stages`` says otherwise (the paper interleaves, by how much its
    table does not say)."""
    return predict_published(run, virtual_stages=virtual_stages, vocab_size=LLAMA3_VOCAB)


#: Llama 3 405B's long-context row of Dubey et al. 2024, Table 4 (16384 H100, tp 8, cp 16,
#: pp 16, dp 8, sequences of 131,072, 38% MFU), as the catalog keeps it.
LLAMA3_LONG_CONTEXT = next(run for run in mfu_records.PUBLISHED_RUNS
                           if run.model == "Llama 3 405B, 131,072-token context")


def published_run_plan(run: mfu_records.PublishedRun, *, fabric_link: str = "IB-NDR") -> Plan:
    """The planner's prediction of a published dense run (:mod:`clusterlab.catalog.published.
    mfu_records`) under its layout and the planner's defaults: ZeRO-1, FlashAttention without
    recomputation, its own vocabulary and precision, the nodes joined by ``fabric_link``.

    For :data:`LLAMA3_LONG_CONTEXT` these are the two 8K-token rows' defaults
    (:func:`llama3_plan`; Table 4 states no recomputation policy). Each GPU holds
    ``131,072 / 16`` = 8,192 tokens of a sequence, so its activations are those of the
    16384-GPU 8K row. Its step prices attention as a causal fused kernel runs it, the
    unmasked half at the kernel's measured rate
    (:func:`clusterlab.analytic.gemm.fused_attention_time_s`); its MFU counts the whole
    ``s x s`` score matrix, PaLM's convention
    (:func:`clusterlab.analytic.flops.mfu_convention_over_causal`). The published-runs table
    (:func:`clusterlab.analytic.plan.mfu_table.run_plan`) prices its rows with it."""
    workload = Workload(run.n_params, run.seq_len, run.global_batch, n_layers=run.n_layers,
                        d_model=run.d_model, n_heads=run.n_heads, n_kv_heads=run.n_kv_heads,
                        vocab_size=run.vocab_size, precision=run.precision)
    spec = cluster(run.gpu, run.n_gpus, storage_read_bytes_per_s=1e12, fabric_link=fabric_link)
    layout = Layout(dp=run.dp, tp=run.tp, pp=run.pp, cp=run.cp, zero_stage=1,
                    virtual_stages=run.virtual_stages)
    return predict(workload, spec, layout)


def embedding_share(plan: Plan) -> float:
    """The output layer's ``V d`` parameters as a share of the workload's ``n_params`` (what is
    counted twice when ``n_params`` includes them; 0 without a vocabulary)."""
    workload = plan.workload
    if workload.vocab_size is None:
        return 0.0
    return workload.vocab_size * workload.shape[1] / workload.n_params


def fp8_plan(run: fp8_runs.Fp8Run, *, precision: str = "fp8") -> Plan:
    """The planner's prediction of one published FP8 run (:mod:`clusterlab.catalog.published.
    fp8_runs`), on its GPUs under its layout, its parameters counted from its shape
    (:func:`clusterlab.analytic.plan.shape_params`); ``precision="bf16"`` prices the same run
    as if it trained in BF16 (what the planner could say before it modelled FP8)."""
    n_params = shape_params(run.n_layers, run.d_model, n_heads=run.n_heads,
                            n_kv_heads=run.n_kv_heads, ffn_width=run.ffn_width,
                            vocab_size=run.vocab_size)
    workload = Workload(n_params, run.seq_len, run.global_batch, n_layers=run.n_layers,
                        d_model=run.d_model, n_heads=run.n_heads, n_kv_heads=run.n_kv_heads,
                        vocab_size=run.vocab_size, precision=precision)
    layout = Layout(dp=run.dp, tp=run.tp, pp=run.pp, cp=run.cp, zero_stage=run.zero_stage,
                    micro_batch=run.micro_batch, virtual_stages=run.virtual_stages)
    return predict(workload, cluster(run.gpu, run.n_gpus, storage_read_bytes_per_s=1e12),
                   layout)


def tokens_per_s_per_gpu(plan: Plan) -> float:
    """Trained tokens per second per GPU of a plan."""
    return plan.workload.tokens_per_step / plan.step_s / plan.hardware.n_gpus


def fp8_validation_table(*, precision: str = "fp8") -> list[ValidationRow]:
    """The published FP8 runs (:data:`clusterlab.catalog.published.fp8_runs.ROWS`), tokens per
    second per GPU, each predicted under the planner's defaults: the linear GEMMs at the FP8
    peak and Transformer Engine's current-scaling casts by their bytes
    (:func:`clusterlab.analytic.plan.prediction.fp8_activation_casts`,
    :func:`~clusterlab.analytic.plan.prediction.fp8_weight_casts`), the recipe the rows name
    ("FP8-CS"); none sets a parameter. ``precision="bf16"`` gives the same rows priced as BF16
    training (the before)."""
    rows = []
    for run in fp8_runs.ROWS:
        predicted = fp8_plan(run, precision=precision)
        rows.append(ValidationRow(f"{run.name}, {run.n_gpus} {run.gpu}, FP8", TOKENS_METRIC,
                                  run.tokens_per_s_per_gpu, tokens_per_s_per_gpu(predicted),
                                  "FP8", "megatron_bridge_perf", False, predicted))
    return rows


def unstated_memory_note(plan: Plan) -> str:
    """The note of a published layout that does not fit the planner's memory model when its
    source does not say how it fit (empty when it fits)."""
    if plan.fits:
        return ""
    return (f"needs {plan.memory_bytes / 2**30:.1f} GiB of {plan.memory_limit_bytes / 2**30:.1f} "
            f"GiB usable in the planner's model without recomputation; the published table "
            f"does not say what the run recomputed or offloaded to fit")


def moe_plan(run: moe_runs.MoeRun) -> Plan:
    """The planner's prediction of one published mixture-of-experts run
    (:mod:`clusterlab.catalog.published.moe_runs`) under its layout, ZeRO-1 (Megatron's
    distributed optimizer), no recomputation of the layers. The experts run as the release ran
    them (moe_runs' note): GPT-OSS's clamped activation and fc2 biases, in Megatron Core 0.15's
    eager kernels (``fused_bias_geglu``, ``experts.TEGroupedMLP._apply_bias``), and the
    activation recomputed where the release's configuration lists ``moe_act``
    (:attr:`~clusterlab.catalog.published.moe_runs.MoeRun.recompute_modules`)."""
    layers, width, heads, kv_heads, experts, top_k, expert_mlp, vocab = (
        moe_runs.GPT_OSS_120B_SHAPE)
    spec = MoE(experts, top_k, expert_mlp, activation_clamp=True, expert_bias=True,
               recompute_activation="moe_act" in run.recompute_modules)
    n_params = shape_params(layers, width, n_heads=heads, n_kv_heads=kv_heads,
                            vocab_size=vocab, moe=spec)
    workload = Workload(n_params, run.seq_len, run.global_batch, n_layers=layers,
                        d_model=width, n_heads=heads, n_kv_heads=kv_heads, vocab_size=vocab,
                        moe=spec)
    layout = Layout(dp=run.dp, tp=run.tp, pp=run.pp, ep=run.ep, zero_stage=1,
                    micro_batch=run.micro_batch)
    # the domain set by replace(), not cluster()'s argument: tests/test_plan_moe_grouped.py
    # reruns this function on the workload.py of a commit whose cluster() had none
    cluster_spec = replace(cluster(run.gpu, run.n_gpus, storage_read_bytes_per_s=1e12,
                                   gpus_per_node=run.gpus_per_node, fabric_link=run.fabric_link),
                           nvlink_domain_gpus=run.nvlink_domain_gpus)
    return predict(workload, cluster_spec, layout)


def moe_validation_table() -> list[ValidationRow]:
    """The published mixture-of-experts runs, tokens per second per GPU, each predicted under
    the planner's defaults; none sets a parameter. The experts run as grouped GEMMs on the
    busiest GPU with the router, the permutations and the release's eager expert kernels
    priced (prediction._moe_layer_time_s, :func:`moe_plan`), at a load imbalance of 1.0: the
    benchmarks force the balance (moe_runs' note), so no imbalance is read from these rows.
    What the planner does not price (host-side work) is what these rows measure."""
    rows = []
    for run in moe_runs.ROWS:
        predicted = moe_plan(run)
        rows.append(ValidationRow(f"{run.name}, {run.n_gpus} {run.gpu}, NeMo {run.release}",
                                  TOKENS_METRIC, run.tokens_per_s_per_gpu,
                                  tokens_per_s_per_gpu(predicted), "MoE", "megatron_bridge_perf",
                                  False, predicted, unstated_memory_note(predicted)))
    return rows


@functools.cache
def moe_error_span() -> tuple[float, float, int]:
    """(lowest, highest, rows) of the signed errors of :func:`moe_validation_table`: how far
    the course's model has missed every published mixture-of-experts run it was tested on
    (what the planner warns of on a plan with experts)."""
    errors = [row.error for row in moe_validation_table()]
    return min(errors), max(errors), len(errors)


def unpriced_s_per_layer_pass(row: ValidationRow) -> float:
    """Seconds per layer pass the planner leaves out of a throughput row: the published step
    less the predicted one, over the layer passes on a step's critical path (one micro-batch's
    forward and backward through one layer; ``(m + p - 1) L / p`` of them in a 1F1B pipeline
    of ``p`` stages and ``m`` micro-batches, fill and drain included). It locates what is
    missing, on the assumption that it rides on every layer pass; it prices nothing.

    Raises:
        ValueError: for a row that is not a tokens-per-second row, or an interleaved layout.
    """
    if row.metric != TOKENS_METRIC:
        raise ValueError(f"unpriced_s_per_layer_pass needs a {TOKENS_METRIC!r} row (its step "
                         f"follows from the throughput); {row.run!r} is {row.metric!r}.")
    plan = row.plan
    layout, workload = plan.layout, plan.workload
    if layout.virtual_stages > 1:
        raise ValueError(f"{row.run!r} interleaves its pipeline; count its passes by hand.")
    published_step_s = workload.tokens_per_step / (row.published * plan.hardware.n_gpus)
    microbatches = workload.global_batch // (layout.dp * layout.micro_batch)
    passes = (microbatches + layout.pp - 1) * workload.shape[0] / layout.pp
    return (published_step_s - plan.step_s) / passes


def validation_table() -> list[ValidationRow]:
    """Every published row, predicted under the planner's defaults (Megatron's FP32 gradients
    for the Korthikanti rows): Korthikanti Table 5 (8 rows), Megatron 1T (HFU), PaLM (MFU),
    Llama 3 405B (MFU, 3 rows: 8K tokens on 8192 and 16384 GPUs, 131K on 16384). Twelve
    predictions took 0.73 s in a fresh process on the course's 2-core machine at load average
    15 (2 December 2026), 0.01 s once clusterlab.analytic.gemm has cached the layers."""
    rows = []
    for run in training_runs.rows(timed=True):
        predicted = korthikanti_plan(run)
        size = "Korthikanti 22B" if run.name == "22B" else "Korthikanti 175B-1T"
        rows.append(ValidationRow(f"Korthikanti {run.name}, {run.recompute}",
                                  "iteration time (s)", run.iteration_s, predicted.step_s,
                                  size, "korthikanti2022", run.role != "test", predicted))
    megatron = megatron_1t_plan()
    rows.append(ValidationRow("Megatron-LM 1T, 3072 A100", "HFU", 0.52, megatron.hfu,
                              "utilization", "narayanan2021", False, megatron))
    palm = palm_plan()
    rows.append(ValidationRow("PaLM 540B, 6144 TPU v4", "MFU", 0.462, palm.mfu, "utilization",
                              "chowdhery2022", False, palm))
    for run in training_runs.LLAMA3_405B:
        predicted = llama3_plan(run)
        rows.append(ValidationRow(f"Llama 3 405B, {run.n_gpus} H100", "MFU", run.mfu,
                                  predicted.mfu, "utilization", "dubey2024",
                                  run.role != "test", predicted,
                                  llama3_memory_note(predicted)))
    long_context = published_run_plan(LLAMA3_LONG_CONTEXT)
    rows.append(ValidationRow("Llama 3 405B, 16384 H100, 131K context", "MFU",
                              LLAMA3_LONG_CONTEXT.mfu, long_context.mfu, "utilization",
                              "dubey2024", False, long_context,
                              llama3_memory_note(long_context)))
    unexplained = [r.run for r in rows if not r.fits and not r.memory_note]
    if unexplained:
        raise AssertionError(f"{unexplained} do not fit the planner's memory model and no note "
                             f"says why the published run did: add one.")
    return rows


def regime_summary(rows: list[ValidationRow]) -> dict[str, dict[str, float]]:
    """Median and largest ``|error|`` and the row count per regime, over the rows that set no
    parameter: "all", each row's ``regime``, and the Korthikanti rows by policy ("full",
    "selective")."""
    counted = [r for r in rows if not r.sets_parameter]
    groups: dict[str, list[ValidationRow]] = {"all": counted}
    for row in counted:
        groups.setdefault(row.regime, []).append(row)
    for policy in ("full", "selective"):
        groups[f"Korthikanti {policy}"] = [r for r in counted if r.run.startswith("Korthikanti")
                                           and r.run.endswith(policy)]
    return {name: {"median_abs_error": statistics.median(abs(r.error) for r in group),
                   "max_abs_error": max(abs(r.error) for r in group), "rows": len(group)}
            for name, group in groups.items() if group}


#: The issue's goals for rows that set nothing: median |error| within 10%, every row within 25%.
MEDIAN_GOAL, ROW_GOAL = 0.10, 0.25

TABLE_HEADER = ("run", "metric", "published", "predicted", "error", "source",
                "sets a parameter")
#: the columns table_cells(..., with_memory=True) adds: memory per GPU against the usable
#: memory in the planner's model, and whether the layout fits
MEMORY_HEADER = ("memory GiB (usable)", "fits")
#: markdown_table's alignment of TABLE_HEADER + MEMORY_HEADER
TABLE_ALIGN = "llrrrllrl"
SUMMARY_HEADER = ("regime", "rows", "median |error|", "largest |error|")


def _value(row: ValidationRow, value: float) -> str:
    if row.metric == TOKENS_METRIC:
        return f"{value:,.0f}"
    return f"{value:.2f} s" if row.metric.startswith("iteration") else f"{value:.1%}"


def table_cells(rows: list[ValidationRow], *,
                with_memory: bool = False) -> list[tuple[str, ...]]:
    """Each row as the cells of :data:`TABLE_HEADER` (and :data:`MEMORY_HEADER` with
    ``with_memory``), as text (for a table in a book or lab)."""
    cells = [(r.run, r.metric, _value(r, r.published), _value(r, r.predicted),
              f"{r.error:+.1%}", r.source, "yes" if r.sets_parameter else "no") for r in rows]
    if not with_memory:
        return cells
    return [row + (f"{r.plan.memory_bytes / 2**30:.1f} ({r.plan.memory_limit_bytes / 2**30:.1f})",
                   "yes" if r.fits else "no, see note") for row, r in zip(cells, rows)]


def memory_notes(rows: list[ValidationRow]) -> list[str]:
    """One line per row whose published layout does not fit the planner's memory model: the
    row and why the published run did."""
    return [f"{r.run}: {r.memory_note}." for r in rows if not r.fits]


SOURCE_HEADER = ("source", "kind", "rows", "sets parameters", "median error", "lowest",
                 "highest")


def source_summary(rows: list[ValidationRow]) -> list[dict]:
    """Signed errors per source, dense and mixture-of-experts apart and the rows that set a
    parameter apart from those that do not: for each group its row count and the median,
    lowest and highest ``error`` (a signed error: minus is a prediction below the published
    figure)."""
    groups: dict[tuple[str, str, bool], list[float]] = {}
    for r in rows:
        kind = "dense" if r.plan.workload.moe is None else "moe"
        groups.setdefault((r.source, kind, r.sets_parameter), []).append(r.error)
    return [{"source": source, "kind": kind, "sets_parameter": sets, "rows": len(errors),
             "median": statistics.median(errors), "lowest": min(errors),
             "highest": max(errors)}
            for (source, kind, sets), errors in groups.items()]


def source_cells(summary: list[dict]) -> list[tuple[str, ...]]:
    """:func:`source_summary` as the cells of :data:`SOURCE_HEADER`, as text."""
    return [(s["source"], s["kind"], str(s["rows"]), "yes" if s["sets_parameter"] else "no",
             f"{s['median']:+.1%}", f"{s['lowest']:+.1%}", f"{s['highest']:+.1%}")
            for s in summary]


def summary_cells(summary: dict[str, dict[str, float]]) -> list[tuple[str, ...]]:
    """:func:`regime_summary` as the cells of :data:`SUMMARY_HEADER`, as text."""
    return [(name, str(s["rows"]), f"{s['median_abs_error']:.1%}", f"{s['max_abs_error']:.1%}")
            for name, s in summary.items()]


def outside_goals(summary: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """The regimes where the planner misses a goal: median |error| above :data:`MEDIAN_GOAL` or
    a row above :data:`ROW_GOAL` (where it is not to be trusted to that precision)."""
    return {name: s for name, s in summary.items()
            if s["median_abs_error"] > MEDIAN_GOAL or s["max_abs_error"] > ROW_GOAL}


def _fixed_width(header: tuple[str, ...], cells: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *cells)]
    lines = ["  ".join(f"{h:<{w}}" for h, w in zip(header, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(f"{c:<{w}}" for c, w in zip(row, widths)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def format_validation_table(rows: list[ValidationRow]) -> str:
    """The rows as a fixed-width table (:data:`TABLE_HEADER` and :data:`MEMORY_HEADER`): run,
    metric, published, predicted, error, source, whether the row set a parameter and its memory
    per GPU against the usable memory in the planner's model; below it, a note for each layout
    that does not fit (:func:`memory_notes`)."""
    table = _fixed_width(TABLE_HEADER + MEMORY_HEADER, table_cells(rows, with_memory=True))
    return "\n".join([table] + [f"note: {note}" for note in memory_notes(rows)])


def format_source_summary(summary: list[dict]) -> str:
    """:func:`source_summary` as a fixed-width table (:data:`SOURCE_HEADER`)."""
    return _fixed_width(SOURCE_HEADER, source_cells(summary))


def format_regime_summary(summary: dict[str, dict[str, float]]) -> str:
    """:func:`regime_summary` as a fixed-width table (:data:`SUMMARY_HEADER`)."""
    return _fixed_width(SUMMARY_HEADER, summary_cells(summary))
