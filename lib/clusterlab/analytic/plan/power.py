"""Power: what a cluster draws from the facility, and what a power budget holds.

Facility power is IT power times the PUE (:func:`facility_power_w`); clusters come in whole
servers or racks of :mod:`clusterlab.catalog.hardware` at their catalogued full-load power.
"""

from __future__ import annotations

import math
from typing import Literal

from clusterlab._checks import count, positive
from clusterlab.catalog import hardware

#: Industry-average power usage effectiveness, flat near this value since about 2020 (Uptime
#: Institute, Global Data Center Survey 2023: 1.58) [uptime_pue2023].
PUE_INDUSTRY_AVERAGE = 1.58
#: A modern hyperscale fleet: Google's fleet-wide trailing twelve-month PUE, 1.10 [google_pue].
PUE_HYPERSCALE = 1.10


def facility_power_w(it_power_w: float, *, pue: float) -> float:
    """Power a data centre draws to run an IT load: ``it_power_w * pue``.

    The power usage effectiveness (PUE) is total facility power over IT power; the excess is
    cooling, power conversion and distribution, lighting.

    Args:
        it_power_w: power of the IT equipment (servers, switches, storage), in W (>= 0).
        pue: power usage effectiveness (>= 1; 1 would be a facility with no overhead at all).

    Returns:
        Facility power in W.

    Raises:
        ValueError: if the IT power is negative or the PUE is below 1 or not finite.

    References:
        The Green Grid, "PUE: a comprehensive examination of the metric", White Paper 49, 2012.
        Uptime Institute, Global Data Center Survey (industry average PUE 1.58 in 2023).
    """
    it_w = positive("it_power_w", it_power_w, allow_zero=True)
    ratio = positive("pue", pue)
    if ratio < 1.0:
        raise ValueError(f"pue must be >= 1 (total facility power over IT power), got {pue!r}.")
    return it_w * ratio


def cluster_power_w(system: hardware.Node | hardware.Rack | str, n_gpus: int, *, pue: float,
                    other_it_fraction: float = 0.0) -> float:
    """Facility power of a cluster of ``n_gpus`` GPUs built from whole servers or racks.

    ``ceil(n_gpus / g)`` units of ``g`` GPUs (8 per DGX server, 72 per NVL72 rack), each at its
    catalogued full-load power (:func:`clusterlab.catalog.hardware.power_per_gpu_w` per GPU), plus
    ``other_it_fraction`` of that for the IT the catalogue's figure leaves out (switches,
    storage, management), times the PUE.

    Args:
        system: a server or rack of :mod:`clusterlab.catalog.hardware` or its name ("DGX H100",
            "GB200 NVL72").
        n_gpus: GPUs in the cluster (integer >= 1), rounded up to whole units.
        pue: the facility's power usage effectiveness (>= 1).
        other_it_fraction: IT power outside the servers or racks, as a fraction of theirs (>= 0).

    Returns:
        Facility power in W.

    Raises:
        ValueError: if the system is unknown or has no power figure, or an argument is out of
            range.

    References:
        NVIDIA DGX H100 datasheet (10.2 kW per server); NVIDIA DGX SuperPOD GB200 reference
        architecture (1.2 MW per scalable unit of 8 racks).
    """
    per_unit = hardware.nvlink_domain_gpus(system)
    gpus = per_unit * math.ceil(count("n_gpus", n_gpus) / per_unit)
    extra = positive("other_it_fraction", other_it_fraction, allow_zero=True)
    return facility_power_w(gpus * hardware.power_per_gpu_w(system) * (1.0 + extra), pue=pue)


def gpus_within_power(system: hardware.Node | hardware.Rack | str, facility_budget_w: float, *,
                      pue: float, other_it_fraction: float = 0.0) -> int:
    """The most GPUs, in whole servers or racks, whose facility power fits a power budget.

    The inverse of :func:`cluster_power_w`: ``floor(budget / (unit power * (1 + other) * PUE))``
    units of ``g`` GPUs.

    Args:
        system: a server or rack of :mod:`clusterlab.catalog.hardware` or its name.
        facility_budget_w: power the site can deliver to the cluster, in W (>= 0).
        pue: the facility's power usage effectiveness (>= 1).
        other_it_fraction: IT power outside the servers or racks, as a fraction of theirs (>= 0).

    Returns:
        The number of GPUs (a multiple of the unit's GPU count; 0 if not one unit fits).

    Raises:
        ValueError: as :func:`cluster_power_w`, or on a negative budget.
    """
    budget = positive("facility_budget_w", facility_budget_w, allow_zero=True)
    per_unit = hardware.nvlink_domain_gpus(system)
    unit_w = cluster_power_w(system, per_unit, pue=pue, other_it_fraction=other_it_fraction)
    # A tiny relative slack so that an exact fit is not rounded down by floating point.
    return int(math.floor(budget / unit_w * (1 + 1e-12))) * per_unit


def peak_flops_per_facility_w(system: hardware.Node | hardware.Rack | str, *,
                              precision: Literal["bf16", "fp8"] = "bf16", pue: float,
                              other_it_fraction: float = 0.0) -> float:
    """Dense peak FLOP/s a server or rack design delivers per watt the facility draws.

    One GPU's dense peak at ``precision`` over its share of the facility's power: the system's
    power per GPU (:func:`clusterlab.catalog.hardware.power_per_gpu_w`), plus ``other_it_fraction``
    for IT outside it, times the PUE. Within a fixed power envelope this, not the GPU count, sets
    the compute a site can hold.

    Args:
        system: a server or rack of :mod:`clusterlab.catalog.hardware` or its name.
        precision: ``"bf16"`` or ``"fp8"`` (see :func:`clusterlab.catalog.hardware.peak_flops`).
        pue: the facility's power usage effectiveness (>= 1).
        other_it_fraction: IT power outside the servers or racks, as a fraction of theirs (>= 0).

    Returns:
        FLOP/s per facility watt (multiply by 1e6 / 1e15 for PFLOP/s per MW).

    Raises:
        ValueError: as :func:`cluster_power_w`, or for a precision the GPU lacks.
    """
    per_unit = hardware.nvlink_domain_gpus(system)        # also rejects unknown systems
    unit_w = cluster_power_w(system, per_unit, pue=pue, other_it_fraction=other_it_fraction)
    return per_unit * hardware.peak_flops(_system_gpu(system), precision=precision) / unit_w


def _system_gpu(system: hardware.Node | hardware.Rack | str) -> str:
    """The GPU name of a server or rack given as a spec or a (known) name."""
    if isinstance(system, (hardware.Node, hardware.Rack)):
        return system.gpu
    racks = {name.lower(): spec for name, spec in hardware.RACKS.items()}
    spec = racks.get(str(system).lower()) or hardware.node(system)
    return spec.gpu
