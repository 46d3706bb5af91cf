"""Two fixes to the HTML that Sphinx 7.4 and docutils 0.21 write, found by the browser test.

1. Each inline ``<script>`` once per page. Sphinx 7.4 files a script that an extension adds after
   the builder exists twice (the builder's copy under the file name ``None``, the registry's,
   re-added before writing, under ``''``), so its duplicate check misses: sphinx-thebe's
   ``const THEBE_JS_URL = ...`` runs twice and every page logs "SyntaxError: Identifier
   'THEBE_JS_URL' has already been declared" (sphinx-togglebutton's selector is doubled too).
2. Bibliography entries as list items. docutils marks each citation ``role="doc-biblioentry"``
   inside a ``role="list"``; DPUB-ARIA 1.1 deprecated that role because it is not a valid child
   of a list, so screen readers get a list without items (axe: aria-required-children,
   critical). ``role="listitem"`` is what DPUB-ARIA 1.1 says to use instead.
"""

from __future__ import annotations

from typing import Any


def _script_key(script: Any) -> tuple:
    filename = getattr(script, "filename", script) or ""
    attributes = getattr(script, "attributes", {})
    return (str(filename), tuple(sorted((k, str(v)) for k, v in attributes.items())))


def _fix_page(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if isinstance(scripts, list):
        seen: set[tuple] = set()
        unique = []
        for script in scripts:
            if (key := _script_key(script)) not in seen:
                seen.add(key)
                unique.append(script)
        scripts[:] = unique
    if "body" in context:
        context["body"] = context["body"].replace('role="doc-biblioentry"', 'role="listitem"')


def setup(app) -> dict[str, Any]:
    # Last, after every extension (sphinx.ext.mathjax included) has added its page scripts.
    app.connect("html-page-context", _fix_page, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
