"""Bibliography labels that read like the citations in the text ("Shoeybi et al., 2019").

The book cites author-year (``bibtex_reference_style: author_year``), but pybtex's styles label
the bibliography's entries alpha-style ("[SPP+19]"), so a reader who sees "Shoeybi et al., 2019"
in a chapter looks for it under a label that says something else, in the HTML and in the PDF.
This registers a pybtex label style, ``author_year``, that renders each label with
sphinxcontrib-bibtex's own author-year template (the same person style, "et al." rule and
separator as the parenthetical citation), and a formatting style, ``author_year``, which is
pybtex's ``plain`` (sorted by author, year, title) with these labels.

Two entries with the same author and year ("NVIDIA, 2024") become "2024a", "2024b", as in APA
style: the suffix is written into the entry's year, so the citation in the text, the label and
the year in the reference all read "NVIDIA, 2024a" (sphinxcontrib-bibtex formats the labels
before any citation, and both read the same entries).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Iterator

import pybtex.plugin
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle
from sphinxcontrib.bibtex.style.referencing import PersonStyle
from sphinxcontrib.bibtex.style.template import join, year

STYLE_NAME = "author_year"


class _Style:
    """What sphinxcontrib-bibtex's templates read from ``data["style"]``: the person style."""

    person = PersonStyle()  # the default of bibtex_reference_style "author_year"


def author_year_label(entry: Any) -> str:
    """The parenthetical citation text of a pybtex ``Entry``, without brackets, as plain text."""
    template = join(sep=", ")[_Style.person.author_or_editor_or_title(full=False), year]
    return template.format_data({"entry": entry, "style": _Style}).render_as("text")


class AuthorYearLabelStyle(BaseLabelStyle):
    """Labels "Author et al., YEAR"; equal ones get a, b, ... after the year, in the year too."""

    def format_labels(self, sorted_entries: Iterable[Any]) -> Iterator[str]:
        sorted_entries = list(sorted_entries)
        labels = [author_year_label(entry) for entry in sorted_entries]
        total, seen = Counter(labels), Counter()
        for entry, label in zip(sorted_entries, labels):
            if total[label] == 1:
                yield label
                continue
            suffix = chr(ord("a") + seen[label])
            seen[label] += 1
            if "year" in entry.fields:
                entry.fields["year"] += suffix
            yield label + suffix


class AuthorYearStyle(PlainStyle):
    """pybtex's ``plain`` style with author-year labels."""

    default_label_style = STYLE_NAME


def setup(app) -> dict[str, Any]:
    pybtex.plugin.register_plugin("pybtex.style.labels", STYLE_NAME, AuthorYearLabelStyle)
    pybtex.plugin.register_plugin("pybtex.style.formatting", STYLE_NAME, AuthorYearStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
