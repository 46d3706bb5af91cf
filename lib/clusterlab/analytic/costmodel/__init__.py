"""Cost models of communication: alpha-beta, the strategies' traffic, and NCCL across nodes.

Conventions follow nccl-tests (``doc/PERFORMANCE.md``):

* ``nbytes`` is the *full buffer* as nccl-tests prints it in its ``size`` column: the per-device
  buffer for all-reduce, broadcast, reduce, all-to-all and send/recv; the gathered output for
  all-gather; the input that is scattered for reduce-scatter.
* ``bandwidth`` is in bytes/s, per device, per direction (unidirectional).
* ``algbw = nbytes / time``; ``busbw = algbw * busbw_factor(op, n)``. With the ring algorithm and
  no latency, busbw equals the link bandwidth, which is why nccl-tests reports it.

The package, by job (every public name is re-exported here, so ``costmodel.X`` works):

* :mod:`~clusterlab.analytic.costmodel.alpha_beta`: the alpha-beta model per algorithm (Thakur et
  al. 2005) on one level of links, and lines fitted to measurements (held out, two levels).
* :mod:`~clusterlab.analytic.costmodel.traffic`: bytes per step of data, sharded (ZeRO) and tensor
  parallelism, Megatron's all-reduces per layer, gradient buckets, and the pipeline bubble.
* :mod:`~clusterlab.analytic.costmodel.cluster`: :func:`cluster_collective`, the one model of
  collectives across nodes: NCCL 2.30.7's own tuning model (the private ``_nccl`` port and
  ``_model``, which reads a :class:`clusterlab.catalog.hardware.ClusterSpec` as NCCL's topology
  does).
* :mod:`~clusterlab.analytic.costmodel.validation`: that model against every published nccl-tests
  row (:mod:`clusterlab.catalog.published.nccl_tests`), its error by regime, and the band it sets.

References:
    Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in
    MPICH", IJHPCA 19(1), 2005. https://doi.org/10.1177/1094342005051521
    NVIDIA nccl-tests, doc/PERFORMANCE.md. https://github.com/NVIDIA/nccl-tests
"""

from clusterlab.analytic.costmodel._model import (CLUSTER_ALGORITHMS, FABRICS, LAUNCH_OVERHEAD_S,
                                                  NCCL_RELEASE, NIC_EFFICIENCY, NVLINK_EFFICIENCY,
                                                  PIPELINE_FILL_CHUNKS, PROTOCOLS, SIZE_CLASSES,
                                                  CollectiveEstimate, Regime, fabric_of, regime)
from clusterlab.analytic.costmodel.alpha_beta import (ALGORITHMS, IMPLEMENTATIONS, OPS,
                                                      RUNNABLE_OPS, AlphaBeta, HeldOutFit,
                                                      TwoLevelModel, algbw, busbw, busbw_factor,
                                                      collective_alpha_beta,
                                                      collective_steps_and_bytes, collective_time,
                                                      crossover_bytes, fit_alpha_beta, fit_held_out,
                                                      fit_two_level, hierarchical_all_reduce_time,
                                                      link_from_fit)
from clusterlab.analytic.costmodel.cluster import all_reduce_time, cluster_collective
from clusterlab.analytic.costmodel.traffic import (MEGATRON_PAIRS_PER_LAYER, PIPELINE_SCHEDULES,
                                                   TensorParallelTraffic, check_pipeline,
                                                   data_parallel_bytes_per_step, gradient_buckets,
                                                   megatron_all_reduces_per_layer,
                                                   pipeline_activation_microbatches,
                                                   pipeline_bubble_fraction,
                                                   sharded_data_parallel_bytes_per_step,
                                                   tensor_parallel_bytes_per_step)
from clusterlab.analytic.costmodel.validation import (BAND_MARGIN, MIN_VALIDATION_ROWS,
                                                      TOLERANCE, UNVALIDATED_BAND,
                                                      VALIDATION_LEVELS, Disagreement, RegimeError,
                                                      ValidationRow, disagreements,
                                                      fit_launch_overhead, fit_set_parameters,
                                                      format_disagreements, format_regime_errors,
                                                      format_validation_table, is_validated,
                                                      median_abs_error,
                                                      published_time_s, regime_errors,
                                                      regime_summaries,
                                                      smallest_caught_loss,
                                                      validation_by_regime, nccl_validation_table)

__all__ = [
    "ALGORITHMS", "BAND_MARGIN", "CLUSTER_ALGORITHMS", "FABRICS", "LAUNCH_OVERHEAD_S",
    "IMPLEMENTATIONS", "MEGATRON_PAIRS_PER_LAYER", "MIN_VALIDATION_ROWS", "NCCL_RELEASE",
    "NIC_EFFICIENCY", "NVLINK_EFFICIENCY", "OPS", "PIPELINE_FILL_CHUNKS", "PIPELINE_SCHEDULES",
    "PROTOCOLS", "RUNNABLE_OPS",
    "SIZE_CLASSES", "TOLERANCE", "UNVALIDATED_BAND", "VALIDATION_LEVELS", "AlphaBeta",
    "CollectiveEstimate", "Disagreement",
    "HeldOutFit", "Regime", "RegimeError", "TensorParallelTraffic", "TwoLevelModel",
    "ValidationRow", "algbw", "all_reduce_time", "busbw", "busbw_factor", "check_pipeline",
    "cluster_collective", "collective_alpha_beta", "collective_steps_and_bytes", "collective_time",
    "crossover_bytes", "data_parallel_bytes_per_step", "disagreements", "fabric_of",
    "fit_alpha_beta", "fit_held_out", "fit_launch_overhead", "fit_set_parameters", "fit_two_level",
    "format_disagreements", "format_regime_errors", "format_validation_table", "gradient_buckets",
    "hierarchical_all_reduce_time", "is_validated", "link_from_fit", "median_abs_error",
    "megatron_all_reduces_per_layer", "pipeline_activation_microbatches",
    "pipeline_bubble_fraction", "published_time_s", "regime", "regime_errors",
    "regime_summaries",
    "sharded_data_parallel_bytes_per_step", "smallest_caught_loss",
    "tensor_parallel_bytes_per_step",
    "validation_by_regime", "nccl_validation_table",
]
