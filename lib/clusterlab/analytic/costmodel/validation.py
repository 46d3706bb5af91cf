"""The NCCL model held against published nccl-tests rows, by regime, and the band it sets.

:func:`nccl_validation_table` prices every published row
(:mod:`clusterlab.catalog.published.nccl_tests`) with the model of
:mod:`clusterlab.analytic.costmodel._model`; :func:`validation_by_regime` summarises the errors per
regime (nodes, fabric, op family, size class); :func:`with_band` turns a regime's errors into the
band of a healthy measurement that :func:`clusterlab.analytic.costmodel.cluster_collective` reports.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from clusterlab.analytic.costmodel import _model
from clusterlab.analytic.costmodel._model import CollectiveEstimate, Regime
from clusterlab.analytic.costmodel.alpha_beta import busbw_factor
from clusterlab.catalog import hardware
from clusterlab.catalog.published import nccl_tests

#: A healthy run's margin below the band that the model's validated error sets (run to run
#: noise of one nccl-tests measurement).
BAND_MARGIN = 0.05
#: Fewer test rows than this in a regime, and the rows set no band (and validate nothing).
MIN_VALIDATION_ROWS = 3
#: A regime is validated when the median |error| of its test rows is at most this; a regime
#: with rows but a larger error is only "tested".
TOLERANCE = 0.15
#: The band used where a regime has too few rows to set one: a healthy run lies above
#: ``(1 - UNVALIDATED_BAND) * expected``.
UNVALIDATED_BAND = 0.5
#: How far published rows back an estimate, best first (:attr:`CollectiveEstimate.validation`):
#: "validated": at least ``MIN_VALIDATION_ROWS`` test rows in its regime, median |error| at most
#: ``TOLERANCE``, and its node count inside theirs; "tested": rows, but too few or a larger
#: error; "extrapolated": a regime with rows, at a node count beyond them (or more GPUs per
#: node than any of them); "untested": no rows.
VALIDATION_LEVELS = ("validated", "tested", "extrapolated", "untested")


def is_validated(errors: Sequence[float]) -> bool:
    """The course's rule for any group of test errors, ``(model - published) / published``:
    validated with at least ``MIN_VALIDATION_ROWS`` of them and a median |error| within
    ``TOLERANCE``."""
    return _within_tolerance(len(errors), float(np.median(np.abs(errors))) if errors else 0.0)


def _within_tolerance(rows: int, median_abs: float) -> bool:
    return rows >= MIN_VALIDATION_ROWS and median_abs <= TOLERANCE


def smallest_caught_loss(errors: Sequence[float]) -> float:
    """The smallest loss of bandwidth that the band of a regime with these errors always flags.

    A healthy run lies at ``expected / (1 + e)`` for some ``e`` between the regime's lowest and
    highest error; the floor is ``expected / (1 + highest) * (1 - BAND_MARGIN)``. A run that
    lost a fraction ``L`` falls below the floor, whichever ``e`` it had, when
    ``(1 - L) / (1 + lowest) < (1 - BAND_MARGIN) / (1 + highest)``.

    Args:
        errors: the regime's errors, ``(model - published) / published``.

    Returns:
        ``1 - (1 - BAND_MARGIN) (1 + lowest) / (1 + highest)``, a fraction in [0, 1).
    """
    if not errors:
        raise ValueError("A regime without rows has no band; give at least one error.")
    return 1 - (1 - BAND_MARGIN) * (1 + min(errors)) / (1 + max(errors))


def with_band(estimate: CollectiveEstimate, where: Regime,
              view: hardware.ClusterSpec) -> CollectiveEstimate:
    """The estimate with its regime, its validation level and the band the regime's rows set.

    Args:
        estimate: the model's estimate.
        where: its regime.
        view: its cluster as NCCL counts nodes (one per NVLink domain,
            :func:`~clusterlab.analytic.costmodel._model.nccl_nodes`), to compare with the
            node counts and node sizes of the regime's rows.
    """
    summary = regime_summaries().get(where)
    errors = regime_errors().get(where, ())
    if len(errors) >= MIN_VALIDATION_ROWS:
        low = estimate.busbw / (1 + max(errors)) * (1 - BAND_MARGIN)
    else:
        low = estimate.busbw * (1 - UNVALIDATED_BAND)
    level = ("untested" if summary is None
             else summary.level_at(view.n_nodes, view.gpus_per_node))
    return replace(estimate, low_busbw=low, regime=where, validation=level)




@dataclass(frozen=True)
class ValidationRow:
    """One published measurement beside the model (:func:`nccl_validation_table`)."""

    system: str
    op: str
    size_bytes: int
    published_gbps: float
    model_gbps: float
    model_algorithm: str
    role: str
    source: str
    regime: Regime
    provenance: str
    nccl_version: str | None
    published_algorithm: str
    nccl_nodes: int
    nccl_gpus_per_node: int

    @property
    def error(self) -> float:
        """``(model - published) / published``; +0.1: the model expects 10% more busbw."""
        return (self.model_gbps - self.published_gbps) / self.published_gbps


def _row_cluster(row: nccl_tests.PublishedRow) -> hardware.ClusterSpec:
    """The cluster a published row was measured on."""
    return hardware.ClusterSpec(gpu=row.gpu, n_nodes=row.n_nodes,
                                gpus_per_node=row.gpus_per_node, nic=row.nic,
                                nics_per_node=row.nics_per_node or None,
                                intra_node_bytes_per_s=row.intra_node_link_bytes_per_s,
                                nvlink_domain_gpus=row.nvlink_domain_gpus)


def _model_row(row: nccl_tests.PublishedRow) -> ValidationRow:
    cluster = _row_cluster(row)
    view = _model.nccl_nodes(cluster)
    estimate = _model.estimate(row.op, row.size_bytes, cluster, algorithm=row.algorithm)
    return ValidationRow(system=row.system, op=row.op, size_bytes=row.size_bytes,
                         published_gbps=row.busbw_gbps, model_gbps=estimate.busbw / 1e9,
                         model_algorithm=estimate.algorithm, role=row.role, source=row.source,
                         regime=_model.cluster_regime(estimate, cluster, row.fabric),
                         provenance=row.provenance, nccl_version=row.nccl_version,
                         published_algorithm=row.algorithm,
                         nccl_nodes=view.n_nodes, nccl_gpus_per_node=view.gpus_per_node)


def nccl_validation_table(role: str | None = "test") -> list[ValidationRow]:
    """The model beside every published nccl-tests row (of one role, by default the tests).

    Args:
        role: ``"test"`` (rows nothing was fitted to), ``"set"`` (the rows that set
            ``LAUNCH_OVERHEAD_S`` and ``PIPELINE_FILL_CHUNKS``), ``"unhealthy"`` (logs of
            systems their threads call broken) or None (all healthy rows).

    Returns:
        One :class:`ValidationRow` per published row, in the order of
        :data:`clusterlab.catalog.published.nccl_tests.ROWS`.
    """
    return [_model_row(row) for row in nccl_tests.rows(role)]


@dataclass(frozen=True)
class RegimeError:
    """The model's error over the test rows of one :class:`Regime`."""

    regime: Regime
    rows: int
    median_abs: float        # median |error|
    lowest: float            # most negative error (the model under-predicts)
    highest: float           # most positive error (the model over-predicts)
    sources: int             # distinct sources (URLs) among the rows
    fewest_nodes: int        # the rows' node counts, as NCCL counts nodes (one per NVLink
    most_nodes: int          # domain): beyond them an estimate is extrapolated
    most_gpus_per_node: int  # the largest node (NVLink domain) among the rows

    @property
    def validated(self) -> bool:
        """At least ``MIN_VALIDATION_ROWS`` rows and a median |error| within ``TOLERANCE``."""
        return _within_tolerance(self.rows, self.median_abs)

    def level_at(self, nccl_nodes: int, gpus_per_node: int) -> str:
        """The validation level (:data:`VALIDATION_LEVELS`) of an estimate in this regime on
        ``nccl_nodes`` nodes (NVLink domains) of ``gpus_per_node`` GPUs."""
        if (not self.fewest_nodes <= nccl_nodes <= self.most_nodes
                or gpus_per_node > self.most_gpus_per_node):
            return "extrapolated"
        return "validated" if self.validated else "tested"

    def row_span(self) -> str:
        """Where the rows were measured, as NCCL counts nodes: ``"4-12 nodes of up to 8 GPUs"``."""
        nodes = (f"{self.fewest_nodes}" if self.fewest_nodes == self.most_nodes
                 else f"{self.fewest_nodes}-{self.most_nodes}")
        return (f"{nodes} node{'s' * (self.most_nodes > 1)} of up to {self.most_gpus_per_node} "
                "GPUs")

    def verdict(self) -> str:
        """The regime's validation in words: ``"validated: median 2.4%, -28.8% to +5.6%"`` or
        ``"tested: off by -52.6% to +26.0%"`` (a median, and with few rows, a row count)."""
        spread = f"{100 * self.lowest:+.1f}% to {100 * self.highest:+.1f}%"
        if self.validated:
            return f"validated: median {100 * self.median_abs:.1f}%, {spread}"
        few = f", {self.rows} row{'s' * (self.rows > 1)}" if self.rows < MIN_VALIDATION_ROWS else ""
        return f"tested: off by {spread} (median {100 * self.median_abs:.1f}%{few})"


def validation_by_regime(rows: Sequence[ValidationRow] | None = None) -> list[RegimeError]:
    """The model's error per regime (nodes, fabric, op family, size class) over test rows.

    Rows forced to an algorithm NCCL would not pick still count: they test that algorithm's
    price. Rows that set a parameter (``role="set"``) are left out: their error proves nothing.
    """
    rows = nccl_validation_table("test") if rows is None else [r for r in rows if r.role == "test"]
    groups: dict[Regime, list[ValidationRow]] = {}
    for r in rows:
        groups.setdefault(r.regime, []).append(r)
    out = []
    for where in sorted(groups, key=str):
        errors = [r.error for r in groups[where]]
        nodes = [r.nccl_nodes for r in groups[where]]
        out.append(RegimeError(regime=where, rows=len(errors),
                               median_abs=float(np.median(np.abs(errors))), lowest=min(errors),
                               highest=max(errors),
                               sources=len({r.source.split(" ")[0] for r in groups[where]}),
                               fewest_nodes=min(nodes), most_nodes=max(nodes),
                               most_gpus_per_node=max(r.nccl_gpus_per_node
                                                      for r in groups[where])))
    return out


@functools.lru_cache(maxsize=1)
def _regime_errors(launch_overhead_s: float,
                   fill_chunks: float) -> dict[Regime, tuple[float, ...]]:
    return {e.regime: tuple(r.error for r in nccl_validation_table("test") if r.regime == e.regime)
            for e in validation_by_regime()}


def regime_errors() -> dict[Regime, tuple[float, ...]]:
    """Each regime's errors over its test rows (cached; the band of :func:`cluster_collective`)."""
    return _regime_errors(_model.LAUNCH_OVERHEAD_S, _model.PIPELINE_FILL_CHUNKS)


@functools.lru_cache(maxsize=1)
def _regime_summaries(launch_overhead_s: float,
                      fill_chunks: float) -> dict[Regime, RegimeError]:
    return {e.regime: e for e in validation_by_regime()}


def regime_summaries() -> dict[Regime, RegimeError]:
    """Each regime's :class:`RegimeError` over its test rows (cached)."""
    return _regime_summaries(_model.LAUNCH_OVERHEAD_S, _model.PIPELINE_FILL_CHUNKS)


def format_regime_errors(errors: Sequence[RegimeError]) -> str:
    """A fixed-width table of :func:`validation_by_regime`."""
    lines = [f"{'regime':<58} {'rows':>4} {'sources':>7} {'median':>7} {'range':>15}  level"]
    for e in errors:
        range_ = f"{100 * e.lowest:+.1f}..{100 * e.highest:+.1f}%"
        lines.append(f"{str(e.regime):<58} {e.rows:4d} {e.sources:7d} "
                     f"{100 * e.median_abs:6.1f}% {range_:>15}  "
                     f"{'validated' if e.validated else 'tested'}")
    return "\n".join(lines)


def format_validation_table(rows: Sequence[ValidationRow]) -> str:
    """A fixed-width table of :func:`nccl_validation_table` rows: system, op, size, published and
    model busbw (GB/s), the algorithm the model picks, and the error."""
    lines = [f"{'system':<52} {'op':<14} {'size':>9} {'published':>9} {'model':>8} "
             f"{'algorithm':>9} {'error':>7}"]
    for r in rows:
        size = (f"{r.size_bytes / 2**30:g} GiB" if r.size_bytes >= 2**30
                else f"{r.size_bytes / 2**20:g} MiB" if r.size_bytes >= 2**20
                else f"{r.size_bytes / 2**10:g} KiB")
        lines.append(f"{r.system[:52]:<52} {r.op:<14} {size:>9} {r.published_gbps:9.2f} "
                     f"{r.model_gbps:8.2f} {r.model_algorithm:>9} {100 * r.error:+6.1f}%")
    return "\n".join(lines)


def median_abs_error(rows: Sequence[ValidationRow], *, min_bytes: float = 0,
                     max_bytes: float = math.inf) -> float:
    """Median of ``|error|`` over the rows whose size lies in ``[min_bytes, max_bytes]``."""
    errors = [abs(r.error) for r in rows if min_bytes <= r.size_bytes <= max_bytes]
    if not errors:
        raise ValueError(f"No rows between {min_bytes} and {max_bytes} bytes.")
    return float(np.median(errors))


def _set_sweep_score(sweep: Sequence[nccl_tests.PublishedRow]) -> float:
    """Median ``|log(model / published)|`` over ``sweep`` with the module's constants as set."""
    return float(np.median([abs(math.log(_model_row(r).model_gbps / r.busbw_gbps))
                            for r in sweep]))


def fit_set_parameters(*, overhead_step_s: float = 0.5e-6, overhead_max_s: float = 40e-6,
                       fill_step: float = 0.25, fill_max: float = 6.0) -> tuple[float, float]:
    """Refit :data:`LAUNCH_OVERHEAD_S` and :data:`PIPELINE_FILL_CHUNKS` together on the
    ``role="set"`` sweep rows (<= 16 MiB), the only rows either is set from.

    Tries every pair on the grid (overheads from 0 to ``overhead_max_s``, fills from 0 to
    ``fill_max`` chunk-times) and keeps the pair with the smallest median
    ``|log(model / published)|`` over those rows (the first found on a tie).

    Returns:
        ``(launch_overhead_s, fill_chunks)``; the module constants are this pair.
    """
    sweep = [r for r in nccl_tests.rows("set") if r.size_bytes <= 16 * 2**20]
    saved = _model.LAUNCH_OVERHEAD_S, _model.PIPELINE_FILL_CHUNKS
    best_score, best = math.inf, (0.0, 0.0)
    try:
        for j in range(int(round(fill_max / fill_step)) + 1):
            for k in range(int(round(overhead_max_s / overhead_step_s)) + 1):
                # The model reads the constants at each call: set them, price the sweep.
                _model.LAUNCH_OVERHEAD_S = k * overhead_step_s
                _model.PIPELINE_FILL_CHUNKS = j * fill_step
                score = _set_sweep_score(sweep)
                if score < best_score - 1e-12:
                    best_score = score
                    best = (_model.LAUNCH_OVERHEAD_S, _model.PIPELINE_FILL_CHUNKS)
    finally:
        _model.LAUNCH_OVERHEAD_S, _model.PIPELINE_FILL_CHUNKS = saved
    return best


def fit_launch_overhead(step_s: float = 0.5e-6, max_s: float = 100e-6) -> float:
    """Refit :data:`LAUNCH_OVERHEAD_S` alone on the ``role="set"`` sweep rows (<= 16 MiB),
    with :data:`PIPELINE_FILL_CHUNKS` as it is set.

    Tries overheads from 0 to ``max_s`` in steps of ``step_s`` and keeps the one with the
    smallest median ``|log(model / published)|`` over those rows.

    Returns:
        The overhead in seconds (the module constant is this value, rounded to ``step_s``).
    """
    sweep = [r for r in nccl_tests.rows("set") if r.size_bytes <= 16 * 2**20]
    saved, best_score, best_s = _model.LAUNCH_OVERHEAD_S, math.inf, 0.0
    try:
        for k in range(int(round(max_s / step_s)) + 1):
            # The model reads the constant at each call: set it, price the sweep.
            _model.LAUNCH_OVERHEAD_S = k * step_s
            score = _set_sweep_score(sweep)
            if score < best_score - 1e-12:
                best_score, best_s = score, _model.LAUNCH_OVERHEAD_S
    finally:
        _model.LAUNCH_OVERHEAD_S = saved
    return best_s


# --- Published rows that disagree with each other ----------------------------------------------

@dataclass(frozen=True)
class Disagreement:
    """Two published rows that cannot both be a healthy run of the same collective.

    ``kind`` is ``"sweep"``: in one sweep (same system, source, op) a buffer ``second`` at
    least twice as large as ``first`` took no longer, which no collective does (its time is a
    latency plus a term that grows with the bytes); or ``"sources"``: the same configuration
    and size from two systems or sources, busbw ``ratio`` apart.
    """

    kind: str
    first: nccl_tests.PublishedRow
    second: nccl_tests.PublishedRow
    first_s: float           # published time of ``first`` (s)
    second_s: float          # published time of ``second`` (s)
    ratio: float             # busbw of the faster over the slower row


def published_time_s(row: nccl_tests.PublishedRow) -> float:
    """The time a published row implies: ``size x busbw_factor / busbw`` (nccl-tests' columns)."""
    return row.size_bytes * busbw_factor(row.op, row.n_nodes * row.gpus_per_node) / (
        row.busbw_gbps * 1e9)


def _config(row: nccl_tests.PublishedRow) -> tuple:
    return (row.op, row.gpu, row.n_nodes, row.gpus_per_node, row.nic, row.nics_per_node,
            row.algorithm, row.intra_node_link_bytes_per_s)


def disagreements(rows: Sequence[nccl_tests.PublishedRow] | None = None, *,
                  min_bytes: float = 2**20, max_bytes: float = 16 * 2**20,
                  source_ratio: float = 2.0) -> list[Disagreement]:
    """Published rows (sizes in ``[min_bytes, max_bytes]``) that disagree with other rows.

    A sweep row ``first`` disagrees with a row ``second`` of the same sweep of at least twice
    its size when ``t(second) <= t(first)`` (times from the published busbw,
    :func:`published_time_s`): twice the bytes in no more time. Two rows of the same
    configuration and size from different systems or sources disagree when their busbw is more
    than ``source_ratio`` apart.

    Args:
        rows: the rows to search (default: every healthy row, :func:`nccl_tests.rows`).
        min_bytes, max_bytes: the sizes of ``first`` that are reported.
        source_ratio: the busbw ratio above which two sources disagree.

    Returns:
        The disagreements, sweeps first, in the order of the rows.
    """
    rows = nccl_tests.rows(None) if rows is None else list(rows)
    out = []
    sweeps: dict[tuple, list[nccl_tests.PublishedRow]] = {}
    for r in rows:
        sweeps.setdefault((r.system, r.source, r.op), []).append(r)
    for sweep in sweeps.values():
        for a in sweep:
            if not min_bytes <= a.size_bytes <= max_bytes:
                continue
            for b in sorted(sweep, key=lambda r: r.size_bytes):
                if (b.size_bytes >= 2 * a.size_bytes
                        and published_time_s(b) <= published_time_s(a)):
                    out.append(Disagreement("sweep", a, b, published_time_s(a),
                                            published_time_s(b), 0.0))
                    break
    configs: dict[tuple, list[nccl_tests.PublishedRow]] = {}
    for r in rows:
        if min_bytes <= r.size_bytes <= max_bytes:
            configs.setdefault((*_config(r), r.size_bytes), []).append(r)
    for group in configs.values():
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                if a.system == b.system and a.source == b.source:
                    continue
                ratio = max(a.busbw_gbps, b.busbw_gbps) / min(a.busbw_gbps, b.busbw_gbps)
                if ratio > source_ratio:
                    out.append(Disagreement("sources", a, b, published_time_s(a),
                                            published_time_s(b), ratio))
    return out


def format_disagreements(found: Sequence[Disagreement]) -> str:
    """A fixed-width table of :func:`disagreements`."""
    lines = [f"{'kind':<8} {'row':<48} {'size':>8} {'time':>9}   {'against':<48} {'size':>8} "
             f"{'time':>9} {'why':>20}"]
    for d in found:
        why = ("2x+ bytes, no longer" if d.kind == "sweep" else f"busbw x{d.ratio:.2f}")
        lines.append(f"{d.kind:<8} {d.first.system[:48]:<48} {d.first.size_bytes / 2**20:6g}Mi "
                     f"{d.first_s * 1e6:7.1f}us   {d.second.system[:48]:<48} "
                     f"{d.second.size_bytes / 2**20:6g}Mi {d.second_s * 1e6:7.1f}us {why:>20}")
    return "\n".join(lines)
