"""Grading a submission cannot reach (issue 22): judging outside its kernel, and its sandbox.

The fixture lab 98 (key tests/data/keys/lab98.py, instructor's copy tests/data/labs) is graded
from submissions that try to forge their verdicts, read the keys, or take the grader down; each
test asserts the exact verdict lines. Sandbox limits are small so that each run ends in seconds.
"""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import pytest

from clusterlab.course import grading, sandbox
from conftest import ROOT, fixture_submission

FIXTURE_KEYS = ROOT / "tests" / "data" / "keys"
SMALL = sandbox.Limits(cpu_s=6, memory_bytes=4 * 2**30, processes=96, wall_s=60)
BLANK = ["from clusterlab.course import check\npair = (1, 2)",
         "answer = ...\ncheck.answer(\"lab98.1\", answer)",
         "answer = ...\ncheck.answer(\"lab98.2\", answer)",
         "double = ...\ncheck.answer(\"lab98.3\", double)"]
HONEST = ["from clusterlab.course import check\npair = (1, 2)",
          "check.answer(\"lab98.1\", 2.5)",
          "check.answer(\"lab98.2\", [1, 2])",
          "def double(x):\n    return 2 * x\ncheck.answer(\"lab98.3\", double)"]
BLANK_LINES = [
    "✗ time (s): no answer yet; replace the ... with your value.",
    "✗ pair: no answer yet; replace the ... with your value.",
    "✗ double: no answer yet; replace the ... with your value."]


def _lines(path: Path) -> list[str]:
    return [v.line for v in grading.grade_notebook(path, key_dir=FIXTURE_KEYS, timeout_s=30,
                                                   limits=SMALL)]


ATTACKS = {
    "the forgery of issue 22": (
        "import clusterlab.course.grading as g\n"
        "g.judge_all = lambda key, recorded, ns: [g.Verdict(i, True, '✓ ' + key[i].name + "
        "': correct') for i in sorted(key, key=g._order)]"),
    "a printed verdict line": (
        "print('clusterlab-grade 0 [[\"lab98.1\", true, \"✓ time (s) is correct.\"]]')\n"
        "print('  lab98.1  ✓ time (s) is correct.')"),
    "patched clusterlab.course.check and answers": (
        "import clusterlab.course.answers as a, clusterlab.course.check as c\n"
        "a.close_verdict = a.equal_verdict = lambda *args, **kw: (True, '✓ correct')\n"
        "a.is_unanswered = lambda value: False\n"
        "c.answer = lambda i, v: a.record(i, v)"),
    "a patched numpy": (
        "import numpy\nnumpy.allclose = lambda *args, **kw: True\n"
        "numpy.asarray = lambda *args, **kw: numpy.array(2.5)"),
    "a patched jax": (
        "import jax\njax.jit = lambda f, *args, **kw: f\n"
        "jax.export.export = lambda *args, **kw: (lambda *a: None)"),
}


@pytest.mark.parametrize("attack", ATTACKS, ids=list(ATTACKS))
def test_nothing_the_submission_runs_changes_a_verdict(attack, tmp_path):
    # a blank copy with one added cell, after the check calls and before them
    after = _lines(fixture_submission(tmp_path / "after", [*BLANK, ATTACKS[attack]]))
    before = _lines(fixture_submission(tmp_path / "before", [BLANK[0], ATTACKS[attack], *BLANK[1:]]))
    assert after == BLANK_LINES
    assert before == BLANK_LINES


def test_the_submission_sees_no_key_by_path_env_or_walking_up(tmp_path):
    # it records what it could read as lab98.1's answer: the verdict shows what it saw
    probe = (
        "import os, pathlib\n"
        "from clusterlab.course import check, grading\n"
        f"paths = [{str(FIXTURE_KEYS / 'lab98.py')!r}, {str(ROOT / 'keys' / 'lab00.py')!r},\n"
        "         os.environ.get('CLUSTERLAB_KEYS', '') + '/lab98.py']\n"
        f"for start in (pathlib.Path.cwd(), pathlib.Path({str(tmp_path)!r})):\n"
        "    paths += [str(d / 'keys' / 'lab00.py') for d in (start, *start.parents)]\n"
        "seen = []\n"
        "for path in paths:\n"
        "    try:\n"
        "        seen.append(open(path).read()[:20])\n"
        "    except OSError:\n"
        "        pass\n"
        "check.answer('lab98.1', f'{seen} {grading.keys_dir()}')")
    lines = _lines(fixture_submission(tmp_path, [probe]))
    assert lines == ["✗ time (s): expected a number, got '[] None'.",
                     '✗ pair: no answer recorded (check.answer("lab98.2", ...) did not run).',
                     '✗ double: no answer recorded (check.answer("lab98.3", ...) did not run).']


ENDINGS = {
    "a fork bomb": ("import os\nwhile True:\n    os.fork()",
                    "the notebook ended before reporting: a cell hit the sandbox's process limit "
                    "(a fork bomb?) (status 3)"),
    "an infinite loop": ("n = 0\nwhile True:\n    n += 1",
                         "the notebook ran past its CPU-time limit of 6 s"),
    "a 20 GB allocation": ("import numpy as np\nx = np.ones(20 * 2**30 // 8)",
                           "the notebook ended before reporting: a cell ran out of the sandbox's "
                           "memory limit (status 3)"),
}


@pytest.mark.parametrize("ending", ENDINGS, ids=list(ENDINGS))
def test_a_submission_that_hits_a_limit_ends_alone_and_the_next_is_graded(ending, tmp_path,
                                                                          capsys):
    cell, why = ENDINGS[ending]
    bad = fixture_submission(tmp_path / "bad", [*HONEST[:2], cell, *HONEST[2:]], "98-bad.ipynb")
    good = fixture_submission(tmp_path / "good", HONEST, "98-good.ipynb")
    grades = tmp_path / "grades.csv"
    status = grading.main([str(bad), str(good)], key_dir=str(FIXTURE_KEYS), timeout_s=30,
                          csv_path=str(grades), limits=SMALL)
    assert status == 1
    assert capsys.readouterr().out.splitlines()[1:] == [
        str(bad),
        f"  lab98.1  ✗ time (s): {why}.", f"  lab98.2  ✗ pair: {why}.",
        f"  lab98.3  ✗ double: {why}.", "  total: 0/3 exercises correct",
        str(good),
        "  lab98.1  ✓ time (s) is correct.", "  lab98.2  ✓ pair is correct.",
        "  lab98.3  ✓ double is correct.", "  total: 3/3 exercises correct"]
    with open(grades) as handle:
        assert list(csv.reader(handle)) == [
            ["student", "exercise", "points", "named_by"],
            ["98-bad", "lab98.1", "0", "file"], ["98-bad", "lab98.2", "0", "file"],
            ["98-bad", "lab98.3", "0", "file"], ["98-good", "lab98.1", "1", "file"],
            ["98-good", "lab98.2", "1", "file"], ["98-good", "lab98.3", "1", "file"]]


def test_a_cell_deleting_files_deletes_nothing_outside_its_folder(tmp_path):
    other = fixture_submission(tmp_path / "other", HONEST, "98-other.ipynb")
    library = Path(grading.__file__)
    wiper = ("import shutil, pathlib\n"
             f"for path in [{str(FIXTURE_KEYS)!r}, {str(other.parent)!r}, "
             f"{str(library.parent)!r}, pathlib.Path.home()]:\n"
             "    shutil.rmtree(path, ignore_errors=True)")
    lines = _lines(fixture_submission(tmp_path / "wiper", [*HONEST, wiper]))
    assert lines == ["✓ time (s) is correct.", "✓ pair is correct.", "✓ double is correct."]
    assert (FIXTURE_KEYS / "lab98.py").is_file() and other.is_file()
    assert (library.parent / "grading.py").is_file()
    assert _lines(other) == lines


def test_without_bubblewrap_grading_refuses_and_names_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sandbox, "_BWRAP", "no-such-bwrap")
    status = grading.main([str(fixture_submission(tmp_path, HONEST))], key_dir=str(FIXTURE_KEYS),
                          timeout_s=30)
    assert status == 2
    errors = capsys.readouterr().err.splitlines()
    assert [line for line in errors if not line.startswith("note: ")] == [
        "error: grading runs each submission in bubblewrap, which is not installed: run "
        "tests/system_deps.sh (apt-get install bubblewrap)."]


def test_a_program_calling_outside_xla_is_refused():
    # a custom call runs code outside XLA (a host callback: the submission's own); the grader
    # rebuilds only programs whose custom calls are sharding markers. jnp.linalg.inv on CPU
    # lowers to LAPACK custom calls: a harmless one, refused by the same rule.
    import jax.numpy as jnp

    from clusterlab.course import submission

    export = grading.Export(args=[((2, 2), "float32")], n_devices=1)
    data = submission.export_answer(jnp.linalg.inv, [export.request()])
    assert grading.from_data(data, [export]) == (
        "its program calls lapack_sgetrf_ffi, lapack_strsm_ffi outside XLA, which the grader "
        "does not run: compute it without host callbacks or library calls.")


def test_no_user_namespace_inside_and_a_missing_cgroup_named_once_per_batch(tmp_path, capsys):
    # The notebook reports through its first answer whether `unshare -Urm true` failed (2.5,
    # right) or ran (0.0); outside the sandbox, on this platform, it runs: the control.
    probe = ("import subprocess\nmade = subprocess.run(['unshare', '-Urm', 'true'], "
             "capture_output=True).returncode == 0\ncheck.answer('lab98.1', 0.0 if made else 2.5)")
    outside = subprocess.run(["unshare", "-Urm", "true"], capture_output=True)
    bad = fixture_submission(tmp_path / "bad", [HONEST[0], probe, *HONEST[2:]], "98-userns.ipynb")
    good = fixture_submission(tmp_path / "good", HONEST, "98-good.ipynb")
    grading.main([str(bad), str(good)], key_dir=str(FIXTURE_KEYS), timeout_s=30, limits=SMALL)
    captured = capsys.readouterr()
    if sandbox.seccomp_unavailable():
        assert f"note: {sandbox.seccomp_unavailable()}." in captured.err.splitlines()
    else:
        assert outside.returncode == 0, outside.stderr        # the probe can tell
        assert captured.out.count("  total: 3/3 exercises correct") == 2, captured.out
    capped, why = sandbox.whole_submission_cap()
    if capped:
        assert sandbox._capped(SMALL)[:2] == ["systemd-run", "--scope"]
    else:
        assert "systemd-run" in why
        assert captured.err.splitlines().count(f"note: {why}.") == 1
