"""The book builds with no warnings (Sphinx -W -n), from the chapters and the stored labs.

The build itself is the session fixture ``book`` (tests/conftest.py), shared with the browser
test, so the book is built once per test run.
"""

import re
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


def test_every_chapter_file_is_in_the_toc_in_reading_order():
    # _config.yml builds only the toc's files, so a chapter left out of _toc.yml would vanish
    # from the book without a warning; the numbered chapters (04, 04b, 05, ...) read in the
    # order their names sort, so a chapter split in two keeps every later chapter's number.
    on_disk = sorted(f"chapters/{path.stem}" for path in (ROOT / "chapters").glob("*.md"))
    toc = _toc_files()
    assert sorted(f for f in toc if f.startswith("chapters/")) == on_disk
    numbered = [f for f in toc if re.fullmatch(r"chapters/\d\d[a-z]?-.+", f)]
    assert numbered == sorted(numbered) and len(numbered) >= 11, numbered


# A kernel's transport logs through tornado, not Sphinx: under load a chapter's kernel may log
# "ERROR:tornado.general:Uncaught exception in ZMQStream callback" while the build itself
# succeeds (seen on a loaded fresh clone). Sphinx's own warnings and errors still fail the test.
KERNEL_TRANSPORT_NOISE = re.compile(r"^ERROR:tornado\.general:")


def sphinx_problems(log: str) -> list[str]:
    """The build log's warning and error lines, less a kernel's transport noise."""
    return [line for line in log.splitlines()
            if re.search(r"WARNING|ERROR", line) and not KERNEL_TRANSPORT_NOISE.match(line)]


def test_the_log_check_skips_kernel_noise_and_keeps_sphinx_warnings():
    log = ("ERROR:tornado.general:Uncaught exception in ZMQStream callback\n"
           "chapters/03.md:12: WARNING: undefined label: 'fig-clos'\n"
           "/work/chapters/05.md: ERROR: Unknown directive type \"figur\".\n")
    assert sphinx_problems(log) == [
        "chapters/03.md:12: WARNING: undefined label: 'fig-clos'",
        '/work/chapters/05.md: ERROR: Unknown directive type "figur".']
    assert sphinx_problems("ERROR:tornado.general:Uncaught exception\nbuild succeeded.") == []


def test_book_builds_without_warnings(book):
    warnings = sphinx_problems(book.log)
    assert book.returncode == 0 and not warnings, "\n".join(warnings) or book.log[-3000:]

    for page in _toc_files():
        assert (book.html / f"{page}.html").is_file(), f"{page} was not rendered"
    # Labs are rendered from their stored outputs: an exercise check's verdict is in the page.
    lab = (book.html / "labs" / "01-measuring-collectives.html").read_text()
    assert "✓" in lab


def test_lab_pages_number_exercises_per_page_and_show_no_stray_booleans(book):
    labs = sorted((book.html / "labs").glob("*.html"))
    assert labs
    numbered = 0
    for page in labs:
        html = page.read_text()
        numbers = [int(n) for n in re.findall(r'caption-number">Exercise (\d+)', html)]
        # Each lab's exercises read 1, 2, 3, ..., not a count across the book (_ext).
        assert numbers == list(range(1, len(numbers) + 1)), (page.name, numbers)
        numbered += bool(numbers)
        # A check cell shows its verdict line only: no output that is just True or False.
        stray = re.findall(r"<pre><span></span>(True|False)\s*</pre>", html)
        assert not stray, (page.name, stray)
    assert numbered >= 5


# The book's own Sphinx extensions (_ext/), unit-tested without a build.
sys.path.insert(0, str(ROOT / "_ext"))
import bib_labels  # noqa: E402
import exercise_numbers  # noqa: E402
import pdf_edition  # noqa: E402


def test_exercises_are_renumbered_from_one_on_each_page():
    numbers = {
        "labs/01": {"exercise": {"ex-b": (40,), "ex-a": (39,)}, "figure": {"fig": (7,)}},
        "labs/02": {"exercise": {"ex-c": (41,)}},
        "intro": {"figure": {"fig": (1,)}},
    }
    assert exercise_numbers.renumber_per_page(numbers) == ["labs/01", "labs/02"]
    assert numbers["labs/01"]["exercise"] == {"ex-a": (1,), "ex-b": (2,)}  # Sphinx's order kept
    assert numbers["labs/02"]["exercise"] == {"ex-c": (1,)}
    assert numbers["labs/01"]["figure"] == {"fig": (7,)}  # other figure types untouched
    assert exercise_numbers.renumber_per_page(numbers) == []  # already from one: no rewrite


def test_bibliography_labels_read_like_author_year_citations():
    from pybtex.database import parse_string

    bib = parse_string("""
        @misc{one, author={Shoeybi, M. and Patwary, M. and Puri, R.}, title={M}, year={2019}}
        @misc{two, author={{NVIDIA}}, title={A}, year={2024}}
        @misc{three, author={{NVIDIA}}, title={B}, year={2024}}
        @misc{four, author={Dean, J. and Barroso, L.}, title={T}, year={2013}}
    """, "bibtex")
    bib_labels.setup(app=None)  # registers the pybtex plugins, as Sphinx does at start-up
    style = bib_labels.AuthorYearStyle()
    labels = {entry.key: entry.label for entry in style.format_entries(bib.entries.values())}
    assert labels == {"one": "Shoeybi et al., 2019", "four": "Dean and Barroso, 2013",
                      "two": "NVIDIA, 2024a", "three": "NVIDIA, 2024b"}
    # The suffix is in the year, so an author-year citation of "three" reads "NVIDIA, 2024b"
    # too, and formatting again (an incremental build) gives the same labels.
    assert bib.entries["three"].fields["year"] == "2024b"
    again = {entry.key: entry.label for entry in style.format_entries(bib.entries.values())}
    assert again == labels


def test_pdf_link_only_when_the_pdf_was_built(tmp_path):
    html, latex = tmp_path / "_build" / "html", tmp_path / "_build" / "latex"
    html.mkdir(parents=True)
    latex.mkdir()
    assert pdf_edition.built_pdf(html) is None
    (latex / "figure.pdf").write_bytes(b"%PDF-")  # a figure, not the book: no .tex beside it
    assert pdf_edition.built_pdf(html) is None
    (latex / "book.tex").write_text("")
    (latex / "book.pdf").write_bytes(b"%PDF-")
    assert pdf_edition.built_pdf(html) == latex / "book.pdf"
    # intro.md links the name that _config.yml gives the PDF.
    target = yaml.safe_load((ROOT / "_config.yml").read_text())["latex"]["latex_documents"]
    pdf_name = Path(target["targetname"]).with_suffix(".pdf").name
    intro = (ROOT / "intro.md").read_text()
    assert f"{{only}} html and {pdf_edition.TAG}" in intro and f'href="{pdf_name}"' in intro
