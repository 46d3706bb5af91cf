"""Tables for the book's pages that print as tables in the HTML book and in the PDF.

A code cell that returns ``IPython.display.HTML`` renders as a table in the HTML book only: the
LaTeX builder has no use for ``text/html`` and falls back to ``text/plain``, so the PDF prints
"<IPython.core.display.HTML object>". A Markdown table is parsed by MyST into a docutils table,
which every Sphinx builder writes as a table (``nb_render_markdown_format: myst`` in _config.yml,
so MyST roles such as ``{cite}`key``` work inside cells too).
"""

from __future__ import annotations

from typing import Sequence

from IPython.display import Markdown

_ALIGN_RULE = {"l": ":---", "r": "---:", "c": ":---:"}


def _cell(value: object) -> str:
    # A "|" would end the cell and a line break the row.
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[object], rows: Sequence[Sequence[object]], *,
                   align: str | None = None) -> Markdown:
    """A table as Markdown, displayed as a table by the HTML book and the PDF alike.

    Args:
        header: the column titles, one per column.
        rows: the table's rows, each with one value per column (``str()`` of each is shown).
        align: one letter per column, ``l`` (left), ``r`` (right) or ``c`` (centre); ``None``
            leaves the alignment to the theme.

    Returns:
        An ``IPython.display.Markdown`` object; the last expression of a cell to show it.

    Raises:
        ValueError: an empty header, a row or ``align`` whose length is not the header's, or an
            alignment letter other than l, r, c.
    """
    n_columns = len(header)
    if n_columns == 0:
        raise ValueError("markdown_table needs at least one column in header")
    for index, row in enumerate(rows):
        if len(row) != n_columns:
            raise ValueError(f"row {index} has {len(row)} cells, the header {n_columns}: give "
                             f"one value per column")
    if align is None:
        rule = ["---"] * n_columns
    else:
        if len(align) != n_columns or set(align) - set(_ALIGN_RULE):
            raise ValueError(f"align={align!r}: give one letter l, r or c per column "
                             f"({n_columns} columns)")
        rule = [_ALIGN_RULE[letter] for letter in align]
    lines = ["| " + " | ".join(map(_cell, header)) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(map(_cell, row)) + " |" for row in rows]
    return Markdown("\n".join(lines))
