"""Grading lab exercises from an instructor-only key, outside the submission's reach.

A lab's exercise cells record answers with :func:`clusterlab.course.check.answer` and carry no
expected value. The expected values, tolerances and hints live in a key, ``keys/labNN.py`` at
the repository root, which student copies leave out (``make student`` writes notebooks only).
A key is a Python module with one dictionary, ``KEY``, from exercise id to :class:`Exercise`::

    from clusterlab.analytic import costmodel
    from clusterlab.course import grading

    KEY = {
        # a value: expected from library calls, compared within a relative tolerance
        "lab01.1": grading.close(costmodel.collective_steps_and_bytes("all_gather", 2**24, 8)[1],
                                 name="bytes sent per device", hint="Count the blocks."),
        # a value the lab itself computes: a recipe of the lab's namespace, evaluated in the
        # INSTRUCTOR's copy of the lab (labs/NN-*.ipynb), never in the submission
        "lab03.1": grading.close(lambda ns: costmodel.data_parallel_bytes_per_step(
                                     ns["n_params"], 2, 16), name="bytes", hint="..."),
        # a function the student wrote (an assignment): exported by the submission's kernel for
        # the shapes and device counts of ``exports``, judged here on the rehydrated programs
        "lab00.3": grading.code(check_global_max, name="global maximum", hint="...",
                                exports=[grading.Export(args=[((64,), "float32")])]),
    }

How a submission is graded (:func:`grade_notebook`, ``python -m clusterlab grade``):

1. The grader copies the submission into a temporary folder and runs it, cell by cell, errors
   allowed, in a sandbox (:mod:`clusterlab.course.sandbox`: bubblewrap, no network, no keys, no
   other submission, CPU-time, memory, process and wall-clock limits). The kernel is told no key
   path: ``check.answer`` there only records.
2. Its last cell, added by the grader, calls :func:`clusterlab.course.submission.report` with a
   request ``{exercise id: [export request, ...]}``: the ids to hand over and, for a code exercise,
   each :class:`Export` (``wrap``, ``n_devices``, ``args`` as shapes and dtypes, ``axis``) and
   nothing else (no expected value, seed or path). The kernel writes DATA: each recorded value as
   JSON (numbers, strings, lists, arrays with dtype and shape, a blank), each recorded function as
   its ``jax.export`` StableHLO bytecode per export.
3. This process, with its own ``clusterlab`` and its own keys, reads that file and judges every
   exercise of the key. A code exercise's programs are rebuilt as :class:`Program` (refusing
   effects and custom calls other than sharding markers) and run in a child process with CPU,
   memory, output and wall-clock limits (:func:`judge_programs_apart`), on hidden inputs drawn
   afresh each run (:func:`hidden_seed`). Recipes of the lab's namespace are evaluated once per
   grading run in the instructor's copy of the lab (:func:`reference_values`).

The library's own implementation of what a code exercise asks for (``references`` of
:func:`code`) refuses, in the sandbox, to run for the answers the notebook hands over, whether
the notebook calls it or JAX does while tracing the notebook's function; the lab's own cells,
which run before, still use it. The grader also refuses a program whose recorded call stack
names one (:func:`program_frames`), so patching the sandbox's guard away earns nothing either.

Whatever the submission runs (a replaced ``judge_all``, a patched ``check``, ``numpy`` or
``jax``, a printed verdict line) changes only the data it hands over, never how it is judged.

Writing an assignment (labs 03-06 follow lab 02's ``lab02.3``/``lab02.4``): the student writes a
function ``f(*blocks, axis_name)`` that runs inside ``shard_map``; the key declares
``grading.code(checker, name=..., hint=..., exports=[Export(wrap="shard_map", n_devices=n,
args=[(shape, dtype), ...]) for each hidden case])``; the kernel exports
``shard_map(lambda *b: f(*b, axis), mesh=1-D mesh of the first n devices named axis,
in_specs=P(axis) for every input, out_specs=P(axis))``; ``checker(programs)`` receives one
:class:`Program` per export, in order: call it on the grader's own random inputs
(``program(*arrays)`` places them on the grader's mesh of ``n_devices``), compare with a
reference (:func:`require_close`), and read its collectives (:meth:`Program.collectives`,
:func:`require_collectives`); raise :class:`Refused` naming the failed test and a hint.

Why not otter-grader or nbgrader: both keep their tests in notebook cells of their own format
and generate the student and autograder copies from it, which duplicates the book's gated
``solution-start``/``-end`` exercises and the stored outputs nbval compares; nbgrader adds a
database and Jupyter server extensions, otter-grader runs its grading in Docker by default.
Neither inspects a compiled JAX program.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import io
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from clusterlab.course import answers, sandbox, submission, verification
from clusterlab.device import hlo

KEYS_ENV = "CLUSTERLAB_KEYS"
SEED_ENV = "CLUSTERLAB_GRADING_SEED"
# a lab's key, labNN.py, or a chapter's, chNN.py (ch04b.py)
_KEY_FILE = re.compile(r"^(lab\d\d|ch\d\d[a-z]?)\.py$")
_LAB_IN_NAME = re.compile(r"(?:^|[^0-9])(\d\d)-")
# custom calls a shard_map or a sharding constraint lowers to; any other target in a submitted
# program (a host callback, a registered FFI handler) would run code of its choosing here
_SAFE_CUSTOM_CALLS = re.compile(r"^(Sharding|SPMDFullToShardShape|SPMDShardToFullShape|"
                                r"xla\.sdy\.[A-Za-z_]+)$")
_CUSTOM_CALL = re.compile(r'custom_call\s*@([\w.$-]+)|call_target_name\s*=\s*"([^"]*)"')


class Refused(Exception):
    """A code checker's reason for refusing a student's function (shown in the ✗ line)."""


@dataclass(frozen=True)
class Export:
    """One program a code exercise asks the submission's kernel to export.

    Attributes:
        args: the inputs' (shape, dtype), e.g. ``[((64,), "float32")]``; for
            ``wrap="shard_map"`` the GLOBAL shapes, split along dimension 0 over the devices.
        n_devices: the devices the program runs on (for ``"jit"``, those of the mesh the
            student's function builds itself).
        wrap: ``"jit"`` exports the function as it is; ``"shard_map"`` exports
            ``function(*blocks, axis)`` inside ``shard_map`` over ``n_devices`` devices.
        axis: the mesh axis name of ``"shard_map"``.
    """

    args: Sequence[tuple[Sequence[int], str]]
    n_devices: int = 8
    wrap: Literal["jit", "shard_map"] = "jit"
    axis: str = "ring"

    def request(self) -> dict:
        """The request the kernel receives: shapes and device counts only."""
        return {"wrap": self.wrap, "n_devices": self.n_devices, "axis": self.axis,
                "args": [[list(shape), str(dtype)] for shape, dtype in self.args]}


@dataclass(frozen=True)
class Exercise:
    """One exercise of a key.

    Attributes:
        name: what the answer is, for the verdict line ("bytes sent per device").
        judge: ``judge(answer, expected) -> (passed, line)``; ``answer`` as the grader rebuilt
            it from the kernel's data (a value, or a list of :class:`Program`), ``expected``
            the resolved expected value (None for a code exercise).
        expected: the expected value, or a recipe ``expected(namespace)`` of the lab's globals.
        exports: for a code exercise, the programs to export.
        references: the course's own implementations of what a code exercise asks for, by
            qualified name: while a submission's answers are exported they refuse to run
            for them.
    """

    name: str
    judge: Callable[[object, object], tuple[bool, str]]
    expected: object = None
    exports: tuple[Export, ...] = field(default=())
    references: tuple[str, ...] = field(default=())

    @property
    def is_recipe(self) -> bool:
        """Whether the expected value is a recipe of the lab's namespace."""
        return callable(self.expected)


@dataclass(frozen=True)
class Verdict:
    """The verdict on one exercise: its id, whether it passed, and its one-line message."""

    exercise_id: str
    passed: bool
    line: str


def close(expected, *, name: str, hint: str = "", rtol: float = 1e-3,
          atol: float = 0.0) -> Exercise:
    """A value exercise compared within a tolerance
    (:func:`clusterlab.course.answers.close_verdict`).

    Args:
        expected: the value, or a recipe of the lab's namespace returning it.
        name: what the answer is.
        hint: shown with a wrong answer: what to look at again, not the answer.
        rtol: relative tolerance.
        atol: absolute tolerance.
    """
    return Exercise(name, lambda answer, value: answers.close_verdict(
        answer, value, rtol=rtol, atol=atol, hint=hint, name=name), expected)


def equal(expected, *, name: str, hint: str = "") -> Exercise:
    """An exact-value exercise (:func:`clusterlab.course.answers.equal_verdict`); ``expected`` as in
    :func:`close`."""
    return Exercise(name, lambda answer, value: answers.equal_verdict(
        answer, value, hint=hint, name=name), expected)


def code(checker: Callable[[Sequence[Program]], None], *, name: str, hint: str = "",
         exports: Sequence[Export], references: Sequence[str] = ()) -> Exercise:
    """A code exercise: the answer is the function the student wrote, judged as programs.

    Args:
        checker: ``checker(programs)``, one :class:`Program` per export, in order; runs them
            on fresh inputs and inspects what they compile to; raises :class:`Refused` naming
            the failed test. Any other exception is the student's program failing.
        name: what the function computes.
        hint: shown when it is refused.
        exports: the programs the submission's kernel exports (at least one).
        references: the library's own functions that do what the exercise asks, by qualified
            name (``"clusterlab.device.collectives.ring_reduce_scatter"``): in the grading
            sandbox they refuse to run for the notebook's answers (called by the notebook or
            by JAX for it), and a program built by one is refused (:func:`program_frames`),
            so calling one earns nothing (:func:`clusterlab.course.sandbox.withheld_binds`).

    Raises:
        ValueError: when ``exports`` is empty.
    """
    if not exports:
        raise ValueError(f"grading.code({name!r}) needs exports=[grading.Export(...)]: the "
                         "shapes and device counts the submission's kernel exports.")

    def judge(answer, _expected):
        if answers.is_unanswered(answer):
            return answers.equal_verdict(answer, None, name=name)
        if isinstance(answer, str):                       # why there is no program
            return False, f"✗ {name}: {answer} {hint}".rstrip()
        try:
            checker(answer)
            _refuse_references(answer, references)
        except Refused as refusal:
            return False, f"✗ {name}: {refusal} {hint}".rstrip()
        except Exception as error:  # the student's program failing is a verdict, not a crash
            return False, (f"✗ {name}: your function raised {_one_line(error)} "
                           f"{hint}").rstrip()
        return True, f"✓ {name} is correct."

    return Exercise(name, judge, None, tuple(exports), tuple(references))


# the printed StableHLO's source locations: an alias of a file position
# (#loc7 = loc("/.../experts.py":232:21 to :48)), and a Python frame by its function's name at a
# position, by alias or inline (loc("route"(#loc7)))
_FILE_LOCATION = re.compile(r'^(#loc\d+) = loc\("([^"]+)":\d+:\d+', re.MULTILINE)
_FRAME_LOCATION = re.compile(r'loc\("([\w.<>]+)"\((?:(#loc\d+)|"([^"]+)":\d+:\d+)')


def program_frames(program: Program) -> set[tuple[str, str]]:
    """The Python frames, ``(function name, file)``, that the submission's kernel was in while it
    traced ``program``: JAX (0.10.2 here) records each operation's call stack in the source
    locations of the StableHLO it exports."""
    text = program.exported.mlir_module()
    files = dict(_FILE_LOCATION.findall(text))
    return {(name, files.get(alias, "") if alias else file)
            for name, alias, file in _FRAME_LOCATION.findall(text)}


def _module_file(module: str) -> str:
    return "/" + module.replace(".", "/") + ".py"


def _refuse_references(programs: Sequence[Program], references: Sequence[str]) -> None:
    # The sandbox's guard runs in the submission's own process, which can patch it; the program
    # it hands over still names the frames that built it, down to the export's own, unless
    # JAX was told to keep the innermost frame only (then the export's frame is missing).
    for program in programs if references else ():
        frames = program_frames(program)
        if not any(file.endswith(_module_file(submission.__name__)) for _, file in frames):
            raise Refused("its program carries no call stacks in its source locations, which "
                          "the grader reads to see what built it; export it as check.answer "
                          "does, with JAX's jax_include_full_tracebacks_in_locations left on.")
        for reference in references:
            module, _, function = reference.rpartition(".")
            if any(name == function and file.endswith(_module_file(module))
                   for name, file in frames):
                raise Refused(f"its program was built by {reference}, the course's own "
                              "solution to this exercise, which grading withholds. Call the "
                              "function you wrote.")


def _one_line(error: BaseException) -> str:
    message = str(error).splitlines()[0][:200] if str(error) else ""
    return f"{type(error).__name__}: {message}"


@dataclass(frozen=True)
class Program:
    """A student's function as the grader rebuilt it from the exported StableHLO.

    Attributes:
        export: what was asked for.
        exported: the ``jax.export.Exported`` rebuilt here (its inputs are the grader's shapes).
    """

    export: Export
    exported: object

    def place(self, *args) -> list:
        """``args`` as arrays on the grader's own mesh of ``export.n_devices`` devices."""
        import jax  # here, not at the top: check imports this module, chapters import check
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        mesh = Mesh(np.array(jax.devices()[:self.export.n_devices]), (self.export.axis,))
        return [jax.device_put(np.asarray(a), NamedSharding(mesh, P())) for a in args]

    def __call__(self, *args):
        """Run the program on ``args`` (host arrays) and return its output as NumPy."""
        import jax

        return jax.tree_util.tree_map(np.asarray, self.exported.call(*self.place(*args)))

    def collective_ops(self, *args) -> list:
        """The collectives the program executes on ``args``
        (:class:`clusterlab.device.hlo.CollectiveOp`: kind and bytes), in program order, read from
        the program compiled here
        (:func:`clusterlab.device.hlo.executed_collectives` counts loop trips)."""
        import jax

        return hlo.executed_collectives(jax.jit(self.exported.call), *self.place(*args))

    def collectives(self, *args) -> list[str]:
        """The kinds (XLA opcodes) of :meth:`collective_ops`, in program order."""
        return [op.kind for op in self.collective_ops(*args)]


def rehydrate(data, export: Export) -> Program:
    """Rebuild one exported program from the kernel's data, with the grader's input shapes.

    Raises:
        Refused: when the data is not a program of the kind asked for, or the program has side
            effects or calls code outside XLA (custom calls other than sharding markers).
    """
    import jax
    from jax._src import core  # ShapedArray: the avals jax.export.Exported is built from

    if not isinstance(data, dict) or "mlir" not in data:
        raise Refused(data.get("error", "no program was exported.") if isinstance(data, dict)
                      else "no program was exported.")
    if data.get("effects") or int(data.get("nr_devices", -1)) not in (1, export.n_devices):
        raise Refused(f"its program was exported for {data.get('nr_devices')} devices (or with "
                      f"side effects); it must run on {export.n_devices} without effects.")
    outputs = tuple(core.ShapedArray(tuple(int(d) for d in shape), np.dtype(str(dtype)))
                    for shape, dtype in data["out"])
    in_avals = tuple(core.ShapedArray(tuple(shape), np.dtype(dtype)) for shape, dtype in
                     export.args)
    kept = tuple(data.get("kept", range(len(in_avals))))
    if sorted(set(kept)) != list(kept) or any(not 0 <= int(i) < len(in_avals) for i in kept):
        raise Refused(f"its program names inputs {list(kept)} of {len(in_avals)}.")
    single = bool(data["single"]) and len(outputs) == 1
    out_tree = jax.tree_util.tree_structure(0 if single else (0,) * len(outputs))
    none_in, none_out = (None,) * len(in_avals), (None,) * len(outputs)
    exported = jax.export.Exported(
        fun_name="submitted", in_tree=jax.tree_util.tree_structure((tuple(in_avals), {})),
        in_avals=in_avals, out_tree=out_tree, out_avals=outputs, _has_named_shardings=False,
        _in_named_shardings=none_in, _out_named_shardings=none_out, in_shardings_hlo=none_in,
        out_shardings_hlo=none_out, nr_devices=int(data["nr_devices"]), platforms=("cpu",),
        ordered_effects=(), unordered_effects=(), disabled_safety_checks=(),
        mlir_module_serialized=base64.b64decode(data["mlir"]),
        calling_convention_version=int(data["version"]),
        module_kept_var_idx=tuple(int(i) for i in kept), uses_global_constants=False,
        _get_vjp=None)
    targets = {a or b for a, b in _CUSTOM_CALL.findall(exported.mlir_module())}
    unsafe = sorted(t for t in targets if not _SAFE_CUSTOM_CALLS.match(t))
    if unsafe:
        raise Refused(f"its program calls {', '.join(unsafe)} outside XLA, which the grader "
                      "does not run: compute it without host callbacks or library calls.")
    return Program(export, exported)


def from_data(data, exports: Sequence[Export] = ()):
    """An answer as the grader judges it, from the kernel's data (:func:`submission.to_data`):
    arrays as NumPy, a blank as ``...``, a code exercise's programs rebuilt (:func:`rehydrate`),
    anything the kernel could only name by type as that name."""
    if isinstance(data, list):
        return tuple(from_data(v) for v in data)
    if not isinstance(data, dict):
        return data
    if data.get("blank"):
        return ...
    if "array" in data:
        return np.asarray(data["array"], dtype=np.dtype(str(data["dtype"]))).reshape(
            data["shape"])
    if "dict" in data:
        return {k: from_data(v) for k, v in data["dict"].items()}
    if "programs" in data and exports:
        if len(data["programs"]) != len(exports):
            return "the kernel exported a different number of programs than asked for."
        try:
            return [rehydrate(p, e) for p, e in zip(data["programs"], exports)]
        except Refused as refusal:
            return str(refusal)
    if exports:
        return f"expected the function you wrote, got a {data.get('type', 'value')}."
    return f"<{data.get('type', 'unknown')}>"


def collective_kinds(function: Callable, *args) -> list[str]:
    """The collectives ``function(*args)`` executes, by XLA opcode, in program order.

    A :class:`Program` compiles its rebuilt StableHLO; another function is jitted first when it
    is not (:func:`clusterlab.device.hlo.executed_collectives` counts loop trips).
    """
    if isinstance(function, Program):
        return function.collectives(*args)
    import jax

    jitted = function if hasattr(function, "lower") else jax.jit(function)
    return [op.kind for op in hlo.executed_collectives(jitted, *args)]


def require_collectives(function: Callable, *args, includes: Iterable[str],
                        excludes: Iterable[str] = ()) -> list[str]:
    """Refuse ``function`` unless its compiled program runs each of ``includes`` and none of
    ``excludes`` (XLA opcodes such as ``"all-reduce"``, ``"collective-permute"``).

    Returns:
        The executed collectives' kinds.

    Raises:
        Refused: naming what is missing or forbidden and what the program runs.
    """
    kinds = collective_kinds(function, *args)
    found = ", ".join(sorted(set(kinds))) or "no collective"
    missing = [kind for kind in includes if kind not in kinds]
    if missing:
        raise Refused(f"its compiled program runs {found}; it must run {', '.join(missing)}.")
    forbidden = [kind for kind in excludes if kind in kinds]
    if forbidden:
        raise Refused(f"its compiled program runs {', '.join(forbidden)}, which this exercise "
                      "asks you to build yourself.")
    return kinds


def require_close(test: str, actual, expected, *, hint: str = "", rtol: float = 1e-5) -> None:
    """Refuse unless ``actual`` has ``expected``'s structure and shapes and its values within
    ``rtol`` of each leaf's largest magnitude (:func:`clusterlab.course.verification.verify_close`).

    Raises:
        Refused: naming ``test``, the difference and the leaf (not the arrays), then ``hint``.
    """
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its ✓ line is for labs, not verdicts
            verification.verify_close(test, actual, expected, rtol=rtol)
    except verification.VerificationFailed as failure:
        reason = str(failure).removeprefix("✗ ")
        raise Refused(f"{reason}. Hint: {hint}" if hint else reason) from None


def run_seed() -> int:
    """The seed of this grading run's hidden inputs: ``$CLUSTERLAB_GRADING_SEED`` (set by
    :func:`main` for its children), else drawn from ``os.urandom`` once per process."""
    if SEED_ENV not in os.environ:
        os.environ[SEED_ENV] = str(int.from_bytes(os.urandom(8), "little"))
    return int(os.environ[SEED_ENV])


def hidden_seed(case: int) -> int:
    """A seed for one hidden test's inputs, fresh each grading run: the key's ``case`` number
    mixed with :func:`run_seed`. A key draws its hidden inputs from it
    (``jax.random.key(grading.hidden_seed(201))``), so no table of outputs kept from an
    earlier run, or from the key's own numbers, matches them."""
    state = np.random.SeedSequence([run_seed(), int(case)]).generate_state(1, np.uint32)
    return int(state[0])


def keys_dir() -> Path | None:
    """Where the keys are: ``$CLUSTERLAB_KEYS`` when set (a missing folder means no key), else
    the first ``keys/`` folder holding a ``labNN.py`` in the working directory or above it."""
    configured = os.environ.get(KEYS_ENV)
    if configured:
        path = Path(configured)
        return path if path.is_dir() else None
    for folder in (Path.cwd(), *Path.cwd().parents):
        candidate = folder / "keys"
        if candidate.is_dir() and any(candidate.glob("lab[0-9][0-9].py")):
            return candidate
    return None


_LOADED: dict[tuple[Path, float], dict[str, Exercise]] = {}


def load_key(path: str | Path) -> dict[str, Exercise]:
    """Load a key module ``labNN.py`` (or a chapter's, ``chNN.py``) and return its ``KEY``.

    Raises:
        ValueError: when the file is not named ``labNN.py`` or ``chNN.py``, has no ``KEY``
            dictionary of :class:`Exercise`, or names an exercise of another lab or chapter.
    """
    path = Path(path).resolve()
    match = _KEY_FILE.match(path.name)
    if not match:
        raise ValueError(f"A key file is named labNN.py (lab01.py) or chNN.py (ch04b.py); got "
                         f"{path.name}.")
    stamp = (path, path.stat().st_mtime)
    if stamp not in _LOADED:
        spec = importlib.util.spec_from_file_location(f"clusterlab_key_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        key = getattr(module, "KEY", None)
        if not isinstance(key, dict) or not all(isinstance(e, Exercise) for e in key.values()):
            raise ValueError(f"{path.name} must define KEY, a dict from exercise id to "
                             "clusterlab.course.grading.Exercise.")
        wrong = [i for i in key if not re.fullmatch(rf"{match.group(1)}\.\d+", i)]
        if wrong:
            raise ValueError(f"{path.name} holds exercises of another lab or badly named ids: "
                             f"{wrong}; ids look like {match.group(1)}.1.")
        _LOADED[stamp] = key
    return _LOADED[stamp]


def find_key(exercise_id: str) -> dict[str, Exercise] | None:
    """The key of ``exercise_id``'s lab or chapter (``keys/lab01.py``, ``keys/ch04b.py``), or
    None where no key is found (a student copy)."""
    folder = keys_dir()
    lab = exercise_id.split(".")[0]
    if folder is None or not (folder / f"{lab}.py").is_file():
        return None
    return load_key(folder / f"{lab}.py")


def _verdict(exercise_id: str, exercise: Exercise, data, expected: Callable[[], object]
             ) -> Verdict:
    try:
        passed, line = exercise.judge(from_data(data, exercise.exports), expected())
    except Exception as error:  # e.g. a name the key reads from the lab was deleted
        passed, line = False, (f"✗ {exercise.name}: could not be graded ({_one_line(error)});"
                               " run every cell of the lab.")
    return Verdict(exercise_id, passed, line)


def _exercise(key: Mapping[str, Exercise], exercise_id: str) -> Exercise:
    if exercise_id not in key:
        raise ValueError(f"The key has no exercise {exercise_id}; it has {sorted(key)}.")
    return key[exercise_id]


def judge(key: Mapping[str, Exercise], exercise_id: str, answer,
          namespace: Mapping[str, object]) -> Verdict:
    """Judge one answer recorded in THIS process (the instructor's lab, a test): exported and
    rebuilt exactly as a submission's is, recipes evaluated on ``namespace``.

    Raises:
        ValueError: when the key has no such exercise.
    """
    exercise = _exercise(key, exercise_id)
    data = json.loads(json.dumps(submission.export_answer(
        answer, [e.request() for e in exercise.exports])))
    return _verdict(exercise_id, exercise, data, lambda: (
        exercise.expected(namespace) if exercise.is_recipe else exercise.expected))


def judge_all(key: Mapping[str, Exercise], recorded: Mapping[str, object],
              references: Mapping[str, object],
              judged: Mapping[str, Verdict] | None = None) -> list[Verdict]:
    """Judge EVERY exercise of the key from the kernel's data; one without a recorded answer
    fails as unanswered.

    Args:
        key: the lab's key.
        recorded: the kernel's data by exercise id (:func:`clusterlab.course.submission.report`).
        references: the recipes' expected values by exercise id (:func:`reference_values`).
        judged: verdicts already reached elsewhere (code exercises judged in a child process,
            :func:`judge_programs_apart`), taken as they are.
    """
    judged = judged or {}
    def expected(exercise_id: str, exercise: Exercise):
        if not exercise.is_recipe:
            return exercise.expected
        value = references[exercise_id]
        if isinstance(value, Refused):       # the instructor's lab could not compute it
            raise value
        return value

    verdicts = []
    for exercise_id, exercise in sorted(key.items(), key=lambda item: _order(item[0])):
        if exercise_id in judged:
            verdicts.append(judged[exercise_id])
        elif exercise_id not in recorded:
            verdicts.append(Verdict(exercise_id, False, f"✗ {exercise.name}: no answer recorded "
                                    f"(check.answer(\"{exercise_id}\", ...) did not run)."))
        else:
            verdicts.append(_verdict(exercise_id, exercise, recorded[exercise_id],
                                     lambda i=exercise_id, e=exercise: expected(i, e)))
    return verdicts


def _order(exercise_id: str) -> tuple[int, int]:
    lab, number = exercise_id.removeprefix("lab").split(".")
    return int(lab), int(number)


def write_references(key_path: str, out_path: str, namespace: Mapping[str, object]) -> None:
    """Evaluate the key's recipes on ``namespace`` (the INSTRUCTOR's lab) and write their values
    as data to ``out_path`` (the last cell :func:`reference_values` adds)."""
    values = {}
    for exercise_id, exercise in load_key(key_path).items():
        if exercise.is_recipe:
            try:
                values[exercise_id] = submission.to_data(exercise.expected(namespace))
            except Exception as error:  # reported as this exercise's, not the grader's, failure
                values[exercise_id] = {"reference_error": _one_line(error)}
    Path(out_path).write_text(json.dumps(values))


_REFERENCES: dict[tuple, dict[str, object]] = {}


def reference_values(key_path: Path, labs_dir: Path, timeout_s: float) -> dict[str, object]:
    """The expected values of the key's recipes, from the instructor's copy of the lab
    (``labs_dir/NN-*.ipynb``) run once per grading process in a trusted kernel of its own.

    Returns:
        By exercise id, the value, or a :class:`Refused` saying why it could not be computed.
    """
    recipes = [i for i, e in load_key(key_path).items() if e.is_recipe]
    lab = next(iter(sorted(labs_dir.glob(f"{key_path.stem.removeprefix('lab')}-*.ipynb"))), None)
    if not recipes or lab is None:
        return {i: Refused(f"no instructor's lab {key_path.stem} in {labs_dir}") for i in recipes}
    stamp = (key_path, key_path.stat().st_mtime, lab, lab.stat().st_mtime)
    if stamp not in _REFERENCES:
        import nbformat  # here: 2 s to import, only the grader needs it
        from nbclient import NotebookClient

        notebook = nbformat.read(lab, as_version=4)
        with tempfile.TemporaryDirectory(prefix="clusterlab-reference-") as folder:
            out = Path(folder) / "references.json"
            notebook.cells.append(nbformat.v4.new_code_cell(
                "from clusterlab.course import grading as _clusterlab_grading\n_clusterlab_grading."
                f"write_references({str(key_path)!r}, {str(out)!r}, globals())"))
            NotebookClient(notebook, timeout=timeout_s, allow_errors=True,
                           resources={"metadata": {"path": str(lab.parent)}}).execute()
            data = json.loads(out.read_text()) if out.is_file() else {}
        _REFERENCES[stamp] = {
            i: Refused(f"the instructor's lab did not compute it ({data[i]['reference_error']})")
            if isinstance(data.get(i), dict) and "reference_error" in data[i]
            else from_data(data[i]) if i in data
            else Refused("the instructor's lab did not run to its end") for i in recipes}
    return _REFERENCES[stamp]


def lab_of(notebook_path: str | Path, notebook) -> str:
    """The lab (``"lab01"``) a submission belongs to: from its file name (``01-...``), else
    from its exercise labels (``:label: lab01-...``).

    Raises:
        ValueError: when neither names exactly one lab.
    """
    match = _LAB_IN_NAME.search(Path(notebook_path).name)
    if match:
        return f"lab{match.group(1)}"
    labels = {m for cell in notebook.cells if cell.cell_type == "markdown"
              for m in re.findall(r":label:\s*(lab\d\d)-", cell.source)}
    if len(labels) != 1:
        raise ValueError(f"{notebook_path}: cannot tell which lab it is; name it NN-*.ipynb "
                         "like the lab it answers.")
    return labels.pop()


def grade_notebook(path: str | Path, *, key_dir: str | Path, timeout_s: float = 600,
                   labs_dir: str | Path | None = None,
                   limits: sandbox.Limits | None = None,
                   judge_limits: sandbox.Limits | None = None) -> list[Verdict]:
    """Run a submitted notebook in a sandbox and judge every exercise of its lab's key outside it.

    Cells run in order in a temporary copy of the notebook's folder; a cell that raises does
    not stop the run, a cell running past ``timeout_s`` is interrupted. The kernel hands back
    data only (:mod:`clusterlab.course.submission`); judging happens in this process.

    Args:
        path: the submitted ``.ipynb``.
        key_dir: the folder of the keys.
        timeout_s: the longest one cell may run, in seconds.
        labs_dir: the instructor's labs, for the keys' recipes (default: ``labs/`` beside
            ``key_dir``).
        limits: the sandbox's limits (default :class:`clusterlab.course.sandbox.Limits`).
        judge_limits: the limits of the child that runs its programs (default
            :data:`JUDGE_LIMITS`).

    Returns:
        One verdict per exercise of the key, in order.

    Raises:
        ValueError: when the notebook's lab cannot be told or has no key.
        sandbox.SandboxUnavailable: when bubblewrap is missing.
    """
    import nbformat  # here, not at the top: 2 s to import, only the grader needs it

    path = Path(path)
    lab = lab_of(path, nbformat.read(path, as_version=4))
    key_path = Path(key_dir).resolve() / f"{lab}.py"
    if not key_path.is_file():
        raise ValueError(f"{path.name}: no key {key_path} for {lab}.")
    key = load_key(key_path)
    request = {i: [e.request() for e in exercise.exports] for i, exercise in key.items()}
    withheld = sorted({name for exercise in key.values() for name in exercise.references})
    recorded, why = sandbox.run_submission(path, request, cell_timeout_s=timeout_s,
                                           hide=[key_path.parent], limits=limits,
                                           withhold=withheld)
    if recorded is None:
        return _all_failed(key, why)
    programs = {i: recorded[i] for i, exercise in key.items() if exercise.exports and i in recorded}
    judged = judge_programs_apart(key_path, programs, judge_limits or JUDGE_LIMITS)
    labs = Path(labs_dir) if labs_dir is not None else key_path.parent.parent / "labs"
    return judge_all(key, recorded, reference_values(key_path, labs.resolve(), timeout_s), judged)


JUDGE_LIMITS = sandbox.Limits(cpu_s=1200, memory_bytes=12 * 2**30, processes=4096, wall_s=600,
                              file_bytes=64 * 2**20)
"""The limits of the process that runs one submission's programs (:func:`judge_programs_apart`):
JAX on 8 simulated CPUs reserves about 3 GB of address space before it runs anything."""


def judge_programs_apart(key_path: Path, programs: Mapping[str, object],
                         limits: sandbox.Limits) -> dict[str, Verdict]:
    """Judge code exercises in a child process under ``limits``, never in the grader's own.

    A submitted program is XLA code of the student's choosing: it can loop forever or allocate
    past the machine's memory. The child rebuilds and runs the programs (:func:`judge_programs`)
    and writes each verdict as it reaches it. When it dies or runs past a limit, the exercise
    it was judging fails with one line saying how, and a fresh child judges the rest.

    Args:
        key_path: the lab's key (the child loads it itself).
        programs: the kernel's data of the code exercises, by exercise id.
        limits: the child's CPU-time, memory, output and wall-clock limits.

    Returns:
        A verdict per exercise of ``programs``.
    """
    key = load_key(key_path)
    verdicts: dict[str, Verdict] = {}
    remaining = sorted(programs, key=_order)
    with tempfile.TemporaryDirectory(prefix="clusterlab-judge-") as folder:
        while remaining:
            data, out, errors = (Path(folder) / name for name in ("programs.json",
                                                                  "verdicts.jsonl", "stderr"))
            data.write_text(json.dumps({i: programs[i] for i in remaining}))
            out.write_text("")
            why = _run_judge(key_path, data, out, errors, limits)
            verdicts.update(_read_verdicts(out, remaining))
            remaining = [i for i in remaining if i not in verdicts]
            if remaining:       # the child ended while judging the first of them
                first = remaining.pop(0)
                why = why or "its program ended the grader's child without a verdict"
                verdicts[first] = Verdict(first, False, f"✗ {key[first].name}: {why}.")
    return verdicts


# JAX's persistent compilation cache (``make test`` sets one): the judge compiles every submitted
# program itself, so that no compiled program another process left on disk can stand in for it.
_NOT_INHERITED = ("JAX_COMPILATION_CACHE_DIR",)


def _judge_environment() -> dict[str, str]:
    """The judging child's environment: the grader's, with this run's seed and without
    :data:`_NOT_INHERITED`."""
    kept = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    return {**kept, SEED_ENV: str(run_seed())}


def _run_judge(key_path: Path, data: Path, out: Path, errors: Path,
               limits: sandbox.Limits) -> str:
    """Run :func:`judge_programs` in a limited child; "" when it ended normally, else why not."""
    import subprocess

    command = sandbox.limited(limits) + [
        sys.executable, "-c", "import sys; from clusterlab.course import grading; "
        "grading.judge_programs(*sys.argv[1:])", str(key_path), str(data), str(out)]
    try:
        with open(errors, "wb") as stderr:
            result = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=stderr,
                                    timeout=limits.wall_s, env=_judge_environment())
    except subprocess.TimeoutExpired:
        return f"its program ran past the grader's {limits.wall_s:g} s wall-clock limit"
    if result.returncode == 0:
        return ""
    return sandbox.ended(result.returncode, sandbox.tail(errors), limits, what="its program")


def _read_verdicts(out: Path, asked: Sequence[str]) -> dict[str, Verdict]:
    verdicts = {}
    for line in out.read_text(errors="replace").splitlines():
        try:
            exercise_id, passed, text = json.loads(line)
        except ValueError:          # a line cut short when the child was killed
            continue
        if exercise_id in asked:
            verdicts[exercise_id] = Verdict(exercise_id, bool(passed), str(text))
    return verdicts


def judge_programs(key_path: str, data_path: str, out_path: str) -> None:
    """(In the child of :func:`judge_programs_apart`.) Judge each code exercise of
    ``data_path`` with the key, appending ``[id, passed, line]`` to ``out_path`` as JSON lines,
    each written as soon as it is reached."""
    _grader_devices()
    key = load_key(key_path)
    with open(out_path, "a") as out:
        for exercise_id, data in json.loads(Path(data_path).read_text()).items():
            verdict = _verdict(exercise_id, key[exercise_id], data, lambda: None)
            out.write(json.dumps([verdict.exercise_id, verdict.passed, verdict.line]) + "\n")
            out.flush()


def _all_failed(key: Mapping[str, Exercise], why: str) -> list[Verdict]:
    return [Verdict(i, False, f"✗ {key[i].name}: {why}.")
            for i in sorted(key, key=_order)]


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
MAX_LINE = 500


def printable(text: str, limit: int = MAX_LINE) -> str:
    """``text`` safe to print in a report: no control characters (a submission's strings can
    hold terminal escapes), no lone surrogates (they cannot be encoded), at most ``limit``
    characters."""
    text = text.encode("utf-8", "replace").decode("utf-8")
    text = _CONTROL.sub("?", text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def format_report(name: str, verdicts: Sequence[Verdict]) -> str:
    """The report of one submission: one line per exercise and the total."""
    lines = [printable(name)]
    lines += [f"  {v.exercise_id}  {printable(v.line)}" for v in verdicts]
    correct = sum(v.passed for v in verdicts)
    lines.append(f"  total: {correct}/{len(verdicts)} exercises correct")
    return "\n".join(lines)


CSV_HEADER = ["student", "exercise", "points", "named_by"]


def student_names(submissions: Sequence[str]) -> tuple[dict[str, str], str]:
    """Who each submission is: its file name without ``.ipynb`` while those differ, else its
    folder (one folder per student, the instructor guide's layout), else its path.

    Returns:
        ``({submission: student}, "file" | "folder" | "path")``.
    """
    for named_by, name_of in (("file", lambda p: Path(p).stem),
                              ("folder", lambda p: Path(p).resolve().parent.name),
                              ("path", lambda p: str(Path(p)))):
        names = {submission: name_of(submission) for submission in submissions}
        if len(set(names.values())) == len(names):
            return names, named_by
    raise ValueError("the same submission is listed twice; list each notebook once.")


def _csv_rows(student: str, verdicts: Sequence[Verdict], named_by: str) -> list[list]:
    return [[student, v.exercise_id, int(v.passed), named_by] for v in verdicts]


def _grader_devices(n: int = 8) -> None:
    # the programs of code exercises run here on up to 8 devices: simulated CPUs where no
    # accelerator is, sized before JAX's first operation (as devices.setup does, silently)
    import jax

    from clusterlab.device import devices

    if not devices._backends_initialized():
        jax.config.update("jax_num_cpu_devices", n)


def _refuse_link(path: Path) -> None:
    # A submission is data the grader reads as root: a link could point at any host file.
    if path.is_symlink():
        raise ValueError(f"{path}: is a symbolic link; submit the notebook file itself.")
    if not path.is_file():
        raise ValueError(f"{path}: no such notebook.")


def main(submissions: Sequence[str], *, key_dir: str, timeout_s: float,
         csv_path: str | None = None, limits: sandbox.Limits | None = None,
         judge_limits: sandbox.Limits | None = None, seed: int | None = None) -> int:
    """Grade each submission and print its report (and with ``csv_path``, the points as CSV).

    Each submission is graded on its own: whatever one does (a notebook that is not a notebook,
    an answers file that is not data, a link), it gets one clear line and 0 points, and the
    next is graded. The CSV gets each submission's rows as soon as it is graded, so a grader
    stopped half-way keeps what it graded.

    Args:
        submissions: the notebooks.
        key_dir: the folder of the keys.
        timeout_s: the longest one cell may run, in seconds.
        csv_path: where to write ``student,exercise,points,named_by`` rows, if anywhere
            (``named_by``: ``file``, ``folder`` or ``path``, see :func:`student_names`).
        limits: each submission's sandbox limits (default
            :class:`clusterlab.course.sandbox.Limits`).
        judge_limits: the limits of the child that runs a submission's programs (default
            :data:`JUDGE_LIMITS`).
        seed: the seed of the hidden inputs (:func:`hidden_seed`); default, fresh from
            ``os.urandom``. The report's first line names it, so a run can be repeated.

    Returns:
        0 when every exercise of every submission passed, 1 when any failed, 2 when a
        submission could not be graded at all (no such file, a link, unknown lab, no key, no
        sandbox).
    """
    import csv

    if not Path(key_dir).is_dir():
        print(f"error: no key folder {key_dir}; pass --key with the folder of labNN.py files.",
              file=sys.stderr)
        return 2
    names, named_by = student_names(submissions)
    os.environ[SEED_ENV] = str(int.from_bytes(os.urandom(8), "little") if seed is None
                               else seed)
    print(f"hidden inputs from seed {run_seed()} (--seed {run_seed()} draws them again)",
          flush=True)
    for missing in sandbox.missing_protections():
        print(f"note: {missing}.", file=sys.stderr)
    status = 0
    with open(csv_path, "w", newline="") if csv_path else contextlib.nullcontext() as handle:
        writer = csv.writer(handle) if handle else None
        if writer:
            writer.writerow(CSV_HEADER)
            handle.flush()
        for name in submissions:
            try:
                _refuse_link(Path(name))
                verdicts = grade_notebook(name, key_dir=key_dir, timeout_s=timeout_s,
                                          limits=limits, judge_limits=judge_limits)
            except sandbox.SandboxUnavailable as error:
                print(f"error: {error}", file=sys.stderr)
                return 2
            except Exception as error:  # noqa: BLE001 - one submission never stops the batch
                why = (str(error) if isinstance(error, ValueError)
                       else f"{name}: not graded: {_one_line(error)}")
                print(f"error: {printable(why)}", file=sys.stderr)
                if writer:
                    writer.writerow([names[name], "not graded", 0, named_by])
                    handle.flush()
                status = 2
                continue
            print(format_report(name, verdicts), flush=True)
            if writer:
                writer.writerows(_csv_rows(names[name], verdicts, named_by))
                handle.flush()
            if not all(v.passed for v in verdicts) and status == 0:
                status = 1
    return status


def cli(argv: Sequence[str]) -> int:
    """``make grade``'s command line: ``SUBMISSION... --key KEYS [--csv FILE] [--timeout S]
    [--seed N]``
    (``python -m clusterlab grade`` without ``--csv``); returns :func:`main`'s status."""
    import argparse

    parser = argparse.ArgumentParser(prog="make grade")
    parser.add_argument("submissions", nargs="+")
    parser.add_argument("--key", required=True, help="the folder of the labNN.py keys")
    parser.add_argument("--csv", help="write student,exercise,points rows to this file")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per cell")
    parser.add_argument("--seed", type=int, help="the hidden inputs' seed (default: fresh)")
    arguments = parser.parse_args(argv)
    return main(arguments.submissions, key_dir=arguments.key, timeout_s=arguments.timeout,
                csv_path=arguments.csv, seed=arguments.seed)
