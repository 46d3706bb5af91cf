"""Exercises and figures numbered per page: a lab's first exercise is "Exercise 1", not
"Exercise 39", and a chapter's first figure is "Figure 1", not "Figure 12".

sphinx-exercise numbers exercises with Sphinx's ``numfig`` (figure type ``exercise``), and numfig
counts per section number; the book's table of contents is not numbered, so every page shares
one counter and the numbers run across the whole book. sphinx-exercise has no option to restart
them (its ``:nonumber:`` drops the number altogether), nor has Sphinx (sphinx-doc/sphinx#7135).
Sphinx assigns the numbers in ``env.toc_fignumbers`` on ``env-get-updated``; this runs after it
and renumbers each page's exercises 1, 2, ... in the order Sphinx numbered them. Exercise
titles, solutions' "Solution to Exercise N" and ``{numref}`` all read those numbers, in the HTML
and in the PDF, where each chapter's exercises thus also start at 1.

Figures (``{figure}`` and ``{glue:figure}`` with a caption) share the problem and the fix: numfig
numbers them across the book. Their "Figure N" captions and ``{numref}`` texts in the HTML read
the renumbered ``env.toc_fignumbers``; the PDF's figures are numbered by LaTeX itself.
"""

from __future__ import annotations

from typing import Any

# The numfig types numbered from 1 on each page.
PER_PAGE_FIGTYPES = ("exercise", "figure")


FigNumbers = dict[str, dict[str, dict[str, tuple[int, ...]]]]


def renumber_per_page(toc_fignumbers: FigNumbers, figtype: str = "exercise") -> list[str]:
    """Renumber every page's ``figtype`` from 1, in place; return the pages that changed.

    Args:
        toc_fignumbers: Sphinx's ``env.toc_fignumbers``: page -> figure type -> node id ->
            number (a tuple such as ``(39,)``).
        figtype: the numfig type to renumber (``exercise``, ``figure``, ...); others are left.
    """
    changed = []
    for page, by_type in toc_fignumbers.items():
        numbers = by_type.get(figtype)
        if not numbers:
            continue
        in_order = sorted(numbers, key=numbers.__getitem__)
        renumbered = {node_id: (index,) for index, node_id in enumerate(in_order, start=1)}
        if renumbered != numbers:
            by_type[figtype] = renumbered
            changed.append(page)
    return changed


def _on_env_get_updated(app, env) -> list[str]:
    changed = {page for figtype in PER_PAGE_FIGTYPES
               for page in renumber_per_page(env.toc_fignumbers, figtype)}
    return sorted(changed)


def setup(app) -> dict[str, Any]:
    # After Sphinx's TocTreeCollector (default priority 500) has assigned the numbers.
    app.connect("env-get-updated", _on_env_get_updated, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
