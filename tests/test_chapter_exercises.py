"""Chapter exercises answered with ``check.answer("chNN.K", answer)``: ids, keys (keys/chNN.py) and
the student's notebooks (``python -m clusterlab.course.student --chapters chapters``)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import numpy as np
import pytest

from clusterlab.course import check, grading, student
from conftest import ROOT

KEYS = ROOT / "keys"
CHAPTERS = ROOT / "chapters"
CHAPTER_KEYS = sorted(KEYS.glob("ch*.py"))
KEYED = [(path, exercise_id) for path in CHAPTER_KEYS for exercise_id in grading.load_key(path)]


def _chapter_of(key_path: Path) -> Path:
    (chapter,) = CHAPTERS.glob(f"{key_path.stem.removeprefix('ch')}-*.md")
    return chapter


def _perturbed(value):
    """``value`` times 1.5, element by element."""
    if isinstance(value, (tuple, list)):
        return tuple(_perturbed(v) for v in value)
    return float(value) * 1.5


def _hint(line: str) -> str:
    """The hint a ✗ line of close_verdict or equal_verdict ends with."""
    return re.split(r"relative\)\. |is not right\. ", line, maxsplit=1)[-1]


@pytest.fixture
def course_keys(monkeypatch):
    monkeypatch.setenv(grading.KEYS_ENV, str(KEYS))


def test_the_chapter_keys_cover_the_required_chapters():
    keyed_chapters = {path.stem for path in CHAPTER_KEYS}
    assert {"ch01", "ch02", "ch04", "ch05", "ch08"} <= keyed_chapters
    print(f"{len(KEYED)} chapter exercises keyed in {len(CHAPTER_KEYS)} keys")


@pytest.mark.parametrize("key_path", CHAPTER_KEYS, ids=lambda p: p.stem)
def test_each_chapter_key_names_exercises_its_chapter_has(key_path):
    exercises = student.chapter_exercises(_chapter_of(key_path).read_text())
    key = grading.load_key(key_path)
    numbers = sorted(int(i.split(".")[1]) for i in key)
    assert numbers and set(numbers) <= set(range(1, len(exercises) + 1)), (key_path.name, numbers)


@pytest.mark.parametrize("key_path, exercise_id", KEYED, ids=[i for _, i in KEYED])
def test_the_keys_own_value_is_right_and_a_perturbed_one_wrong_with_its_hint(
        key_path, exercise_id, course_keys, capsys):
    expected = grading.load_key(key_path)[exercise_id].expected
    check.answer(exercise_id, expected)
    check.answer(exercise_id, _perturbed(expected))
    right, wrong = capsys.readouterr().out.splitlines()
    assert right.startswith("✓ ") and right.endswith(" is correct."), right
    assert wrong.startswith("✗ "), wrong
    hint = _hint(wrong)
    assert hint != wrong and len(hint.split()) >= 8, f"no hint in: {wrong}"
    assert check.recorded_answers()[exercise_id] == _perturbed(expected)


@pytest.mark.parametrize("bad", ["ch1.2", "chapter01.1", "ch04B.1", "ch01-1", "lab01", "ch01.x", 3])
def test_answer_refuses_a_bad_id_naming_both_forms(bad):
    with pytest.raises(ValueError, match=r"look like 'lab01\.2' \(lab 01, exercise 2\) or "
                                         r"'ch04b\.1' \(chapter 04b, exercise 1\); got"):
        check.answer(bad, 1.0)


def test_a_chapter_key_with_another_chapters_ids_is_refused(tmp_path):
    (tmp_path / "ch04b.py").write_text("from clusterlab.course import grading\n"
                                       "KEY = {'ch04.1': grading.close(1, name='x')}")
    with pytest.raises(ValueError, match=r"badly named ids: \['ch04.1'\]; ids look like ch04b.1"):
        grading.load_key(tmp_path / "ch04b.py")
    (tmp_path / "chapter04.py").write_text("KEY = {}")
    with pytest.raises(ValueError, match=r"labNN.py \(lab01.py\) or chNN.py \(ch04b.py\)"):
        grading.load_key(tmp_path / "chapter04.py")


def test_chapter_ids_come_from_the_file_name():
    assert student.chapter_id("chapters/04b-nccl-on-a-cluster.md") == "ch04b"
    assert student.chapter_id("05-parallelism-strategies.md") == "ch05"
    with pytest.raises(ValueError, match="named NN-title.md"):
        student.chapter_id("glossary.md")


def test_roles_render_as_plain_text():
    text = ("See {cite}`brown2020` chapter {doc}`04-collective-communication`, the "
            "{doc}`model card <../appendix/card>`, {ref}`sec-x`, {eq}`eq-step-time`, "
            "$\\alpha$ = {glue:text}`alpha_us:.0f` µs and {term}`busbw`.")
    rendered = student.render_roles(text, {"alpha_us:.0f": "2"}, {"sec-x": "Across nodes"})
    assert rendered == ("See chapter 04, the model card, the section \"Across nodes\", the "
                        "chapter's step-time equation, $\\alpha$ = 2 µs and busbw.")
    with pytest.raises(ValueError, match="no glued value"):
        student.render_roles("{glue:text}`missing`", {}, {})


TINY_CHAPTER = """# A tiny chapter

```{code-cell} ipython3
import math
from myst_nb import glue
glue("two", 2.0, display=False)
```

```{exercise-start}
:label: ex-tiny-1
```
Take {glue:text}`two:.1f` GPUs {cite}`x`. How many pairs?
```{exercise-end}
```

```{solution-start} ex-tiny-1
:class: dropdown
```
**Answer:** SOLUTION-TEXT-ONE
```{solution-end}
```

```{exercise-start}
:label: ex-tiny-2
```
Explain why.
```{exercise-end}
```
"""


def test_a_chapter_notebook_has_headings_answer_cells_and_no_solution(tmp_path):
    chapters, keys = tmp_path / "chapters", tmp_path / "keys"
    chapters.mkdir()
    keys.mkdir()
    (chapters / "03-tiny.md").write_text(TINY_CHAPTER)
    (keys / "ch03.py").write_text("from clusterlab.course import grading\n"
                                  "KEY = {'ch03.1': grading.equal(1, name='pairs', hint='h')}")
    written, kept = student.write_chapter_exercises(chapters, tmp_path / "out", keys)
    assert [p.name for p in written] == ["chapter-03-exercises.ipynb"] and kept == []
    cells = nbformat.read(written[0], as_version=4).cells
    assert [(c.cell_type, c.source) for c in cells[2:]] == [
        ("markdown", "## Exercise 1\n\nTake 2.0 GPUs. How many pairs?"),
        ("code", 'answer = ...  # your answer: pairs\ncheck.answer("ch03.1", answer)'),
        ("markdown", "## Exercise 2\n\nExplain why."),
        ("markdown", "*Your answer, in words (double-click to edit):*")]
    assert cells[1].source == "import math\nfrom clusterlab.course import check"
    assert "SOLUTION-TEXT-ONE" not in written[0].read_text()
    # the student's work is kept unless --replace
    written[0].write_text(written[0].read_text().replace("Explain why.", "my work"))
    assert student.write_chapter_exercises(chapters, tmp_path / "out", keys) == ([], written)
    assert "my work" in written[0].read_text()
    assert student.write_chapter_exercises(chapters, tmp_path / "out", keys,
                                           replace=True) == (written, [])
    assert "my work" not in written[0].read_text()


@pytest.fixture(scope="module")
def chapter_notebooks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("student")
    written, _ = student.write_chapter_exercises(CHAPTERS, out, KEYS)
    assert len(written) == len([p for p in CHAPTERS.glob("[0-9]*.md")
                                if student.chapter_exercises(p.read_text())])
    return out


def _value_texts(value) -> set[str]:
    """How a key's number could be written into a notebook (at least 3 digits)."""
    texts = set()
    for number in np.asarray(value, dtype=float).ravel():
        for spec in (".3g", ".4g", ".2f", ".1f", ",.0f"):
            text = format(number, spec)
            if sum(ch.isdigit() for ch in text) >= 3:
                texts.add(text)
        texts.add(repr(float(number)))
    return texts


def test_no_chapter_notebook_holds_a_solution_or_a_key_value(chapter_notebooks):
    checked = 0
    for chapter in sorted(CHAPTERS.glob("[0-9]*.md")):
        text = chapter.read_text()
        exercises = student.chapter_exercises(text)
        if not exercises:
            continue
        number = student.chapter_id(chapter).removeprefix("ch")
        notebook = chapter_notebooks / f"chapter-{number}-exercises.ipynb"
        shown = "\n".join(c.source for c in nbformat.read(notebook, as_version=4).cells)
        assert not re.search(r"\{[\w:-]+\}`|```\{|:label:", shown), notebook.name
        assert [m for m in re.findall(r"## Exercise (\d+)", shown)] == [
            str(k) for k in range(1, len(exercises) + 1)]
        asked = "\n".join(exercises) + "\n" + shown.split("## Exercise 1")[0]
        hidden = [line.strip() for block in re.findall(
            r"```\{solution-start\}.*?```\{solution-end\}|:tags: \[remove-cell\].*?\n```", text,
            re.S) for line in block.splitlines()]
        for line in hidden:
            if len(line) >= 25 and line not in asked:
                assert line not in shown, f"{notebook.name} shows the solution's {line!r}"
                checked += 1
        key_path = KEYS / f"{student.chapter_id(chapter)}.py"
        if key_path.is_file():
            for exercise_id, exercise in grading.load_key(key_path).items():
                for value_text in _value_texts(exercise.expected) - {
                        t for t in _value_texts(exercise.expected) if t in asked}:
                    assert value_text not in shown, f"{notebook.name} shows {exercise_id}'s value"
                    checked += 1
    print(f"{checked} solution lines and key values checked absent")
    assert checked > 100


def _run(notebook: nbformat.NotebookNode, folder: Path) -> str:
    import nbclient

    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(folder)}}).execute()
    assert all(output.get("output_type") != "error" for cell in notebook.cells
               if cell.cell_type == "code" for output in cell.outputs)
    return "".join(output.get("text", "") for cell in notebook.cells
                   if cell.cell_type == "code" for output in cell.outputs)


def test_chapter_04s_notebook_runs_blank_then_answered(chapter_notebooks, tmp_path, course_keys):
    # chapter 04: its text carries glued values; every exercise is keyed
    path = chapter_notebooks / "chapter-04-exercises.ipynb"
    key = grading.load_key(KEYS / "ch04.py")
    blank = nbformat.read(path, as_version=4)
    printed = _run(blank, tmp_path)
    assert printed.splitlines() == [f"✗ {key[i].name}: no answer yet; replace the ... with your "
                                    "value." for i in sorted(key)]
    answered = nbformat.read(path, as_version=4)
    for cell in answered.cells:
        found = re.search(r'check\.answer\("(ch04\.\d)"', cell.source)
        if found:
            value = np.asarray(key[found.group(1)].expected).tolist()
            cell.source = re.sub(r"answer = \.\.\.", f"answer = {value!r}", cell.source)
    printed = _run(answered, tmp_path)
    assert printed.splitlines() == [f"✓ {key[i].name} is correct." for i in sorted(key)]


# The answers the chapters compute themselves in hidden cells (outside their solutions), as
# (glued name, scale to the key's unit): each key must find the chapter's own numbers, so a key
# that restated a chapter's input wrongly, or drifted from it, fails here.
CHAPTER_GLUED_ANSWERS = {
    "06-storage-and-the-data-path.md": {
        "ch06.1": [("ex1_need_gb_s", 1), ("ex1_fed", 1)],
        "ch06.2": [("ex2_read_gb_s", 1), ("ex2_ratio", 1)],
        "ch06.3": [("ex3_ckpt_tb", 1), ("ex3_need_gb_s", 1)],
        "ch06.4": [("ex4_llm_gpus", 1), ("ex4_image_gpus", 1)],
        "ch06.5": [("ex5_node_gb_s", 1), ("ex5_ports", 1), ("ex5_host_gb_s", 1)]},
    "08-planning-a-cluster.md": {
        "ch08.1": [("ex_floor_days", 1), ("ex_fewest_ports", 1)],
        "ch08.2": [("ex_overlap_eta_max_pct", 0.01), ("ex_overlap_b_best_s", 1)],
        "ch08.3": [("ex_dp_7b_stage1", 1), ("ex_dp_70b_stage3", 1)],
        "ch08.4": [("ex_big_mtbf_h", 1), ("ex_big_interval_min", 1), ("ex_big_lost_pct", 1),
                   ("ex_big_lost_half_pct", 1)],
        "ch08.5": [("ex_pw_gb200", 1), ("ex_pw_h100", 1), ("ex_pw_gb200_eflops", 1),
                   ("ex_pw_h100_eflops", 1), ("ex_pw_pue", 1)]},
}


@pytest.mark.parametrize("chapter_name", sorted(CHAPTER_GLUED_ANSWERS))
def test_keys_agree_with_the_values_the_chapter_computes(chapter_name):
    answers = CHAPTER_GLUED_ANSWERS[chapter_name]
    chapter = CHAPTERS / chapter_name
    glued = student.glued_values(chapter, sorted({n for names in answers.values()
                                                  for n, _ in names}))
    key = grading.load_key(KEYS / f"{student.chapter_id(chapter)}.py")
    for exercise_id, names in answers.items():
        from_chapter = [float(glued[name]) * scale for name, scale in names]
        expected = np.ravel(np.asarray(key[exercise_id].expected, dtype=float))
        assert np.allclose(expected, from_chapter, rtol=1e-9), (exercise_id, expected,
                                                                from_chapter)
    print(f"{chapter_name}: {len(answers)} keys agree with the chapter's own values")
