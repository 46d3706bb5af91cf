"""The table of published MFU (chapter 07c): the catalog's new rows, what the course computes
from them and the planner's prediction beside each.

Sources: Jiang et al. 2024 (MegaScale), Tables 1-3; Dubey et al. 2024 (Llama 3), Table 4;
DeepSeek-AI 2024 (DeepSeek-V3), Table 1 and sections 3-4.
"""

import math

import pytest

from clusterlab.analytic import flops
from clusterlab.analytic.plan import mfu_table
from clusterlab.catalog import hardware
from clusterlab.catalog.published import mfu_records

A100_BF16 = hardware.peak_flops("A100")
H100_FP8 = hardware.peak_flops("H100", precision="fp8")


def _run(system: str) -> mfu_records.PublishedRun:
    return next(r for r in mfu_records.PUBLISHED_RUNS if r.system == system)


def test_every_new_row_is_a_whole_layout_with_a_source():
    for run in (*mfu_records.PUBLISHED_RUNS, mfu_records.MEGASCALE_ABLATION_RUN):
        assert run.dp * run.tp * run.pp * run.cp == run.n_gpus, run.model
        assert ("Table" in run.source or "section" in run.source), run.model
        # a row states an MFU, or the GPU-hours and tokens the course computes one from
        assert (run.mfu is not None) != (run.gpu_hours is not None and run.n_tokens is not None)


def test_the_planner_flag_still_reads_only_the_records():
    """PUBLISHED_RUNS add rows without changing what mfu_records.record returns."""
    assert mfu_records.record("A100", "dense").mfu == 0.563
    assert mfu_records.record("H100", "dense").mfu == 0.47
    assert mfu_records.record("H100", "moe") is None
    assert mfu_records.record("H100", "dense", precision="fp8") is None


@pytest.mark.parametrize("system", ["MegaScale", "Megatron-LM (MegaScale's baseline)"])
def test_megascale_table_2_iteration_time_gives_its_mfu(system):
    """The course's MFU of Table 2's iteration time is the paper's MFU to within 1%: the
    transcription and the FLOP convention agree."""
    run = _run(system)
    per_token = flops.transformer_flops_per_token(run.n_params, run.n_layers, run.seq_len,
                                                  run.d_attn)
    tokens_per_s = run.global_batch * run.seq_len / run.iteration_s
    course_mfu = flops.mfu(tokens_per_s * per_token, run.n_gpus, A100_BF16)
    print(f"{system}: course {course_mfu:.3f}, published {run.mfu}")
    assert course_mfu == pytest.approx(run.mfu, rel=0.01)


def test_megascale_speedup_is_the_papers():
    """MegaScale states 1.34x Megatron-LM's MFU at 12,288 GPUs (abstract, Table 2)."""
    ratio = _run("MegaScale").mfu / _run("Megatron-LM (MegaScale's baseline)").mfu
    assert round(ratio, 2) == 1.34


def test_deepseek_gpu_hours_mfu_is_the_hand_computation():
    run = _run("HAI-LLM")
    by_hand = (run.n_tokens * (6 * run.n_params + 12 * run.n_layers * run.seq_len * run.d_attn)
               / (run.gpu_hours * 3600 * H100_FP8))
    computed = mfu_table.gpu_hours_mfu(run, H100_FP8)
    print(f"DeepSeek-V3: {computed:.3f} of the FP8 peak")
    assert computed == pytest.approx(by_hand, rel=1e-12)
    assert 0.15 < computed < 0.30
    with pytest.raises(ValueError, match="GPU-hours"):
        mfu_table.gpu_hours_mfu(_run("MegaScale"), H100_FP8)


def test_run_plan_refuses_what_it_cannot_express():
    with pytest.raises(ValueError, match="mixture of experts"):
        mfu_table.run_plan(_run("HAI-LLM"))
    with pytest.raises(ValueError, match="FABRIC_BY_GPU"):
        mfu_table.run_plan(_run("MegaScale")._replace(gpu="B200"))


def test_step_shares_telescope_and_refuse_bad_input():
    mfus = [m for _, m in mfu_records.MEGASCALE_ABLATION[2:6]]
    shares = mfu_table.step_shares_removed(mfus)
    assert len(shares) == 3 and all(s > 0 for s in shares)
    assert math.isclose(sum(shares), 1 - mfus[0] / mfus[-1])
    assert mfu_table.step_shares_removed([0.5, 0.4]) == [pytest.approx(-0.25)]
    with pytest.raises(ValueError, match="two MFUs"):
        mfu_table.step_shares_removed([0.5])
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        mfu_table.step_shares_removed([53.3, 59.5])


def test_table_rows_and_the_errors_found():
    rows = mfu_table.published_mfu_rows(stand_in_peak_flops=H100_FP8)
    by_system = {row.system: row for row in rows}
    for row in rows:
        assert row.source
        if row.predicted is None:
            assert row.error is None and row.note, row.model
        else:
            assert row.error == pytest.approx((row.predicted - row.published) / row.published)
        print(f"{row.model} | {row.system} | {row.gpus} | {row.published} | {row.predicted} | "
              f"{row.error}")
    # what chapter 07c says: the planner lands near MegaScale and far above its baseline, which
    # ran the same model on the same GPUs under the same layout
    assert abs(by_system["MegaScale"].error) < 0.05
    assert by_system["Megatron-LM (MegaScale's baseline)"].error > 0.30
    assert by_system["HAI-LLM"].computed == pytest.approx(
        mfu_table.gpu_hours_mfu(_run("HAI-LLM"), H100_FP8))
    assert by_system["HAI-LLM"].published is None
