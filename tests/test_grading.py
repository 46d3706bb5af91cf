"""Grading from the instructor's key: check.answer, keys/labNN.py, python -m clusterlab grade.

A tiny fixture lab ("lab 98", key in tests/data/keys) covers the grader's paths in seconds;
lab 00, the quickest real lab, is graded as submitted: with its solutions, as an unanswered
student copy, and with wrong answers (one of them jnp.max for the shard_map exercise).
"""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import nbformat
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from clusterlab.course import check, grading, student
from clusterlab.device import collectives
from conftest import DEVICES, ROOT, fixture_submission, run_python, sub_mesh

FIXTURE_KEYS = ROOT / "tests" / "data" / "keys"
KEYS = ROOT / "keys"
LAB00 = ROOT / "labs" / "00-devices-and-meshes.ipynb"


@pytest.fixture
def fixture_keys(monkeypatch):
    monkeypatch.setenv(grading.KEYS_ENV, str(FIXTURE_KEYS))


# --- check.answer in a notebook ----------------------------------------------------------------

def test_answer_without_a_key_records_and_says_how_it_is_graded(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(grading.KEYS_ENV, str(tmp_path / "no-keys"))
    check.answer("lab98.1", 2.5)
    assert capsys.readouterr().out == ("• lab98.1: answer recorded; your instructor grades it "
                                       "with the course's key (python -m clusterlab grade).\n")
    assert check.recorded_answers()["lab98.1"] == 2.5
    check.answer("lab98.1", ...)
    assert capsys.readouterr().out == ("✗ lab98.1: no answer yet; replace the ... with your "
                                       "value.\n")


def test_answer_with_the_key_prints_its_verdict_and_hint(fixture_keys, capsys):
    check.answer("lab98.1", 2.5)
    check.answer("lab98.1", 3.0)
    check.answer("lab98.3", lambda x: 2 * x)
    check.answer("lab98.3", lambda x: x + 2)
    assert capsys.readouterr().out.splitlines() == [
        "✓ time (s) is correct.",
        "✗ time (s) is off: 3.0 vs the expected value (within 1e-03 relative). Divide the bytes "
        "by the bandwidth.",
        "✓ double is correct.",
        "✗ double: it returns 23 for 21. Return twice the input."]


pair = (1, 2)   # what lab98.2's key reads from the calling notebook's namespace


def test_answer_takes_expected_values_from_the_callers_namespace(fixture_keys, capsys):
    check.answer("lab98.2", [1, 2])
    check.answer("lab98.2", (2, 1))
    assert capsys.readouterr().out.splitlines() == ["✓ pair is correct.",
                                                    "✗ pair is not right. Swap nothing."]


@pytest.mark.parametrize("bad", ["lab1.2", "lab01-2", "01.2", 3])
def test_answer_refuses_a_malformed_id(bad):
    with pytest.raises(ValueError, match="Exercise ids look like 'lab01.2'"):
        check.answer(bad, 1.0)


def test_an_id_missing_from_the_key_is_an_error(fixture_keys):
    with pytest.raises(ValueError, match=r"The key has no exercise lab98.9"):
        check.answer("lab98.9", 1.0)


def test_keys_are_found_above_the_working_directory(monkeypatch):
    monkeypatch.delenv(grading.KEYS_ENV, raising=False)
    monkeypatch.chdir(ROOT / "labs")
    assert grading.keys_dir() == KEYS


# --- keys ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, text, match", [
    ("key.py", "KEY = {}", "named labNN.py"),
    ("lab97.py", "ANSWERS = {}", "must define KEY"),
    ("lab97.py", "KEY = {'lab97.1': 2.5}", "must define KEY"),
    ("lab97.py", "from clusterlab.course import grading\nKEY = {'lab96.1': grading.close(1, name='x')}",
     r"another lab or badly named ids: \['lab96.1'\]"),
])
def test_malformed_keys_are_refused(tmp_path, name, text, match):
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=match):
        grading.load_key(tmp_path / name)


def test_every_exercise_not_recorded_fails_by_name():
    key = grading.load_key(FIXTURE_KEYS / "lab98.py")
    verdicts = grading.judge_all(key, {"lab98.1": 2.5}, {})
    assert [(v.exercise_id, v.passed) for v in verdicts] == [
        ("lab98.1", True), ("lab98.2", False), ("lab98.3", False)]
    assert verdicts[2].line == ('✗ double: no answer recorded (check.answer("lab98.3", ...) did '
                                'not run).')
    assert verdicts[1].line.startswith("✗ pair: no answer recorded")


def test_a_key_that_cannot_read_the_lab_fails_the_exercise_not_the_grader():
    key = grading.load_key(FIXTURE_KEYS / "lab98.py")
    verdict = grading.judge(key, "lab98.2", (1, 2), {})          # the lab's `pair` is missing
    assert not verdict.passed and "could not be graded (KeyError" in verdict.line


def _exercise_ids(cells) -> list[str]:
    return re.findall(r'check\.answer\("(lab\d\d\.\d+)"', "\n".join(c.source for c in cells
                                                                   if c.cell_type == "code"))


@pytest.mark.parametrize("key_path", sorted(KEYS.glob("lab*.py")), ids=lambda p: p.stem)
def test_each_key_covers_its_lab_and_both_cells_of_every_exercise_record(key_path, tmp_path):
    lab = next((ROOT / "labs").glob(f"{key_path.stem.removeprefix('lab')}-*.ipynb"))
    notebook = nbformat.read(lab, as_version=4)
    in_lab = _exercise_ids(notebook.cells)
    in_student_copy = _exercise_ids(student.strip_solutions(notebook).cells)
    key = grading.load_key(key_path)
    assert sorted(key, key=grading._order) == sorted(set(in_lab), key=grading._order)
    # the student's cell and the solution's cell each record every exercise, once
    assert sorted(in_student_copy) == sorted(key)
    assert sorted(in_lab) == sorted(2 * list(key))
    labels = [m for c in notebook.cells if c.cell_type == "markdown"
              for m in re.findall(r"\{exercise-start\}", c.source)]
    assert len(labels) == len(key)


# --- code exercises are judged on what the student wrote ---------------------------------------

def test_lab00_global_max_refuses_jnp_max_and_accepts_a_shard_map():
    key = grading.load_key(KEYS / "lab00.py")
    mesh = sub_mesh(8, "data")
    shard_map_max = jax.jit(jax.shard_map(
        lambda block: jax.lax.pmax(jnp.max(block, keepdims=True), "data"), mesh=mesh,
        in_specs=P("data"), out_specs=P()))
    verdicts = {name: grading.judge(key, "lab00.3", fn, {}) for name, fn in [
        ("shard_map", shard_map_max), ("jnp.max", jax.jit(lambda d: jnp.max(d, keepdims=True))),
        ("a value", shard_map_max(jnp.arange(64.0)))]}
    assert verdicts["shard_map"].passed
    assert not verdicts["jnp.max"].passed
    assert "its compiled program runs no collective; it must run all-reduce" in \
        verdicts["jnp.max"].line
    assert "expected the function you wrote, got a ArrayImpl" in verdicts["a value"].line


def test_require_collectives_names_what_is_missing_and_what_is_forbidden():
    mesh = sub_mesh(8, "data")
    x = jnp.ones((8 * 16,))
    psum = collectives.make_collective("all_reduce", mesh, "data")
    assert grading.require_collectives(psum, x, includes=["all-reduce"]) == ["all-reduce"]
    with pytest.raises(grading.Refused, match="runs all-reduce; it must run collective-permute"):
        grading.require_collectives(psum, x, includes=["collective-permute"])
    with pytest.raises(grading.Refused, match="runs all-reduce, which this exercise asks you"):
        grading.require_collectives(psum, x, includes=[], excludes=["all-reduce"])
    assert len(DEVICES) == 8


def test_a_student_function_that_raises_is_refused_with_the_error():
    key = grading.load_key(FIXTURE_KEYS / "lab98.py")
    verdict = grading.judge(key, "lab98.3", lambda x: x.missing, {})
    # the kernel traces it to export it: the error is the tracer's
    assert verdict.line == ("✗ double: your function raised AttributeError: DynamicJaxprTracer "
                            "has no attribute missing Return twice the input.")


def test_a_function_that_ignores_an_input_is_judged_on_those_it_reads():
    # jax.export drops an input the function never reads (a hand-written backward needs no
    # bias); the rebuilt program still takes every input the key passes it
    def doubles_its_first_input(programs):
        (program,) = programs
        x = np.arange(8.0, dtype=np.float32)
        grading.require_close("its result", program(x, np.ones(8, np.float32)), 2 * x)

    key = {"lab98.9": grading.code(doubles_its_first_input, name="first input doubled",
                                   exports=[grading.Export(args=[((8,), "float32")] * 2,
                                                           n_devices=2, wrap="shard_map")])}
    verdict = grading.judge(key, "lab98.9", lambda x, _unused, axis_name: 2 * x, {})
    assert verdict.passed, verdict.line


# --- python -m clusterlab grade: a submitted notebook, run in its own kernel --------------------

FIXTURE_CELLS = ["from clusterlab.course import check\npair = (1, 2)",
                 "answer = 2.5  # s\ncheck.answer(\"lab98.1\", answer)",
                 "raise RuntimeError('a broken cell does not stop grading')",
                 "answer = [1, 2]\ncheck.answer(\"lab98.2\", answer)",
                 "def double(x):\n    return 2 * x\ncheck.answer(\"lab98.3\", double)"]


def test_grade_a_correct_submission_scores_full_despite_a_broken_cell(tmp_path):
    verdicts = grading.grade_notebook(fixture_submission(tmp_path, FIXTURE_CELLS), key_dir=FIXTURE_KEYS)
    assert [(v.exercise_id, v.passed) for v in verdicts] == [
        ("lab98.1", True), ("lab98.2", True), ("lab98.3", True)]


def test_grade_cli_a_deleted_check_and_a_wrong_answer_fail_with_hints(tmp_path):
    cells = list(FIXTURE_CELLS)
    cells[1] = "answer = 3.0\ncheck.answer(\"lab98.1\", answer)"     # wrong
    cells[3] = "answer = [1, 2]"                                      # its check call deleted
    wrong = fixture_submission(tmp_path, cells, "alice-98-fixture.ipynb")
    right = fixture_submission(tmp_path, FIXTURE_CELLS)
    result = run_python("-m", "clusterlab", "grade", str(right), str(wrong),
                        "--key", str(FIXTURE_KEYS), timeout=400)
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines()[1:] == [
        str(right),
        "  lab98.1  ✓ time (s) is correct.",
        "  lab98.2  ✓ pair is correct.",
        "  lab98.3  ✓ double is correct.",
        "  total: 3/3 exercises correct",
        str(wrong),
        "  lab98.1  ✗ time (s) is off: 3.0 vs the expected value (within 1e-03 relative). "
        "Divide the bytes by the bandwidth.",
        '  lab98.2  ✗ pair: no answer recorded (check.answer("lab98.2", ...) did not run).',
        "  lab98.3  ✓ double is correct.",
        "  total: 1/3 exercises correct"]
    only_right = run_python("-m", "clusterlab", "grade", str(right), "--key", str(FIXTURE_KEYS),
                            timeout=400)
    assert only_right.returncode == 0 and "total: 3/3" in only_right.stdout


@pytest.mark.parametrize("args, message", [
    (["missing.ipynb", "--key", str(FIXTURE_KEYS)], "error: missing.ipynb: no such notebook."),
    (["x.ipynb", "--key", "no-such-folder"], "error: no key folder no-such-folder"),
])
def test_grade_cli_errors_exit_2(args, message):
    result = run_python("-m", "clusterlab", "grade", *args)
    errors = [line for line in result.stderr.splitlines() if not line.startswith("note: ")]
    assert result.returncode == 2 and errors[0].startswith(message), result.stderr


def test_a_cell_past_the_timeout_is_interrupted_and_grading_goes_on(tmp_path):
    cells = [*FIXTURE_CELLS[:2], "import time\ntime.sleep(60)", *FIXTURE_CELLS[3:]]
    verdicts = grading.grade_notebook(fixture_submission(tmp_path, cells), key_dir=FIXTURE_KEYS,
                                      timeout_s=3)
    assert [v.passed for v in verdicts] == [True, True, True]


def test_the_lab_comes_from_the_file_name_or_the_exercise_labels():
    labelled = nbformat.v4.new_notebook()
    labelled.cells = [nbformat.v4.new_markdown_cell("```{exercise-start}\n:label: lab07-knee\n```")]
    assert grading.lab_of("submitted/bob/07-data-path.ipynb", labelled) == "lab07"
    assert grading.lab_of("homework.ipynb", labelled) == "lab07"


def test_grade_refuses_a_notebook_of_an_unknown_lab(tmp_path):
    notebook = nbformat.v4.new_notebook()
    path = tmp_path / "homework.ipynb"
    nbformat.write(notebook, path)
    with pytest.raises(ValueError, match="cannot tell which lab it is"):
        grading.grade_notebook(path, key_dir=FIXTURE_KEYS)
    with pytest.raises(ValueError, match="no key .*lab97.py for lab97"):
        grading.grade_notebook(fixture_submission(tmp_path, [], "97-x.ipynb"), key_dir=FIXTURE_KEYS)


# --- lab 00, as students submit it ------------------------------------------------------------

def _lab00_student_copy(tmp_path: Path, answers: dict[str, str] | None = None) -> Path:
    copy = student.strip_solutions(nbformat.read(LAB00, as_version=4))
    for blank, answer in (answers or {}).items():
        cells = [c for c in copy.cells if c.cell_type == "code" and blank in c.source]
        assert len(cells) == 1, blank
        cells[0].source = cells[0].source.replace(blank, answer)
    path = tmp_path / LAB00.name
    nbformat.write(copy, path)
    return path


def test_lab00_with_its_solutions_scores_full():
    verdicts = grading.grade_notebook(LAB00, key_dir=KEYS)
    assert [v.exercise_id for v in verdicts] == ["lab00.1", "lab00.2", "lab00.3"]
    assert all(v.passed for v in verdicts), [v.line for v in verdicts]


def test_lab00_unanswered_student_copy_fails_every_exercise_by_name(tmp_path):
    verdicts = grading.grade_notebook(_lab00_student_copy(tmp_path), key_dir=KEYS)
    assert [v.line for v in verdicts] == [
        "✗ block shape: no answer yet; replace the ... with your value.",
        "✗ copies of w[0]: no answer yet; replace the ... with your value.",
        "✗ global maximum: no answer yet; replace the ... with your value."]


def test_lab00_wrong_answers_get_their_hints_and_jnp_max_is_refused(tmp_path):
    path = _lab00_student_copy(tmp_path, {
        "answer = ...  # the shape of one device's block": "answer = [4, 6]  #",
        "answer = ...  # devices holding w[0]": "answer = 1  #",
        "global_max = ...": "global_max = jax.jit(lambda d: jnp.max(d, keepdims=True))  #"})
    verdicts = grading.grade_notebook(path, key_dir=KEYS)
    assert [v.passed for v in verdicts] == [True, False, False]
    assert verdicts[1].line == ("✗ copies of w[0] is not right. The spec does not mention "
                                "'data': what happens along it?")
    assert verdicts[2].line.startswith("✗ global maximum: its compiled program runs no "
                                       "collective; it must run all-reduce.")
