"""Bibliography labels that read like the citations in the text ("Shoeybi et al., 2019").

The book cites author-year (``bibtex_reference_style: author_year``), but pybtex's styles label
the bibliography's entries alpha-style ("[SPP+19]"), so a reader who sees "Shoeybi et al., 2019"
in a chapter looks for it under a label that says something else, in the HTML and in the PDF.
This registers a pybtex label style, ``author_year``, that renders each label with
sphinxcontrib-bibtex's own author-year template (the same person style, "et al." rule and
separator as the parenthetical citation), and a formatting style, ``author_year``, which is
pybtex's ``plain`` (sorted by author, year, title) with these labels. Two entries with the same
author and year get "a", "b" after the year, as alpha labels do.
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
    """Labels "Author et al., YEAR"; equal labels get a, b, ... appended."""

    def format_labels(self, sorted_entries: Iterable[Any]) -> Iterator[str]:
        labels = [author_year_label(entry) for entry in sorted_entries]
        total, seen = Counter(labels), Counter()
        for label in labels:
            if total[label] == 1:
                yield label
            else:
                yield label + chr(ord("a") + seen[label])
                seen[label] += 1


class AuthorYearStyle(PlainStyle):
    """pybtex's ``plain`` style with author-year labels."""

    default_label_style = STYLE_NAME


def setup(app) -> dict[str, Any]:
    pybtex.plugin.register_plugin("pybtex.style.labels", STYLE_NAME, AuthorYearLabelStyle)
    pybtex.plugin.register_plugin("pybtex.style.formatting", STYLE_NAME, AuthorYearStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
