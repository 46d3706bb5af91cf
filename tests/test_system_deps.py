"""tests/system_deps.sh, the first thing `make test` runs: a user who may not install is told
in one line, at once, which command to run.

To see the script's answer on a machine that has everything, the test hides packages' files in
a private mount namespace (a bind mount of /dev/null over them: no longer executable) and runs
the script as the unprivileged user ``nobody``. Making the namespace needs root, as CI runs.

``nobody`` runs a byte-for-byte copy of the script in a directory of its own that it may enter:
a clone often lives where ``nobody`` cannot (a home or ``mktemp -d`` directory has mode 700), and
the script reads nothing beside itself, so the copy answers as the clone's own script would.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import ROOT

SCRIPT = ROOT / "tests" / "system_deps.sh"
NOBODY = "65534"
# Only root may make the mount namespace that hides installed packages. CI runs make test as root,
# so there these tests run; a non-root `make test` on a machine that has everything skips them
# (and on one that lacks a package, system_deps.sh has already stopped with its line).
NEEDS_ROOT = pytest.mark.skipif(
    os.geteuid() != 0, reason="hiding installed packages needs a private mount namespace, which "
                              "only root may make: run make test as root, as CI does")


def _others_may_enter(directory: Path) -> bool:
    # Every directory on the way needs the execute bit for others, or nobody cannot reach it.
    return all(path.stat().st_mode & stat.S_IXOTH for path in (directory, *directory.parents))


@pytest.fixture
def script_nobody_can_run():
    """A copy of system_deps.sh in a fresh directory that ``nobody`` can enter, removed afterwards.

    The copy has the same bytes; it is readable by all, and executable by all exactly when the
    clone's script is executable by its owner (a lost executable bit still fails, as in make).
    """
    tmp = tempfile.gettempdir()
    base = next((Path(d) for d in (tmp, "/tmp") if _others_may_enter(Path(d))), None)
    assert base is not None, (f"the user nobody can enter neither {tmp} nor /tmp: set TMPDIR "
                              "to a directory with mode 755 or 1777")
    directory = Path(tempfile.mkdtemp(prefix="system-deps-", dir=base))
    try:
        directory.chmod(0o755)
        copy = directory / SCRIPT.name
        copy.write_bytes(SCRIPT.read_bytes())
        copy.chmod(0o755 if SCRIPT.stat().st_mode & stat.S_IXUSR else 0o644)
        yield copy
    finally:
        shutil.rmtree(directory)


def _as_nobody_without(script: Path,
                       paths: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    hide = "".join(f"mount --bind /dev/null {path} && " for path in paths)
    command = f"{hide}exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups {script}"
    start = time.monotonic()
    done = subprocess.run(["unshare", "--mount", "sh", "-c", command], cwd=script.parent,
                          capture_output=True, text=True, timeout=60)
    return done, time.monotonic() - start


@NEEDS_ROOT
def test_without_root_a_missing_package_stops_at_once_with_one_line(script_nobody_can_run):
    done, elapsed_s = _as_nobody_without(script_nobody_can_run, [
        "/usr/sbin/munged", "/usr/sbin/slurmd", "/usr/bin/chromium", "/usr/bin/bwrap"])
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "make test needs chromium slurm-wlm munge bubblewrap: run 'sudo apt-get install -y "
        "chromium slurm-wlm munge bubblewrap' (Debian/Ubuntu), then make test again."]
    assert elapsed_s < 5


@NEEDS_ROOT
def test_with_everything_installed_it_says_nothing(script_nobody_can_run):
    # The control: the same run with nothing hidden passes silently (as nobody too).
    done, _ = _as_nobody_without(script_nobody_can_run, [])
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
