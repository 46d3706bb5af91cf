"""Student copies of the labs: solutions removed, outputs cleared, no answer key.

``python -m clusterlab.course.student --out student/`` (``make student``) writes one notebook per
lab in ``labs/``. A solution is every cell from the markdown cell that opens it (a
```` ```{solution-start} ```` directive, QuantEcon's gated format) to the markdown cell that
closes it (```` ```{solution-end} ````), both included; text that shares a cell with those
directives, before the opening or after the closing one, stays. Exercises and the cells where
students write their answers stay. Code cells lose their outputs and execution counts, so the
copy shows nothing a student has not run. Each code exercise's public tests are wrapped in
:func:`clusterlab.course.check.public_tests` (:func:`guard_public_tests`), so "Run All" on a fresh
copy runs to the end and says which functions are not written yet.

The answer key stays out: the copies are notebooks only (the keys live in ``keys/labNN.py``, see
:mod:`clusterlab.course.grading`), and a copy is refused when a cell left in it checks an exercise
with its expected value (``check.close``/``check.equal``) instead of recording it with
``check.answer(id, answer)``. To grade submitted copies, run them against the key:
``python -m clusterlab grade submitted/*.ipynb --key keys`` (``make grade SUBMISSIONS=...``).
"""

from __future__ import annotations

import argparse
import io
import re
import sys
import tokenize
from pathlib import Path

import nbformat

SOLUTION_START = "{solution-start}"
SOLUTION_END = "{solution-end}"
_END = re.compile(r"```\{solution-end\}[^\n]*\n\s*```[^\n]*(\n|$)")
# a check that carries its expected value, in a cell a student sees
_VISIBLE_KEY = re.compile(r"\bcheck\.(close|equal)\(")
# a code exercise's skeleton: raise NotImplementedError("write ..."), then check.answer(id, fn)
_SKELETON = re.compile(r"raise NotImplementedError\(\"write ")
_ANSWER_ID = re.compile(r"check\.answer\(\"(lab\d\d\.\d+)\"")


def strip_solutions(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of ``notebook`` without its solution cells and with code outputs cleared.

    Args:
        notebook: an nbformat v4 notebook.

    Returns:
        A new notebook; the input is left unchanged.

    Raises:
        ValueError: when a solution is opened twice, closed without being opened or never
            closed, naming the cell.
    """
    copy = nbformat.from_dict(notebook)
    kept, inside, opened_at = [], False, None
    for index, cell in enumerate(copy.cells):
        source = cell.source if cell.cell_type == "markdown" else ""
        start = source.find("```" + SOLUTION_START)
        end = _END.search(source)
        if start >= 0 and end is not None and end.start() < start:
            raise ValueError(f"Cell {index} closes a solution before it opens one; split it.")
        if start >= 0 and inside:
            raise ValueError(f"Cell {index} opens a solution inside the solution opened in "
                             f"cell {opened_at}; close it first with {SOLUTION_END}.")
        if end is not None and not inside and start < 0:
            raise ValueError(f"Cell {index} closes a solution that no cell opened.")
        if start >= 0 or end is not None:
            # A markdown cell may carry text before the solution opens or after it closes
            # (the next exercise): keep that text, drop the solution's.
            before = source[:start] if start >= 0 else ""
            after = source[end.end():] if end is not None else ""
            inside, opened_at = end is None, index if start >= 0 else opened_at
            text = (before.rstrip() + "\n\n" + after.lstrip()).strip()
            if text:
                cell.source = text
                kept.append(cell)
            continue
        if not inside:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
                cell.metadata.pop("execution", None)
            kept.append(cell)
    if inside:
        raise ValueError(f"The solution opened in cell {opened_at} is never closed with "
                         f"{SOLUTION_END}.")
    copy.cells = kept
    return copy


def indented(source: str, prefix: str = "    ") -> str:
    """``source`` one block deeper: every code line gets ``prefix``; the lines inside a string
    that spans lines (a script a cell writes to a file, say) keep their text exactly."""
    inside_string: set[int] = set()   # 1-based numbers of lines that continue a string
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.STRING and token.end[0] > token.start[0]:
                inside_string.update(range(token.start[0] + 1, token.end[0] + 1))
    except tokenize.TokenError:  # a cell that does not parse: the student sees its own error
        pass
    return "".join(line if number in inside_string or not line.strip() else prefix + line
                   for number, line in enumerate(source.splitlines(keepends=True), start=1))


def guard_public_tests(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Wrap each code exercise's public tests in :func:`clusterlab.course.check.public_tests`.

    The public tests are the first code cell after the exercise's solution. In a fresh copy the
    function is still a skeleton, so the wrapped cell prints "not attempted" instead of raising,
    and "Run All" goes on to the end. A cell that already calls ``check.public_tests`` is left
    as the lab wrote it. The notebook is changed in place and returned.
    """
    exercise, after_solution = None, False
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            if _END.search(cell.source) and exercise is not None:
                after_solution = True
            continue
        if cell.cell_type != "code":
            continue
        answered = _ANSWER_ID.search(cell.source)
        if answered and _SKELETON.search(cell.source):
            exercise, after_solution = answered.group(1), False
        elif after_solution and "check.public_tests(" in cell.source:  # guarded in the lab
            exercise, after_solution = None, False
        elif after_solution:
            cell.source = (f'with check.public_tests("{exercise}"):  # "not attempted" while the '
                           f"function is a skeleton\n{indented(cell.source)}")
            exercise, after_solution = None, False
    return notebook


_EXERCISE_START = re.compile(r"```\{exercise-start\}[^\n]*\n((?::[\w-]+:[^\n]*\n)*)```")
_EXERCISE_END = re.compile(r"\n*```\{exercise-end\}\n```\n*")


def exercise_headings(notebook):
    """The book's exercise markup as Jupyter shows it: ``### Exercise N`` headings, numbered
    in the notebook, in place of the ``{exercise-start}`` / ``{exercise-end}`` fences (raw
    text in Jupyter). Each label stays in an HTML comment, which Jupyter hides and the grader
    still reads (:func:`clusterlab.course.grading.lab_of`)."""
    number = 0

    def heading(match: re.Match) -> str:
        nonlocal number
        number += 1
        labels = re.findall(r":label:\s*([\w-]+)", match.group(1))
        hidden = "".join(f"\n<!-- :label: {label} -->" for label in labels)
        return f"### Exercise {number}{hidden}"

    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            text = _EXERCISE_START.sub(heading, cell.source)
            cell.source = _EXERCISE_END.sub("\n\n", text).strip()
    notebook.cells = [c for c in notebook.cells if c.cell_type != "markdown" or c.source]
    return notebook


def write_student_copies(labs_dir: str | Path, out_dir: str | Path, *,
                         replace: bool = False) -> list[Path]:
    """Write a student copy of every ``*.ipynb`` in ``labs_dir`` to ``out_dir``.

    A copy that is already there is the student's work: it is kept unless ``replace``.

    Args:
        labs_dir: the folder of the labs.
        out_dir: where to write the copies (created if missing).
        replace: overwrite copies that exist (their work is lost).

    Returns:
        The paths written, sorted (not those kept).
    """
    labs = sorted(Path(labs_dir).glob("*.ipynb"))
    if not labs:
        raise ValueError(f"No notebooks (*.ipynb) in {labs_dir}.")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for lab in labs:
        try:
            original = guard_public_tests(nbformat.read(lab, as_version=4))
            copy = exercise_headings(strip_solutions(original))
        except ValueError as error:
            raise ValueError(f"{lab.name}: {error}") from None
        for index, cell in enumerate(copy.cells):
            if cell.cell_type == "code" and _VISIBLE_KEY.search(cell.source):
                raise ValueError(f"{lab.name}: cell {index} of the student copy checks an "
                                 "exercise with its expected value; record the answer with "
                                 "check.answer(id, answer) and put the value in keys/.")
        target = out / lab.name
        if target.exists() and not replace:
            continue
        nbformat.write(copy, target)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clusterlab.course.student",
        description="Write student copies of the labs: solutions removed, outputs cleared.")
    parser.add_argument("--labs", default="labs", help="folder of the labs (labs)")
    parser.add_argument("--out", default="student", help="folder to write to (student)")
    parser.add_argument("--replace", action="store_true",
                        help="overwrite copies that exist (the work in them is lost)")
    args = parser.parse_args(argv)
    try:
        written = write_student_copies(args.labs, args.out, replace=args.replace)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    kept = len(list(Path(args.labs).glob("*.ipynb"))) - len(written)
    print(f"Wrote {len(written)} student notebooks to {args.out}"
          + (f"; kept {kept} that were there (your work; --replace overwrites them)"
             if kept else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
