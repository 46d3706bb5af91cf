"""``python -m clusterlab plan``: every layout axis and model dimension can be pinned, and
``--json`` prints the plans (issue 38, item 6)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from clusterlab.analytic import flops
from clusterlab.course import cli

#: A 16-GPU cluster and an 8B-class model with grouped-query attention (Llama 3 8B's shape).
CLUSTER = ["--gpu", "H100", "--gpus", "16"]
LLAMA_8B = ["--layers", "32", "--d-model", "4096", "--heads", "32", "--kv-heads", "8",
            "--ffn", "14336", "--vocab", "128256", "--seq-len", "8192", "--batch", "64"]
#: One value on every layout axis: exactly one layout.
PINNED = ["--tensor-parallel", "4", "--pipeline-parallel", "2", "--context-parallel", "1",
          "--micro-batches", "1", "--virtual-stages", "2", "--zero", "1", "--recompute", "flash"]
SCHEMA = {"layout", "step_s", "mfu", "tokens_per_s_per_gpu", "memory_bytes_per_gpu", "fits",
          "bottleneck"}


def plans(capsys, *argv: str) -> list[dict]:
    """The plans `plan --json` prints for ``argv`` (the run must succeed)."""
    assert cli.main(["plan", *argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)["plans"]


def error(capsys, *argv: str) -> str:
    """The error `plan` prints for ``argv`` (the run must fail with status 2)."""
    assert cli.main(["plan", *argv]) == 2
    return capsys.readouterr().err


def with_value(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag``'s value replaced."""
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def test_every_layout_axis_pinned_gives_that_one_layout_in_the_json_schema(capsys):
    (only,) = plans(capsys, *LLAMA_8B, *CLUSTER, *PINNED)
    assert SCHEMA <= set(only), set(only)
    assert only["layout"] == {"dp": 2, "tp": 4, "pp": 2, "cp": 1, "ep": 1, "zero_stage": 1,
                              "micro_batch": 1, "virtual_stages": 2, "sequence_parallel": True,
                              "recompute": "flash", "load_imbalance": None}
    assert only["step_s"] > 0 and 0 < only["mfu"] < 1 and only["fits"] is True
    # tokens per second per GPU is the batch's tokens over the step and the 16 GPUs
    assert only["tokens_per_s_per_gpu"] == pytest.approx(64 * 8192 / only["step_s"] / 16)
    assert only["memory_bytes_per_gpu"] > 0 and isinstance(only["bottleneck"], str)


@pytest.mark.parametrize("flag, values, key", [
    ("--tensor-parallel", "2,4", "tp"), ("--pipeline-parallel", "1,2", "pp"),
    ("--context-parallel", "1,2", "cp"), ("--micro-batches", "1,2", "micro_batch"),
    ("--virtual-stages", "1,2", "virtual_stages"), ("--zero", "1,3", "zero_stage"),
    ("--recompute", "flash,full", "recompute")])
def test_a_comma_list_searches_exactly_its_values(capsys, flag, values, key):
    argv = with_value(PINNED, flag, values)
    if flag == "--pipeline-parallel":     # interleaving needs pp > 1
        argv = with_value(argv, "--virtual-stages", "1")
    found = {p["layout"][key] for p in plans(capsys, *LLAMA_8B, *CLUSTER, *argv, "--top", "50")}
    wanted = {v if key == "recompute" else int(v) for v in values.split(",")}
    assert found == wanted, (flag, found)


def test_one_value_pins_each_axis(capsys):
    for flag, key, value in (("--tensor-parallel", "tp", 2), ("--pipeline-parallel", "pp", 4),
                             ("--context-parallel", "cp", 2), ("--zero", "zero_stage", 2),
                             ("--micro-batches", "micro_batch", 2)):
        argv = with_value(PINNED, flag, str(value))
        if flag == "--pipeline-parallel":
            argv = with_value(with_value(argv, "--virtual-stages", "1"), "--zero", "0")
        found = {p["layout"][key] for p in plans(capsys, *LLAMA_8B, *CLUSTER, *argv)}
        assert found == {value}, (flag, found)


def test_the_parameters_are_counted_from_the_shape():
    # Llama 3 8B's shape counts 8.03e9 parameters (Meta's model card: 8B)
    n_params = flops.transformer_params(32, 4096, n_heads=32, n_kv_heads=8, ffn_width=14336,
                                        vocab_size=128256)
    assert n_params == pytest.approx(8.03e9, rel=1e-3)
    workload = cli._parser().parse_args(["plan", *LLAMA_8B, *CLUSTER])
    assert workload.params is None   # counted by _plan from the shape


def test_grouped_query_attention_shrinks_kv_traffic_and_memory(capsys):
    context = with_value(with_value(PINNED, "--context-parallel", "2"), "--virtual-stages", "1")
    context = with_value(context, "--tensor-parallel", "2")
    multi_head = with_value(LLAMA_8B, "--kv-heads", "32")
    shape = ["--params", "8.03e9", "--layers", "32", "--d-model", "4096", "--heads", "32",
             "--seq-len", "8192", "--batch", "64"]
    (gqa,) = plans(capsys, *shape, "--kv-heads", "8", *CLUSTER, *context)
    (mha,) = plans(capsys, *shape, *CLUSTER, *context)
    gather = "context-parallel K/V all-gather"
    # K and V of 8 heads instead of 32: a quarter of the bytes, so less time (latency stays)
    assert gqa["breakdown_s"][gather] < 0.5 * mha["breakdown_s"][gather]
    assert gqa["memory_bytes_per_gpu"] < mha["memory_bytes_per_gpu"]
    assert plans(capsys, *multi_head, *CLUSTER, *PINNED)[0]["fits"]


def test_vocab_adds_the_output_layer(capsys):
    shape = ["--params", "8e9", "--layers", "32", "--d-model", "4096", "--heads", "32",
             "--seq-len", "8192", "--batch", "64"]
    (without,) = plans(capsys, *shape, *CLUSTER, *PINNED)
    (with_vocab,) = plans(capsys, *shape, "--vocab", "128256", *CLUSTER, *PINNED)
    assert with_vocab["step_s"] > without["step_s"]


def test_experts_are_pinned_too(capsys):
    mixtral = ["--layers", "32", "--d-model", "4096", "--heads", "32", "--kv-heads", "8",
               "--vocab", "32000", "--experts", "8", "--top-k", "2", "--expert-mlp", "14336",
               "--seq-len", "4096", "--batch", "64"]
    pinned = with_value(PINNED, "--virtual-stages", "1") + ["--expert-parallel", "2"]
    (only,) = plans(capsys, *mixtral, *CLUSTER, *pinned)
    assert only["layout"]["ep"] == 2
    assert "expert-parallel all-to-all (unvalidated)" in only["breakdown_s"]


#: Mixtral 8x7B's shape (Jiang et al. 2024, Table 1) on 16 H100, every layout axis pinned, ep 2
MIXTRAL_PINNED = ["--layers", "32", "--d-model", "4096", "--heads", "32", "--kv-heads", "8",
                  "--vocab", "32000", "--experts", "8", "--top-k", "2", "--expert-mlp", "14336",
                  "--seq-len", "4096", "--batch", "64", *CLUSTER,
                  *with_value(PINNED, "--virtual-stages", "1"), "--expert-parallel", "2"]


def test_load_imbalance_slows_the_moe_step_and_only_the_compute(capsys):
    (balanced,) = plans(capsys, *MIXTRAL_PINNED)
    (default,) = plans(capsys, *MIXTRAL_PINNED, "--load-imbalance", "1")
    (skewed,) = plans(capsys, *MIXTRAL_PINNED, "--load-imbalance", "1.5")
    assert default["step_s"] == balanced["step_s"]      # 1 is the default: balanced
    assert skewed["step_s"] > balanced["step_s"]
    parts, skewed_parts = balanced["breakdown_s"], skewed["breakdown_s"]
    assert skewed_parts["compute"] > parts["compute"]
    # the all-to-alls keep capacity_factor's buffers: only the busiest GPU's experts grow
    term = "expert-parallel all-to-all (unvalidated)"
    assert skewed_parts[term] == parts[term]
    print(f"Mixtral, 16 H100, ep 2: step {balanced['step_s']:.3f} s balanced, "
          f"{skewed['step_s']:.3f} s at load imbalance 1.5")


def test_json_layout_shows_the_load_imbalance_it_was_priced_at(capsys):
    (balanced,) = plans(capsys, *MIXTRAL_PINNED)
    (skewed,) = plans(capsys, *MIXTRAL_PINNED, "--load-imbalance", "1.5")
    assert balanced["layout"]["load_imbalance"] == 1.0
    assert skewed["layout"]["load_imbalance"] == 1.5


def test_load_imbalance_is_refused_for_a_dense_model_or_below_one(capsys):
    dense = error(capsys, *LLAMA_8B, *CLUSTER, *PINNED, "--load-imbalance", "1.2")
    assert "--load-imbalance describes experts: give --experts too" in dense
    for below in ("0.9", "nan"):
        low = error(capsys, *MIXTRAL_PINNED, "--load-imbalance", below)
        assert "at least 1" in low and "give 1 for a balanced router" in low, low


def test_tokens_are_optional_and_give_days_when_given(capsys):
    assert cli.main(["plan", *LLAMA_8B, *CLUSTER, *PINNED]) == 0
    assert "time to train" not in capsys.readouterr().out
    assert cli.main(["plan", *LLAMA_8B, *CLUSTER, *PINNED, "--tokens", "1e12"]) == 0
    assert "time to train 1e+12 tokens" in capsys.readouterr().out


def test_an_mfu_above_the_published_maximum_is_flagged_with_its_source(capsys):
    # a 1.3B model on one node: the course's model predicts above 47%, which no published
    # dense H100 run reached
    small = ["--params", "1.3e9", "--seq-len", "2048", "--batch", "512", "--gpus", "8",
             "--top", "1"]
    (best,) = plans(capsys, *small)
    assert best["mfu"] > 0.47
    assert best["mfu_above_published"]["mfu"] == 0.47
    assert "Megatron-LM README" in best["mfu_above_published"]["source"]
    assert cli.main(["plan", *small]) == 0
    assert "warning: MFU" in capsys.readouterr().out
    # below the record: no flag (Llama 3 8B, tp 4 x pp 2, at well under 47%)
    (pinned,) = plans(capsys, *LLAMA_8B, *CLUSTER, *PINNED, "--recompute", "full")
    assert pinned["mfu"] < 0.47 and pinned["mfu_above_published"] is None


def test_a_batch_that_does_not_divide_over_dp_names_the_fix(capsys):
    message = error(capsys, *with_value(LLAMA_8B, "--batch", "63"), *CLUSTER, *PINNED)
    assert "does not divide over dp = 2: use a batch of 62 or 64 sequences" in message


def test_a_pinned_layout_that_does_not_fit_is_shown_with_include_unfit(capsys):
    big = with_value(LLAMA_8B, "--seq-len", "65536")
    pinned = with_value(PINNED, "--recompute", "none")
    assert "No layout fits" in error(capsys, *big, *CLUSTER, *pinned)
    (shown,) = plans(capsys, *big, *CLUSTER, *pinned, "--include-unfit")
    assert shown["fits"] is False
    assert shown["memory_bytes_per_gpu"] > shown["memory_limit_bytes_per_gpu"]


@pytest.mark.parametrize("argv, match", [
    (["--layers", "32"], "--d-model, --heads missing"),
    (["--params", "8e9", "--ffn", "14336"], "drop one of them"),
    (["--layers", "32", "--d-model", "4096", "--heads", "32"], "needs the MLP width"),
    (["--params", "8e9", "--heads", "32", "--kv-heads", "5"], "must divide the 32"),
])
def test_bad_model_flags_name_the_fix(capsys, argv, match):
    assert match in error(capsys, *argv, *CLUSTER, *PINNED)


def test_precision_fp8_is_faster_and_refused_without_fp8_units(capsys):
    (bf16,) = plans(capsys, *LLAMA_8B, *CLUSTER, *PINNED)
    (fp8,) = plans(capsys, *LLAMA_8B, *CLUSTER, *PINNED, "--precision", "fp8")
    assert fp8["step_s"] < bf16["step_s"]
    assert fp8["mfu_above_published"] is None          # no FP8 record: nothing to flag
    on_a100 = ["--gpu", "A100", "--gpus", "16"]
    assert "A100 has no FP8 tensor cores" in error(capsys, *LLAMA_8B, *on_a100, *PINNED,
                                                    "--precision", "fp8")


def test_python_m_clusterlab_plan_json_runs_as_a_command():
    run = subprocess.run([sys.executable, "-m", "clusterlab", "plan", *LLAMA_8B, *CLUSTER,
                          *PINNED, "--json"], capture_output=True, text=True, timeout=300,
                         check=True)
    (only,) = json.loads(run.stdout)["plans"]
    assert SCHEMA <= set(only)


def test_shape_params_counts_the_experts():
    # Mixtral 8x7B (Jiang et al. 2024, Table 1): 46.7e9 parameters, every layer 8 experts
    from clusterlab.analytic import plan
    mixtral = plan.shape_params(32, 4096, n_heads=32, n_kv_heads=8, vocab_size=32000,
                                moe=plan.MoE(8, 2, 14336))
    assert mixtral == pytest.approx(46.7e9, rel=2e-3)
    with pytest.raises(ValueError, match="needs the MLP width"):
        plan.shape_params(32, 4096, n_heads=32, moe=plan.MoE(8, 2, 14336, n_moe_layers=16))


def published_moe_argv(run) -> list[str]:
    """The `plan` flags that describe one published GPT-OSS run (moe_runs.ROWS): its shape, the
    release's expert kernels, its cluster and its layout, every axis pinned."""
    from clusterlab.catalog.published import moe_runs
    layers, width, heads, kv_heads, experts, top_k, expert_mlp, vocab = (
        moe_runs.GPT_OSS_120B_SHAPE)
    recompute = (["--recompute-expert-activation"] if "moe_act" in run.recompute_modules
                 else [])
    domain = [] if run.nvlink_domain_gpus is None else ["--nvlink-domain",
                                                         str(run.nvlink_domain_gpus)]
    return ["--layers", str(layers), "--d-model", str(width), "--heads", str(heads),
            "--kv-heads", str(kv_heads), "--vocab", str(vocab), "--experts", str(experts),
            "--top-k", str(top_k), "--expert-mlp", str(expert_mlp), "--clamped-activation",
            "--expert-bias", *recompute, "--seq-len", str(run.seq_len),
            "--batch", str(run.global_batch), "--gpu", run.gpu, "--gpus", str(run.n_gpus),
            "--gpus-per-node", str(run.gpus_per_node), *domain, "--fabric", run.fabric_link,
            "--storage-gb-s", "1000", "--tensor-parallel", str(run.tp),
            "--pipeline-parallel", str(run.pp), "--context-parallel", "1",
            "--expert-parallel", str(run.ep), "--micro-batches", str(run.micro_batch),
            "--virtual-stages", "1", "--zero", "1", "--recompute", "flash", "--include-unfit"]


def test_every_published_moe_row_can_be_typed_at_the_cli(capsys):
    # A practitioner reproduces each row of the planner's MoE validation table from the
    # command line: the same step to the last digit, GB200's and GB300's racks included.
    from clusterlab.analytic.plan import validation
    from clusterlab.catalog.published import moe_runs
    for run in moe_runs.ROWS:
        (typed,) = plans(capsys, *published_moe_argv(run))
        assert typed["step_s"] == validation.moe_plan(run).step_s, run


def test_the_rack_and_release_flags_change_the_step(capsys):
    # negative controls: each new flag is read. Without --nvlink-domain the GB200 run's
    # all-to-alls cross the NICs; without the release's kernels the experts run faster.
    from clusterlab.catalog.published import moe_runs
    gb200 = next(run for run in moe_runs.ROWS if run.gpu == "GB200")
    argv = published_moe_argv(gb200)
    (rack,) = plans(capsys, *argv)
    without_domain = argv[:argv.index("--nvlink-domain")] + argv[argv.index("--nvlink-domain")
                                                                  + 2:]
    (hosts,) = plans(capsys, *without_domain)
    term = "expert-parallel all-to-all (unvalidated)"
    assert hosts["breakdown_s"][term] > 2 * rack["breakdown_s"][term]
    for flag in ("--clamped-activation", "--expert-bias", "--recompute-expert-activation"):
        (lighter,) = plans(capsys, *[a for a in argv if a != flag])
        assert lighter["step_s"] < rack["step_s"], flag


def test_the_rack_and_release_flags_refuse_what_they_cannot_describe(capsys):
    dense = error(capsys, *LLAMA_8B, *CLUSTER, *PINNED, "--expert-bias")
    assert "--expert-bias describes experts: give --experts too" in dense
    trays = ["--gpu", "GB200", "--gpus", "72", "--gpus-per-node", "4"]
    assert "not a whole number of hosts of 4 GPUs" in error(
        capsys, *LLAMA_8B, *trays, "--nvlink-domain", "70", *PINNED)
    assert "--nvlink-domain needs --gpus" in error(
        capsys, *LLAMA_8B, "--tokens", "1e12", "--budget-days", "30", "--nvlink-domain", "72")


def test_a_plan_with_experts_carries_the_models_known_miss(capsys):
    # The course's model is tested on five published MoE runs and misses all of them the same
    # way: the warning gives that span, from the validation table itself; a dense plan has none
    from clusterlab.analytic.plan import validation
    low, high, rows = validation.moe_error_span()
    assert rows == 5 and 0.25 < low < high
    assert (low, high) == (min(r.error for r in validation.moe_validation_table()),
                           max(r.error for r in validation.moe_validation_table()))
    (moe,) = plans(capsys, *MIXTRAL_PINNED)
    assert moe["moe_warning"] == (
        f"mixtures of experts: on the 5 published runs it was tested on, the course's model "
        f"predicted {low:+.0%} to {high:+.0%} more tokens per second than they reached "
        f"(plan.validation.moe_validation_table): read this step as a floor")
    (dense,) = plans(capsys, *LLAMA_8B, *CLUSTER, *PINNED)
    assert dense["moe_warning"] is None
    assert cli.main(["plan", *MIXTRAL_PINNED]) == 0
    text = capsys.readouterr().out
    assert f"warning: {moe['moe_warning']}" in text
    # without --tokens there is no time to train: the days column says so with a dash
    row = next(line for line in text.splitlines() if line.startswith("dp2 tp4 pp2 ep2"))
    assert "nan" not in row and " - " in row
