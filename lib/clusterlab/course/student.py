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

``--chapters chapters`` also writes one exercises notebook per chapter,
``chapter-NN-exercises.ipynb`` (:func:`write_chapter_exercises`): each exercise's text under an
"## Exercise K" heading, its MyST roles rendered as plain text (:func:`render_roles`), then a cell
that records the answer with ``check.answer("chNN.K", answer)`` where the chapter's key
(``keys/chNN.py``) has that exercise, or a text cell where the exercise asks for an explanation.
Solutions, hidden cells and expected values stay out.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import re
import subprocess
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


# ---- chapter exercises -------------------------------------------------------------------------

_CHAPTER_FILE = re.compile(r"^(\d\d[a-z]?)-[\w-]+\.md$")
_CHAPTER_EXERCISE = re.compile(r"```\{exercise-start\}[^\n]*\n(?::[\w-]+:[^\n]*\n)*```[^\n]*\n"
                               r"(.*?)```\{exercise-end\}", re.S)
_ROLE = re.compile(r"\{([\w:-]+)\}`([^`]*)`")
_CITATION = re.compile(r"\s*\{cite(?::\w+)?\}`[^`]*`")
_CODE_CELL = re.compile(r"```\{code-cell\}[^\n]*\n(.*?)\n```", re.S)
_SOLUTION = re.compile(r"```\{solution-start\}.*?```\{solution-end\}", re.S)
_TARGET = re.compile(r"^(.*?)\s*<([^>]*)>$", re.S)
_MYST_LEFT = re.compile(r"\{[\w:-]+\}`|```\{|^:[\w-]+:", re.M)


def chapter_id(path: str | Path) -> str:
    """The exercise-id prefix of a chapter file: ``04b-nccl-on-a-cluster.md`` -> ``"ch04b"``.

    Raises:
        ValueError: when the name does not start with the chapter's number and a hyphen.
    """
    match = _CHAPTER_FILE.match(Path(path).name)
    if not match:
        raise ValueError(f"{Path(path).name}: a chapter file is named NN-title.md (or "
                         "NNb-title.md); rename it so its exercises get ids chNN.K.")
    return "ch" + match.group(1)


def chapter_exercises(text: str) -> list[str]:
    """The text of each exercise of a chapter's MyST source, in order, roles still raw."""
    return [body.strip() for body in _CHAPTER_EXERCISE.findall(text)]


def _section_titles(text: str) -> dict[str, str]:
    """A chapter's ``(label)=`` targets and the headings they name."""
    return dict(re.findall(r"^\(([\w-]+)\)=\s*\n#+\s*(.+?)\s*$", text, re.M))


def render_roles(text: str, glued: dict[str, str], sections: dict[str, str]) -> str:
    """An exercise's MyST text as Jupyter can show it: every role rendered as plain text.

    Citations go; ``{glue:text}`name:fmt``` becomes its formatted value (``glued``, keyed by
    the role's content); ``{doc}`04-title``` becomes the chapter's number (the text says
    "chapter" already); ``{ref}`label``` becomes the section's title (``sections``);
    ``{eq}`eq-step-time``` becomes "the chapter's step-time equation"; any other role, and a
    role's ``text <target>``, its text.

    Raises:
        ValueError: when a glued value is missing from ``glued``.
    """
    def plain(match: re.Match) -> str:
        role, content = match.groups()
        target = _TARGET.match(content)
        if target:
            return target.group(1)
        if role.startswith("glue"):
            if content not in glued:
                raise ValueError(f"no glued value for {{{role}}}`{content}`.")
            return glued[content]
        if role == "doc":
            number = re.match(r"(?:\.\./)*(\d\d[a-z]?)-", content)
            return number.group(1) if number else content
        if role == "ref":
            return f'the section "{sections[content]}"' if content in sections else content
        if role == "eq":
            return f"the chapter's {content.removeprefix('eq-')} equation"
        return content

    return _ROLE.sub(plain, _CITATION.sub("", text))


# Run in a child process, in the chapter's folder: the chapter's code cells outside its
# solutions, in order, with glue() recording values, until every name asked for is glued.
_GLUE_SCRIPT = r"""
import json, os, re, sys
cells, wanted = json.loads(sys.stdin.read())
out, sys.stdout = sys.stdout, open(os.devnull, "w")   # the cells' prints are not the values
wanted = set(wanted)
values = {}
def glue(name, value, display=True):
    values[name] = value
namespace = {"__name__": "__chapter__", "glue": glue}
for source in cells:
    if wanted <= values.keys():
        break
    source = re.sub(r"^from myst_nb import glue$", "", source, flags=re.M)
    exec(compile(source, "<chapter cell>", "exec"), namespace)
json.dump({n: (v.item() if hasattr(v, "item") else v) for n, v in values.items() if n in wanted},
          out)
"""


def _cell_code(source: str) -> str:
    """A MyST code cell's Python: its options (``:option:`` lines or a ``---`` YAML block) and
    IPython magics removed."""
    lines = source.splitlines()
    if lines and lines[0].strip() == "---":
        lines = lines[lines.index("---", 1) + 1:]
    while lines and re.match(r"^:[\w-]+:", lines[0]):
        lines.pop(0)
    return "\n".join(line for line in lines if not line.lstrip().startswith("%"))


def _chapter_cells(text: str) -> list[str]:
    """The Python of a chapter's code cells outside its solutions, in order."""
    solutions = [m.span() for m in _SOLUTION.finditer(text)]
    return [_cell_code(m.group(1)) for m in _CODE_CELL.finditer(text)
            if not any(start <= m.start() < end for start, end in solutions)]


def glued_values(chapter: Path, roles: list[str]) -> dict[str, str]:
    """The text of each ``{glue:text}`` role content (``name`` or ``name:format``), computed by
    running the chapter's code outside its solutions in a child process, as the book does.

    Raises:
        ValueError: when the chapter's code fails or never glues a name.
    """
    if not roles:
        return {}
    cells = _chapter_cells(chapter.read_text())
    wanted = sorted({role.split(":")[0] for role in roles})
    result = subprocess.run([sys.executable, "-c", _GLUE_SCRIPT], input=json.dumps(
        [cells, wanted]), capture_output=True, text=True, cwd=chapter.parent,
        env={**os.environ, "MPLBACKEND": "Agg"})
    if result.returncode != 0:
        raise ValueError(f"{chapter.name}: running its code to find the glued values "
                         f"{wanted} failed: {result.stderr.strip().splitlines()[-1:]}")
    values = json.loads(result.stdout)
    missing = [name for name in wanted if name not in values]
    if missing:
        raise ValueError(f"{chapter.name}: its code outside the solutions never glues {missing}.")
    return {role: format(values[role.split(":")[0]], role.partition(":")[2])
            for role in roles}


def _setup_code(text: str) -> str:
    """The chapter's top-level imports outside its solutions, each once (``myst_nb`` and
    ``IPython`` left out: the notebook has no book to glue into), and ``check``."""
    imports: list[str] = []
    for source in _chapter_cells(text):
        for node in ast.parse(source).body:
            line = ast.get_source_segment(source, node)
            if (isinstance(node, (ast.Import, ast.ImportFrom)) and line not in imports
                    and not re.search(r"\b(myst_nb|IPython)\b", line)):
                imports.append(line)
    if not any(re.search(r"\bimport\b.*\bcheck\b", line) for line in imports):
        imports.append("from clusterlab.course import check")
    return "\n".join(imports)


def chapter_notebook(chapter: str | Path, key: dict | None) -> nbformat.NotebookNode:
    """A chapter's exercises notebook: each exercise's text, then where it records its answer.

    Args:
        chapter: the chapter's MyST file (``chapters/NN-title.md``).
        key: the chapter's key (:func:`clusterlab.course.grading.load_key`), or None: its
            exercises get an answer cell calling ``check.answer``, the comment naming what the
            answer is; the others (prose answers) a text cell.

    Raises:
        ValueError: when the chapter has no exercises, or rendered text keeps MyST markup.
    """
    chapter = Path(chapter)
    prefix, text = chapter_id(chapter), chapter.read_text()
    exercises = chapter_exercises(text)
    if not exercises:
        raise ValueError(f"{chapter.name} has no {{exercise-start}} ... {{exercise-end}} blocks.")
    roles = sorted({m.group(2) for body in exercises for m in _ROLE.finditer(body)
                    if m.group(1).startswith("glue")})
    glued, sections = glued_values(chapter, roles), _section_titles(text)
    title = re.search(r"^#\s+(.+)$", text, re.M)
    cells = [nbformat.v4.new_markdown_cell(
        f"# Exercises: {title.group(1) if title else chapter.stem}\n\n"
        "Replace each `...` with your answer and run the cell: `check.answer` records it and, "
        "where the course's keys are at hand, says whether it is right, with a hint. Exercises "
        "that ask for an explanation have a text cell. The book's chapter has the solutions."),
        nbformat.v4.new_code_cell(_setup_code(text))]
    for number, body in enumerate(exercises, start=1):
        rendered = render_roles(body, glued, sections)
        left = _MYST_LEFT.search(rendered)
        if left:
            raise ValueError(f"{chapter.name}, exercise {number}: MyST markup "
                             f"{left.group(0)!r} is left after rendering; render that role.")
        cells.append(nbformat.v4.new_markdown_cell(f"## Exercise {number}\n\n{rendered}"))
        exercise_id = f"{prefix}.{number}"
        if key is not None and exercise_id in key:
            cells.append(nbformat.v4.new_code_cell(
                f"answer = ...  # your answer: {key[exercise_id].name}\n"
                f'check.answer("{exercise_id}", answer)'))
        else:
            cells.append(nbformat.v4.new_markdown_cell(
                "*Your answer, in words (double-click to edit):*"))
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata.kernelspec = {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}
    return notebook


def write_chapter_exercises(chapters_dir: str | Path, out_dir: str | Path,
                            keys_dir: str | Path | None = "keys", *,
                            replace: bool = False) -> tuple[list[Path], list[Path]]:
    """Write ``chapter-NN-exercises.ipynb`` for every chapter with exercises in
    ``chapters_dir`` (:func:`chapter_notebook`), keeping a copy already there unless ``replace``.

    Args:
        chapters_dir: the folder of the chapters' MyST files (``NN-title.md``).
        out_dir: where to write the notebooks (created if missing).
        keys_dir: the folder of the chapters' keys (``chNN.py``); a chapter without a key, or
            ``None``, gets a text cell for every exercise.
        replace: overwrite notebooks that exist (the work in them is lost).

    Returns:
        ``(written, kept)``: the paths written and those kept, sorted.
    """
    from clusterlab.course import grading  # here: it imports the grader, which only this needs

    chapters = [p for p in sorted(Path(chapters_dir).glob("*.md")) if _CHAPTER_FILE.match(p.name)
                and chapter_exercises(p.read_text())]
    if not chapters:
        raise ValueError(f"No chapter with exercises (NN-title.md) in {chapters_dir}.")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written, kept = [], []
    for chapter in chapters:
        prefix = chapter_id(chapter)
        target = out / f"chapter-{prefix.removeprefix('ch')}-exercises.ipynb"
        if target.exists() and not replace:
            kept.append(target)
            continue
        key_path = Path(keys_dir) / f"{prefix}.py" if keys_dir is not None else None
        key = grading.load_key(key_path) if key_path and key_path.is_file() else None
        nbformat.write(chapter_notebook(chapter, key), target)
        written.append(target)
    return written, kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clusterlab.course.student",
        description="Write student copies of the labs (solutions and outputs removed) and the "
                    "chapters' exercises notebooks.")
    parser.add_argument("--labs", help="folder of the labs (labs, unless only --chapters)")
    parser.add_argument("--chapters", help="folder of the chapters: also write "
                        "chapter-NN-exercises.ipynb for each")
    parser.add_argument("--keys", default="keys", help="folder of the chapters' keys (keys): "
                        "which exercises take a checked answer")
    parser.add_argument("--out", default="student", help="folder to write to (student)")
    parser.add_argument("--replace", action="store_true",
                        help="overwrite copies that exist (the work in them is lost)")
    args = parser.parse_args(argv)
    labs = args.labs or (None if args.chapters else "labs")
    try:
        if labs:
            written = write_student_copies(labs, args.out, replace=args.replace)
            kept = len(list(Path(labs).glob("*.ipynb"))) - len(written)
            print(f"Wrote {len(written)} student notebooks to {args.out}"
                  + (f"; kept {kept} that were there (your work; --replace overwrites them)"
                     if kept else ""))
        if args.chapters:
            written, kept_chapters = write_chapter_exercises(args.chapters, args.out, args.keys,
                                                             replace=args.replace)
            print(f"Wrote {len(written)} chapter exercises notebooks to {args.out}"
                  + (f"; kept {len(kept_chapters)} that were there (your work; --replace "
                     "overwrites them)" if kept_chapters else ""))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
