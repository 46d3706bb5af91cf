"""The course's fabric comparison (chapters 01, 07 and 08, labs 10 and 12): one data-parallel
job (:data:`FABRIC_JOB`) on clusters that differ in their network (:data:`FABRIC_CLUSTERS`),
each step priced by :func:`fabric_step` with the one model of NCCL across nodes."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from clusterlab._checks import count, positive
from clusterlab.analytic import flops
from clusterlab.analytic.plan._network import all_reduce
from clusterlab.analytic.plan.step import data_parallel_step, model_shape, StepTime
from clusterlab.catalog.hardware import ClusterSpec


@dataclass(frozen=True)
class DataParallelJob:
    """A data-parallel training job as the fabric comparison prices it (no pipeline, no TP).

    Attributes mirror :func:`clusterlab.analytic.plan.data_parallel_step`; the gradients travel in
    BF16.
    """

    n_params: float                  # N, parameters
    n_tokens: float                  # D, tokens to train on
    tokens_per_step: float           # B, tokens in one global batch
    seq_len: int                     # tokens per sequence (attention's FLOPs)
    compute_efficiency: float = 0.5  # fraction of peak the matrix multiplications reach
    bytes_per_grad: int = 2          # BF16 gradients (2 bytes per value)
    n_layers: int | None = None      # transformer layers; None: default_shape(n_params)
    d_model: int | None = None       # model width; None: default_shape(n_params)

    def __post_init__(self) -> None:
        for name in ("n_params", "n_tokens", "tokens_per_step"):
            positive(name, getattr(self, name))
        count("seq_len", self.seq_len)
        count("bytes_per_grad", self.bytes_per_grad)
        model_shape(self.n_params, self.n_layers, self.d_model)

    @property
    def gradient_bytes(self) -> float:
        """Bytes each GPU all-reduces per step: ``bytes_per_grad * n_params``."""
        return self.bytes_per_grad * self.n_params

    @property
    def steps(self) -> float:
        """Steps to train: ``n_tokens / tokens_per_step``."""
        return self.n_tokens / self.tokens_per_step

    @property
    def flops_per_token(self) -> float:
        """Model FLOPs per token, :func:`clusterlab.analytic.flops.transformer_flops_per_token`."""
        n_layers, d_model = model_shape(self.n_params, self.n_layers, self.d_model)
        return flops.transformer_flops_per_token(self.n_params, n_layers, self.seq_len, d_model)


def fabric_step(job: DataParallelJob, cluster: ClusterSpec, *, overlap: float = 0.0,
                network_bytes_per_s: float | None = None) -> StepTime:
    """One data-parallel step of ``job`` on every GPU of ``cluster``: compute plus the exposed
    all-reduce.

    The gradient all-reduce is :func:`clusterlab.analytic.costmodel.cluster_collective` (the one
    model of NCCL across nodes) on the cluster; the step is
    :func:`clusterlab.analytic.plan.data_parallel_step`.

    Compute is ``job.compute_efficiency`` of peak, not the per-GEMM model that
    :func:`clusterlab.analytic.plan.predict` uses by default
    (``Assumptions.compute_efficiency=None``), on purpose: the comparison asks what the *network*
    costs, so it holds compute at one stated fraction that the chapters' code and prose reason with
    (chapter 01's and 08's ``e = 0.5``, chapter 07's "the GPUs alone could do 50%"), and the same
    fraction on every cluster keeps the fabrics' ratios a statement about fabrics. The per-GEMM
    model would price :data:`FABRIC_JOB`'s compute at 75% of peak (33 layers of 4224, one 4096-token
    sequence per micro-batch on an H100; ``tests/test_plan.py`` computes it), which shortens every
    step's compute by a third and makes the network a larger share; for that question use
    :func:`clusterlab.analytic.plan.predict` with ``Layout(dp=n_gpus)``, whose data-parallel term is
    this function's all-reduce (lab 10 checks the two agree at ``compute_efficiency=0.5``).

    Args:
        job: the workload.
        cluster: the GPUs and NICs.
        overlap: the fraction of the all-reduce hidden behind the backward pass, in [0, 1],
            capped at the backward pass's time.
        network_bytes_per_s: replaces the node's NICs by this line rate per node (bytes/s per
            direction), e.g. to sweep the fabric; the NIC's name still says which fabric it is.
            None: the cluster's own network.

    Returns:
        The :class:`StepTime`; ``job.steps * step.step_s`` is the time to train;
        ``step.all_reduce`` is the estimate (``step.validated``: whether published rows validate
        it).

    Raises:
        ValueError: if ``job`` or ``cluster`` is of the wrong type, or a rate is not positive.
    """
    if not isinstance(job, DataParallelJob) or not isinstance(cluster, ClusterSpec):
        raise ValueError("fabric_step(job, cluster) takes a plan.DataParallelJob and a "
                         "hardware.ClusterSpec, e.g. plan.FABRIC_JOB, plan.FABRIC_CLUSTERS['A'].")
    if network_bytes_per_s is not None and cluster.n_nodes > 1:
        cluster = replace(cluster, network_bytes_per_s=positive("network_bytes_per_s",
                                                                network_bytes_per_s))
    estimate = all_reduce(job.gradient_bytes, cluster)
    return data_parallel_step(job.n_params, job.tokens_per_step, cluster.n_gpus, cluster.gpu,
                              seq_len=job.seq_len, n_layers=job.n_layers, d_model=job.d_model,
                              compute_efficiency=job.compute_efficiency,
                              all_reduce_s=estimate.time_s, overlap=overlap,
                              all_reduce=estimate)


def network_to_match(job: DataParallelJob, cluster: ClusterSpec, step_s: float, *,
                     overlap: float = 0.0, max_bytes_per_s: float = 1e13) -> float:
    """The smallest per-node network line rate at which ``cluster`` steps within ``step_s``.

    Bisects :func:`fabric_step` over ``network_bytes_per_s`` (the step time does not grow with
    the network's rate) to a relative precision of 1e-6.

    Args:
        job: the workload.
        cluster: GPUs and nodes (its own NICs are replaced by the swept rate).
        step_s: the step time to match, e.g. another cluster's ``fabric_step(...).step_s``.
        overlap: as in :func:`fabric_step`.
        max_bytes_per_s: the largest rate tried.

    Returns:
        Bytes/s per node, per direction; ``math.inf`` when even ``max_bytes_per_s`` is too slow
        (compute or NVLink alone exceed ``step_s``); 0.0 on one node (no network).
    """
    step_s = positive("step_s", step_s)
    if cluster.n_nodes == 1:
        return 0.0 if fabric_step(job, cluster, overlap=overlap).step_s <= step_s else math.inf

    def step_at(rate: float) -> float:
        return fabric_step(job, cluster, overlap=overlap, network_bytes_per_s=rate).step_s

    high = positive("max_bytes_per_s", max_bytes_per_s)
    if step_at(high) > step_s:
        return math.inf
    low = high
    while step_at(low) <= step_s:
        low /= 2
        if low < 1.0:
            return low
    while high / low > 1 + 1e-6:
        middle = math.sqrt(low * high)
        low, high = (low, middle) if step_at(middle) <= step_s else (middle, high)
    return high


#: The job of the course's fabric comparison: a 7B model (default_shape: 33 layers of 4224) on
#: 2T tokens in 4M-token steps of 1024 sequences of 4096 tokens, at 50% of peak while computing
#: (chapters 01 and 08, lab 10).
FABRIC_JOB = DataParallelJob(n_params=7e9, n_tokens=2e12, tokens_per_step=2**22, seq_len=4096,
                             compute_efficiency=0.5)
#: The clusters it compares: A, 256 H100 with one 400G NDR port per GPU (a DGX H100's 8 per
#: node); B, twice the GPUs with one 100 GbE port per node; B2, the same with 2 x 200 GbE.
FABRIC_CLUSTERS = {
    "A": ClusterSpec("H100", n_nodes=32, nic="IB-NDR", nics_per_node=8, name="A"),
    "B": ClusterSpec("H100", n_nodes=64, nic="Ethernet-100G", nics_per_node=1, name="B"),
    "B2": ClusterSpec("H100", n_nodes=64, nic="Ethernet-200G", nics_per_node=2, name="B2"),
}

