"""Answer key of lab 12, the fabric at scale (instructor-only: student copies leave keys/ out).

``lab12.2`` is the assignment: the student's ``max_min_rates(incidence, capacity)``, a dense
f32[links, flows] incidence (the fraction of each flow on each link) and f32[links] capacities
in, f32[flows] rates out, is exported with ``jax.jit`` and judged on 6 random flow sets the lab
never shows (16 flows on 12 links; the last three spray some flows over two links), case by
case, against the flow model's own ``fabric.max_min_rates``. The tolerance is float32 rounding
(rtol 1e-4), where a wrong rule is off by tens of percent.
"""

import numpy as np
import scipy.sparse as sp

from clusterlab.analytic import fabric
from clusterlab.course import grading


def _fewest_qps_near_spraying(ns):
    # the lab's scattered 256-GPU job: mean busbw over seeds 0-7 per QP count, against spraying
    mean_busbw = {q: np.mean([r.busbw for r in fabric.sweep(
        ns["cluster"], "all_reduce", ns["GIB"], over="seed", values=range(8),
        ranks=ns["scattered"], qps=q, progress=False)]) for q in (1, 2, 4, 8, 16)}
    return min(q for q, b in mean_busbw.items() if b >= 0.95 * ns["sprayed"] * 1e9)


# --- lab12.2: the student's max-min fair rates, judged against the flow model's own ----------

_LINKS, _FLOWS = 12, 16
_N_CASES, _FIRST_SPRAYED = 6, 3


def _flow_set(seed: int, sprayed: bool) -> tuple[np.ndarray, np.ndarray]:
    """One hidden case: f32[links, flows] incidence and f32[links] capacities in GB/s. Each flow
    crosses 1 to 4 links; with ``sprayed``, every third flow splits its bytes over two of them."""
    rng = np.random.default_rng(grading.hidden_seed(seed))
    incidence = np.zeros((_LINKS, _FLOWS), dtype=np.float32)
    for f in range(_FLOWS):
        links = rng.choice(_LINKS, size=rng.integers(1, 5), replace=False)
        incidence[links, f] = 1.0
        if sprayed and f % 3 == 0:
            pair = rng.choice(np.setdiff1d(np.arange(_LINKS), links), size=2, replace=False)
            incidence[pair, f] = 0.5
    capacity = rng.choice([12.5, 25.0, 50.0, 100.0], size=_LINKS).astype(np.float32)
    return incidence, capacity


# drawn when the key loads: the grader's judging child loads it afresh for each grading run
_CASES = [_flow_set(1200 + i, sprayed=i >= _FIRST_SPRAYED) for i in range(_N_CASES)]


def _case_name(i: int) -> str:
    return (f"flow set {i + 1} ({_FLOWS} flows on {_LINKS} links"
            + (", some sprayed" if i >= _FIRST_SPRAYED else "") + ")")


def _check_max_min_rates(programs) -> None:
    (program,) = programs
    for i, (incidence, capacity) in enumerate(_CASES):
        rates = program(incidence, capacity)
        if np.shape(rates) != (_FLOWS,):
            raise grading.Refused(f"its result: shape {np.shape(rates)}; return one rate per "
                                  f"flow, f32[{_FLOWS}].")
        expected = fabric.max_min_rates(sp.csr_matrix(incidence.astype(np.float64)),
                                        capacity.astype(np.float64))
        grading.require_close(
            f"{_case_name(i)}: its rates", np.asarray(rates, dtype=np.float64), expected,
            rtol=1e-4,
            hint="grow only the unfrozen flows, all at the same pace, until the next link fills; "
                 "a link's load counts each such flow by its fraction on it; then freeze every "
                 "flow that crosses a full link, and repeat.")


KEY = {
    "lab12.1": grading.equal(_fewest_qps_near_spraying, name="queue pairs",
                             hint="For each QP count, average the busbw of the 8 seeds and hold "
                                  "it against the sprayed busbw (sprayed is in GB/s, busbw in "
                                  "bytes/s)."),
    "lab12.2": grading.code(
        _check_max_min_rates, name="max-min fair rates",
        hint="Progressive filling: raise the unfrozen flows together, freeze those on a full "
             "link, repeat; one flow at least freezes per round.",
        exports=[grading.Export(args=[((_LINKS, _FLOWS), "float32"), ((_LINKS,), "float32")],
                                n_devices=1)]),
    # no references: fabric.max_min_rates runs SciPy on the host, so it cannot be traced into
    # the exported program, and the lab's own check cell calls it
}
