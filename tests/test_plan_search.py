"""The planner's search (clusterlab.analytic.plan.search): the space's rules, the refusals, the best plan
against brute force, and the CLI's summary of both."""

import contextlib
import io
import itertools
from dataclasses import replace

import pytest

from clusterlab.analytic import plan
from clusterlab.course import cli as cli

# A 7B model (32 layers) on two nodes: small enough to predict every layout by brute force.
W7 = plan.Workload(7e9, 4096, 32, n_tokens=1e12, n_layers=32, d_model=4096)
HW16 = plan.cluster("H100", 16, storage_read_bytes_per_s=20e9)


def _obeys_megatron(workload: plan.Workload, layout: plan.Layout) -> bool:
    """The rules the search must keep, written out again from Megatron-LM's checks."""
    n_layers, _ = workload.shape
    per_replica = workload.global_batch // layout.dp
    n_micro = per_replica // layout.micro_batch
    interleaved_ok = layout.virtual_stages == 1 or (
        layout.pp > 1 and n_layers % (layout.pp * layout.virtual_stages) == 0
        and n_micro % layout.pp == 0)
    return (per_replica % layout.micro_batch == 0 and interleaved_ok
            and (layout.zero_stage == 0 or layout.dp > 1))


def test_every_ranked_plan_obeys_the_rules_and_the_space_is_explored():
    plans = plan.rank_layouts(W7, HW16)
    assert plans and all(_obeys_megatron(W7, p.layout) and p.fits for p in plans)
    # each dimension of the space is reached, so a search that dropped one would fail here
    assert {p.layout.micro_batch for p in plans} == {1, 2, 4, 8}
    assert {p.layout.virtual_stages for p in plans} == {1, 2, 4}
    assert {p.workload.recompute_policy for p in plans} == set(plan.SearchSpace().recompute)
    assert {p.layout.zero_stage for p in plans} == {0, 1, 2, 3}
    assert any(p.layout.virtual_stages > 1 and p.layout.pp > 1 for p in plans)


def test_refusals_add_up_to_the_candidates_and_name_each_rule():
    space = plan.SearchSpace()
    result = plan.search_layouts(W7, HW16, limit=3)
    grids = sum(1 for tp in (1, 2, 4, 8) for pp in range(1, 17)
                if 16 % (tp * pp) == 0 and W7.global_batch % (16 // (tp * pp)) == 0)
    assert result.n_candidates == grids * (len(space.micro_batches) * len(space.virtual_stages)
                                           * len(space.recompute) * len(space.zero_stages))
    assert sum(r.count for r in result.refused) + len(result.plans) == result.n_candidates
    reasons = {r.reason: r for r in result.refused}
    for rule in ("ZeRO needs dp > 1", "interleaving needs pp > 1",
                 "interleaving needs micro-batches a multiple of pp",
                 "layers not divisible by pp * v",
                 "micro-batch does not divide the replica's sequences"):
        example = reasons[f"does not divide: {rule}"].layout
        assert not _obeys_megatron(W7, example), rule
    slower = reasons["fits, slower than the shown ones"]
    assert slower.count == len(plan.rank_layouts(W7, HW16)) - 3


def test_a_does_not_fit_example_really_does_not_fit():
    refusal = next(r for r in plan.search_layouts(W7, HW16).refused
                   if r.reason == "does not fit in memory")
    refused = plan.predict(replace(W7, recompute=refusal.recompute), HW16, refusal.layout)
    assert not refused.fits and refused.memory_bytes > refused.memory_limit_bytes
    assert f"{refused.memory_bytes / 1e9:.1f} GB >" in refusal.example


def test_the_best_plan_is_no_slower_than_any_fitting_layout_by_brute_force():
    best = plan.best_plan(W7, HW16)
    fitting = []
    for dp, tp, pp, zero, mbs, v, policy in itertools.product(
            (1, 2, 4, 8, 16), (1, 2, 4, 8), (1, 2, 4, 8, 16), range(4), (1, 2, 4, 8), (1, 2, 4),
            plan.SearchSpace().recompute):     # the default space: "flash_full" is opt-in
        if dp * tp * pp != 16:
            continue
        layout = plan.Layout(dp=dp, tp=tp, pp=pp, zero_stage=zero, micro_batch=mbs,
                             virtual_stages=v)
        try:
            candidate = plan.predict(replace(W7, recompute=policy), HW16, layout)
        except ValueError:          # predict's own checks refuse it
            continue
        if candidate.fits:
            fitting.append(candidate)
    assert len(fitting) > 100
    assert best.step_s <= min(p.step_s for p in fitting) + 1e-12


def test_a_narrow_space_searches_only_its_values():
    space = plan.SearchSpace(micro_batches=(2,), virtual_stages=(1,), recompute=("full",),
                             zero_stages=(1,))
    plans = plan.rank_layouts(W7, HW16, space=space)
    assert plans and all(p.layout.micro_batch == 2 and p.layout.zero_stage == 1
                         and p.workload.recompute_policy == "full" for p in plans)
    # the old default: the workload's policy, micro-batches of one, no interleaving
    layouts = plan.candidate_layouts(W7, HW16)
    assert {(lay.micro_batch, lay.virtual_stages) for lay in layouts} == {(1, 1)}


@pytest.mark.parametrize("make, match", [
    (lambda: plan.SearchSpace(recompute=("sometimes",)), "recompute must be among"),
    (lambda: plan.SearchSpace(micro_batches=(0,)), "micro_batches must be positive"),
    (lambda: plan.SearchSpace(zero_stages=(4,)), "zero_stages must be among"),
    (lambda: plan.rank_layouts(plan.Workload(70e9, 4096, 1024, n_tokens=2e12), replace(
        HW16, n_nodes=1)), "No layout fits: the smallest, .* GB per GPU .* use more GPUs"),
])
def test_bad_spaces_and_no_fit_are_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def _run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(["plan", "--params", "7e9", "--tokens", "1e12", "--batch", "32",
                             "--layers", "32", "--d-model", "4096", "--gpus", "16", *args])
        except SystemExit as exit_:            # argparse's errors
            code = exit_.code
    return code, out.getvalue(), err.getvalue()


def test_cli_prints_the_best_layouts_and_the_refusal_summary():
    code, out, _ = _run_cli("--top", "3")
    assert code == 0
    result = plan.search_layouts(W7, HW16, limit=3)
    assert plan.format_plans(result.plans) in out
    assert plan.format_refusals(result) in out
    assert f"# {result.n_candidates} candidates: 3 shown; refused:" in out
    code, out, _ = _run_cli("--top", "2", "--recompute", "--micro-batches", "1,2", "--zero", "1")
    assert code == 0
    narrowed = plan.search_layouts(W7, HW16, space=plan.SearchSpace(
        micro_batches=(1, 2), recompute=("full",), zero_stages=(1,)), limit=2)
    assert plan.format_plans(narrowed.plans) in out


@pytest.mark.parametrize("flag, value, match", [
    ("--micro-batches", "1,x", "comma-separated integers"),
    ("--micro-batches", "0", "must be positive"),
    ("--virtual-stages", "-2", "must be positive"),
    ("--zero", "4", "among 0,1,2,3"),
    ("--recompute", "sometimes", "among flash,none,selective,full"),
])
def test_cli_bad_flags_give_clear_errors(flag, value, match):
    code, _, err = _run_cli(flag, value)
    assert code == 2 and match in err
