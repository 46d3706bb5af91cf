"""Lab 10's claims about the planner's own model, held here so that the lab keeps one check per idea.

- Llama 3 405B interleaved its pipeline (Dubey et al. 2024), by how much its paper does not say.
  The validation table prices the plain 1F1B schedule; with v = 2 or 4 virtual stages per GPU the
  planner predicts more than the published MFU on both published GPU counts (8,192 and 16,384):
  the compute model is optimistic, as lab 10 says beside the printed rows.
"""

from __future__ import annotations

import pytest

from clusterlab.analytic import plan
from clusterlab.catalog.published import training_runs


@pytest.mark.parametrize("run", training_runs.LLAMA3_405B, ids=lambda run: f"{run.n_gpus} H100")
def test_interleaved_llama3_rows_predict_above_the_published_mfu(run):
    plain = plan.validation.llama3_plan(run, virtual_stages=1)
    interleaved = {v: plan.validation.llama3_plan(run, virtual_stages=v) for v in (2, 4)}
    # more virtual stages, a smaller bubble: the predictions rise with v
    assert plain.mfu < interleaved[2].mfu < interleaved[4].mfu
    for v, prediction in interleaved.items():
        assert prediction.mfu > run.mfu, (v, prediction.mfu, run.mfu)
