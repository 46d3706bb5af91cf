"""Student copies of the labs (``python -m clusterlab.course.student``): solutions and outputs out, and
no check that carries its expected value (grading from the key: tests/test_grading.py)."""

from __future__ import annotations

import re

import nbformat
import pytest

from clusterlab.course import check, grading, student
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
    result = run_python("-m", "clusterlab.course.student", "--out", str(tmp_path / "student"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Wrote {len(LABS)} student notebooks")
    for lab in LABS:
        original = nbformat.read(lab, as_version=4)
        copy = nbformat.read(tmp_path / "student" / lab.name, as_version=4)
        text = "\n".join(c.source for c in copy.cells)
        assert student.SOLUTION_START not in text and student.SOLUTION_END not in text
        assert all(c.outputs == [] and c.execution_count is None
                   for c in copy.cells if c.cell_type == "code")
        # every exercise stays, as a numbered heading Jupyter shows (no raw book markup), and
        # nothing but solutions is removed
        opened = sum(student.SOLUTION_START in c.source for c in original.cells
                     if c.cell_type == "markdown")
        exercises = "\n".join(c.source for c in original.cells).count("{exercise-start}")
        assert "{exercise-start}" not in text and "{exercise-end}" not in text
        assert [int(n) for n in re.findall(r"^### Exercise (\d+)$", text, re.M)] == list(
            range(1, exercises + 1))
        assert grading.lab_of(lab.name, copy) == grading.lab_of("renamed.ipynb", copy)
        assert (len(copy.cells) < len(original.cells)) == (opened > 0)


def test_missing_labs_folder_is_an_error(tmp_path):
    assert student.main(["--labs", str(tmp_path), "--out", str(tmp_path / "s")]) == 2


def test_a_copy_that_would_show_an_expected_value_is_refused(tmp_path):
    labs = tmp_path / "labs"
    labs.mkdir()
    nbformat.write(_notebook(("md", "# Lab"), ("code", "answer = ...\ncheck.close(answer, 2.5)")),
                   labs / "98-x.ipynb")
    with pytest.raises(ValueError, match=r"98-x.ipynb: cell 1 of the student copy checks an "
                                         r"exercise with its expected value"):
        student.write_student_copies(labs, tmp_path / "out")


def test_student_copies_record_answers_without_expected_values(tmp_path):
    for path in student.write_student_copies(ROOT / "labs", tmp_path):
        code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells
                         if c.cell_type == "code")
        for call in re.findall(r"check\.answer\(([^\n]*)", code):
            assert re.fullmatch(r'"lab\d\d\.\d+", \w+\)', call), (path.name, call)


def test_a_second_run_keeps_the_students_work(tmp_path, capsys):
    # `make student` twice, or `make lab` after it, must not wipe a student's answers.
    labs = tmp_path / "labs"
    labs.mkdir()
    for name in ("00-devices-and-meshes.ipynb", "01-measuring-collectives.ipynb"):
        (labs / name).write_text((ROOT / "labs" / name).read_text())
    out = tmp_path / "student"
    assert student.main(["--labs", str(labs), "--out", str(out)]) == 0
    worked = out / "00-devices-and-meshes.ipynb"
    worked.write_text(worked.read_text().replace("devices.setup(8)", "devices.setup(8)  # mine"))
    assert student.main(["--labs", str(labs), "--out", str(out)]) == 0
    assert "# mine" in worked.read_text()
    assert "kept 2 that were there" in capsys.readouterr().out
    assert student.main(["--labs", str(labs), "--out", str(out), "--replace"]) == 0
    assert "# mine" not in worked.read_text()  # the negative control: --replace overwrites


# --- "Run All" on a fresh copy: public tests of an unwritten function say "not attempted" --------

_SKELETON = ('def double(x):\n    raise NotImplementedError("write double.")\n\n\n'
             'check.answer("lab98.1", double)')
_PUBLIC = "def twice(x):\n    return 2 * x\n\n\ncheck.verify_equal('double doubles', double(3), twice(3))"


def _exercise_notebook() -> nbformat.NotebookNode:
    return _notebook(("md", "# Lab"), ("code", "from clusterlab.course import check"),
                     ("code", _SKELETON),
                     ("md", "```{solution-start} lab98-double\n```"),
                     ("code", "def double(x):\n    return 2 * x"),
                     ("md", "```{solution-end}\n```\n\nThe public tests:"),
                     ("code", _PUBLIC), ("code", "after = 1"))


def test_public_tests_say_not_attempted_for_a_skeleton_only(capsys):
    with check.public_tests("lab98.1"):
        raise NotImplementedError("write double.")
    assert capsys.readouterr().out.startswith("○ lab98.1: not attempted yet (write double.)")
    # negative controls: a bug in the student's function, and JAX's own NotImplementedError,
    # are raised as usual
    with pytest.raises(ZeroDivisionError), check.public_tests("lab98.1"):
        1 / 0
    with pytest.raises(NotImplementedError, match="unsupported on this platform"), \
            check.public_tests("lab98.1"):
        raise NotImplementedError("unsupported on this platform")


def test_the_copy_wraps_the_cell_after_each_solution_and_nothing_else():
    copy = student.strip_solutions(student.guard_public_tests(_exercise_notebook()))
    code = [c.source for c in copy.cells if c.cell_type == "code"]
    assert code[0] == "from clusterlab.course import check" and code[1] == _SKELETON
    assert code[2].startswith('with check.public_tests("lab98.1"):')
    assert code[2].split("\n", 1)[1] == "".join(
        f"    {line}" if line.strip() else line for line in _PUBLIC.splitlines(keepends=True))
    assert code[3] == "after = 1"


def test_run_all_on_the_wrapped_cells(capsys):
    copy = student.strip_solutions(student.guard_public_tests(_exercise_notebook()))
    namespace: dict = {}
    for cell in copy.cells:
        if cell.cell_type == "code":
            exec(cell.source, namespace)   # "Run All": every cell, in order
    assert namespace["after"] == 1
    out = capsys.readouterr().out
    assert "○ lab98.1: not attempted yet" in out
    # the student writes the function: the same cell now runs the tests and passes
    exec("def double(x):\n    return 2 * x", namespace)
    exec(next(c.source for c in copy.cells if "public_tests" in c.source), namespace)
    assert "✓ double doubles" in capsys.readouterr().out
    # and a wrong function fails the test (it raises, it is not "not attempted")
    exec("def double(x):\n    return x + 1", namespace)
    with pytest.raises(check.VerificationFailed):
        exec(next(c.source for c in copy.cells if "public_tests" in c.source), namespace)


def test_a_string_over_several_lines_keeps_its_text_when_the_cell_is_wrapped():
    # lab 09's public tests write a child script from a triple-quoted string: indenting its
    # lines would hand the child an IndentationError
    source = 'script = """import os\nprint(os.getpid())\n"""\nlength = len(script)\n'
    wrapped = "with check.public_tests('lab98.1'):\n" + student.indented(source)
    namespace = {"check": check}
    exec(wrapped, namespace)
    exec(source, expected := {})
    assert namespace["script"] == expected["script"] and namespace["length"] == len("import os\nprint(os.getpid())\n")
    assert student.indented("x = (\n") == "    x = (\n"   # a cell that does not parse: as is


def test_run_all_on_a_fresh_copy_of_a_lab_reaches_the_end(tmp_path):
    # Lab 02's fresh copy runs every cell in order, as Jupyter's "Run All" does: its two
    # unwritten ring functions are reported by their public tests, not raised.
    import nbclient

    labs = tmp_path / "labs"
    labs.mkdir()
    lab = next((ROOT / "labs").glob("02-*.ipynb"))
    (labs / lab.name).write_text(lab.read_text())
    (copy_path,) = student.write_student_copies(labs, tmp_path / "student")
    notebook = nbformat.read(copy_path, as_version=4)
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT / "labs")}}).execute()
    printed = "".join(output.get("text", "") for cell in notebook.cells
                      if cell.cell_type == "code" for output in cell.outputs)
    assert "○ lab02.3: not attempted yet (write ring_reduce_scatter.)" in printed
    assert "○ lab02.4: not attempted yet (write ring_all_gather.)" in printed
    assert all(output.get("output_type") != "error" for cell in notebook.cells
               if cell.cell_type == "code" for output in cell.outputs)


def test_a_cell_the_lab_already_guards_is_not_wrapped_again():
    guarded = 'with check.public_tests("lab98.1"):\n    double(3)'
    notebook = _exercise_notebook()
    notebook.cells[6].source = guarded
    copy = student.strip_solutions(student.guard_public_tests(notebook))
    assert [c.source for c in copy.cells if c.cell_type == "code"][2] == guarded
