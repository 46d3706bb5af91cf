"""Tables for the book's pages that print as tables in the HTML book and in the PDF, and sizes
written as text (``4 KiB``, ``64M``) in them.

A code cell that returns ``IPython.display.HTML`` renders as a table in the HTML book only: the
LaTeX builder has no use for ``text/html`` and falls back to ``text/plain``, so the PDF prints
"<IPython.core.display.HTML object>". A Markdown table is parsed by MyST into a docutils table,
which every Sphinx builder writes as a table (``nb_render_markdown_format: myst`` in _config.yml,
so MyST roles such as ``{cite}`key``` work inside cells too).

:func:`format_bytes` and :func:`parse_size` write and read byte counts in binary units, as
nccl-tests' size arguments do; :func:`format_power_of_ten` writes a large number as a reader
would (``2.6 × 10¹²``, not ``2.6e+12``). Nothing here needs JAX.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from IPython.display import Markdown

_ALIGN_RULE = {"l": ":---", "r": "---:", "c": ":---:"}
_SUPERSCRIPTS = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


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
    from IPython.display import Markdown  # here: IPython is the course extra, not the base install

    return Markdown("\n".join(lines))


_SIZE_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text: str) -> int:
    """Parse a byte count as nccl-tests does: ``4K`` is 4096 bytes, ``64M`` is 64 MiB.

    Raises:
        ValueError: for anything that is not a positive number with an optional K/M/G/T.
    """
    match = _SIZE_PATTERN.match(str(text))
    if not match:
        raise ValueError(f"Cannot read {text!r} as a size in bytes; write a number with an "
                         "optional K, M, G or T (powers of 1024), e.g. 4K or 64M.")
    value = float(match.group(1)) * _UNITS[match.group(2).upper()]
    if value < 1 or value != int(value):
        raise ValueError(f"A size must be a positive whole number of bytes, got {text!r}.")
    return int(value)


def format_bytes(nbytes: float) -> str:
    """``4096`` -> ``'4 KiB'``: binary units, as in nccl-tests' size arguments."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def format_power_of_ten(x: float, digits: int = 2) -> str:
    """``2.6e12`` -> ``'2.6 × 10¹²'``: a number as a reader writes it, to ``digits`` significant
    digits (a non-zero ``x``)."""
    if x == 0 or not math.isfinite(x):
        raise ValueError(f"format_power_of_ten needs a finite non-zero number, got {x!r}.")
    exponent = math.floor(math.log10(abs(x)))
    mantissa = x / 10**exponent
    return f"{mantissa:.{digits - 1}f} × 10{str(exponent).translate(_SUPERSCRIPTS)}"
