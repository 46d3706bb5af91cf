"""Grading lab exercises from an instructor-only key.

A lab's exercise cells record answers with :func:`clusterlab.check.answer` and carry no
expected value. The expected values, tolerances and hints live in a key, ``keys/labNN.py`` at
the repository root, which student copies leave out (``make student`` writes notebooks only).
A key is a Python module with one dictionary, ``KEY``, from exercise id to :class:`Exercise`::

    from clusterlab import costmodel, grading

    KEY = {
        # a value: expected from library calls, compared within a relative tolerance
        "lab01.1": grading.close(costmodel.collective_steps_and_bytes("all_gather", 2**24, 8)[1],
                                 name="bytes sent per device", hint="Count the blocks."),
        # a value the lab itself defines: a function of the notebook's namespace
        "lab00.1": grading.equal(lambda ns: ns["y"].sharding.shard_shape(ns["y"].shape),
                                 name="block shape", hint="Dimension 0 is split over 'model'."),
        # a function the student wrote: a checker runs it on a fresh input and inspects its
        # compiled program (raise grading.Refused with the reason to refuse it)
        "lab00.3": grading.code(check_global_max, name="global maximum", hint="..."),
    }

``python -m clusterlab grade SUBMISSION.ipynb`` (:func:`grade_notebook`) runs a submitted
notebook in its own kernel, errors allowed, then judges EVERY exercise of the key from the
answers the notebook recorded: an exercise whose check call was deleted has no recorded answer
and scores zero. Judging runs in the submission's kernel because code exercises call the
student's function on that kernel's devices.

Why not otter-grader or nbgrader: both keep their tests in notebook cells of their own format
(``# BEGIN HIDDEN TESTS`` cells, an ``otter assign`` master notebook) and generate the student
and autograder copies from it, which duplicates the book's gated ``solution-start``/``-end``
exercises and the stored outputs nbval compares; nbgrader adds a database and Jupyter server
extensions, otter-grader runs its grading in Docker by default. Neither inspects a compiled JAX
program. A key module beside the labs reuses :mod:`clusterlab.answers`' comparisons and
:func:`clusterlab.hlo.executed_collectives`, and the instructor's labs show the
solutions' ✓ lines in the book and under nbval.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clusterlab import answers, hlo

KEYS_ENV = "CLUSTERLAB_KEYS"
_KEY_FILE = re.compile(r"^lab(\d\d)\.py$")
_LAB_IN_NAME = re.compile(r"(?:^|[^0-9])(\d\d)-")


class Refused(Exception):
    """A code checker's reason for refusing a student's function (shown in the ✗ line)."""


@dataclass(frozen=True)
class Exercise:
    """One exercise of a key.

    Attributes:
        name: what the answer is, for the verdict line ("bytes sent per device").
        judge: ``judge(answer, namespace) -> (passed, line)``; ``namespace`` is the lab
            notebook's globals.
    """

    name: str
    judge: Callable[[object, Mapping[str, object]], tuple[bool, str]]


@dataclass(frozen=True)
class Verdict:
    """The verdict on one exercise: its id, whether it passed, and its one-line message."""

    exercise_id: str
    passed: bool
    line: str


def _expected(expected, namespace: Mapping[str, object]):
    return expected(namespace) if callable(expected) else expected


def close(expected, *, name: str, hint: str = "", rtol: float = 1e-3,
          atol: float = 0.0) -> Exercise:
    """A value exercise compared within a tolerance (:func:`clusterlab.answers.close_verdict`).

    Args:
        expected: the value, or a function of the lab's namespace returning it.
        name: what the answer is.
        hint: shown with a wrong answer: what to look at again, not the answer.
        rtol: relative tolerance.
        atol: absolute tolerance.
    """
    return Exercise(name, lambda answer, ns: answers.close_verdict(
        answer, _expected(expected, ns), rtol=rtol, atol=atol, hint=hint, name=name))


def equal(expected, *, name: str, hint: str = "") -> Exercise:
    """An exact-value exercise (:func:`clusterlab.answers.equal_verdict`); ``expected`` as in
    :func:`close`."""
    return Exercise(name, lambda answer, ns: answers.equal_verdict(
        answer, _expected(expected, ns), hint=hint, name=name))


def code(checker: Callable[[Callable, Mapping[str, object]], None], *, name: str,
         hint: str = "") -> Exercise:
    """A code exercise: the answer is the function the student wrote.

    Args:
        checker: ``checker(function, namespace)``; runs the function on a fresh input and
            inspects its compiled program; raises :class:`Refused` with the reason to refuse it.
            Any other exception is the student's function failing and refuses it too.
        name: what the function computes.
        hint: shown when it is refused.
    """
    def judge(answer, ns):
        if answers.is_unanswered(answer):
            return answers.equal_verdict(answer, None, name=name)
        if not callable(answer):
            return False, (f"✗ {name}: expected the function you wrote, got a "
                           f"{type(answer).__name__}. {hint}").rstrip()
        try:
            checker(answer, ns)
        except Refused as refusal:
            return False, f"✗ {name}: {refusal} {hint}".rstrip()
        except Exception as error:  # the student's code failing is a verdict, not a crash
            message = str(error).splitlines()[0][:200] if str(error) else ""
            return False, (f"✗ {name}: your function raised {type(error).__name__}: "
                           f"{message} {hint}").rstrip()
        return True, f"✓ {name} is correct."

    return Exercise(name, judge)


def collective_kinds(function: Callable, *args) -> list[str]:
    """The collectives ``function(*args)`` executes, by XLA opcode, in program order.

    ``function`` is jitted first when it is not (:func:`clusterlab.hlo.executed_collectives`
    reads the compiled program and counts loop trips).
    """
    import jax  # here, not at the top: check imports this module, chapters import check

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


def require_close(actual, expected, *, what: str, rtol: float = 1e-5,
                  atol: float = 1e-5) -> None:
    """Refuse unless ``actual`` equals ``expected`` within the tolerances and has its shape.

    Raises:
        Refused: with :func:`clusterlab.answers.close_verdict`'s reason.
    """
    passed, line = answers.close_verdict(np.asarray(actual), np.asarray(expected), rtol=rtol,
                                       atol=atol, name=what)
    if not passed:
        raise Refused(line.removeprefix("✗ "))


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
    """Load a key module ``labNN.py`` and return its ``KEY``.

    Raises:
        ValueError: when the file is not named ``labNN.py``, has no ``KEY`` dictionary of
            :class:`Exercise`, or names an exercise of another lab.
    """
    path = Path(path).resolve()
    match = _KEY_FILE.match(path.name)
    if not match:
        raise ValueError(f"A key file is named labNN.py (lab01.py); got {path.name}.")
    stamp = (path, path.stat().st_mtime)
    if stamp not in _LOADED:
        spec = importlib.util.spec_from_file_location(f"clusterlab_key_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        key = getattr(module, "KEY", None)
        if not isinstance(key, dict) or not all(isinstance(e, Exercise) for e in key.values()):
            raise ValueError(f"{path.name} must define KEY, a dict from exercise id to "
                             "clusterlab.grading.Exercise.")
        wrong = [i for i in key if not re.fullmatch(rf"lab{match.group(1)}\.\d+", i)]
        if wrong:
            raise ValueError(f"{path.name} holds exercises of another lab or badly named ids: "
                             f"{wrong}; ids look like lab{match.group(1)}.1.")
        _LOADED[stamp] = key
    return _LOADED[stamp]


def find_key(exercise_id: str) -> dict[str, Exercise] | None:
    """The key of ``exercise_id``'s lab, or None where no key is found (a student copy)."""
    folder = keys_dir()
    lab = exercise_id.split(".")[0]
    if folder is None or not (folder / f"{lab}.py").is_file():
        return None
    return load_key(folder / f"{lab}.py")


def judge(key: Mapping[str, Exercise], exercise_id: str, answer,
          namespace: Mapping[str, object]) -> Verdict:
    """Judge one recorded answer with the key.

    Raises:
        ValueError: when the key has no such exercise.
    """
    if exercise_id not in key:
        raise ValueError(f"The key has no exercise {exercise_id}; it has {sorted(key)}.")
    exercise = key[exercise_id]
    try:
        passed, line = exercise.judge(answer, namespace)
    except Exception as error:  # e.g. a name the key reads from the lab was deleted
        passed, line = False, (f"✗ {exercise.name}: could not be graded ({type(error).__name__}:"
                               f" {error}); run every cell of the lab.")
    return Verdict(exercise_id, passed, line)


def judge_all(key: Mapping[str, Exercise], recorded: Mapping[str, object],
              namespace: Mapping[str, object]) -> list[Verdict]:
    """Judge EVERY exercise of the key; one without a recorded answer fails as unanswered."""
    verdicts = []
    for exercise_id, exercise in sorted(key.items(), key=lambda item: _order(item[0])):
        if exercise_id not in recorded:
            verdicts.append(Verdict(exercise_id, False, f"✗ {exercise.name}: no answer recorded "
                                    f"(check.answer(\"{exercise_id}\", ...) did not run)."))
        else:
            verdicts.append(judge(key, exercise_id, recorded[exercise_id], namespace))
    return verdicts


def _order(exercise_id: str) -> tuple[int, int]:
    lab, number = exercise_id.removeprefix("lab").split(".")
    return int(lab), int(number)


_MARK = "clusterlab-grade"


def report(key_path: str, token: str, namespace: Mapping[str, object]) -> None:
    """Print the verdicts on every exercise as one marked JSON line (the grader's last cell)."""
    verdicts = judge_all(load_key(key_path), answers.recorded_answers(), namespace)
    print(f"{_MARK} {token} " + json.dumps([[v.exercise_id, v.passed, v.line] for v in verdicts]))


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
                   kernel_name: str = "python3") -> list[Verdict]:
    """Run a submitted notebook in its own kernel and judge every exercise of its lab's key.

    Cells run in order in the notebook's folder; a cell that raises does not stop the run, a
    cell running past ``timeout_s`` is interrupted. Then a last cell, added here, judges every
    exercise of ``key_dir/labNN.py`` from the answers the notebook recorded.

    Args:
        path: the submitted ``.ipynb``.
        key_dir: the folder of the keys.
        timeout_s: the longest one cell may run, in seconds.
        kernel_name: the Jupyter kernel to run it in.

    Returns:
        One verdict per exercise of the key, in order.

    Raises:
        ValueError: when the notebook's lab cannot be told or has no key.
    """
    # Here, not at the top: every lab and chapter imports this module through check, and
    # nbformat's schema validation alone takes about 2 s to import; only the grader needs it.
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    notebook = nbformat.read(path, as_version=4)
    lab = lab_of(path, notebook)
    key_path = Path(key_dir).resolve() / f"{lab}.py"
    if not key_path.is_file():
        raise ValueError(f"{path.name}: no key {key_path} for {lab}.")
    key = load_key(key_path)
    token = secrets.token_hex(16)
    notebook.cells.append(nbformat.v4.new_code_cell(
        "from clusterlab import grading as _clusterlab_grading\n"
        f"_clusterlab_grading.report({str(key_path)!r}, {token!r}, globals())"))
    previous = os.environ.get(KEYS_ENV)
    os.environ[KEYS_ENV] = str(key_path.parent)   # the kernel inherits it: check calls judge too
    try:
        NotebookClient(notebook, timeout=timeout_s, kernel_name=kernel_name, allow_errors=True,
                       interrupt_on_timeout=True,
                       resources={"metadata": {"path": str(path.parent.resolve())}}).execute()
    except Exception as error:  # the kernel died: nothing recorded can be read back
        return _all_failed(key, f"the notebook did not finish ({type(error).__name__}: {error})")
    finally:
        if previous is None:
            os.environ.pop(KEYS_ENV, None)
        else:
            os.environ[KEYS_ENV] = previous
    for output in notebook.cells[-1].get("outputs", []):
        for line in output.get("text", "").splitlines():
            if line.startswith(f"{_MARK} {token} "):
                rows = json.loads(line.split(" ", 2)[2])
                return [Verdict(i, bool(passed), text) for i, passed, text in rows]
    return _all_failed(key, "the grading cell did not report (the kernel failed)")


def _all_failed(key: Mapping[str, Exercise], why: str) -> list[Verdict]:
    return [Verdict(i, False, f"✗ {key[i].name}: {why}.")
            for i in sorted(key, key=_order)]


def format_report(name: str, verdicts: Sequence[Verdict]) -> str:
    """The report of one submission: one line per exercise and the total."""
    lines = [f"{name}"]
    lines += [f"  {v.exercise_id}  {v.line}" for v in verdicts]
    correct = sum(v.passed for v in verdicts)
    lines.append(f"  total: {correct}/{len(verdicts)} exercises correct")
    return "\n".join(lines)


def main(submissions: Sequence[str], *, key_dir: str, timeout_s: float) -> int:
    """Grade each submission and print its report.

    Returns:
        0 when every exercise of every submission passed, 1 when any failed, 2 when a
        submission could not be graded at all (no such file, unknown lab, no key).
    """
    if not Path(key_dir).is_dir():
        print(f"error: no key folder {key_dir}; pass --key with the folder of labNN.py files.",
              file=sys.stderr)
        return 2
    status = 0
    for submission in submissions:
        try:
            if not Path(submission).is_file():
                raise ValueError(f"{submission}: no such notebook.")
            verdicts = grade_notebook(submission, key_dir=key_dir, timeout_s=timeout_s)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            status = 2
            continue
        print(format_report(submission, verdicts))
        if not all(v.passed for v in verdicts) and status == 0:
            status = 1
    return status
