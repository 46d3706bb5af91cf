"""What the release behind the GPT-OSS 120B rows ran, checked against the planner (issue 38,
item 4): the sources that say which kernels the published runs used, and where the published
table and the release's own configuration disagree.

Sources: Megatron-Bridge 0.2.0 (NeMo 25.11; ``scripts/performance/configs/gpt_oss/
workload_base_configs.py``, ``src/megatron/bridge/models/gpt_oss/gpt_oss_provider.py``) and
Transformer Engine 2.9 (``transformer_engine/pytorch/attention/dot_product_attention/
utils.py``), which that release pins.
"""

from __future__ import annotations

import pytest

from clusterlab.analytic import costmodel
from clusterlab.analytic.plan import validation
from clusterlab.catalog import hardware
from clusterlab.catalog.published import moe_runs

#: GPT-OSS 120B's query heads (OpenAI's config.json; GPTOSSProvider: num_attention_heads 64)
HEADS = 64
BF16_BYTES = 2


def unfused_probabilities_bytes(run: moe_runs.MoeRun) -> float:
    """Bytes of attention probabilities an unfused attention keeps on the first pipeline stage:
    ``b a s^2`` BF16 values per layer (the product with V needs them in the backward, so
    autograd keeps them), for every layer of the stage (the unfused path turns a sliding window
    into a mask over the whole ``s x s``: Transformer Engine 2.9's backend table), times the
    micro-batches 1F1B keeps in flight there."""
    layers = moe_runs.GPT_OSS_120B_SHAPE[0] // run.pp
    microbatches = run.global_batch // (run.dp * run.micro_batch)
    in_flight = costmodel.pipeline_activation_microbatches(run.pp, microbatches, "1f1b")
    per_layer = run.micro_batch * HEADS * run.seq_len ** 2 * BF16_BYTES
    return per_layer * layers * in_flight


@pytest.mark.parametrize("run", moe_runs.ROWS, ids=lambda r: f"{r.gpu}-{r.release}")
def test_no_published_run_could_have_run_attention_unfused(run):
    """Transformer Engine 2.9 runs learned-sink attention fused (cuDNN 9.13.1 or later) or
    unfused; which one the container's cuDNN gave is not published. The memory settles it:
    unfused, the probabilities alone, beside what the planner counts for the layout, exceed
    the GPU. So every row ran the fused kernel, as the planner prices it."""
    plan = validation.moe_plan(run)
    needed = plan.memory_bytes + unfused_probabilities_bytes(run)
    memory = hardware.gpu(run.gpu).memory_bytes
    print(f"{run.gpu} {run.release}: unfused would need {needed / 2**30:.0f} GiB of "
          f"{memory / 2**30:.0f} GiB")
    assert needed > memory


def test_the_h100_2511_rows_micro_batch_in_the_release_config_gives_the_2602_rows_error():
    """The 25.11 table gives the H100 run a micro-batch of 4; the release's configuration file
    (Megatron-Bridge 0.2.0, GPT_OSS_120B_H100_BF16_BASE_CONFIG) gives 1. At 4 the layout does
    not fit the planner's memory; at 1 it fits, and its error is the 26.02 row's (same layout
    but the batch) within a point. The table is the measurement, so the row keeps 4, but the
    unpriced time's growth with tokens (4,096 against 16,384 a micro-batch) rests on it."""
    h100_2511, h100_2602 = moe_runs.ROWS[0], moe_runs.ROWS[1]
    assert (h100_2511.gpu, h100_2511.release, h100_2511.micro_batch) == ("H100", "25.11", 4)
    as_table = validation.moe_plan(h100_2511)
    as_config = validation.moe_plan(h100_2511._replace(micro_batch=1))
    later = validation.moe_plan(h100_2602)

    def error(plan, run):
        return validation.tokens_per_s_per_gpu(plan) / run.tokens_per_s_per_gpu - 1

    assert not as_table.fits and as_config.fits
    assert error(as_config, h100_2511) == pytest.approx(error(later, h100_2602), abs=0.01)
    print(f"H100 25.11: {error(as_table, h100_2511):+.1%} at the table's micro-batch 4, "
          f"{error(as_config, h100_2511):+.1%} at the config's 1; 26.02: "
          f"{error(later, h100_2602):+.1%}")
