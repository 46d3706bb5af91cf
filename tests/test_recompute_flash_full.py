"""The "flash_full" recomputation policy: full activation recomputation with FlashAttention
(issue 38, item 5). Each layer keeps only its input (Korthikanti et al. 2022, section 4
[korthikanti2022]); the whole forward runs once more, 4/3 of the model's GEMM FLOPs; attention
is one fused kernel in every pass (Dao 2023, FlashAttention-2), so no ``s x s`` tensor is kept
or written to HBM.

The validation table has no Llama 3 405B long-context row (its two Llama 3 rows are the
8,192-token ones). The 128K test below builds the layout of Dubey et al. 2024, Table 4's third
row [dubey2024] (16,384 H100, tp 8, cp 16, pp 16, dp 8, 131,072 tokens, 16M tokens a batch,
38% BF16 MFU) and checks that its MFU rises from "full" to "flash_full" by the ``s^2`` terms.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from clusterlab.analytic import gemm, memory, plan
from clusterlab.catalog import hardware
from clusterlab.course import cli

H100 = hardware.gpu("H100")
#: A layer shape of Korthikanti's 22B (h 6144, 64 heads) at 4,096 tokens, two sequences, tp 8.
LAYER = dict(seq_len=4096, micro_batch=2, d_model=6144, n_heads=64, ffn_hidden=4 * 6144,
             tensor_parallel=8)
#: HBM bytes per attention score of the unfused kernels in the docstring of
#: gemm.transformer_layer_elementwise: softmax 4 and dropout 5 forward (and once more when
#: recomputed), softmax 6 and dropout 5 backward.
UNFUSED_BYTES_PER_SCORE = {"forward": 4 + 5, "recompute": 4 + 5, "dgrad": 6 + 5}

#: Llama 3 405B's long-context stage (Dubey et al. 2024, Tables 3 and 4 [dubey2024]): 126
#: layers of 16384, 128 heads, 8 key/value heads, 131,072 tokens, 128 sequences a step.
LLAMA3_128K = plan.Workload(405e9, 131072, 128, n_tokens=15.6e12, n_layers=126, d_model=16384,
                            n_heads=128, n_kv_heads=8, vocab_size=128_256)
LLAMA3_128K_LAYOUT = plan.Layout(dp=8, tp=8, pp=16, cp=16, zero_stage=1)
LLAMA3_128K_MFU = 0.38          # Dubey et al. 2024, Table 4, 16,384 GPUs, CP 16
LLAMA3_128K_CLUSTER = plan.cluster("H100", 16384, storage_read_bytes_per_s=1e12)


def _activation_bytes(policy: str, seq_len: int = 4096, **shape) -> float:
    args = dict(micro_batch=2, hidden=6144, n_heads=64, tensor_parallel=8,
                sequence_parallel=True) | shape
    return memory.transformer_layer_activation_bytes(seq_len, recompute=policy, **args)


def _llama3_128k(policy: str) -> plan.Plan:
    return plan.predict(replace(LLAMA3_128K, recompute=policy), LLAMA3_128K_CLUSTER,
                        LLAMA3_128K_LAYOUT)


# (a) memory ----------------------------------------------------------------------------------

@pytest.mark.parametrize("tp, sequence_parallel", [(1, False), (8, False), (8, True)])
def test_flash_full_keeps_only_each_layers_input_with_no_score_bytes(tp, sequence_parallel):
    shape = dict(tensor_parallel=tp, sequence_parallel=sequence_parallel)
    s, b, h, a = 4096, 2, 6144, 64
    scores = _activation_bytes("none", **shape) - _activation_bytes("selective", **shape)
    assert scores == pytest.approx(5 * a * s * s * b / tp)     # the S^2 term the model has
    # "full" keeps no score bytes either (Korthikanti's 2 s b h): "full" less them is "full"
    kept = 2 * s * b * h / (tp if sequence_parallel else 1)
    assert _activation_bytes("flash_full", **shape) == _activation_bytes("full", **shape) == kept
    print(f"tp {tp}, sp {sequence_parallel}: flash_full {kept / 2**20:.0f} MiB a layer, "
          f"'none''s scores {scores / 2**20:.0f} MiB")


def test_flash_full_memory_doubles_with_the_sequence_not_fourfold():
    short, long = _activation_bytes("flash_full", 4096), _activation_bytes("flash_full", 8192)
    assert long == 2 * short
    # control: the same ratio for a policy that keeps the scores is well above 2
    assert _activation_bytes("none", 8192) / _activation_bytes("none", 4096) > 2.5


@pytest.mark.parametrize("seq_len", [2048, 8192, 131072])
@pytest.mark.parametrize("tp, sequence_parallel, kv_heads", [(1, False, 64), (8, False, 8),
                                                              (8, True, 8), (4, True, 64)])
def test_negative_control_flash_full_never_keeps_more_than_flash(seq_len, tp,
                                                                 sequence_parallel, kv_heads):
    """Full recomputation keeps less than no recomputation at every shape, so a policy
    mislabelled as full recomputation (keeping what "flash" keeps) fails the same comparison."""
    shape = dict(tensor_parallel=tp, sequence_parallel=sequence_parallel, n_kv_heads=kv_heads)
    flash = _activation_bytes("flash", seq_len, **shape)
    assert _activation_bytes("flash_full", seq_len, **shape) < flash
    assert not _activation_bytes("selective", seq_len, **shape) < flash   # the mislabel fails


def test_the_planner_keeps_fulls_activations_for_flash_full_at_128k():
    full, flash_full, flash = (_llama3_128k(p) for p in ("full", "flash_full", "flash"))
    assert flash_full.activation_bytes == full.activation_bytes < flash.activation_bytes
    assert flash_full.fits and not flash.fits
    print(f"Llama 3 405B at 128K, first stage: flash_full {flash_full.memory_bytes / 2**30:.1f} "
          f"GiB ({flash_full.activation_bytes / 2**30:.1f} activations), flash "
          f"{flash.memory_bytes / 2**30:.1f} GiB of {flash.memory_limit_bytes / 2**30:.1f} usable")


# (b) compute ---------------------------------------------------------------------------------

def _flops(policy: str, **shape) -> float:
    return sum(g.flops for g in gemm.transformer_layer_gemms(**(LAYER | shape),
                                                            recompute=policy))


@pytest.mark.parametrize("shape", [{}, dict(seq_len=131072, micro_batch=1, tensor_parallel=1)])
def test_flash_full_runs_fulls_gemm_flops_four_thirds_of_no_recomputation(shape):
    assert _flops("flash_full", **shape) == pytest.approx(_flops("full", **shape), rel=1e-12)
    assert _flops("flash_full", **shape) == pytest.approx(4 / 3 * _flops("flash", **shape),
                                                          rel=1e-12)
    again = [g for g in gemm.transformer_layer_gemms(**LAYER, recompute="flash_full")
             if g.pass_ == "recompute"]
    assert [g.name for g in again] == ["qkv", "scores", "attention_over_values",
                                       "output_projection", "mlp_up", "mlp_down"]


def test_flash_full_gemm_traffic_has_no_score_term():
    def hbm(policy: str, seq_len: int) -> float:
        return sum(g.hbm_bytes for g in gemm.transformer_layer_gemms(
            **(LAYER | dict(seq_len=seq_len)), recompute=policy))
    def second_difference(policy: str) -> float:   # zero for bytes affine in s
        return hbm(policy, 3 * 4096) - 2 * hbm(policy, 2 * 4096) + hbm(policy, 4096)
    # the weights' bytes are fixed and the activations' linear in s with the scores on chip;
    # "full" writes and reads the scores, 2 b a s^2 / t bytes a pass each way (control)
    assert second_difference("flash_full") == pytest.approx(0, abs=1e-6 * hbm("flash_full", 4096))
    assert second_difference("full") > 0.1 * hbm("full", 4096)


def test_flash_full_elementwise_bytes_are_flashs_plus_its_forward_again():
    def kernels(policy: str, seq_len: int = 4096) -> tuple[gemm.Elementwise, ...]:
        shape = LAYER | dict(seq_len=seq_len)
        shape.pop("ffn_hidden")
        return gemm.transformer_layer_elementwise(**shape, ffn_hidden=LAYER["ffn_hidden"],
                                                  sequence_parallel=True, recompute=policy)

    def total(policy: str, seq_len: int = 4096) -> float:
        return sum(k.hbm_bytes for k in kernels(policy, seq_len))

    forward = sum(k.hbm_bytes for k in kernels("flash") if k.pass_ == "forward")
    assert total("flash_full") == pytest.approx(total("flash") + forward, rel=1e-12)
    assert total("flash_full", 8192) == pytest.approx(2 * total("flash_full"), rel=1e-12)
    s, b, a, t = 4096, LAYER["micro_batch"], LAYER["n_heads"], LAYER["tensor_parallel"]
    score_bytes = sum(UNFUSED_BYTES_PER_SCORE.values()) * b * a * s * s / t
    assert total("full") - total("flash_full") == pytest.approx(score_bytes, rel=1e-12)


# (c) the planner at 128K ---------------------------------------------------------------------

def test_llama3_128k_mfu_rises_from_full_to_flash_full_by_the_score_terms():
    full, flash_full, flash = (_llama3_128k(p) for p in ("full", "flash_full", "flash"))
    for name, p in (("full", full), ("flash_full", flash_full), ("flash", flash)):
        print(f"{name:<10} MFU {p.mfu:.1%} ({(p.mfu - LLAMA3_128K_MFU) / LLAMA3_128K_MFU:+.0%} "
              f"against Dubey et al.'s {LLAMA3_128K_MFU:.0%}), step {p.step_s:.2f} s, compute "
              f"{p.compute_s:.2f} s, fits {p.fits}")
    assert full.mfu < flash_full.mfu < flash.mfu
    # the same FLOPs as "full": the gap is the s^2 terms alone. One layer's: the unfused
    # attention GEMMs' extra time and the softmax and dropout bytes over HBM
    s, b = LLAMA3_128K.seq_len, LLAMA3_128K_LAYOUT.micro_batch
    _, d = LLAMA3_128K.shape
    shape = dict(ffn_hidden=LLAMA3_128K.mlp_width, tensor_parallel=8)

    def attention_s(policy: str) -> float:
        return sum(gemm.gemm_time_s(g, H100) for g in gemm.transformer_layer_gemms(
            s, b, d, LLAMA3_128K.heads, recompute=policy, **shape)
            if g.name in gemm.LAYER_GEMM_GROUPS["attention"])
    score_bytes = (sum(UNFUSED_BYTES_PER_SCORE.values()) * b * LLAMA3_128K.heads * s * s
                   / LLAMA3_128K_LAYOUT.tp)
    layer_gap_s = (attention_s("full") - attention_s("flash_full")
                   + score_bytes / H100.hbm_bytes_per_s)
    layers = LLAMA3_128K.shape[0] / LLAMA3_128K_LAYOUT.pp
    micro_batches = LLAMA3_128K.global_batch // LLAMA3_128K_LAYOUT.dp
    assert full.compute_s - flash_full.compute_s == pytest.approx(
        micro_batches * layers * layer_gap_s / LLAMA3_128K_LAYOUT.cp, rel=1e-9)
    # the layers (the output layer is not recomputed): with the scores on chip one more
    # forward costs 4/3 of the GEMMs' time and less of the element-wise kernels' (their forward
    # moves under a third of their bytes); unfused, the scores' traffic makes "full" several
    # times "flash" (control)
    def layers_s(p: plan.Plan) -> float:
        return p.compute_s - p.output_layer_s
    assert 1.30 < layers_s(flash_full) / layers_s(flash) <= 4 / 3
    assert layers_s(full) / layers_s(flash) > 2


# the search and the CLI ----------------------------------------------------------------------

def test_flash_full_is_opt_in_for_the_search():
    assert "flash_full" in gemm.RECOMPUTE_POLICIES
    assert "flash_full" not in plan.SearchSpace().recompute
    assert set(plan.SearchSpace().recompute) == set(gemm.RECOMPUTE_POLICIES) - {"flash_full"}


LLAMA_8B = ["--layers", "32", "--d-model", "4096", "--heads", "32", "--kv-heads", "8",
            "--ffn", "14336", "--vocab", "128256", "--seq-len", "8192", "--batch", "64",
            "--gpu", "H100", "--gpus", "16", "--tensor-parallel", "4",
            "--pipeline-parallel", "2", "--context-parallel", "1", "--micro-batches", "1",
            "--virtual-stages", "1", "--zero", "1"]


def test_plan_cli_searches_flash_full_only_when_asked(capsys):
    def policies(*extra: str) -> set[str]:
        assert cli.main(["plan", *LLAMA_8B, *extra, "--top", "50", "--json"]) == 0
        return {p["layout"]["recompute"] for p in json.loads(capsys.readouterr().out)["plans"]}
    assert "flash_full" not in policies()
    assert policies("--recompute", "flash,flash_full") == {"flash", "flash_full"}
    assert cli.main(["plan", *LLAMA_8B, "--recompute", "flash_full"]) == 0
    table = capsys.readouterr().out.splitlines()
    header = next(line for line in table if line.startswith("layout "))
    row = next(line for line in table if " flash_full " in line)
    # the policy column widens for the longer name, and ZeRO's column follows it
    assert header.index("recompute") == row.index("flash_full")
    assert header.index("ZeRO") == row.index("flash_full") + len("flash_full") + 1
    with pytest.raises(SystemExit) as refused:     # argparse refuses an unknown policy
        cli.main(["plan", *LLAMA_8B, "--recompute", "flash_ful"])
    assert refused.value.code == 2
    assert "among flash,none,selective,full,flash_full" in capsys.readouterr().err
