"""The PDF edition (``make pdf``): the whole book as one A4 PDF, built with XeLaTeX.

The PDF is built from the same sources as the HTML book, into the same temporary output tree as
the ``book`` fixture (conftest.py), so the chapters' executed notebooks are reused from that
build's cache and only the LaTeX is new. The checks hold the PDF against the HTML book: every
figure of the HTML is in the PDF, glued numbers read the same in both, nothing printed as a
Python repr, no character missing from the fonts.

Needs the TeX set and poppler-utils (tests/system_deps.sh installs them; make test runs it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
PDF_NAME = Path(CONFIG["latex"]["latex_documents"]["targetname"]).with_suffix(".pdf").name
# About 315 pages in December 2026; chapters still grow, so only a sane range is asserted.
PAGES_MIN, PAGES_MAX = 120, 900
# Pages whose glued numbers must read the same in the PDF as in the HTML.
GLUE_PAGES = ("chapters/notation-and-units", "chapters/04-collective-communication",
              "chapters/04b-nccl-on-a-cluster", "chapters/08-planning-a-cluster")


class _Page(HTMLParser):
    """The figures (``<img>`` outside ``_static/``) and glued texts of a rendered HTML page.

    Images in cells tagged hide-output or hide-cell are left out: the HTML folds them away and
    Jupyter Book's LaTeX leaves them out of the PDF on purpose (sphinx-jupyterbook-latex). An
    explorer (``div.cl-explorer``, clusterlab.course.explorers) counts as one figure: the PDF
    prints its static figure in its place.
    """

    HIDDEN = {"tag_hide-output", "tag_hide-cell"}

    def __init__(self):
        super().__init__()
        self.images: list[str] = []
        self.glued: list[str] = []
        self._in_glue = 0
        self._divs: list[bool] = []  # per open <div>: does it start a hidden cell?

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "div":
            classes = set((attrs.get("class") or "").split())
            self._divs.append(bool(self.HIDDEN & classes))
            if "cl-explorer" in classes:
                self.images.append(attrs["id"])
        if tag == "img" and "_static/" not in (attrs.get("src") or "") and not any(self._divs):
            self.images.append(Path(attrs["src"]).name)
        if tag == "span" and "pasted-text" in (attrs.get("class") or "").split():
            self._in_glue += 1
            self.glued.append("")
        elif self._in_glue and tag == "span":
            self._in_glue += 1

    def handle_endtag(self, tag):
        if tag == "div" and self._divs:
            self._divs.pop()
        if tag == "span" and self._in_glue:
            self._in_glue -= 1

    def handle_data(self, data):
        if self._in_glue:
            self.glued[-1] += data


def _html_page(html_dir: Path, page: str) -> _Page:
    parser = _Page()
    parser.feed((html_dir / f"{page}.html").read_text())
    return parser


def _toc_pages() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [toc["root"]] + [entry["file"] for part in toc["parts"] for entry in part["chapters"]]


@pytest.fixture(scope="module")
def pdf(book):
    """Build the PDF into the ``book`` fixture's output tree; return what the build left."""
    for tool in ("xelatex", "latexmk", "pdftotext", "pdfinfo", "pdfimages"):
        assert shutil.which(tool), f"no {tool}: run tests/system_deps.sh as root (make test does)"
    output = book.html.parents[1]  # <tmp>/_build/html -> <tmp>
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    start_s = time.perf_counter()
    result = subprocess.run(
        [str(jupyter_book), "build", str(ROOT), "--builder", "pdflatex", "-W", "-n",
         "--keep-going", "--path-output", str(output)],
        capture_output=True, text=True, timeout=1200)
    print(f"\nPDF built in {time.perf_counter() - start_s:.0f} s (LaTeX writing and XeLaTeX)")
    latex = output / "_build" / "latex"
    pdf_path = latex / PDF_NAME
    text = subprocess.run(["pdftotext", "-enc", "UTF-8", str(pdf_path), "-"], capture_output=True,
                          text=True, check=True).stdout if pdf_path.is_file() else ""
    return {"returncode": result.returncode, "log": result.stdout + result.stderr,
            "latex": latex, "path": pdf_path, "text": text}


def test_pdf_builds_without_warnings(pdf):
    warnings = [line for line in pdf["log"].splitlines() if re.search(r"WARNING|ERROR", line)]
    assert pdf["returncode"] == 0 and not warnings, "\n".join(warnings) or pdf["log"][-3000:]
    assert pdf["path"].is_file() and pdf["path"].read_bytes()[:5] == b"%PDF-"


def test_page_count_and_paper(pdf):
    info = subprocess.run(["pdfinfo", str(pdf["path"])], capture_output=True, text=True,
                          check=True).stdout
    pages = int(re.search(r"^Pages:\s+(\d+)", info, re.M).group(1))
    assert PAGES_MIN <= pages <= PAGES_MAX, pages
    # A4 is 595 x 842 points.
    width, height = map(float, re.search(r"^Page size:\s+([\d.]+) x ([\d.]+)", info, re.M).groups())
    assert abs(width - 595) < 2 and abs(height - 842) < 2, (width, height)


def _tex_figures_per_page(tex: str) -> dict[str, int]:
    """How many images each page includes in the book's .tex (a page starts at its doc label)."""
    parts = re.split(r"\\label\{\\detokenize\{([^}]+?)::doc\}\}", tex)
    counts: dict[str, int] = {}
    for page, body in zip(parts[1::2], parts[2::2]):
        counts[page] = counts.get(page, 0) + body.count("\\sphinxincludegraphics")
    return counts


def test_every_html_figure_is_in_the_pdf(book, pdf):
    html_figures = {page: len(_html_page(book.html, page).images) for page in _toc_pages()}
    assert sum(html_figures.values()) >= 20, html_figures  # the book's plots and diagrams
    tex = (pdf["latex"] / PDF_NAME).with_suffix(".tex").read_text()
    tex_figures = _tex_figures_per_page(tex)
    # Page by page, as many figures in the PDF as in the HTML (counted, not matched by content
    # hash: a lab re-executed between the two builds redraws its plots).
    assert {page: tex_figures.get(page, 0) for page in html_figures} == html_figures
    listed = subprocess.run(["pdfimages", "-list", str(pdf["path"])], capture_output=True,
                            text=True, check=True).stdout.splitlines()[2:]
    drawn = [row for row in listed if row.split()[2] == "image"]  # not their alpha masks
    assert len(drawn) >= sum(html_figures.values()), (len(drawn), html_figures)


def test_no_missing_glyphs(pdf):
    log = (pdf["latex"] / PDF_NAME).with_suffix(".log").read_text(errors="replace")
    missing = sorted(set(re.findall(r"Missing character: There is no (.+?) in font", log)))
    assert not missing, missing


def test_no_python_repr_printed_instead_of_content(pdf):
    for text in ("IPython.core.display", "<Figure size", "object at 0x"):
        assert text not in pdf["text"], text


def test_glued_numbers_read_the_same_as_in_the_html(book, pdf):
    # Compared without white space, and with LaTeX's end-of-line hyphens joined up.
    flat = re.sub(r"\s+", "", re.sub(r"-\n", "", pdf["text"]))
    glued = [value.strip() for page in GLUE_PAGES
             for value in _html_page(book.html, page).glued if value.strip()]
    assert len(glued) >= 20, glued
    missing = [value for value in glued if re.sub(r"\s+", "", value) not in flat]
    assert not missing, missing


def test_tables_and_exercises_print_as_in_the_html(pdf):
    text = re.sub(r"\s+", " ", pdf["text"])
    # The notation page's table (a Markdown table: clusterlab.analytic.tables) with its header row.
    assert "decimal bytes binary bytes binary / decimal" in text
    # Exercises are numbered per page: every chapter's and lab's first one is "Exercise 1".
    assert text.count("Exercise 1 ") >= 10
