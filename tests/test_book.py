"""The book builds with no warnings (Sphinx -W -n), from the chapters and the stored labs."""

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc["parts"]:
        files += [entry["file"] for entry in part["chapters"]]
    return files


def test_book_builds_without_warnings(tmp_path):
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    result = subprocess.run(
        [str(jupyter_book), "build", str(ROOT), "-W", "-n", "--keep-going",
         "--path-output", str(tmp_path)],
        capture_output=True, text=True, timeout=1800)
    log = result.stdout + result.stderr
    warnings = [line for line in log.splitlines() if re.search(r"WARNING|ERROR", line)]
    assert result.returncode == 0 and not warnings, "\n".join(warnings) or log[-3000:]

    html = tmp_path / "_build" / "html"
    for page in _toc_files():
        assert (html / f"{page}.html").is_file(), f"{page} was not rendered"
    # Labs are rendered from their stored outputs: an exercise check's verdict is in the page.
    lab = (html / "labs" / "01-measuring-collectives.html").read_text()
    assert "✓" in lab
