"""clusterlab.tables: Markdown tables that print as tables in the HTML book and the PDF."""

import pytest
from IPython.display import Markdown

from clusterlab.tables import markdown_table


def test_markdown_table_rows_alignment_and_escaping():
    table = markdown_table(("link", "GB/s"), [("IB-NDR", 50), ("a|b", 2.5)], align="lr")
    assert isinstance(table, Markdown)
    assert table.data.splitlines() == [
        "| link | GB/s |",
        "|:---|---:|",
        "| IB-NDR | 50 |",
        "| a\\|b | 2.5 |",  # a "|" inside a cell does not split it
    ]
    # Markdown, so the LaTeX builder (which skips text/html) gets a table, not a repr.
    assert table._repr_markdown_() == table.data


def test_markdown_table_default_alignment_and_line_breaks():
    table = markdown_table(["a"], [["x\ny"]])
    assert table.data.splitlines() == ["| a |", "|---|", "| x y |"]


@pytest.mark.parametrize("header, rows, align, match", [
    ((), [], None, "at least one column"),
    (("a", "b"), [("1",)], None, "row 0 has 1 cells"),
    (("a", "b"), [], "l", "one letter l, r or c per column"),
    (("a", "b"), [], "lx", "one letter l, r or c per column"),
])
def test_markdown_table_rejects_bad_shapes(header, rows, align, match):
    with pytest.raises(ValueError, match=match):
        markdown_table(header, rows, align=align)
