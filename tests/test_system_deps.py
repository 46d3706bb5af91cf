"""tests/system_deps.sh, the first thing `make test` runs: a user who may not install is told
in one line, at once, which command to run.

To see the script's answer on a machine that has everything, the test hides packages' files in
a private mount namespace (a bind mount of /dev/null over them: no longer executable) and runs
the script as the unprivileged user ``nobody``. Making the namespace needs root, as CI runs.
"""

from __future__ import annotations

import os
import subprocess
import time

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


def _as_nobody_without(paths: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    hide = "".join(f"mount --bind /dev/null {path} && " for path in paths)
    command = f"{hide}exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups {SCRIPT}"
    start = time.monotonic()
    done = subprocess.run(["unshare", "--mount", "sh", "-c", command], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    return done, time.monotonic() - start


@NEEDS_ROOT
def test_without_root_a_missing_package_stops_at_once_with_one_line():
    done, elapsed_s = _as_nobody_without(["/usr/sbin/munged", "/usr/sbin/slurmd",
                                          "/usr/bin/chromium"])
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "make test needs chromium slurm-wlm munge: run 'sudo apt-get install -y chromium "
        "slurm-wlm munge' (Debian/Ubuntu), then make test again."]
    assert elapsed_s < 5


@NEEDS_ROOT
def test_with_everything_installed_it_says_nothing():
    # The control: the same run with nothing hidden passes silently (as nobody too).
    done, _ = _as_nobody_without([])
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
