"""What a submitted notebook's kernel hands the grader: its answers as plain data.

The grader (:mod:`clusterlab.course.grading`) never judges in the submission's kernel. It appends
one cell that calls :func:`report` with a request, the list of exercise ids to hand over and, for a
code exercise, the programs to export (input shapes and device counts only: no expected value,
no seed, no key path). :func:`report` writes one JSON file the grader reads back:

- a recorded value becomes data (:func:`to_data`): numbers, strings, lists, arrays as nested
  lists with their dtype and shape, ``...`` as a blank; anything else is named by its type;
- a recorded function becomes, per requested export, its program serialized with
  ``jax.export`` (StableHLO bytecode and the output shapes). The grader rebuilds it, runs it on
  its own inputs and mesh and reads the collectives from the program it compiles itself.

Whatever this module writes is only data the submission could have written itself: nothing here
decides a verdict, so a submission that patches it forges nothing but its own answers.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from clusterlab.course import answers

# a program export request: {"wrap": "jit" | "shard_map", "n_devices": int,
#                            "args": [[shape, dtype], ...], "axis": str}
ExportRequest = Mapping[str, object]


def to_data(value) -> object:
    """``value`` as JSON-able data: numbers, strings, lists, dicts with string keys, arrays
    (``{"array": nested lists, "dtype": ..., "shape": ...}``), a blank (``{"blank": true}``);
    anything else is ``{"type": its type name}``."""
    if value is None or value is Ellipsis:   # not answers.is_unanswered: a cell may patch it
        return {"blank": True}
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (np.generic,)):
        return value.item()
    if answers.is_array(value):
        array = np.asarray(value)
        return {"array": array.tolist(), "dtype": str(array.dtype), "shape": list(array.shape)}
    if isinstance(value, (list, tuple)):
        return [to_data(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: to_data(v) for k, v in value.items()}}
    return {"type": type(value).__name__}


def export_program(function: Callable, request: ExportRequest) -> dict:
    """Serialize ``function`` for the shapes and devices of ``request`` with ``jax.export``.

    ``wrap="jit"`` exports ``jax.jit(function)`` as it is (a function that builds its own
    mesh); ``wrap="shard_map"`` exports ``function(*blocks, axis)`` run inside ``jax.shard_map``
    over the first ``n_devices`` devices on a 1-D mesh named ``axis``, every input and the
    output split along dimension 0.

    Returns:
        ``{"mlir": base64 StableHLO bytecode, "nr_devices", "out": [[shape, dtype], ...],
        "single": whether the output is one array, "version": calling convention, "kept": the
        inputs the program reads (``jax.export`` drops those a function never uses)}``.
    """
    import jax  # here: this module is imported by check, which chapters import without JAX
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    structs = [jax.ShapeDtypeStruct(tuple(shape), dtype) for shape, dtype in request["args"]]
    if request["wrap"] == "shard_map":
        axis, n = str(request["axis"]), int(request["n_devices"])
        mesh = Mesh(np.array(jax.devices()[:n]), (axis,))
        target = jax.shard_map(lambda *blocks: function(*blocks, axis), mesh=mesh,
                               in_specs=(P(axis),) * len(structs), out_specs=P(axis))
    else:
        target = function
    jitted = target if hasattr(target, "lower") else jax.jit(target)
    exported = jax.export.export(jitted)(*structs)
    single = exported.out_tree == jax.tree_util.tree_structure(0)
    return {"mlir": base64.b64encode(bytes(exported.mlir_module_serialized)).decode(),
            "nr_devices": exported.nr_devices, "single": single,
            "out": [[list(a.shape), str(a.dtype)] for a in exported.out_avals],
            "effects": bool(exported.ordered_effects or exported.unordered_effects),
            "version": exported.calling_convention_version,
            "kept": [int(i) for i in exported.module_kept_var_idx]}


def export_answer(value, exports: Sequence[ExportRequest]) -> object:
    """One recorded answer as data: ``to_data(value)``, or for a code exercise (``exports``
    given) and a callable ``value``, ``{"programs": [export_program(...) or {"error": ...}]}``."""
    if not exports or value is None or value is Ellipsis:
        return to_data(value)
    if not callable(value) or answers.is_array(value):      # a jax.Array is callable (it indexes)
        return {"type": type(value).__name__}
    programs = []
    for request in exports:
        try:
            programs.append(export_program(value, request))
        except Exception as error:  # the student's function failing to trace is their verdict
            message = str(error).splitlines()[0][:200] if str(error) else ""
            programs.append({"error": f"your function raised {type(error).__name__}: "
                                      f"{message}"})
    return {"programs": programs}


def report(request: str, out_path: str) -> None:
    """Write the recorded answers the grader asks for to ``out_path`` as JSON.

    Args:
        request: JSON ``{exercise id: [export request, ...]}`` (an empty list for a value).
        out_path: the file the grader reads back.
    """
    global _exporting
    recorded = answers.recorded_answers()
    asked = json.loads(request)
    _exporting = True
    if "jax" in sys.modules:   # no program traced by a cell is reused: each answer is traced anew
        sys.modules["jax"].clear_caches()
    data = {i: export_answer(recorded[i], exports) for i, exports in asked.items()
            if i in recorded}
    Path(out_path).write_text(json.dumps(data))


class ReferenceWithheld(RuntimeError):
    """A submission's answer called the course's own solution of an exercise being graded."""


# True once report() exports the answers: from then on the notebook's code runs only as the
# functions it recorded, and a withheld function refuses it. Before, the lab's own cells call
# them (lab 13's public test calls the layer's combine) and run as in the lab.
_exporting = False


def refuse_unless_library(qualified_name: str) -> None:
    """The first statement of a withheld function in the sandbox
    (:func:`clusterlab.course.sandbox.withheld_binds`). While :func:`report` exports the
    answers, a call made on behalf of the notebook gets :class:`ReferenceWithheld` saying why;
    a call the library makes itself (the ring all-reduce calling the ring reduce-scatter,
    ``context.make_ring_attention``'s program handing ``ring_attention`` to JAX) goes on.

    Who calls is the first frame above the withheld function that is not JAX's (JAX traces
    through frames of its own between ``shard_map`` and the function it runs). It
    must be a module of the library outside ``clusterlab.course``: the course's export code
    calls whatever function the notebook recorded, the library's own included.

    Raises:
        ReferenceWithheld: when the answers are being exported and the caller is not a module of
            the library.
    """
    if not _exporting:
        return
    module, _, function = qualified_name.rpartition(".")
    frame = sys._getframe(1)      # the withheld function's own frame, however it was reached
    while frame is not None and not (frame.f_code.co_name == function
                                     and frame.f_globals.get("__name__") == module):
        frame = frame.f_back
    if frame is not None and _library_caller(frame.f_back):
        return
    raise ReferenceWithheld(
        f"{qualified_name} is the course's own solution to an exercise being graded; while "
        "grading it refuses to run for a notebook. Call the function you wrote.")


def _library_caller(frame) -> bool:
    """Whether the first frame from ``frame`` outwards that is not JAX's belongs to the library
    outside ``clusterlab.course`` (a notebook cell's frame has no file path)."""
    library = Path(__file__).resolve().parent.parent
    jax_code = [Path(sys.modules[name].__file__).resolve().parent
                for name in ("jax", "jaxlib") if name in sys.modules]
    while frame is not None:
        file = Path(frame.f_code.co_filename)
        file = file.resolve() if file.is_absolute() else file
        if not any(file.is_relative_to(folder) for folder in jax_code):
            return file.is_relative_to(library) and not file.is_relative_to(library / "course")
        frame = frame.f_back
    return False


class CellTimeout(Exception):
    """A cell ran past the grader's per-cell limit (raised inside it, so the next cell runs)."""


def run_notebook(notebook: str, request: str, out_path: str, cell_timeout_s: float) -> None:
    """Run every code cell of ``notebook`` in order, errors allowed, then :func:`report`.

    This is the program the sandbox runs (``python -m clusterlab.course.submission``): an IPython
    shell (magics work), no Jupyter kernel or socket, so the sandbox needs no network.

    Args:
        notebook: the submission's copy.
        request: JSON as :func:`report` takes it.
        out_path: where :func:`report` writes.
        cell_timeout_s: the longest one cell may run; past it the cell is interrupted.
    """
    import signal

    import nbformat
    from IPython.core.interactiveshell import InteractiveShell

    def interrupt(_signum, _frame):
        raise CellTimeout(f"the cell ran past {cell_timeout_s:g} s")

    shell = InteractiveShell.instance()
    signal.signal(signal.SIGALRM, interrupt)
    main_process = os.getpid()
    for cell in nbformat.read(notebook, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        signal.setitimer(signal.ITIMER_REAL, cell_timeout_s)
        try:
            error = shell.run_cell(cell.source, store_history=False).error_in_exec
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if os.getpid() != main_process:      # a process the cell forked: it grades nothing
            os._exit(0)
        fatal = next((why for kind, why in _FATAL.items() if isinstance(error, kind)), None)
        if fatal:
            print(f"clusterlab: {fatal}", file=sys.stderr)
            sys.exit(3)
    report(request, out_path)


# errors after which the submission is ended, not graded on: it hit a limit of its sandbox
_FATAL = {MemoryError: "a cell ran out of the sandbox's memory limit",
          BlockingIOError: "a cell hit the sandbox's process limit (a fork bomb?)"}

if __name__ == "__main__":
    # run as the module the withheld functions import, not as __main__, a second copy of it
    # whose _exporting they would never see
    from clusterlab.course import submission

    submission.run_notebook(sys.argv[1], Path(sys.argv[2]).read_text(), sys.argv[3],
                            float(sys.argv[4]))
