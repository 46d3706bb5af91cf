"""Student copies of the labs (``python -m clusterlab.student``) and the instructor's check of a
submitted notebook with nbval in lax mode and strict answer checks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from clusterlab import check, student
from conftest import ROOT, run_python

LABS = sorted((ROOT / "labs").glob("*.ipynb"))


def _notebook(*cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    for kind, source in cells:
        if kind == "md":
            nb.cells.append(nbformat.v4.new_markdown_cell(source))
        else:
            cell = nbformat.v4.new_code_cell(source, execution_count=3)
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="7\n")]
            nb.cells.append(cell)
    return nb


def test_strip_solutions_removes_the_gated_cells_and_clears_outputs():
    nb = _notebook(("md", "# Lab"), ("code", "x = 1"),
                   ("md", "```{exercise-start}\n:label: e\n```\nTask"), ("md", "```{exercise-end}\n```"),
                   ("code", "answer = ..."),
                   ("md", "```{solution-start} e\n:class: dropdown\n```\nWhy"),
                   ("code", "answer = 2"), ("md", "```{solution-end}\n```"),
                   ("md", "## Summary"))
    copy = student.strip_solutions(nb)
    assert [c.source for c in copy.cells] == [
        "# Lab", "x = 1", "```{exercise-start}\n:label: e\n```\nTask", "```{exercise-end}\n```",
        "answer = ...", "## Summary"]
    assert all(c.outputs == [] and c.execution_count is None
               for c in copy.cells if c.cell_type == "code")
    assert len(nb.cells) == 9 and nb.cells[1].outputs            # the input is unchanged


def test_a_solution_in_one_markdown_cell_is_removed():
    nb = _notebook(("md", "```{solution-start} e\n```\nText\n```{solution-end}\n```"),
                   ("md", "after"))
    assert [c.source for c in student.strip_solutions(nb).cells] == ["after"]


def test_text_sharing_a_cell_with_the_directives_stays():
    nb = _notebook(("md", "Intro\n\n```{solution-start} a\n:class: dropdown\n```\nWhy"),
                   ("code", "answer = 2"),
                   ("md", "```{solution-end}\n```\n\n```{exercise-start}\n:label: b\n```\nNext"))
    assert [c.source for c in student.strip_solutions(nb).cells] == [
        "Intro", "```{exercise-start}\n:label: b\n```\nNext"]


@pytest.mark.parametrize("cells, match", [
    ([("md", "```{solution-start} a\n```"), ("md", "```{solution-start} b\n```")],
     "Cell 1 opens a solution inside the solution opened in cell 0"),
    ([("md", "```{solution-end}\n```")], "Cell 0 closes a solution that no cell opened"),
    ([("md", "x"), ("md", "```{solution-start} a\n```")], "opened in cell 1 is never closed"),
    ([("md", "```{solution-end}\n```\n```{solution-start} a\n```")],
     "Cell 0 closes a solution before it opens one"),
])
def test_unbalanced_solutions_are_named(cells, match):
    with pytest.raises(ValueError, match=match):
        student.strip_solutions(_notebook(*cells))


def test_student_copies_of_every_lab(tmp_path):
    result = run_python("-m", "clusterlab.student", "--out", str(tmp_path / "student"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Wrote {len(LABS)} student notebooks")
    for lab in LABS:
        original = nbformat.read(lab, as_version=4)
        copy = nbformat.read(tmp_path / "student" / lab.name, as_version=4)
        text = "\n".join(c.source for c in copy.cells)
        assert student.SOLUTION_START not in text and student.SOLUTION_END not in text
        assert all(c.outputs == [] and c.execution_count is None
                   for c in copy.cells if c.cell_type == "code")
        # every exercise stays, and nothing but solutions is removed
        opened = sum(student.SOLUTION_START in c.source for c in original.cells
                     if c.cell_type == "markdown")
        assert text.count("{exercise-start}") == "\n".join(
            c.source for c in original.cells).count("{exercise-start}")
        assert (len(copy.cells) < len(original.cells)) == (opened > 0)


def test_missing_labs_folder_is_an_error(tmp_path):
    assert student.main(["--labs", str(tmp_path), "--out", str(tmp_path / "s")]) == 2


# The instructor's check, on lab 00 (it runs in seconds): nbval in lax mode runs every cell and
# compares no outputs; strict checks turn each wrong or missing answer into a failing cell.

LAB00_ANSWERS = ["answer = (4, 6)", "answer = 2",
                 "answer = jax.jit(jax.shard_map(lambda b: jax.lax.pmax(jnp.max(b, keepdims=True),"
                 " 'data'), mesh=mesh_1d, in_specs=P('data'), out_specs=P()))(data)"]


def _submission(tmp_path: Path, answers: list[str]) -> Path:
    copy = student.strip_solutions(nbformat.read(ROOT / "labs" / "00-devices-and-meshes.ipynb",
                                                 as_version=4))
    blanks = [c for c in copy.cells if c.cell_type == "code"
              and re.search(r"^answer = \.\.\.", c.source, re.MULTILINE)]
    assert len(blanks) == len(answers) == 3
    for cell, answer in zip(blanks, answers):
        cell.source = re.sub(r"^answer = \.\.\..*$", answer, cell.source, flags=re.MULTILINE)
    path = tmp_path / "submitted.ipynb"
    nbformat.write(copy, path)
    return path


def _nbval_lax(path: Path, *, strict: bool) -> subprocess.CompletedProcess:
    env = {**os.environ, check.STRICT_ENV: "1" if strict else "0"}
    return subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env",
                           "-p", "no:cacheprovider", "-q", path.name], cwd=path.parent, env=env,
                          capture_output=True, text=True, timeout=300)


def test_instructor_check_passes_a_correct_submission(tmp_path):
    result = _nbval_lax(_submission(tmp_path, LAB00_ANSWERS), strict=True)
    assert result.returncode == 0, result.stdout[-3000:]
    assert re.search(r"\d+ passed", result.stdout) and "failed" not in result.stdout


def test_instructor_check_fails_wrong_and_missing_answers(tmp_path):
    path = _submission(tmp_path, ["answer = (6, 4)", "answer = ...", LAB00_ANSWERS[2]])
    strict = _nbval_lax(path, strict=True)
    assert strict.returncode == 1
    assert re.search(r"\b2 failed\b", strict.stdout), strict.stdout[-3000:]
    assert "✗ block shape is not right." in strict.stdout
    assert "✗ copies of w[0]: no answer yet" in strict.stdout
