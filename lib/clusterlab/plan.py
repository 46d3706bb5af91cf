"""Putting the models together: how long one training step takes on a cluster.

The data-parallel step that the chapters use to compare clusters: compute from
:mod:`clusterlab.flops`, the gradient all-reduce priced by :mod:`clusterlab.costmodel`, and the
part of it that is not hidden behind the backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterlab import flops
from clusterlab._checks import count, positive
from clusterlab.hardware import GPU


@dataclass(frozen=True)
class StepTime:
    """One training step, split into compute and exposed communication.

    Attributes:
        compute_s: seconds of forward and backward computation.
        communication_s: seconds of communication not hidden behind the computation.
        model_flops: FLOPs of the step (6 N B).
        n_devices: devices taking part.
        peak_flops_per_device: each device's peak FLOP/s.
    """

    compute_s: float
    communication_s: float
    model_flops: float
    n_devices: int
    peak_flops_per_device: float

    @property
    def step_s(self) -> float:
        return self.compute_s + self.communication_s

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization of the whole step, communication included."""
        return flops.mfu(self.model_flops / self.step_s, self.n_devices,
                         self.peak_flops_per_device)


def data_parallel_step(n_params: float, tokens_per_step: float, n_devices: int, gpu: GPU, *,
                       compute_efficiency: float, all_reduce_s: float,
                       overlap: float = 0.0) -> StepTime:
    """A data-parallel step: ``6 N B / (n peak e)`` of compute plus the exposed all-reduce.

    Args:
        n_params: model parameters N.
        tokens_per_step: tokens B in one global batch.
        n_devices: data-parallel devices.
        gpu: the device, for its peak BF16 FLOP/s.
        compute_efficiency: e, the fraction of peak the matrix multiplications reach.
        all_reduce_s: time of the gradient all-reduce, e.g. from
            :func:`clusterlab.costmodel.collective_time` or
            :func:`clusterlab.costmodel.hierarchical_all_reduce_time`.
        overlap: the fraction of the all-reduce hidden behind the backward pass, in [0, 1].

    Returns:
        The :class:`StepTime`.
    """
    n_devices = count("n_devices", n_devices)
    efficiency = positive("compute_efficiency", compute_efficiency)
    if efficiency > 1:
        raise ValueError(f"compute_efficiency is a fraction of peak, at most 1; got {efficiency}.")
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap is the hidden fraction of the all-reduce, in [0, 1]; got "
                         f"{overlap}.")
    model_flops = flops.training_flops(n_params, tokens_per_step)
    compute_s = model_flops / (n_devices * gpu.bf16_flops * efficiency)
    exposed_s = (1 - overlap) * positive("all_reduce_s", all_reduce_s, allow_zero=True)
    return StepTime(compute_s, exposed_s, model_flops, n_devices, gpu.bf16_flops)
