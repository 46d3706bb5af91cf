"""The book builds with no warnings (Sphinx -W -n), from the chapters and the stored labs.

The build itself is the session fixture ``book`` (tests/conftest.py), shared with the browser
test, so the book is built once per test run.
"""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc["parts"]:
        files += [entry["file"] for entry in part["chapters"]]
    return files


def test_book_builds_without_warnings(book):
    warnings = [line for line in book.log.splitlines() if re.search(r"WARNING|ERROR", line)]
    assert book.returncode == 0 and not warnings, "\n".join(warnings) or book.log[-3000:]

    for page in _toc_files():
        assert (book.html / f"{page}.html").is_file(), f"{page} was not rendered"
    # Labs are rendered from their stored outputs: an exercise check's verdict is in the page.
    lab = (book.html / "labs" / "01-measuring-collectives.html").read_text()
    assert "✓" in lab
