"""The landing page links the PDF edition only when it has been built (``make pdf``).

``make pdf`` builds the PDF into ``_build/latex/`` and then the HTML book. When a build finds the
PDF beside its own output (``<output>/latex/<targetname>.pdf``, the same tree whatever
``--path-output`` says), this sets the Sphinx tag ``pdf_edition``, which shows intro.md's
``{only} html and pdf_edition`` block with the download link, and copies the PDF next to
index.html. Without a PDF the block is left out, so the page never links to a file that is not
there. A change of tag makes Sphinx rewrite every page (the tags' hash is in ``.buildinfo``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

TAG = "pdf_edition"


def built_pdf(html_outdir: str | Path) -> Path | None:
    """The PDF that ``make pdf`` built beside an HTML output folder, or None when there is none.

    Args:
        html_outdir: the HTML builder's output folder, ``<output>/html``.

    Returns:
        ``<output>/latex/NAME.pdf`` where LaTeX wrote it from ``NAME.tex`` (a file name
        Jupyter Book applies after extensions have read the configuration, so it is found on
        disk rather than in ``latex_documents``).
    """
    latex = Path(html_outdir).parent / "latex"
    pdfs = [pdf for pdf in sorted(latex.glob("*.pdf")) if pdf.with_suffix(".tex").is_file()]
    return pdfs[0] if pdfs else None


def _on_config_inited(app, config) -> None:
    # Before the builder exists, so the tag is in the hash that .buildinfo compares.
    if built_pdf(app.outdir) is not None:
        app.tags.add(TAG)


def _on_build_finished(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        pdf = built_pdf(app.outdir)
        if pdf is not None:
            shutil.copy2(pdf, Path(app.outdir) / pdf.name)


def setup(app) -> dict[str, Any]:
    app.connect("config-inited", _on_config_inited)
    app.connect("build-finished", _on_build_finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
