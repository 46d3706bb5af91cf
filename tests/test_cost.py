"""clusterlab.analytic.cost: the price of a GPU-hour, a cluster's TCO, and compute-optimal N and D.

Each test computes the expected value its own way (from the catalog and the formula in the
docstring, or from a property the answer must have) and prints what it checked.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from clusterlab.analytic import cost, flops
from clusterlab.analytic.plan.power import PUE_HYPERSCALE
from clusterlab.catalog import hardware

ROOT = Path(__file__).resolve().parents[1]
OWNED = cost.Ownership()


def test_an_owned_gpu_hour_is_the_purchase_energy_and_operations_over_the_life():
    server = hardware.node("DGX H100")
    hours = OWNED.life_years * cost.HOURS_PER_YEAR
    capex = OWNED.server_price_usd * (1 + OWNED.infrastructure_fraction) / server.gpus_per_node
    facility_kw_per_gpu = (server.max_power_w / server.gpus_per_node
                           * (1 + OWNED.other_it_fraction) * OWNED.pue / 1e3)
    hour = cost.owned_cost_per_gpu_hour("DGX H100")
    assert hour.capex_usd == pytest.approx(capex / hours, rel=1e-12)
    assert hour.energy_usd == pytest.approx(facility_kw_per_gpu * OWNED.usd_per_kwh, rel=1e-12)
    assert hour.operations_usd == pytest.approx(
        capex * OWNED.operations_fraction_per_year / cost.HOURS_PER_YEAR, rel=1e-12)
    assert hour.total_usd == pytest.approx(hour.capex_usd + hour.energy_usd
                                           + hour.operations_usd)
    print(f"owned H100 GPU-hour: ${hour.total_usd:.2f} (capex {hour.capex_usd:.2f}, energy "
          f"{hour.energy_usd:.2f}, operations {hour.operations_usd:.2f})")


def test_the_cluster_tco_over_its_life_is_the_gpu_hour_times_its_gpu_hours():
    n_gpus = 256
    tco = cost.cluster_tco("DGX H100", n_gpus)
    hour = cost.owned_cost_per_gpu_hour("DGX H100")
    gpu_hours = n_gpus * OWNED.life_years * cost.HOURS_PER_YEAR
    assert tco.total_usd == pytest.approx(hour.total_usd * gpu_hours, rel=1e-12)
    assert tco.capex_usd == pytest.approx(32 * OWNED.server_price_usd * 1.2, rel=1e-12)
    print(f"256 H100s for {OWNED.life_years:.0f} years: ${tco.total_usd / 1e6:.1f}M")


def test_gpus_round_up_to_whole_servers_and_years_scale_energy_and_operations_only():
    assert cost.cluster_tco("DGX H100", 9) == cost.cluster_tco("DGX H100", 16)
    one, two = (cost.cluster_tco("DGX H100", 8, years=y) for y in (1.0, 2.0))
    assert two.capex_usd == one.capex_usd
    assert two.energy_usd == pytest.approx(2 * one.energy_usd)
    assert two.operations_usd == pytest.approx(2 * one.operations_usd)
    print("9 GPUs cost as 2 servers; a second year adds energy and operations, not capex")


def test_energy_scales_with_the_pue_and_the_price_of_a_kwh():
    base = cost.owned_cost_per_gpu_hour("DGX H100").energy_usd
    better = cost.owned_cost_per_gpu_hour("DGX H100", replace(OWNED, pue=PUE_HYPERSCALE))
    dearer = cost.owned_cost_per_gpu_hour("DGX H100", replace(OWNED, usd_per_kwh=0.2))
    assert better.energy_usd == pytest.approx(base * PUE_HYPERSCALE / OWNED.pue)
    assert dearer.energy_usd == pytest.approx(base * 0.2 / OWNED.usd_per_kwh)
    print(f"energy per GPU-hour: ${base:.3f}, ${better.energy_usd:.3f} at PUE "
          f"{PUE_HYPERSCALE}, ${dearer.energy_usd:.3f} at $0.20/kWh")


@pytest.mark.parametrize("price", cost.RENTED_PRICES.values(), ids=lambda p: p.name)
def test_owning_beats_renting_exactly_above_the_break_even_utilization(price):
    owned = cost.owned_cost_per_gpu_hour("DGX H100").total_usd
    even = cost.break_even_utilization(owned, price.usd_per_gpu_hour)
    assert 0 < even < 1
    assert owned / (even * 1.01) < price.usd_per_gpu_hour < owned / (even * 0.99)
    print(f"{price.name} (${price.usd_per_gpu_hour:.2f}, {price.listed}): owning wins above "
          f"{100 * even:.0f}% utilization")


def test_every_rented_price_cites_a_source_in_references_bib_with_a_date():
    keys = set(re.findall(r"^@\w+\{([^,]+),", (ROOT / "references.bib").read_text(), re.M))
    for price in cost.RENTED_PRICES.values():
        assert price.source in keys, price
        assert re.search(r"\b20\d\d\b", price.listed), price
    assert cost.HOFFMANN_FIT.source in keys
    print(f"{len(cost.RENTED_PRICES)} rented prices, each cited and dated")


@pytest.mark.parametrize("compute", [1e20, 5.76e23, 1e26])
def test_the_ratio_rule_spends_the_budget_at_twenty_tokens_per_parameter(compute):
    allocation = cost.compute_optimal_by_ratio(compute)
    assert allocation.compute_flops == pytest.approx(compute, rel=1e-12)
    assert allocation.tokens_per_param == pytest.approx(cost.CHINCHILLA_TOKENS_PER_PARAM)
    print(f"C = {compute:.2e}: N = {allocation.n_params:.3g}, D = {allocation.n_tokens:.3g}")


def test_chinchillas_own_budget_gives_chinchilla():
    # Chinchilla: 70B parameters on 1.4T tokens (Hoffmann et al. 2022, Section 4.1)
    allocation = cost.compute_optimal_by_ratio(flops.training_flops(70e9, 1.4e12))
    assert allocation.n_params == pytest.approx(70e9, rel=1e-12)
    print(f"Chinchilla's budget: N = {allocation.n_params:.3g}")


@pytest.mark.parametrize("row", cost.HOFFMANN_TABLE3, ids=lambda r: f"{r[0]:.0e}")
def test_table_3_is_transcribed_consistently_and_the_ratio_rule_matches_it(row):
    n_params, compute, n_tokens = row
    # Each row spends 6ND; the paper rounds tokens to 2-4 digits (67B: 1.5T for 1.43T).
    assert compute == pytest.approx(6 * n_params * n_tokens, rel=0.05)
    assert 19.9 <= n_tokens / n_params <= 22.5
    by_rule = cost.compute_optimal_by_ratio(compute)
    assert by_rule.n_params == pytest.approx(n_params, rel=0.06)
    print(f"N = {n_params:.0e}: {n_tokens / n_params:.1f} tokens per parameter; the 20-token "
          f"rule gives N = {by_rule.n_params:.3g}")


@pytest.mark.parametrize("compute", [1e21, 5.76e23, 1e25])
def test_the_fitted_optimum_is_a_minimum_of_the_fitted_loss_at_fixed_compute(compute):
    best = cost.compute_optimal_by_fit(compute)
    assert best.compute_flops == pytest.approx(compute, rel=1e-12)
    best_loss = cost.fitted_loss(cost.HOFFMANN_FIT, best.n_params, best.n_tokens)
    for factor in (0.8, 0.95, 1.05, 1.25):
        n = best.n_params * factor
        assert cost.fitted_loss(cost.HOFFMANN_FIT, n, compute / (6 * n)) > best_loss
    print(f"C = {compute:.2e}: fitted optimum N = {best.n_params:.3g} "
          f"({best.tokens_per_param:.0f} tokens per parameter), loss {best_loss:.3f}")


def test_the_printed_fit_puts_fewer_parameters_than_table_3_on_every_budget():
    # The paper's Approach 3 picks smaller models than its Approach 1 (Hoffmann et al. 2022,
    # Table 2 and Figure 1), more so as the budget grows.
    shares = [cost.compute_optimal_by_fit(c).n_params / n for n, c, _ in cost.HOFFMANN_TABLE3]
    assert all(s < 1 for s in shares)
    assert shares == sorted(shares, reverse=True)
    print("fitted N over Table 3's N: " + ", ".join(f"{s:.2f}" for s in shares))


def test_the_fitted_loss_falls_with_parameters_and_tokens_towards_e():
    fit = cost.HOFFMANN_FIT
    assert cost.fitted_loss(fit, 1e9, 1e11) > cost.fitted_loss(fit, 1e10, 1e11)
    assert cost.fitted_loss(fit, 1e10, 1e11) > cost.fitted_loss(fit, 1e10, 1e12)
    assert cost.fitted_loss(fit, 1e40, 1e40) == pytest.approx(fit.e, abs=1e-6)
    print(f"loss of a 70B model on 1.4T tokens: "
          f"{cost.fitted_loss(fit, 70e9, 1.4e12):.3f} (E = {fit.e})")


def test_a_budget_buys_gpu_hours_flops_a_model_and_days():
    run = cost.compute_optimal_run(1e6, 4.0, 256, "H100", 0.4)
    hours = 1e6 / 4.0
    assert run.compute_flops == pytest.approx(hours * 3600 * hardware.peak_flops("H100") * 0.4)
    assert run.days == pytest.approx(hours / 256 / 24)
    assert run.allocation == cost.compute_optimal_by_ratio(run.compute_flops)
    assert cost.gpu_hours(run.compute_flops, "H100", 0.4) == pytest.approx(hours)
    print(f"$1M at $4/GPU-hour on 256 H100s: N = {run.allocation.n_params:.3g}, "
          f"D = {run.allocation.n_tokens:.3g}, {run.days:.1f} days")


@pytest.mark.parametrize("call, message", [
    (lambda: cost.compute_optimal_run(1e6, 4.0, 256, "H100", 1.5), "mfu must be at most 1"),
    (lambda: cost.compute_optimal_run(-1.0, 4.0, 256, "H100", 0.4), "budget_usd"),
    (lambda: cost.compute_optimal_run(1e6, 4.0, 0, "H100", 0.4), "n_gpus"),
    (lambda: cost.cluster_tco("DGX H900", 8), "Known"),
    (lambda: cost.Ownership(server_price_usd=0.0), "server_price_usd"),
    (lambda: cost.Ownership(pue=0.9), "pue must be >= 1"),
    (lambda: cost.break_even_utilization(2.0, 0.0), "rented_usd_per_gpu_hour"),
    (lambda: cost.compute_optimal_by_ratio(1e23, tokens_per_param=-20), "tokens_per_param"),
])
def test_bad_input_is_refused_with_a_message_that_names_it(call, message):
    with pytest.raises(ValueError, match=message):
        call()
    print(f"refused: {message}")


def test_the_chapter_08c_key_agrees_with_the_values_the_chapter_computes():
    from clusterlab.course import grading, student

    chapter = ROOT / "chapters" / "08c-what-a-run-costs.md"
    answers = {"ch08c.1": ["ex_c8c_even_3y", "ex_c8c_even_6y"],
               "ch08c.2": ["ex_c8c_loss_rule", "ex_c8c_loss_fit", "ex_c8c_loss_7b"]}
    glued = student.glued_values(chapter, [n for names in answers.values() for n in names])
    key = grading.load_key(ROOT / "keys" / "ch08c.py")
    for exercise_id, names in answers.items():
        assert [float(glued[n]) for n in names] == pytest.approx(key[exercise_id].expected,
                                                                 rel=1e-9), exercise_id
    print(f"keys/ch08c.py agrees with the chapter's own {sum(map(len, answers.values()))} values")
