"""Real or simulated devices, and meshes over them.

Every lab starts with :func:`setup`. On a machine with enough accelerators it uses them; on a
laptop it asks XLA for ``n`` simulated CPU devices, which share the host's cores and memory but
run the same sharded programs. The number of simulated devices is fixed when JAX first creates
its backends, so :func:`setup` must run before any JAX operation.
"""

from __future__ import annotations

import os
import platform
from typing import Sequence

import jax
import numpy as np
from jax._src import xla_bridge
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

# Set CLUSTERLAB_PLATFORM=cpu to use simulated devices even where accelerators exist.
PLATFORM_ENV = "CLUSTERLAB_PLATFORM"


class DeviceSetupError(RuntimeError):
    """The devices asked for cannot be provided in this Python process."""


def _backends_initialized() -> bool:
    # JAX has no public query for this; the private one has existed since 0.4 and only reads.
    return xla_bridge.backends_are_initialized()


def _accelerators() -> list[jax.Device]:
    if os.environ.get(PLATFORM_ENV, "").lower() == "cpu":
        return []
    return [d for d in jax.devices() if d.platform != "cpu"]


def setup(n_devices: int) -> list[jax.Device]:
    """Provide ``n`` devices: accelerators when JAX sees at least ``n``, else simulated CPUs.

    Call it in the first code cell, before any other JAX operation. Calling it again with the
    same ``n`` is harmless.

    Args:
        n_devices: number of devices the lab needs.

    Returns:
        The ``n`` devices to build meshes on.

    Raises:
        DeviceSetupError: when JAX already created its backends with a different number of CPU
            devices and no ``n`` accelerators exist; the message says to restart the kernel.
    """
    if not isinstance(n_devices, (int, np.integer)) or isinstance(n_devices, bool) or n_devices < 1:
        raise ValueError(f"setup(n_devices) needs a positive whole number of devices, got {n_devices!r}.")
    if n_devices > 4096:
        raise ValueError(f"setup({n_devices}) asks for more simulated devices than is sensible on one "
                         "host; use at most a few dozen.")
    if not _backends_initialized():
        # Harmless where accelerators exist: it only sizes the CPU backend.
        jax.config.update("jax_num_cpu_devices", n_devices)
    accelerators = _accelerators()
    if len(accelerators) >= n_devices:
        devices = accelerators[:n_devices]
        print(f"Using {n_devices} of {len(accelerators)} {devices[0].platform.upper()} device(s): "
              f"{devices[0].device_kind}.")
        return devices
    cpus = jax.devices("cpu")
    if len(cpus) != n_devices:
        raise DeviceSetupError(
            f"JAX was already initialised with {len(cpus)} CPU device(s) in this process, and "
            f"{n_devices} were asked for. The device count is fixed once JAX has run an operation: "
            f"restart the kernel (or the Python process) and call clusterlab.device.devices.setup({n_devices}) "
            "before any other JAX code.")
    reason = (f"Only {len(accelerators)} accelerator(s) found" if accelerators
              else "No accelerator found")
    print(f"{reason}: using {_cpu_devices_phrase(n_devices)}.")
    return cpus


def _plural(count: int, noun: str, plural: str | None = None) -> str:
    """``"1 core"``, ``"2 cores"``: a count with its noun in the right number."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def _cpu_devices_phrase(n_devices: int, of: int | None = None) -> str:
    """What ``n`` CPU devices (of ``of`` in this process, default ``n``) are, in words."""
    cores = _plural(os.cpu_count() or 1, "core")
    if of is not None and of > n_devices:
        return (f"{n_devices} of {of} simulated CPU devices in this process, which share the host's "
                f"{cores} and its memory")
    if n_devices == 1:
        return f"the host CPU as 1 device (all its {cores}, no simulation)"
    return (f"{n_devices} simulated CPU devices in this process, sharing the host's {cores} and its "
            "memory")


def describe(devices: Sequence[jax.Device] | None = None) -> str:
    """Print and return what the lab runs on, in words: JAX, the host, and the devices.

    The devices line says plainly what they are: real accelerators (with their kind), the host
    CPU as one device, or several simulated CPU devices that share the host's cores and memory.
    """
    devices = list(devices) if devices is not None else jax.devices()
    if not devices:
        raise ValueError("describe() needs at least one device; pass None for jax.devices().")
    processes = jax.process_count()
    cpus = [d for d in devices if d.platform == "cpu"]
    if cpus and len(cpus) < len(devices):
        what = (f"{len(devices)} devices: {len(devices) - len(cpus)} accelerator(s) and "
                f"{len(cpus)} CPU device(s)")
    elif cpus:
        if processes > 1:
            what = (f"{len(devices)} CPU devices over {processes} processes on "
                    f"{_plural(len(jax.local_devices(backend='cpu')), 'simulated device')} "
                    f"each, all sharing this host's {_plural(os.cpu_count() or 1, 'core')}")
        else:
            what = _cpu_devices_phrase(len(devices), of=len(jax.local_devices(backend="cpu")))
    else:
        kinds = ", ".join(sorted({f"{d.platform.upper()} {d.device_kind}" for d in devices}))
        what = f"{_plural(len(devices), 'accelerator')} ({kinds}), real devices"
    lines = [
        f"jax {jax.__version__}, {_plural(processes, 'process', 'processes')}",
        f"host: {platform.machine()}, {_plural(os.cpu_count() or 1, 'CPU core')}",
        f"devices: {what}",
    ]
    text = "\n".join(lines)
    print(text)
    return text


def mesh(shape: Sequence[int], axis_names: Sequence[str],
         devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A device mesh with named axes.

    Axes are of type ``Auto``: ``shard_map`` and ``jit`` move inputs to the sharding they need,
    as in JAX's classic sharding tutorials (``jax.make_mesh`` defaults to ``Explicit`` in JAX 0.10).

    Args:
        shape: devices along each axis, e.g. ``(2, 4)``.
        axis_names: one name per axis, e.g. ``("data", "model")``.
        devices: the devices to lay out; defaults to all of ``jax.devices()``.

    Raises:
        ValueError: when the shape does not use exactly the devices given.
    """
    shape = tuple(int(s) for s in shape)
    axis_names = tuple(axis_names)
    if len(shape) != len(axis_names):
        raise ValueError(f"A mesh needs one name per axis: shape {shape} has {len(shape)} axes "
                         f"but {len(axis_names)} names {axis_names} were given.")
    if any(s < 1 for s in shape):
        raise ValueError(f"Every mesh axis needs at least one device, got shape {shape}.")
    devices = list(devices) if devices is not None else jax.devices()
    if int(np.prod(shape)) != len(devices):
        raise ValueError(
            f"A mesh of shape {shape} needs {int(np.prod(shape))} devices, but {len(devices)} "
            f"are available. Choose a shape whose product is {len(devices)}, or call "
            f"clusterlab.device.devices.setup({int(np.prod(shape))}) in a fresh kernel.")
    return jax.make_mesh(shape, axis_names, axis_types=(AxisType.Auto,) * len(shape),
                         devices=devices)


def axis_size(mesh: Mesh, axis_name: str) -> int:
    """Devices along ``axis_name`` of ``mesh``, or a ValueError listing the mesh's axes."""
    if axis_name not in mesh.shape:
        raise ValueError(f"Mesh axis {axis_name!r} is not in the mesh; its axes are "
                         f"{tuple(mesh.axis_names)}. Pass one of them as the axis name.")
    return int(mesh.shape[axis_name])


def check_divides(shape: Sequence[int], mesh: Mesh, spec: PartitionSpec) -> None:
    """Raise a clear error unless every sharded dimension divides by its mesh axes.

    Args:
        shape: the global array shape.
        mesh: the mesh to shard over.
        spec: one entry per leading dimension: an axis name, a tuple of names, or None.
    """
    if len(spec) > len(shape):
        raise ValueError(f"PartitionSpec {spec} has {len(spec)} entries but the array has only "
                         f"{len(shape)} dimension(s) {tuple(shape)}.")
    for dim, axes in enumerate(spec):
        if axes is None:
            continue
        names = axes if isinstance(axes, tuple) else (axes,)
        parts = int(np.prod([axis_size(mesh, a) for a in names]))
        if shape[dim] % parts:
            raise ValueError(
                f"Dimension {dim} of an array of shape {tuple(shape)} has size {shape[dim]}, "
                f"which does not divide into {parts} shards over mesh axes {names}. Make it a "
                f"multiple of {parts} (e.g. {(shape[dim] // parts + 1) * parts}) or use fewer "
                "devices on that axis.")


def shard(x: jax.typing.ArrayLike, mesh: Mesh, spec: PartitionSpec) -> jax.Array:
    """Place ``x`` on ``mesh`` split as ``spec``, after checking that it divides."""
    check_divides(np.shape(x), mesh, spec)
    return jax.device_put(x, NamedSharding(mesh, spec))


def per_device_bytes(tree) -> dict[int, int]:
    """Bytes each device actually holds for a pytree of (sharded) JAX arrays.

    Reads every leaf's ``addressable_shards``: a replicated array counts in full on every device,
    an array split ``p`` ways counts ``1/p`` on each. This is the measurement that
    :func:`clusterlab.analytic.memory.training_memory_per_device` predicts (for the arrays you pass:
    parameters, optimizer state, gradients).

    Args:
        tree: a pytree whose leaves are ``jax.Array`` s (e.g. ``(params, opt_state)``).

    Returns:
        ``{device id: bytes}`` for every device holding a shard of any leaf.
    """
    totals: dict[int, int] = {}
    for leaf in jax.tree_util.tree_leaves(tree):
        shards = getattr(leaf, "addressable_shards", None)
        if shards is None:
            raise ValueError(f"per_device_bytes needs jax.Array leaves, got {type(leaf).__name__}; "
                             "place the tree on devices first (jax.device_put).")
        for shard in shards:
            totals[shard.device.id] = totals.get(shard.device.id, 0) + int(shard.data.nbytes)
    return totals
