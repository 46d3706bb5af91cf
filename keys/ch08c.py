"""Answer key of chapter 08c's exercises (instructor-only: student copies leave keys/ out).

Each expected value is computed here as the chapter's solution computes it, with the defaults of
``cost.Ownership``, the late-2024 reserved H100 price and chapter 08's 7B job.
"""

from dataclasses import replace

from clusterlab.analytic import cost, flops
from clusterlab.course import grading

RESERVED = cost.RENTED_PRICES["AWS p5 capacity block"]


def _break_even(years: float) -> float:
    owned = cost.owned_cost_per_gpu_hour("DGX H100", replace(cost.Ownership(), life_years=years))
    return cost.break_even_utilization(owned.total_usd, RESERVED.usd_per_gpu_hour)


def _flat_loss() -> tuple[float, float, float]:
    compute = flops.training_flops(7e9, 2e12)
    rule = cost.compute_optimal_by_ratio(compute)
    best = cost.compute_optimal_by_fit(compute)
    losses = [cost.fitted_loss(cost.HOFFMANN_FIT, a.n_params, a.n_tokens) for a in (rule, best)]
    return (*losses, cost.fitted_loss(cost.HOFFMANN_FIT, 7e9, 2e12))


KEY = {
    "ch08c.1": grading.close(
        (_break_even(3.0), _break_even(6.0)), rtol=1e-3,
        name="(break-even utilization with a 3-year life, with a 6-year life, as fractions)",
        hint="Replace life_years in cost.Ownership(), price the owned GPU-hour, and divide it "
             "by the reserved price per GPU-hour; a fraction, not a percentage."),
    "ch08c.2": grading.close(
        _flat_loss(), rtol=1e-4,
        name="(fitted loss of the 20-token rule's model, of the fitted optimum, of the 7B "
             "model)",
        hint="The compute is 6 x 7e9 x 2e12 FLOPs; split it with compute_optimal_by_ratio and "
             "compute_optimal_by_fit, then evaluate cost.fitted_loss with HOFFMANN_FIT."),
}
