"""One hostile submission cannot sink a batch (issue 37, items 3 and 4): a notebook that is not a
notebook, a link to another file, answers that are not data, a verdict line with terminal
escapes, or an exported program that loops forever or allocates past its limit each cost that
submission alone; the honest submission graded after them keeps its full marks and its CSV row,
and the CSV says how students are named."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest

from clusterlab.course import grading, sandbox
from conftest import fixture_submission
from test_grading_security import FIXTURE_KEYS, HONEST, SMALL

FULL_MARKS = [["lab98.1", "1"], ["lab98.2", "1"], ["lab98.3", "1"]]


def _rows(path: Path) -> list[list[str]]:
    with open(path) as handle:
        return list(csv.reader(handle))


def test_broken_notebooks_and_links_are_refused_one_by_one(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    hostile = {"98-list.ipynb": "[]", "98-string.ipynb": '"x"',
               "98-deep.ipynb": "[" * 200_000 + "]" * 200_000}
    for name, text in hostile.items():
        (folder / name).write_text(text)
    good = fixture_submission(folder, HONEST, "98-good.ipynb")
    link = folder / "98-link.ipynb"
    link.symlink_to(good)  # another student's notebook, or the instructor's lab
    batch = [str(folder / name) for name in hostile] + [str(link), str(good)]
    grades = tmp_path / "grades.csv"
    status = grading.main(batch, key_dir=str(FIXTURE_KEYS), timeout_s=30, csv_path=str(grades),
                          limits=SMALL)
    assert status == 2
    captured = capsys.readouterr()
    assert "is a symbolic link; submit the notebook file itself" in captured.err
    assert captured.err.count("error: ") == 4
    assert captured.out.splitlines()[-1] == "  total: 3/3 exercises correct"
    rows = _rows(grades)
    assert rows[0] == grading.CSV_HEADER
    assert [r[:3] for r in rows[1:5]] == [[Path(n).stem, "not graded", "0"] for n in batch[:4]]
    assert [r[1:3] for r in rows[5:]] == FULL_MARKS and rows[5][0] == "98-good"


@pytest.mark.parametrize("write, why", [
    (lambda path: path.symlink_to("/etc/passwd"), "is a link or cannot be opened"),
    (lambda path: path.write_text("[" * 200_000 + "]" * 200_000), "not JSON the grader can read"),
    (lambda path: path.write_text("[1, 2]"), "not a JSON object"),
    (lambda path: path.write_bytes(b"{" + b" " * (sandbox.MAX_ANSWERS_BYTES + 1) + b"}"),
     "over 64 MiB"),
])
def test_an_answers_file_is_taken_as_data(tmp_path, write, why):
    path = tmp_path / "answers.json"
    write(path)
    answers, reason = sandbox.read_answers(path)
    assert answers is None and why in reason
    # the negative control: a plain object is read
    honest = tmp_path / "honest.json"
    honest.write_text(json.dumps({"lab98.1": 2.5}))
    assert sandbox.read_answers(honest) == ({"lab98.1": 2.5}, "")


def test_an_answers_link_written_by_the_notebook_is_not_followed(tmp_path, capsys):
    # The notebook replaces its answers file with a link to a host file as it exits.
    hostile = HONEST + ["import atexit, os, sys\n"
                        "out = sys.argv[3] if len(sys.argv) > 3 else None\n"
                        "def swap():\n"
                        "    for name in os.listdir('.'):\n"
                        "        if name == 'answers.json':\n"
                        "            os.remove(name); os.symlink('/etc/shadow', name)\n"
                        "atexit.register(swap)"]
    bad = fixture_submission(tmp_path / "bad", hostile, "98-bad.ipynb")
    good = fixture_submission(tmp_path / "good", HONEST, "98-good.ipynb")
    grades = tmp_path / "grades.csv"
    grading.main([str(bad), str(good)], key_dir=str(FIXTURE_KEYS), timeout_s=30,
                 csv_path=str(grades), limits=SMALL)
    out = capsys.readouterr().out
    assert "root:" not in out  # nothing of a host file is printed
    assert out.splitlines()[-1] == "  total: 3/3 exercises correct"
    assert [r[1:3] for r in _rows(grades)[-3:]] == FULL_MARKS


def test_one_folder_per_student_names_students_by_folder(tmp_path, capsys):
    alice = fixture_submission(tmp_path / "alice", HONEST, "98-lab.ipynb")
    bob = fixture_submission(tmp_path / "bob", HONEST[:2], "98-lab.ipynb")
    grades = tmp_path / "grades.csv"
    grading.main([str(alice), str(bob)], key_dir=str(FIXTURE_KEYS), timeout_s=30,
                 csv_path=str(grades), limits=SMALL)
    rows = _rows(grades)
    assert {r[0] for r in rows[1:]} == {"alice", "bob"}
    assert {r[3] for r in rows[1:]} == {"folder"}
    assert sum(int(r[2]) for r in rows[1:] if r[0] == "alice") == 3
    assert sum(int(r[2]) for r in rows[1:] if r[0] == "bob") == 1
    # by file where the file names differ
    assert grading.student_names(["a/98-x.ipynb", "b/98-y.ipynb"]) == (
        {"a/98-x.ipynb": "98-x", "b/98-y.ipynb": "98-y"}, "file")


def test_report_lines_are_printable():
    escape = "✗ pair is off: got '\x1b[2J\x1b[31mpwned' \ud800" + "x" * 1000
    line = grading.printable(escape)
    assert "\x1b" not in line and "\ud800" not in line and len(line) == grading.MAX_LINE
    assert line.startswith("✗ pair is off: got '?[2J?[31mpwned' ?")
    assert grading.printable("✓ pair is correct.") == "✓ pair is correct."


def test_what_a_notebook_prints_stays_out_of_the_graders_memory(tmp_path, capsys):
    import resource

    loud = HONEST + ["import sys\nfor _ in range(384):\n    sys.stdout.write('x' * 2**20)"]
    bad = fixture_submission(tmp_path / "bad", loud, "98-loud.ipynb")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    grading.main([str(bad)], key_dir=str(FIXTURE_KEYS), timeout_s=30, limits=SMALL)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert grown < 128 * 2**20, f"the grader grew by {grown / 2**20:.0f} MiB for 384 MiB printed"
    # printing is allowed: the notebook is graded as usual
    assert capsys.readouterr().out.splitlines()[-1] == "  total: 3/3 exercises correct"


def test_a_notebook_cannot_write_a_file_past_the_size_limit(tmp_path, capsys):
    # Python ignores SIGXFSZ, so the write fails with EFBIG; the notebook reports whether it did
    # through its first answer (2.5 is right only when the 16 MiB write was refused).
    limits = sandbox.Limits(cpu_s=6, memory_bytes=4 * 2**30, processes=96, wall_s=60,
                            file_bytes=8 * 2**20)
    probe = ("try:\n    with open('big', 'wb') as f:\n        f.write(b'x' * 16 * 2**20)\n"
             "    refused = False\nexcept OSError:\n    refused = True\n"
             "check.answer(\"lab98.1\", 2.5 if refused else 0.0)")
    bad = fixture_submission(tmp_path / "bad", [HONEST[0], probe, *HONEST[2:]], "98-big.ipynb")
    grading.main([str(bad)], key_dir=str(FIXTURE_KEYS), timeout_s=30, limits=limits)
    assert capsys.readouterr().out.splitlines()[-1] == "  total: 3/3 exercises correct"
    # the control: with room for the file, the write succeeds and the probe says so
    roomy = sandbox.Limits(cpu_s=6, memory_bytes=4 * 2**30, processes=96, wall_s=60,
                           file_bytes=64 * 2**20)
    grading.main([str(bad)], key_dir=str(FIXTURE_KEYS), timeout_s=30, limits=roomy)
    assert capsys.readouterr().out.splitlines()[-1] == "  total: 2/3 exercises correct"


# The child that runs a submission's programs, with limits small enough to be hit in seconds.
JUDGE_SMALL = sandbox.Limits(cpu_s=20, memory_bytes=6 * 2**30, processes=4096, wall_s=15,
                             file_bytes=2**20)
PROGRAMS = {
    # the loop never ends: c | 1 stays above -5 and cannot overflow
    "an endless loop": ("import jax\ndef double(x):\n"
                        "    return jax.lax.while_loop(lambda c: c > -5, lambda c: c | 1, x)",
                        "its program ran past the grader's 15 s wall-clock limit."),
    # an 8 GiB buffer the scatter must hold whole, past the child's 6 GiB of address space
    "an 8 GiB buffer": ("import jax.numpy as jnp\ndef double(x):\n    return 2 * x + jnp.zeros("
                        "(2**16, 2**15), jnp.int32).at[x, x].set(1).sum()",
                        "your function raised JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory "
                        "allocating 8598323200 bytes. Return twice the input."),
}


@pytest.mark.parametrize("program", PROGRAMS, ids=list(PROGRAMS))
def test_a_program_past_its_limits_fails_alone_and_the_next_is_graded(program, tmp_path,
                                                                       capsys):
    source, why = PROGRAMS[program]
    cells = [*HONEST[:3], source + "\ncheck.answer(\"lab98.3\", double)"]
    bad = fixture_submission(tmp_path / "bad", cells, "98-bad.ipynb")
    good = fixture_submission(tmp_path / "good", HONEST, "98-good.ipynb")
    grades = tmp_path / "grades.csv"
    started = time.monotonic()
    status = grading.main([str(bad), str(good)], key_dir=str(FIXTURE_KEYS), timeout_s=30,
                          csv_path=str(grades), limits=SMALL, judge_limits=JUDGE_SMALL)
    out = capsys.readouterr().out.splitlines()
    print(f"graded both in {time.monotonic() - started:.0f} s")
    assert status == 1
    assert out[1:6] == [str(bad), "  lab98.1  ✓ time (s) is correct.",
                        "  lab98.2  ✓ pair is correct.",
                        f"  lab98.3  ✗ double: {why}",
                        "  total: 2/3 exercises correct"]
    assert out[-1] == "  total: 3/3 exercises correct"
    assert _rows(grades)[1:] == [["98-bad", "lab98.1", "1", "file"],
                                 ["98-bad", "lab98.2", "1", "file"],
                                 ["98-bad", "lab98.3", "0", "file"],
                                 *[["98-good", *row, "file"] for row in FULL_MARKS]]


def test_the_judge_compiles_with_no_shared_compilation_cache(monkeypatch):
    # make test gives its processes JAX's persistent compilation cache; the judging child must
    # compile every submitted program itself, whatever another process left in that cache
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/tmp/a-cache-anyone-could-fill")
    monkeypatch.setenv("CLUSTERLAB_SOMETHING_ELSE", "kept")
    environment = grading._judge_environment()
    assert "JAX_COMPILATION_CACHE_DIR" not in environment
    assert environment["CLUSTERLAB_SOMETHING_ELSE"] == "kept"
    assert environment[grading.SEED_ENV] == str(grading.run_seed())
