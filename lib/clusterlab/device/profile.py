"""Reading a profile: a ``jax.profiler`` trace read into compute, communication and waiting.

A trace is the first thing to look at when a step is slow. :func:`capture` runs a jitted step a
few times under ``jax.profiler.trace`` and returns the Chrome/Perfetto trace file it wrote
(``plugins/profile/<run>/<host>.trace.json.gz``: ``traceEvents``, complete events ``ph: "X"``
with ``pid``/``tid`` and ``ts``/``dur`` in microseconds). :func:`read_trace` turns it into a
:class:`Profile`: per device, the time in compute, in collectives, waiting at a collective's
rendezvous, and idle, which add up to the wall time of the steps.

Two formats of device events are read:

- **XLA:CPU** (simulated devices; jax/jaxlib 0.10.2, read from real traces). With
  ``--xla_cpu_enable_xprof_traceme=true`` in ``XLA_FLAGS`` before JAX creates its backends
  (:func:`enable_cpu_op_events`), the thunk executor emits one event per HLO instruction with
  ``args`` ``device_ordinal``, ``hlo_op``, ``hlo_module`` and ``run_id`` (one ``run_id`` per
  step). A device's ops run on whichever pool thread is free, so events are grouped by
  ``device_ordinal``, not by thread. A collective waits for its peers inside a ``Rendezvous``
  event, in pieces named ``Wait: pending_threads=k/n`` (k of the n participants still missing),
  on the thread of the collective's event; the last to arrive runs ``InvokeRendezvous`` and does
  not wait. Those pieces are the waiting time.
- **GPU** (the format the JAX/XProf trace viewer writes: one process per GPU named
  ``/device:GPU:<n>``, one thread per CUDA stream named ``Stream #<id>(...)``, plus derived
  lines such as ``XLA Ops`` and ``XLA Modules`` that repeat the kernels and are skipped). NCCL
  kernels (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``, ``ncclKernel_AllGather_...``) are the
  collectives. A NCCL kernel waits for its slowest peer *inside* the kernel, so a GPU trace
  cannot split waiting from transfer: its waiting shows as longer collectives on the devices
  that arrived early. **No real GPU trace has been read by this module yet**: the GPU branch is
  tested on a trace constructed in that format (tests/test_profile.py), not on one a GPU wrote.

The accounting, per device, over the union of the steps' windows (first to last device event of
each step, across all devices): *compute* is the time any non-collective op of the device runs;
*collective* is the time a collective runs and no compute does (exposed communication), less
*waiting*, the part of it spent at a rendezvous; *idle* is the rest. So compute + collective +
waiting + idle = wall exactly; *overlap* (a collective running while compute runs on the same
device, counted under compute) is reported beside them.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

import jax

from clusterlab.device import hlo
from clusterlab.device.devices import _backends_initialized

CPU_OP_EVENTS_FLAG = "--xla_cpu_enable_xprof_traceme=true"

# Collective kinds by name, after lower-casing and dropping "-" and "_": XLA opcodes and JAX
# primitive names (all-reduce.3, psum_invariant.7, all-gather-start), NCCL kernels
# (ncclDevKernel_AllReduce_Sum_f32_RING_LL, ncclDevKernel_SendRecv). Order matters:
# reduce-scatter before all-reduce ("psumscatter" contains "psum").
_KIND_PATTERNS = (
    ("reduce-scatter", ("reducescatter", "psumscatter")),
    ("all-reduce", ("allreduce", "psum")),
    ("all-gather", ("allgather",)),
    ("all-to-all", ("alltoall",)),
    ("collective-permute", ("collectivepermute", "ppermute", "sendrecv")),
    ("collective-broadcast", ("collectivebroadcast", "nccldevkernelbroadcast",
                              "ncclkernelbroadcast")),
)
_RENDEZVOUS_WAIT = re.compile(r"^Wait: pending_threads=\d+/\d+")
_GPU_PROCESS = re.compile(r"^/device:GPU:(\d+)")
_GPU_STREAM = re.compile(r"^Stream #")

Interval = tuple[float, float]  # (start_us, end_us)


class TraceError(ValueError):
    """A trace file is missing, empty, or holds no device events this module can read."""


class OpEvent(NamedTuple):
    """One op a device ran, from the trace.

    Attributes:
        device: ``"cpu:3"`` or ``"gpu:0"``.
        name: the HLO instruction or kernel name, e.g. ``"all-reduce.1"``.
        kind: ``"compute"`` or the collective's kind (``"all-reduce"``, ...).
        start_us: start, microseconds on the trace's clock.
        dur_us: duration, microseconds.
        step: the step (``run_id``) it belongs to, or ``None`` where the trace has none.
        thread: ``(pid, tid)`` it ran on.
    """

    device: str
    name: str
    kind: str
    start_us: float
    dur_us: float
    step: str | None
    thread: tuple[int, int]

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclass(frozen=True)
class DeviceTime:
    """Where one device's wall time went; seconds, summed over the traced steps.

    ``compute_s + collective_s + waiting_s + idle_s == wall_s`` (to rounding).
    """

    device: str
    wall_s: float        # the union of the steps' windows (same for every device of a trace)
    compute_s: float     # any non-collective op of this device running
    collective_s: float  # a collective running, no compute, not waiting: exposed communication
    waiting_s: float     # inside a collective, waiting for peers at its rendezvous (CPU only)
    idle_s: float        # nothing of this device running
    overlap_s: float     # a collective running while compute runs (counted in compute_s)
    n_collectives: int   # collective op events (per step: divide by Profile.n_steps)

    def fractions(self) -> dict[str, float]:
        """Compute, collective, waiting and idle as fractions of the wall time (they sum to 1)."""
        return {name: getattr(self, f"{name}_s") / self.wall_s
                for name in ("compute", "collective", "waiting", "idle")}


@dataclass(frozen=True)
class Profile:
    """A trace read per device: see the module docstring for the accounting."""

    devices: tuple[DeviceTime, ...]
    ops: tuple[OpEvent, ...]       # every device op, in start order (for timelines)
    waits: tuple[tuple[str, float, float], ...]  # (device, start_us, end_us) rendezvous waits
    n_steps: int                   # distinct run_ids (1 where the trace has none)
    wall_s: float
    source: str                    # "xla-cpu" or "gpu"

    def device(self, name: str) -> DeviceTime:
        """The :class:`DeviceTime` of ``name`` (``"cpu:0"``, ``"gpu:1"``)."""
        for d in self.devices:
            if d.device == name:
                return d
        raise KeyError(f"No device {name!r} in this profile; it has "
                       f"{[d.device for d in self.devices]}.")

    def steps(self) -> tuple[Profile, ...]:
        """One profile per traced step, in the order they started."""
        groups: dict[str | None, list[OpEvent]] = {}
        for op in self.ops:
            groups.setdefault(op.step, []).append(op)
        out = []
        for ops in sorted(groups.values(), key=lambda group: group[0].start_us):
            start, end = ops[0].start_us, max(op.end_us for op in ops)
            waits = [w for w in self.waits if start <= w[1] <= end]
            out.append(_account(ops, waits, self.source))
        return tuple(out)

    def table(self) -> str:
        """A text table, one row per device, times in ms per step."""
        per = 1e3 / self.n_steps
        rows = [f"{'device':>7} {'compute':>8} {'collective':>10} {'waiting':>8} {'idle':>7} "
                f"{'overlap':>8}   ms per step ({self.n_steps} steps, {self.source})"]
        for d in self.devices:
            rows.append(f"{d.device:>7} {d.compute_s * per:>8.2f} {d.collective_s * per:>10.2f} "
                        f"{d.waiting_s * per:>8.2f} {d.idle_s * per:>7.2f} "
                        f"{d.overlap_s * per:>8.2f}")
        return "\n".join(rows)


# ---------------------------------------------------------------------------------- capturing

def enable_cpu_op_events() -> None:
    """Ask XLA:CPU for one trace event per op (``--xla_cpu_enable_xprof_traceme=true``).

    Call it in a lab's first cell, before :func:`clusterlab.device.devices.setup`: XLA reads
    ``XLA_FLAGS`` when JAX creates its backends. Calling it again is harmless.

    Raises:
        RuntimeError: when JAX's backends already exist without the flag (restart the kernel).
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if CPU_OP_EVENTS_FLAG in flags.split():
        return
    if _backends_initialized():
        raise RuntimeError(
            "JAX already created its backends, so XLA will not read a new XLA_FLAGS: restart "
            "the kernel and call clusterlab.device.profile.enable_cpu_op_events() before "
            "clusterlab.device.devices.setup(...) and any other JAX operation.")
    os.environ["XLA_FLAGS"] = f"{flags} {CPU_OP_EVENTS_FLAG}".strip()


def capture(step: Callable[..., object], *args, steps: int = 3,
            log_dir: str | os.PathLike | None = None) -> Path:
    """Run ``step(*args)`` once to compile, then ``steps`` times under ``jax.profiler.trace``.

    Each step is waited for (``jax.block_until_ready``) before the next starts, so steps do not
    overlap in the trace.

    Args:
        step: a jitted function.
        *args: its arguments.
        steps: how many steps to trace (at least 1).
        log_dir: where the profiler writes; a new temporary directory if ``None``.

    Returns:
        The path of the trace file (``*.trace.json.gz``) it wrote.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"capture(steps=...) needs a whole number >= 1, got {steps!r}.")
    log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="trace-"))
    jax.block_until_ready(step(*args))  # compile outside the trace
    with jax.profiler.trace(str(log_dir)):
        for _ in range(steps):
            jax.block_until_ready(step(*args))
    return find_trace(log_dir)


def capture_programs(programs: Mapping[str, tuple[Callable[..., object], tuple]], *,
                     steps: int = 2, log_dir: str | os.PathLike | None = None) -> Path:
    """Like :func:`capture`, for several programs in one profiling session (one start-up).

    Each program is compiled and run once first, then run ``steps`` times, one program after
    the other, under one ``jax.profiler.trace``. Read one of them with
    ``read_trace(path, module="jit_<its function's name>")``: give the functions distinct
    names.

    Args:
        programs: label -> ``(jitted function, its arguments)``.
        steps: how many steps of each to trace (at least 1).
        log_dir: where the profiler writes; a new temporary directory if ``None``.

    Returns:
        The path of the trace file.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"capture_programs(steps=...) needs a whole number >= 1, got {steps!r}.")
    if not programs:
        raise ValueError("capture_programs needs at least one (function, arguments) pair.")
    log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="trace-"))
    for step, args in programs.values():
        jax.block_until_ready(step(*args))  # compile outside the trace
    with jax.profiler.trace(str(log_dir)):
        for step, args in programs.values():
            for _ in range(steps):
                jax.block_until_ready(step(*args))
    return find_trace(log_dir)


def find_trace(log_dir: str | os.PathLike) -> Path:
    """The newest Chrome/Perfetto trace file under ``log_dir`` (as ``jax.profiler`` lays it out).

    Raises:
        TraceError: when the directory does not exist or holds no ``*.trace.json[.gz]`` or
            ``perfetto_trace.json[.gz]``.
    """
    root = Path(log_dir)
    if not root.is_dir():
        raise TraceError(f"No trace directory {root}: capture one with "
                         "clusterlab.device.profile.capture(step, *args) or jax.profiler.trace(dir).")
    found = [p for pattern in ("*.trace.json.gz", "*.trace.json", "perfetto_trace.json.gz",
                               "perfetto_trace.json") for p in root.rglob(pattern)]
    if not found:
        raise TraceError(f"{root} holds no trace file (*.trace.json.gz): was jax.profiler.trace "
                         "run with this directory, and did the traced code run?")
    return max(found, key=lambda p: p.stat().st_mtime)


# ------------------------------------------------------------------------------------ reading

def load_events(path: str | os.PathLike) -> tuple[list[dict], dict[int, str], dict[tuple, str]]:
    """The complete events of a trace file, with its process and thread names.

    Args:
        path: a ``.json`` or ``.json.gz`` Chrome trace (an object with ``traceEvents``, or a
            bare list of events).

    Returns:
        ``(events, process_names, thread_names)``: the ``ph == "X"`` events; ``pid -> name``;
        ``(pid, tid) -> name``.

    Raises:
        TraceError: a missing file, one that is not a trace, or one with no complete events.
    """
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"No trace file {path}: pass the path clusterlab.device.profile.capture or "
                         "find_trace returned.")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        raise TraceError(f"{path} is not a JSON trace ({error}).") from error
    raw = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(raw, list):
        raise TraceError(f"{path} has no traceEvents list: not a Chrome/Perfetto trace.")
    process_names = {e["pid"]: e["args"]["name"] for e in raw
                     if e.get("ph") == "M" and e.get("name") == "process_name"}
    thread_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in raw
                    if e.get("ph") == "M" and e.get("name") == "thread_name"}
    events = [e for e in raw if e.get("ph") == "X" and "dur" in e and "ts" in e]
    if not events:
        raise TraceError(f"{path} holds no complete events (ph 'X'): an empty trace. Did the "
                         "traced code run inside jax.profiler.trace?")
    return events, process_names, thread_names


def collective_kind(name: str) -> str | None:
    """The collective an op or kernel name stands for, or ``None`` for compute.

    ``"all-reduce.3"``, ``"psum_invariant.7"`` and ``"ncclDevKernel_AllReduce_Sum_f32_RING_LL"``
    are all-reduces; ``"ncclDevKernel_SendRecv"`` is a collective-permute.
    """
    key = re.sub(r"[-_\s]", "", name).lower()
    for kind, needles in _KIND_PATTERNS:
        if any(n in key for n in needles):
            return kind
    return None


def _hlo_kinds(hlo_texts: Iterable[str]) -> dict[str, str]:
    """Instruction name -> "compute" or collective kind, from compiled HLO texts."""
    kinds = {}
    for text in hlo_texts:
        for ins in hlo.hlo_instructions(text):
            opcode = ins.opcode.removesuffix("-start").removesuffix("-done")
            kinds[ins.name] = opcode if opcode in hlo.COLLECTIVE_KINDS else "compute"
    return kinds


def _device_ops(events: list[dict], process_names: dict[int, str],
                thread_names: dict[tuple, str], kinds: dict[str, str]) -> tuple[list[OpEvent], str]:
    ops, source = [], None
    for e in events:
        args = e.get("args") or {}
        thread = (e.get("pid"), e.get("tid"))
        if "device_ordinal" in args and "hlo_op" in args:  # XLA:CPU's thunk executor
            device, name, step, src = f"cpu:{args['device_ordinal']}", args["hlo_op"], \
                str(args.get("run_id")), "xla-cpu"
        else:
            match = _GPU_PROCESS.match(process_names.get(e.get("pid"), ""))
            thread_name = thread_names.get(thread)
            if not match or (thread_name is not None and not _GPU_STREAM.match(thread_name)):
                continue  # host events, or a GPU's derived lines (XLA Ops, XLA Modules, ...)
            device, name, step, src = f"gpu:{match.group(1)}", e["name"], None, "gpu"
        source = source or src
        if src != source:
            raise TraceError("The trace mixes XLA:CPU device events and GPU device events; "
                             "read one platform's trace at a time.")
        kind = kinds.get(name) or collective_kind(name) or "compute"
        ops.append(OpEvent(device, name, kind, float(e["ts"]), float(e["dur"]), step, thread))
    ops.sort(key=lambda op: op.start_us)
    return _without_containers(ops), source


def _without_containers(ops: list[OpEvent]) -> list[OpEvent]:
    """Drop ops that hold others (a loop's or conditional's event around its body's ops).

    One thread runs one thing at a time, so two events of a thread that overlap are nested: the
    outer one is control flow whose time its inner ops already account for.
    """
    last_on_thread: dict[tuple, tuple[int, OpEvent]] = {}
    containers = set()
    for index, op in enumerate(ops):  # in start order
        previous = last_on_thread.get(op.thread)
        if previous is not None and op.start_us < previous[1].end_us:
            containers.add(previous[0])
        if previous is None or op.end_us > previous[1].end_us or previous[0] in containers:
            last_on_thread[op.thread] = (index, op)
    return [op for index, op in enumerate(ops) if index not in containers]


def _waits(events: list[dict], ops: list[OpEvent]) -> list[tuple[str, float, float]]:
    """Rendezvous waits, each given to the collective op that holds it on the same thread."""
    collectives_by_thread: dict[tuple, list[OpEvent]] = {}
    for op in ops:
        if op.kind != "compute":
            collectives_by_thread.setdefault(op.thread, []).append(op)
    out = []
    for e in events:
        if not _RENDEZVOUS_WAIT.match(e.get("name", "")):
            continue
        start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        for op in collectives_by_thread.get((e.get("pid"), e.get("tid")), ()):
            if op.start_us <= start and end <= op.end_us:
                out.append((op.device, start, end))
                break
    return out


def _union(intervals: Iterable[Interval]) -> list[Interval]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def _length(intervals: Sequence[Interval]) -> float:
    return sum(e - s for s, e in intervals)


def _intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Intersection of two unions (each sorted, disjoint)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def read_trace(path: str | os.PathLike, *, hlo_texts: Iterable[str] = (),
               module: str | None = None) -> Profile:
    """Read a trace file into per-device compute, collective, waiting and idle time.

    Args:
        path: the trace file (:func:`capture` or :func:`find_trace` gives it).
        hlo_texts: compiled HLO texts of the traced programs (``hlo.compiled_text``); where
            given, an op is a collective when the compiled program says its opcode is one, not
            by its name (XLA:CPU names an all-reduce ``all-reduce.1`` or ``psum_invariant.7``).
        module: keep only the ops of this compiled module (the ``hlo_module`` XLA:CPU's events
            carry: ``"jit_<function name>"``), to read one program of a trace that ran several
            (:func:`capture_programs`). GPU kernel events carry no module and are then dropped.

    Returns:
        The :class:`Profile`, devices in name order.

    Raises:
        TraceError: missing or empty trace, or one without device events (on CPU: was
            ``enable_cpu_op_events()`` called before JAX started?).
    """
    events, process_names, thread_names = load_events(path)
    ops, source = _device_ops(events, process_names, thread_names, _hlo_kinds(hlo_texts))
    if module is not None:
        modules = {e["args"]["hlo_module"] for e in events if "hlo_module" in (e.get("args") or {})}
        if module not in modules:
            raise TraceError(f"No ops of module {module!r} in {path}; it holds "
                             f"{sorted(modules) or 'no module names'}.")
        kept = {(e.get("pid"), e.get("tid"), float(e["ts"])) for e in events
                if (e.get("args") or {}).get("hlo_module") == module}
        ops = [op for op in ops if (*op.thread, op.start_us) in kept]
    if not ops:
        raise TraceError(
            f"{path} holds no device op events. On simulated CPU devices XLA emits them only "
            f"with {CPU_OP_EVENTS_FLAG} in XLA_FLAGS before JAX starts: call "
            "clusterlab.device.profile.enable_cpu_op_events() before devices.setup(...) (restart the "
            "kernel first). A GPU trace needs processes named /device:GPU:<n>.")
    return _account(ops, _waits(events, ops), source)


def _account(ops: Sequence[OpEvent], waits: Sequence[tuple[str, float, float]],
             source: str) -> Profile:
    """The per-device accounting of the module docstring, over the steps' windows."""
    by_step: dict[str | None, list[OpEvent]] = {}
    for op in ops:
        by_step.setdefault(op.step, []).append(op)
    windows = _union((min(op.start_us for op in group), max(op.end_us for op in group))
                     for group in by_step.values())
    wall_us = _length(windows)
    rows = []
    for device in sorted({op.device for op in ops}, key=_device_order):
        mine = [op for op in ops if op.device == device]
        compute = _union((op.start_us, op.end_us) for op in mine if op.kind == "compute")
        collective = _union((op.start_us, op.end_us) for op in mine if op.kind != "compute")
        overlap_us = _length(_intersect(compute, collective))
        exposed_us = _length(collective) - overlap_us
        wait = _union((s, e) for d, s, e in waits if d == device)
        waiting_us = _length(wait) - _length(_intersect(wait, compute))
        busy_us = _length(_union(compute + collective))
        rows.append(DeviceTime(
            device=device, wall_s=wall_us * 1e-6, compute_s=_length(compute) * 1e-6,
            collective_s=(exposed_us - waiting_us) * 1e-6, waiting_s=waiting_us * 1e-6,
            idle_s=(wall_us - busy_us) * 1e-6, overlap_s=overlap_us * 1e-6,
            n_collectives=sum(op.kind != "compute" for op in mine)))
    return Profile(devices=tuple(rows), ops=tuple(ops), waits=tuple(waits),
                   n_steps=len(by_step), wall_s=wall_us * 1e-6, source=source)


def _device_order(name: str) -> tuple[str, int]:
    platform, _, index = name.partition(":")
    return platform, int(index)


# ----------------------------------------------------------------------------------- reading it

def straggler(profile: Profile, *, wait_ratio: float = 5.0,
              compute_ratio: float = 1.0, explained: float = 0.5,
              min_wait_share: float = 0.4) -> str | None:
    """The device every other one waits for; ``None`` when there is none.

    A straggler arrives last at the collective: it waits least, and every other device waits
    for it. Over the traced steps, the device that waits least is a straggler when every other
    device waits at least ``wait_ratio`` times as long, its compute (busy time that is not a
    collective) is at least ``compute_ratio`` times the median of the others' (it is late
    because it had more to do, not because it skipped work), and it is the one that waits least
    in every step, so that one step's hiccup (a thread of a loaded host descheduled) is not
    taken for a slow device. On XLA:CPU the wait is the rendezvous's (``waiting_s``); on a GPU
    it is inside the NCCL kernel, so there the exposed collective time (``collective_s``)
    stands for it. The compute contrast is mild on purpose: on a loaded host every device's
    compute time includes the time its threads were descheduled, which blurs it; the wait is
    the sharp signal. But the wait alone is not enough: with more simulated devices than cores,
    a balanced step has a device that is started last in every step, and the others wait for
    it although it has no more to do, or its thread is descheduled and its ops run long. So its
    compute beyond the others' median must also explain at least ``explained`` of the shortest
    wait of any other device, and that wait must be material: at least ``min_wait_share`` of
    the others' median compute (a skew small beside the work is the host's scheduling).

    Args:
        profile: a read trace with at least two devices.
        wait_ratio: how much longer every other device must wait (> 1).
        compute_ratio: how much more than the others' median it must compute (>= 1).
        explained: the share of the others' shortest wait that its extra compute must account
            for (in (0, 1]).
        min_wait_share: the others' shortest wait as a share of their median compute (> 0).
    """
    if wait_ratio <= 1 or compute_ratio < 1 or not 0 < explained <= 1 or min_wait_share <= 0:
        raise ValueError(f"straggler needs wait_ratio > 1, compute_ratio >= 1, 0 < explained <= 1 "
                         f"and min_wait_share > 0, got {wait_ratio}, {compute_ratio}, {explained} "
                         f"and {min_wait_share}.")
    if len(profile.devices) < 2:
        raise ValueError("A straggler needs at least two devices in the profile.")
    waited = (lambda d: d.waiting_s) if profile.source == "xla-cpu" else (lambda d: d.collective_s)
    last = min(profile.devices, key=waited)
    others = [d for d in profile.devices if d is not last]
    others_compute = sorted(d.compute_s for d in others)
    median = others_compute[len(others_compute) // 2]
    if last.compute_s < compute_ratio * median or any(
            waited(d) < wait_ratio * waited(last) for d in others):
        return None
    shortest_wait = min(waited(d) for d in others)
    if last.compute_s - median < explained * shortest_wait or shortest_wait < min_wait_share * median:
        return None  # not for work it had and they did not, or too little to matter
    if any(min(step.devices, key=waited).device != last.device for step in profile.steps()):
        return None
    return last.device


def overlapped_collectives(profile: Profile, *, min_overlap_us: float = 1.0) -> list[OpEvent]:
    """The collective ops during which compute of the same device ran for ``min_overlap_us``.

    The trace's answer to "did the compiler overlap this communication with compute?".
    """
    out = []
    for device in profile.devices:
        mine = [op for op in profile.ops if op.device == device.device]
        compute = _union((op.start_us, op.end_us) for op in mine if op.kind == "compute")
        for op in mine:
            if op.kind != "compute" and _length(
                    _intersect([(op.start_us, op.end_us)], compute)) >= min_overlap_us:
                out.append(op)
    return out
