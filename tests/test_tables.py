"""clusterlab.analytic.tables: Markdown tables that print as tables in the HTML book and the PDF, and
byte counts written and read as text."""

import pytest
from IPython.display import Markdown

from clusterlab.analytic import tables
from clusterlab.analytic.tables import markdown_table


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


# --- sizes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("4K", 4 * 1024), ("4k", 4 * 1024), ("4KB", 4 * 1024), ("4KiB", 4 * 1024),
    (" 4 KiB ", 4 * 1024), ("64M", 64 * 1024**2), ("1G", 1024**3), ("2T", 2 * 1024**4),
    ("1.5K", 1536), ("123", 123), ("8B", 8), (4096, 4096),
])
def test_parse_size(text, expected):
    assert tables.parse_size(text) == expected


@pytest.mark.parametrize("text", ["4Q", "", "K", "-4K", "4KK", "abc", "1e3", "4 M B"])
def test_parse_size_rejects_what_is_not_a_size(text):
    with pytest.raises(ValueError, match=r"Cannot read .* as a size in bytes; write a number "
                                         r"with an optional K, M, G or T"):
        tables.parse_size(text)


@pytest.mark.parametrize("text", ["0", "0K", "0.5", "1.3", "1.0001K"])
def test_parse_size_rejects_zero_and_fractions_of_a_byte(text):
    with pytest.raises(ValueError, match=r"A size must be a positive whole number of bytes"):
        tables.parse_size(text)


@pytest.mark.parametrize("nbytes, text", [
    (0, "0 B"), (100, "100 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536, "1.5 KiB"),
    (4096, "4 KiB"), (2**20, "1 MiB"), (64 * 2**20, "64 MiB"), (3 * 2**30, "3 GiB"),
    (2**40, "1024 GiB"),
])
def test_format_bytes(nbytes, text):
    assert tables.format_bytes(nbytes) == text


def test_format_power_of_ten_writes_numbers_as_a_reader_does():
    assert tables.format_power_of_ten(2.6e12) == "2.6 × 10¹²"
    assert tables.format_power_of_ten(8.4e23) == "8.4 × 10²³"
    assert tables.format_power_of_ten(4.4e19, digits=3) == "4.40 × 10¹⁹"
    assert tables.format_power_of_ten(-3e-5) == "-3.0 × 10⁻⁵"
    with pytest.raises(ValueError, match="finite non-zero"):
        tables.format_power_of_ten(0.0)
