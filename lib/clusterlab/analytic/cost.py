"""What training costs: the price of a GPU-hour, a cluster's total cost of ownership (TCO), and
compute-optimal sizing of a model's parameters ``N`` and training tokens ``D``.

**A GPU-hour.** Rented, it is a provider's list price (:data:`RENTED_PRICES`, each with where and
when it was listed). Owned, it is the cluster's TCO over its life divided by its GPU-hours
(:func:`owned_cost_per_gpu_hour`): the purchase (capex) spread over the life, the facility's
energy (IT power times the PUE times the price of a kWh), and operations. The course found no
public list price for a DGX H100 server, so :class:`Ownership` holds the purchase as an *assumed*
price, a parameter the reader moves; its other defaults say which are assumed and which are cited.

**Compute-optimal sizing.** Training costs ``C = 6ND`` FLOPs (:func:`clusterlab.analytic.flops.
training_flops`). For a fixed ``C``, Hoffmann et al. (2022, "Chinchilla") found the loss lowest
near 20 tokens per parameter (:func:`compute_optimal_by_ratio`, checked against their Table 3,
:data:`HOFFMANN_TABLE3`). Their fitted loss ``L(N, D) = E + A/N^alpha + B/D^beta`` gives its own
optimum (:func:`compute_optimal_by_fit`), which puts fewer parameters on large budgets than their
other two methods; Besiroglu et al. (2024) traced that to the fit itself.

Money in US dollars (``_usd``), power in W, energy prices per kWh, times in hours (``_hours``)
or days (``_days``) as named.

References:
    Hoffmann et al., "Training Compute-Optimal Large Language Models", NeurIPS 2022, Table 3 and
    Eq. 10. https://arxiv.org/abs/2203.15556
    Besiroglu et al., "Chinchilla Scaling: A replication attempt", 2024.
    https://arxiv.org/abs/2404.10102
    The Green Grid, "PUE: a comprehensive examination of the metric", White Paper 49, 2012.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clusterlab._checks import count, positive
from clusterlab.analytic import flops
from clusterlab.analytic.plan.power import PUE_INDUSTRY_AVERAGE, cluster_power_w
from clusterlab.catalog import hardware

__all__ = ["HOURS_PER_YEAR", "CHINCHILLA_TOKENS_PER_PARAM", "USD_PER_KWH_VIRGINIA_2023",
           "RentedPrice", "RENTED_PRICES", "Ownership", "CostOfOwnership", "cluster_tco",
           "owned_cost_per_gpu_hour", "break_even_utilization", "gpu_hours",
           "Allocation", "compute_optimal_by_ratio", "ScalingFit", "HOFFMANN_FIT",
           "HOFFMANN_TABLE3", "fitted_loss", "compute_optimal_by_fit", "BudgetRun",
           "compute_optimal_run"]

#: Hours in a year of 365.25 days.
HOURS_PER_YEAR = 365.25 * 24

#: Training tokens per parameter at the compute-optimal point: Chinchilla, 70B parameters on
#: 1.4T tokens; Hoffmann et al. 2022, Table 3, gives 20 to 22.4 over 400M to 10T parameters.
CHINCHILLA_TOKENS_PER_PARAM = 20.0

#: Average price of electricity to industrial customers in Virginia in 2023, 8.92 US cents per
#: kWh (EIA, Electric Power Annual with data for 2023, released 17 October 2024, average revenue
#: per kWh by state) [eia_electric_power_annual_2023].
USD_PER_KWH_VIRGINIA_2023 = 0.0892


@dataclass(frozen=True)
class RentedPrice:
    """A public list price to rent GPUs: per GPU-hour, with when and where it was listed."""

    name: str
    usd_per_gpu_hour: float
    listed: str      # when the price was listed
    source: str      # key in references.bib


#: Two list prices of the same eight-H100 instance (AWS p5.48xlarge, US East), a year apart.
RENTED_PRICES: dict[str, RentedPrice] = {
    price.name: price for price in (
        # $98.32 per instance-hour on demand at launch, for 8 H100s [nextplatform_p5_2023].
        RentedPrice("AWS p5 on demand", 98.32 / 8, "July 2023", "nextplatform_p5_2023"),
        # $39.33 per instance-hour, $4.916 per accelerator-hour, reserved ahead as an EC2
        # Capacity Block; the page said its rates would next change on 1 January 2025
        # [aws_capacity_blocks_pricing].
        RentedPrice("AWS p5 capacity block", 4.916, "late 2024", "aws_capacity_blocks_pricing"),
    )
}


@dataclass(frozen=True)
class Ownership:
    """What owning a cluster costs, per server of ``system``. The defaults mark their sources.

    Attributes:
        server_price_usd: purchase price of one server (an assumed price: the course found no
            public list price).
        infrastructure_fraction: network, storage and installation, as a fraction of the servers'
            price (assumed).
        life_years: years over which the purchase is spread (assumed).
        operations_fraction_per_year: staff, support contracts and floor space per year, as a
            fraction of the purchase (assumed).
        usd_per_kwh: price of electricity (default: Virginia's 2023 industrial average, cited).
        pue: the facility's power usage effectiveness (default: the industry average, cited in
            :mod:`clusterlab.analytic.plan.power`).
        other_it_fraction: switches, storage and management beside the servers, as a fraction of
            their power (assumed, as chapter 08 assumes it).
    """

    server_price_usd: float = 300_000.0
    infrastructure_fraction: float = 0.2
    life_years: float = 4.0
    operations_fraction_per_year: float = 0.1
    usd_per_kwh: float = USD_PER_KWH_VIRGINIA_2023
    pue: float = PUE_INDUSTRY_AVERAGE
    other_it_fraction: float = 0.1

    def __post_init__(self) -> None:
        for name in ("server_price_usd", "life_years", "usd_per_kwh"):
            positive(name, getattr(self, name))
        for name in ("infrastructure_fraction", "operations_fraction_per_year",
                     "other_it_fraction"):
            positive(name, getattr(self, name), allow_zero=True)
        if not positive("pue", self.pue) >= 1.0:
            raise ValueError(f"pue must be >= 1 (total facility power over IT power), "
                             f"got {self.pue!r}.")


@dataclass(frozen=True)
class CostOfOwnership:
    """A cluster's cost over a number of years, in its three parts (US dollars)."""

    capex_usd: float          # servers plus infrastructure, bought once
    energy_usd: float         # facility energy at full load
    operations_usd: float     # staff, support and space over the years

    @property
    def total_usd(self) -> float:
        return self.capex_usd + self.energy_usd + self.operations_usd


def cluster_tco(system: str, n_gpus: int, ownership: Ownership = Ownership(), *,
                years: float | None = None) -> CostOfOwnership:
    """Total cost of owning ``n_gpus`` GPUs in whole servers of ``system`` for some years.

    capex = servers x price x (1 + infrastructure); energy = facility power (the servers at their
    catalogued full-load power, plus other IT, times the PUE; :func:`clusterlab.analytic.plan.
    power.cluster_power_w`) x hours x price per kWh; operations = capex x fraction per year x
    years. Full-load power every hour is an upper bound: an idle GPU draws less.

    Args:
        system: a server of :mod:`clusterlab.catalog.hardware` with a price in ``ownership``
            ("DGX H100").
        n_gpus: GPUs (integer >= 1), rounded up to whole servers.
        ownership: prices and assumptions (:class:`Ownership`).
        years: how long it is owned (> 0); default its ``life_years``, which amortises the
            purchase fully.

    Returns:
        The :class:`CostOfOwnership`.

    Raises:
        ValueError: for an unknown server, a GPU count below 1 or years that are not positive.
    """
    per_server = hardware.node(system).gpus_per_node
    servers = math.ceil(count("n_gpus", n_gpus) / per_server)
    held_years = ownership.life_years if years is None else positive("years", years)
    capex = servers * ownership.server_price_usd * (1.0 + ownership.infrastructure_fraction)
    facility_w = cluster_power_w(system, servers * per_server, pue=ownership.pue,
                                 other_it_fraction=ownership.other_it_fraction)
    energy = facility_w / 1e3 * held_years * HOURS_PER_YEAR * ownership.usd_per_kwh
    operations = capex * ownership.operations_fraction_per_year * held_years
    return CostOfOwnership(capex, energy, operations)


def owned_cost_per_gpu_hour(system: str, ownership: Ownership = Ownership()) -> CostOfOwnership:
    """One GPU-hour of an owned server, in the three parts of its TCO over its life.

    One server's :func:`cluster_tco` over ``ownership.life_years``, divided by its GPUs and the
    hours of that life. Every hour is counted, busy or idle: divide by the utilization for the
    price of a GPU-hour actually used.

    Args:
        system: a server of :mod:`clusterlab.catalog.hardware` ("DGX H100").
        ownership: prices and assumptions (:class:`Ownership`).

    Returns:
        A :class:`CostOfOwnership` whose parts are US dollars per GPU-hour.
    """
    per_server = hardware.node(system).gpus_per_node
    life = cluster_tco(system, per_server, ownership)
    hours = per_server * ownership.life_years * HOURS_PER_YEAR
    return CostOfOwnership(life.capex_usd / hours, life.energy_usd / hours,
                           life.operations_usd / hours)


def break_even_utilization(owned_usd_per_gpu_hour: float, rented_usd_per_gpu_hour: float) -> float:
    """The utilization above which owning costs less per used GPU-hour than renting.

    An owned GPU is paid for every hour; a rented one only while it is used. Owning wins when
    ``owned / utilization < rented``, that is above ``owned / rented``.

    Args:
        owned_usd_per_gpu_hour: an owned GPU-hour, busy or idle (> 0).
        rented_usd_per_gpu_hour: a rented GPU-hour (> 0).

    Returns:
        ``owned / rented``; a value above 1 means renting is cheaper at any utilization.
    """
    return (positive("owned_usd_per_gpu_hour", owned_usd_per_gpu_hour)
            / positive("rented_usd_per_gpu_hour", rented_usd_per_gpu_hour))


def gpu_hours(total_flops: float, gpu: str, mfu: float) -> float:
    """GPU-hours to do ``total_flops`` on GPUs of one kind running at an MFU (dense BF16 peak).

    Args:
        total_flops: the run's model FLOPs (> 0).
        gpu: a GPU of :mod:`clusterlab.catalog.hardware` ("H100").
        mfu: model FLOPs utilization, in (0, 1].

    Returns:
        ``total_flops / (peak x mfu) / 3600``.
    """
    return flops.time_to_train_s(total_flops, 1, hardware.peak_flops(gpu), mfu) / 3600.0


@dataclass(frozen=True)
class Allocation:
    """A model size and a token count that together spend ``6 N D`` FLOPs."""

    n_params: float
    n_tokens: float

    @property
    def tokens_per_param(self) -> float:
        return self.n_tokens / self.n_params

    @property
    def compute_flops(self) -> float:
        return flops.training_flops(self.n_params, self.n_tokens)


def compute_optimal_by_ratio(compute_flops: float, *,
                             tokens_per_param: float = CHINCHILLA_TOKENS_PER_PARAM) -> Allocation:
    """The compute-optimal ``N`` and ``D`` by a fixed ratio ``r = D / N`` (Chinchilla's ~20).

    From ``C = 6 N D`` and ``D = r N``: ``N = sqrt(C / (6 r))``, ``D = r N``.

    Args:
        compute_flops: the training budget ``C`` in FLOPs (> 0).
        tokens_per_param: ``r`` (> 0).

    Returns:
        The :class:`Allocation`.

    References:
        Hoffmann et al. 2022, Table 3 (20 to 22.4 tokens per parameter).
    """
    budget = positive("compute_flops", compute_flops)
    ratio = positive("tokens_per_param", tokens_per_param)
    n_params = math.sqrt(budget / (6.0 * ratio))
    return Allocation(n_params, ratio * n_params)


@dataclass(frozen=True)
class ScalingFit:
    """A fitted loss ``L(N, D) = E + A / N**alpha + B / D**beta`` (nats per token)."""

    e: float
    a: float
    b: float
    alpha: float
    beta: float
    source: str      # key in references.bib


#: Hoffmann et al. 2022, Eq. 10 (their Approach 3), as printed in the paper.
HOFFMANN_FIT = ScalingFit(e=1.69, a=406.4, b=410.7, alpha=0.34, beta=0.28, source="hoffmann2022")

#: Hoffmann et al. 2022, Table 3 (Approach 1): (parameters, training FLOPs, training tokens).
HOFFMANN_TABLE3: tuple[tuple[float, float, float], ...] = (
    (400e6, 1.92e19, 8.0e9),
    (1e9, 1.21e20, 20.2e9),
    (10e9, 1.23e22, 205.1e9),
    (67e9, 5.76e23, 1.5e12),
    (175e9, 3.85e24, 3.7e12),
    (280e9, 9.90e24, 5.9e12),
    (520e9, 3.43e25, 11.0e12),
    (1e12, 1.27e26, 21.2e12),
    (10e12, 1.30e28, 216.2e12),
)


def fitted_loss(fit: ScalingFit, n_params: float, n_tokens: float) -> float:
    """The loss a fitted scaling law predicts for ``N`` parameters trained on ``D`` tokens.

    Args:
        fit: a :class:`ScalingFit` (:data:`HOFFMANN_FIT`).
        n_params: ``N`` (> 0).
        n_tokens: ``D`` (> 0).

    Returns:
        ``E + A / N**alpha + B / D**beta``.
    """
    return (fit.e + fit.a / positive("n_params", n_params) ** fit.alpha
            + fit.b / positive("n_tokens", n_tokens) ** fit.beta)


def compute_optimal_by_fit(compute_flops: float, fit: ScalingFit = HOFFMANN_FIT) -> Allocation:
    """The ``N`` and ``D`` that minimise a fitted loss at ``C = 6 N D`` FLOPs.

    Setting the derivative along ``D = C / (6N)`` to zero gives ``N = G (C/6)**(beta/(alpha+beta))``
    with ``G = (alpha A / (beta B))**(1/(alpha+beta))``, and ``D = (C/6) / N``.

    Args:
        compute_flops: the training budget ``C`` in FLOPs (> 0).
        fit: a :class:`ScalingFit`.

    Returns:
        The :class:`Allocation`.

    References:
        Hoffmann et al. 2022, Eq. 4 and Appendix D.2.
    """
    flops_over_6 = positive("compute_flops", compute_flops) / 6.0
    exponent_sum = fit.alpha + fit.beta
    g = (fit.alpha * fit.a / (fit.beta * fit.b)) ** (1.0 / exponent_sum)
    n_params = g * flops_over_6 ** (fit.beta / exponent_sum)
    return Allocation(n_params, flops_over_6 / n_params)


@dataclass(frozen=True)
class BudgetRun:
    """What a budget in dollars buys on a cluster: the compute, the model, and the days."""

    compute_flops: float
    allocation: Allocation
    days: float


def compute_optimal_run(budget_usd: float, usd_per_gpu_hour: float, n_gpus: int, gpu: str,
                        mfu: float, *,
                        tokens_per_param: float = CHINCHILLA_TOKENS_PER_PARAM) -> BudgetRun:
    """Spend a budget on a cluster: the FLOPs it buys, the compute-optimal ``N`` and ``D``, and
    how many days ``n_gpus`` take.

    GPU-hours = budget / price; FLOPs = GPU-hours x 3600 x peak x MFU (dense BF16 peak of the
    catalog); ``N`` and ``D`` by :func:`compute_optimal_by_ratio`; days = GPU-hours / n_gpus / 24.
    Attention's FLOPs beyond ``6N`` are left out, as Chinchilla's ``C = 6ND`` leaves them out.

    Args:
        budget_usd: money for GPU-hours (> 0).
        usd_per_gpu_hour: price of one GPU-hour actually used (> 0).
        n_gpus: GPUs running the job (integer >= 1).
        gpu: a GPU of :mod:`clusterlab.catalog.hardware` ("H100").
        mfu: model FLOPs utilization, in (0, 1].
        tokens_per_param: ``D / N`` (> 0).

    Returns:
        The :class:`BudgetRun`.
    """
    hours = positive("budget_usd", budget_usd) / positive("usd_per_gpu_hour", usd_per_gpu_hour)
    compute = hours * 3600.0 * hardware.peak_flops(gpu) * positive("mfu", mfu)
    if mfu > 1.0:
        raise ValueError(f"mfu must be at most 1 (a fraction of the peak), got {mfu!r}.")
    allocation = compute_optimal_by_ratio(compute, tokens_per_param=tokens_per_param)
    return BudgetRun(compute, allocation, hours / count("n_gpus", n_gpus) / 24.0)
