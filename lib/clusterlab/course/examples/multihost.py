"""What lab 09 and the tests run in every process of a multi-process job.

Each function runs inside a process already joined by :func:`clusterlab.device.distributed.init`
(the launcher's ``run`` calls it first) and returns JSON-serialisable results. As a script,
``python -m clusterlab.course.examples.multihost`` joins the job itself, checks the collectives and
a data-parallel step against one device, prints the verdicts and exits non-zero when one fails
(:func:`main`): the same command runs under ``python -m clusterlab.device.launch`` on one machine
and under ``srun`` on a cluster (``tests/test_slurm.py`` runs it under a real SLURM).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from clusterlab.device import bench, collectives, distributed, hlo, models
from clusterlab.device.parallel import data

HOSTS, DEVICES = "hosts", "devices"  # the two axes of the (hosts, devices per host) mesh
BOTH = (HOSTS, DEVICES)


# The four ways to all-reduce over the (hosts, devices) mesh, shared by the check and the sweep.
_ALL_REDUCES = {
    "intra": lambda b: jax.lax.psum(b, DEVICES),
    "inter": lambda b: jax.lax.psum(b, HOSTS),
    "flat": lambda b: jax.lax.psum(b, BOTH),
    "hierarchical": lambda b: collectives.hierarchical_all_reduce(
        b, intra_axis=DEVICES, inter_axis=HOSTS),
}
_COUNTED_OPS = ("all-reduce", "reduce-scatter", "all-gather", "collective-permute")
_LABELS = {"intra": "within a process (devices)", "inter": "across processes (hosts)",
           "flat": "whole mesh (flat)", "hierarchical": "whole mesh (hierarchical)"}
# The largest difference from one device (parameters; gradients relative to the largest one)
# that the data-parallel check accepts: float32 rounding of sums taken in another order, far
# below the factor hosts x devices that a sum-for-mean bug leaves in the gradients.
TRAIN_TOLERANCE = 1e-5


def _global(mesh, local_block: np.ndarray, spec=P(BOTH)) -> jax.Array:
    # local_block: f32[d * e] on each process -> global f32[h * d * e] split over every device
    return jax.make_array_from_process_local_data(NamedSharding(mesh, spec), local_block)


def _per_device(mesh, fn):
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P(BOTH), out_specs=P(BOTH),
                                 check_vma=False))


def collectives_check(elements: int = 4) -> dict:
    """All-reduce inside each process, across processes, over the whole mesh, and two-level.

    Device ``(h, i)`` of the ``(hosts, devices)`` mesh holds its global rank + 1 in every one of
    ``elements`` entries; each collective's result is compared with numpy's.

    Returns:
        ``mesh_shape``, per collective the ``(hosts, devices)`` table of first entries it gave,
        ``ok``: whether every collective matched numpy exactly, and ``ops``: per collective,
        how many instructions of each collective kind XLA compiled into its program.
    """
    mesh = distributed.host_mesh(BOTH)
    h, d = mesh.devices.shape
    rank = jax.process_index()
    values = np.arange(1, h * d + 1, dtype=np.float32).reshape(h, d)  # values: f32[h, d]
    local = np.repeat(values[rank], elements).astype(np.float32)  # local: f32[d * e]
    x = _global(mesh, local)
    runs = {_LABELS[name]: body for name, body in _ALL_REDUCES.items()}
    expected = {
        "within a process (devices)": np.repeat(values.sum(1, keepdims=True), d, 1),
        "across processes (hosts)": np.repeat(values.sum(0, keepdims=True), h, 0),
        "whole mesh (flat)": np.full((h, d), values.sum()),
        "whole mesh (hierarchical)": np.full((h, d), values.sum()),
    }
    tables, ok, ops = {}, True, {}
    for name, body in runs.items():
        program = _per_device(mesh, body)
        ops[name] = {op: hlo.hlo_op_count(program, x, op=op) for op in _COUNTED_OPS}
        out = multihost_utils.process_allgather(program(x), tiled=True)
        out = np.asarray(out).reshape(h, d, elements)  # out: f32[h, d, e]
        ok &= bool(np.array_equal(out, np.repeat(expected[name][..., None], elements, -1)))
        tables[name] = out[..., 0].astype(int).tolist()
    return {"mesh_shape": [h, d], "process": rank, "tables": tables, "ok": ok, "ops": ops}


def measure_collectives(sizes_bytes: Sequence[int], *, repeats: int = 7) -> dict:
    """Time four all-reduces of each per-device buffer size on the ``(hosts, devices)`` mesh.

    ``intra`` runs over the devices of each process, ``inter`` over the processes (one
    all-reduce per device index, all at once), ``flat`` over every device, ``hierarchical`` is
    :func:`clusterlab.device.collectives.hierarchical_all_reduce`. The four take turns
    (:func:`clusterlab.device.bench.time_interleaved`), so a change in the machine's load falls on
    all of them alike.

    Args:
        sizes_bytes: per-device buffer sizes in bytes (float32, a multiple of 4 * devices).
        repeats: timed rounds per size.

    Returns:
        ``sizes_bytes`` and, per collective, the median seconds of each size (this process's
        clock), plus the interquartile spread relative to the median.
    """
    mesh = distributed.host_mesh(BOTH)
    h, d = mesh.devices.shape
    bodies = _ALL_REDUCES
    medians = {name: [] for name in bodies}
    spreads = {name: [] for name in bodies}
    for nbytes in sizes_bytes:
        elements = int(nbytes) // 4
        if elements % d or elements * 4 != int(nbytes):
            raise ValueError(f"{nbytes} bytes is not a whole number of float32 elements per "
                             f"device divisible by {d}; use multiples of {4 * d} bytes.")
        x = _global(mesh, np.ones(d * elements, np.float32))
        timings = bench.time_interleaved({name: _per_device(mesh, body)
                                          for name, body in bodies.items()}, x, warmup=1,
                                         repeats=repeats)
        for name, timing in timings.items():
            medians[name].append(timing.median_s)
            spreads[name].append(timing.relative_spread)
    return {"sizes_bytes": [int(s) for s in sizes_bytes], "mesh_shape": [h, d],
            "median_s": medians, "relative_spread": spreads}


def _this_process_batch(mesh, xb: np.ndarray, yb: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """The global batch as a real data loader feeds it: each process passes only its own rows.

    ``xb, yb``: f32[B, D], the same global batch in every process; returns global arrays
    f32[B, D], split over every device of every process (f32[B/(h*d), D] per device).
    """
    h = mesh.devices.shape[0]
    per_process = xb.shape[0] // h
    mine = slice(jax.process_index() * per_process, (jax.process_index() + 1) * per_process)
    return _global(mesh, xb[mine]), _global(mesh, yb[mine])


def _first_device_copy(tree):
    # one device's copy of replicated arrays, readable in every process
    return jax.tree.map(lambda a: np.asarray(a.addressable_data(0)), tree)


def _reference(params0, batches, optimizer, grads: dict) -> dict:
    """Process 0's single-device run and the gradients' distance from it (see train_check)."""
    with jax.default_device(jax.local_devices()[0]):
        ref_params, ref_losses = models.reference_train(params0, batches, optimizer=optimizer)
        ref_grads = jax.device_get(jax.jit(jax.grad(models.mse_loss))(params0, *batches[0]))
    scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(ref_grads))
    result = {"reference_losses": [round(float(v), 6) for v in ref_losses],
              "reference_params": jax.device_get(ref_params)}
    for name, g in grads.items():
        result[f"grad_rel_diff{name}"] = models.max_abs_diff(ref_grads, g) / scale
    return result


def train_check(*, steps: int = 5, batch_size: int = 32, d_model: int = 16, d_hidden: int = 32,
                n_blocks: int = 2, seed: int = 0) -> dict:
    """Data-parallel training across every device of every process, against one device.

    The step is :func:`clusterlab.device.parallel.data.make_data_parallel` over both mesh axes
    (``axis_name=("hosts", "devices")``): each process holds its own ``1/hosts`` of every global
    batch (as a real data loader would), each device computes gradients on its
    ``1/(hosts*devices)``, one mean over both axes averages them, and every device applies the
    same Adam update. Process 0 also trains the same model on one of its devices with
    :func:`clusterlab.device.models.reference_train`.

    Returns:
        ``losses`` (rounded to 6 decimals), and on process 0 ``max_abs_diff``: the largest
        parameter difference from the single-device run (``None`` on the other processes), and
        ``grad_rel_diff`` / ``grad_rel_diff_summed``: the first batch's gradients as the step
        reduces them, or summed (``reduce="sum"``, a negative control) over all devices,
        against one device's, as the largest difference over the largest gradient.
    """
    mesh = distributed.host_mesh(BOTH)
    h, d = mesh.devices.shape
    if batch_size % (h * d):
        raise ValueError(f"batch_size {batch_size} must divide by the {h * d} devices.")

    @jax.jit  # one compilation for data and parameters (eager ops would compile one by one)
    def setup(key):
        key_data, key_init = jax.random.split(key)
        xy = models.synthetic_regression(key_data, n_samples=batch_size * steps, d_model=d_model)
        return xy, models.init_mlp(key_init, d_model=d_model, d_hidden=d_hidden,
                                   n_blocks=n_blocks)

    with jax.default_device(jax.local_devices()[0]):  # the same data and start everywhere
        (x, y), params0 = jax.device_get(setup(jax.random.key(seed)))
    # batches: [(f32[B, D], f32[B, D])] * steps, consecutive rows of the data set
    batches = [(x[i * batch_size:(i + 1) * batch_size], y[i * batch_size:(i + 1) * batch_size])
               for i in range(steps)]
    optimizer = models.make_optimizer()
    dp = data.make_data_parallel(models.mse_loss, mesh, optimizer, axis_name=BOTH)
    params, opt_state = dp.init(params0)
    losses = []
    for xb, yb in batches:
        params, opt_state, loss = dp.step(params, opt_state, *_this_process_batch(mesh, xb, yb))
        losses.append(round(float(loss.addressable_data(0)), 6))
    result = {"process": jax.process_index(), "mesh_shape": [h, d], "losses": losses,
              "max_abs_diff": None}
    # The first batch's gradients, reduced as the step reduces them and, as a negative control,
    # summed (the bug a sum-for-mean mistake makes), for process 0 to compare with one
    # device's: Adam's update would hide a wrong factor, the gradients do not.
    grads = {}
    for name, strategy in (("", dp), ("_summed", data.make_data_parallel(
            models.mse_loss, mesh, optimizer, axis_name=BOTH, reduce="sum"))):
        rows = strategy.grads(strategy.shard(params0), *_this_process_batch(mesh, *batches[0]))
        grads[name] = jax.tree.map(lambda r: r[0], rows)  # this process's first device's
    if jax.process_index() == 0:
        reference = _reference(params0, batches, optimizer, grads)
        result["max_abs_diff"] = models.max_abs_diff(reference.pop("reference_params"),
                                                     _first_device_copy(params))
        result.update(reference)
    return result


def fail(*, mode: str = "raise", process: int = 1, at_step: int = 3, steps: int = 2000,
         step_s: float = 0.01) -> dict:
    """All-reduce in a loop until process ``process`` fails at step ``at_step``.

    Args:
        mode: ``"raise"`` (a Python exception), ``"kill"`` (SIGKILL, as the kernel's
            out-of-memory killer would: no clean-up at all) or ``"hang"`` (SIGSTOP: the process
            stays, its sockets stay open, it just stops, as a hung node does; only JAX's
            heartbeat timeout notices).
        process: which process fails.
        at_step: the step at which it fails; ``at_step >= steps`` fails nowhere and leaves a
            plain all-reduce loop (a running job for the tests to cancel).
        steps: loop length; the others never reach it, they stop on the error.
        step_s: pause between steps, seconds.

    Every process prints one line when its first all-reduce is done, so that whoever waits for
    the job knows the loop is running.
    """
    if mode not in ("raise", "kill", "hang"):
        raise ValueError(f"mode must be 'raise', 'kill' or 'hang', got {mode!r}.")
    mesh = distributed.host_mesh(BOTH)
    d = mesh.devices.shape[1]
    total = _per_device(mesh, lambda b: jax.lax.psum(b, BOTH))
    x = _global(mesh, np.ones(d * 4, np.float32))
    for step in range(steps):
        if jax.process_index() == process and step == at_step:
            print(f"process {process}: failing on purpose at step {step} ({mode})", flush=True)
            if mode in ("kill", "hang"):
                os.kill(os.getpid(), signal.SIGKILL if mode == "kill" else signal.SIGSTOP)
            raise RuntimeError(f"a failure on purpose at step {step}")
        jax.block_until_ready(total(x))
        if step == 0:
            print(f"process {jax.process_index()}: all-reduce loop running", flush=True)
        time.sleep(step_s)
    return {"steps": steps}


def main(argv: Sequence[str] | None = None) -> int:
    """Join the job, check the collectives and a data-parallel step, print one line for each.

    Every process checks its all-reduces (:func:`collectives_check`); process 0 also checks
    :func:`train_check`'s gradients and parameters against one device's, within
    :data:`TRAIN_TOLERANCE`, and that the summed gradients of its negative control fall outside
    it (with more than one device). The exit code is 1 when any of this fails in this process,
    so ``srun`` and ``clusterlab.device.launch`` fail the job.
    """
    env = distributed.init()
    from clusterlab.device import devices

    if env.process_id == 0:
        devices.describe()
    who = f"process {env.process_id} of {env.num_processes} ({env.source})"
    result = collectives_check()
    verdict = "equal numpy's" if result["ok"] else "DIFFER from numpy's"
    print(f"{who}: mesh {tuple(result['mesh_shape'])} (hosts, devices), "
          f"{len(jax.local_devices())} local device(s), all-reduces {verdict}", flush=True)
    trained = train_check()
    ok = result["ok"]
    if env.process_id == 0:
        n_devices = int(np.prod(trained["mesh_shape"]))
        same = max(trained["max_abs_diff"], trained["grad_rel_diff"]) < TRAIN_TOLERANCE
        caught = n_devices == 1 or trained["grad_rel_diff_summed"] > TRAIN_TOLERANCE
        verdict = "equals" if same else "DIFFERS from"
        print(f"{who}: data-parallel step over {n_devices} device(s) {verdict} one device's "
              f"(parameters within {trained['max_abs_diff']:.1e}, gradients within "
              f"{trained['grad_rel_diff']:.1e} of the largest; summed instead of averaged: "
              f"{trained['grad_rel_diff_summed']:.2f}"
              f"{'' if caught else ', NOT caught by the check'})", flush=True)
        ok = ok and same and caught
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
