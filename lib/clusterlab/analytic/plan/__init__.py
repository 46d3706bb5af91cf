"""Putting the models together: size a cluster and predict a training step for a workload.

Every model takes a cluster as one :class:`clusterlab.catalog.hardware.ClusterSpec` (:func:`cluster`
builds one from catalog names, counted in GPUs). The package, by job:

* :mod:`~clusterlab.analytic.plan.step`: the data-parallel step (:func:`data_parallel_step`):
  compute from the course's one MFU numerator
  (:func:`clusterlab.analytic.flops.transformer_flops_per_token`), the gradient all-reduce, and the
  part of it that the backward pass cannot hide.
* The planner: a :class:`Workload` (model size, tokens or a time budget, sequence length, global
  batch; a mixture of experts, :class:`MoE`, optional) on a cluster under a :class:`Layout`
  (data, tensor, pipeline, context and expert parallel degrees, ZeRO stage) and :class:`Assumptions`
  (:mod:`~clusterlab.analytic.plan.workload`) gives a :class:`Plan`
  (:mod:`~clusterlab.analytic.plan.prediction`): memory per device, a step summed from compute,
  tensor-parallel all-reduces (inside a node), context parallelism's K/V all-gathers
  (:func:`kv_all_gather_bytes`), expert parallelism's all-to-alls (:func:`expert_all_to_all_bytes`,
  unvalidated: no published all-to-all measurement), pipeline sends and bubble, the data-parallel
  all-reduce and waiting for storage; MFU, time to train and the bottleneck. :func:`predict`
  prices one layout; :mod:`~clusterlab.analytic.plan.search` ranks all layouts that fit
  (:func:`rank_layouts`) and finds the smallest cluster that meets a deadline
  (:func:`gpus_needed`).
* :mod:`~clusterlab.analytic.plan.fabric_comparison`: the course's comparison of fabrics for one
  data-parallel job (:data:`FABRIC_JOB`, :data:`FABRIC_CLUSTERS`, :func:`fabric_step`,
  :func:`network_to_match`).
* :mod:`~clusterlab.analytic.plan.power`: facility power, PUE, and what a power budget holds.
* :mod:`~clusterlab.analytic.plan.validation`: the planner held to published runs
  (:func:`validation_table`: published, predicted, error, source and memory fit per row; FP8
  runs apart, ``validation.fp8_validation_table``).

A workload trains in BF16 or FP8 (``Workload.precision``: FP8 runs the linear GEMMs at the FP8
peak). ``python -m clusterlab plan`` pins or searches every layout axis and takes the model's
shape (:func:`shape_params` counts its parameters); :func:`plan_record` is a plan as JSON data
and :func:`mfu_warning` flags an MFU above the best published run of its class.

Every all-reduce (tensor- and data-parallel) is priced by
:func:`clusterlab.analytic.costmodel.cluster_collective`, latency included. What the planner leaves
out, on purpose: failures (see :mod:`clusterlab.analytic.reliability`).

Units: bytes, seconds, FLOPs, bytes/s per direction (1 GB = 1e9 bytes).
"""

from clusterlab.analytic.plan.fabric_comparison import (FABRIC_CLUSTERS, FABRIC_JOB,
                                                        DataParallelJob, fabric_step,
                                                        network_to_match)
from clusterlab.analytic.plan.power import (PUE_HYPERSCALE, PUE_INDUSTRY_AVERAGE, cluster_power_w,
                                            facility_power_w, gpus_within_power,
                                            peak_flops_per_facility_w)
from clusterlab.analytic.plan.prediction import (BYTES_PER_VALUE, EP_TERM, Plan, batch_fix,
                                                 broken_rule,
                                                 cp_collectives_per_layer, dp_all_reduce,
                                                 dp_all_reduce_s, ep_all_to_alls_per_layer,
                                                 expert_all_to_all_bytes, kv_all_gather_bytes,
                                                 predict, predict_published)
from clusterlab.analytic.plan.search import (Refusal, SearchResult, SearchSpace, best_plan,
                                             candidate_layouts, describe_plan, format_plans,
                                             format_refusals, gpus_needed, mfu_warning,
                                             plan_record, published_mfu, rank_layouts,
                                             search_layouts)
from clusterlab.analytic.plan.step import (BACKWARD_FRACTION, StepTime, data_parallel_step,
                                           default_shape, exposed_bucketed_reduce_s,
                                           hidden_all_reduce_s, megatron_bucket_params, model_shape)
from clusterlab.analytic.plan import validation
from clusterlab.analytic.plan.validation import validation_table
from clusterlab.analytic.plan.workload import (Assumptions, cluster, EXPERT_MATRICES, Layout, MoE,
                                               Workload, shape_params)

__all__ = [
    "BACKWARD_FRACTION", "BYTES_PER_VALUE", "EP_TERM", "EXPERT_MATRICES", "FABRIC_CLUSTERS",
    "FABRIC_JOB", "PUE_HYPERSCALE", "PUE_INDUSTRY_AVERAGE", "Assumptions", "DataParallelJob",
    "Layout", "MoE", "Plan", "Refusal", "batch_fix", "broken_rule", "SearchResult", "SearchSpace", "StepTime", "Workload", "best_plan", "candidate_layouts", "cluster",
    "cluster_power_w", "data_parallel_step", "default_shape", "describe_plan", "dp_all_reduce",
    "dp_all_reduce_s", "cp_collectives_per_layer", "ep_all_to_alls_per_layer",
    "exposed_bucketed_reduce_s", "megatron_bucket_params",
    "expert_all_to_all_bytes", "kv_all_gather_bytes", "fabric_step", "facility_power_w", "format_plans", "format_refusals", "gpus_needed",
    "gpus_within_power", "hidden_all_reduce_s", "mfu_warning", "plan_record", "published_mfu", "model_shape", "network_to_match",
    "peak_flops_per_facility_w", "predict", "predict_published", "rank_layouts", "search_layouts", "shape_params",
    "validation", "validation_table",
]
