"""The rendered book in a real browser: headless Chromium (Debian's ``chromium``) under Playwright.

The book is built once per test run (the ``book`` fixture in conftest.py) and served from
``_build/html`` on 127.0.0.1. One crawl visits every page of the table of contents and records
what the browser saw; the tests below judge that record:

- every page loads with no console error, no uncaught exception and no failed local request;
- every internal link resolves, ``#anchors`` included, and every image decodes;
- math is typeset by the book's own MathJax (from the sphinx-mathjax-offline package), and no
  request leaves the machine (requests to any other host are blocked by Playwright routing and
  recorded);
- long code lines wrap: no code block scrolls sideways;
- nothing is wider than the page: at 1,280 px no display equation, table or image is wider than
  the article's column, and at a phone's 390 px no page scrolls sideways (a negative control
  injects a 2,000 px element and checks that both checks name it);
- figures are numbered "Figure 1", "Figure 2", ... from 1 on each page;
- no serious or critical accessibility violation (axe-core, injected from the
  axe-playwright-python package, so it runs offline); colour contrast once per distinct text
  style, with a negative control (a pale span is named);
- the search page finds a term, an exercise solution opens on click, every lab page offers its
  notebook for download;
- screenshots of the landing page, a chapter and a lab go to ``_build/screenshots/``, at 1,280 px
  (``<label>.png``) and at 390 px (``<label>-390.png``).
"""

from __future__ import annotations

import functools
import http.server
import json
import threading
import time
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag, urljoin, urlparse

import pytest
import yaml
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"  # Debian's package (.ci/run installs it)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
HOST = "127.0.0.1"
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}  # an iPhone 12-15's viewport in CSS pixels
SCREENSHOTS = ROOT / "_build" / "screenshots"
SCREENSHOT_PAGES = {"landing": "intro", "chapter": "chapters/04-collective-communication",
                    "lab": "labs/01-measuring-collectives"}
SEARCH_TERM, SEARCH_HIT = "all-reduce", "chapters/04-collective-communication"
SOLUTION_PAGE = "chapters/04-collective-communication"

# Accessibility violations that come from the theme and cannot be fixed from the book's side:
# (axe rule id, CSS selector of the offending node) -> the reason. Only these exact nodes are
# excused; any other node, rule or impact fails the test. Empty: the two found so far were fixed
# from the book's side (link contrast in admonitions: _assets/book.css; bibliography roles:
# _ext/html_fixes.py).
AXE_EXCLUSIONS: dict[tuple[str, str], str] = {}
AXE_FAILING_IMPACTS = ("serious", "critical")
# Equations and tables still wider than the 1,280 px column once _assets/book.css has done what
# CSS can: (page, the start of the element's text) -> the fix that is left. MathJax 3 cannot
# break a line, and a table's words cannot shrink further without breaking names mid-word. Each
# scrolls in its own box, never the page; any other element fails the test, and an entry that
# no longer matches must go.
WIDTH_EXCLUSIONS: dict[tuple[str, str], str] = {
    ("chapters/02-inside-a-gpu-server", "GPU HBM, datasheet (GB)"):
        "the catalog's nine columns of numbers and citations; needs fewer columns",
    ("appendix/model-card-nccl", "system op nodes × GPUs"):
        "one row per validation point in eleven columns; needs fewer columns",
}
# axe's CSSOM preload fetches the theme's `@import "../basic.css"` (in _static/styles/theme.css)
# against the site's root, a 404 that is axe's, not the book's; it feeds one rule only
# (css-orientation-lock), and the book locks no orientation.
AXE_OPTIONS = {"resultTypes": ["violations"], "preload": False}
# Every rule but colour contrast runs on every node of every page. Colour contrast depends only on
# a text's style (its colour, the backgrounds behind it, its size, weight, opacity and shadow), so
# it runs once per distinct style: on the first visible element that shows it (_TEXT_STYLES_JS).
# Checking every node of every page gave the same verdicts at about twice the crawl's cost
# (93 of 135 s of axe on 46 pages, December 2026).
AXE_WITHOUT_CONTRAST = {**AXE_OPTIONS, "rules": {"color-contrast": {"enabled": False}}}
AXE_CONTRAST_ONLY = {**AXE_OPTIONS, "runOnly": {"type": "rule", "values": ["color-contrast"]}}
CONTRAST_SAMPLE = "[data-contrast-sample]"


def toc_pages() -> list[str]:
    """Every page of ``_toc.yml``, root first, as paths without suffix."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]
    for part in toc["parts"]:
        pages += [entry["file"] for entry in part["chapters"]]
    return pages


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's signature)
        pass


class _Ids(HTMLParser):
    """The ``id`` and ``<a name>`` values of a static HTML page (for pages the crawl skipped)."""

    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if key == "id" or (tag == "a" and key == "name"):
                self.ids.add(value or "")


# Run in each page after "load": wait for MathJax's typesetting and the fonts it asks for, and
# make lazy images load; returns the sources of the images that do not decode. Layout is final
# after it.
_SETTLE_JS = r"""async () => {
  if (window.MathJax && window.MathJax.startup && window.MathJax.startup.promise) {
    await window.MathJax.startup.promise;
  }
  await document.fonts.ready;
  const brokenImages = [];
  for (const img of Array.from(document.images)) {
    img.loading = 'eager';
    try { await img.decode(); } catch (e) { /* judged just below */ }
    if (!(img.complete && img.naturalWidth > 0)) brokenImages.push(img.getAttribute('src'));
  }
  return brokenImages;
}"""

# The text styles of a settled page that ``seen`` (a list of style keys) does not hold yet. Each new
# style's first visible element with text of its own gets the attribute data-contrast-sample;
# returns the new keys. A key is what colour contrast depends on: colour, the backgrounds behind
# the text up to the first opaque one (and any background image), font size and weight, opacity
# and text shadow.
_TEXT_STYLES_JS = r"""(seen) => {
  const known = new Set(seen);
  const fresh = [];
  const backgrounds = (el) => {
    const layers = [];
    for (let node = el; node; node = node.parentElement) {
      const style = getComputedStyle(node);
      if (style.backgroundImage !== 'none') layers.push(style.backgroundImage.slice(0, 120));
      if (style.backgroundColor !== 'rgba(0, 0, 0, 0)') {
        layers.push(style.backgroundColor);
        if (!style.backgroundColor.startsWith('rgba(')) break;  // opaque: nothing behind shows
      }
    }
    return layers.join(' over ');
  };
  const opacity = (el) => {
    let product = 1;
    for (let node = el; node; node = node.parentElement) {
      product *= parseFloat(getComputedStyle(node).opacity);
    }
    return product.toFixed(2);
  };
  for (const el of document.body.querySelectorAll('*')) {
    const ownText = Array.from(el.childNodes)
      .some((node) => node.nodeType === Node.TEXT_NODE && node.textContent.trim());
    if (!ownText) continue;
    const box = el.getBoundingClientRect();
    const style = getComputedStyle(el);
    if (box.width === 0 || box.height === 0 || style.visibility === 'hidden') continue;
    const key = [style.color, backgrounds(el), style.fontSize, style.fontWeight, opacity(el),
                 style.textShadow].join(' | ');
    if (known.has(key)) continue;
    known.add(key);
    fresh.push(key);
    el.setAttribute('data-contrast-sample', '');
  }
  return fresh;
}"""


def contrast_of_new_styles(page, axe: Axe, seen: set[str]) -> list[dict]:
    """axe's colour-contrast violations on the elements of ``page`` whose text style is not in
    ``seen`` (one element per new style); adds those styles to ``seen``."""
    fresh = page.evaluate(_TEXT_STYLES_JS, sorted(seen))
    seen.update(fresh)
    if not fresh:
        return []
    return axe.run(page, context={"include": [[CONTRAST_SAMPLE]]},
                   options=AXE_CONTRAST_ONLY).response["violations"]


# What sticks out sideways, on a settled page:
# - pageScroll: how far the page scrolls sideways: the document, or the theme's article container
#   (it has overflow-x: auto, so a wide element scrolls the whole article rather than the page);
#   and the elements past the viewport's right edge that cause it (those whose own box sticks out,
#   not their ancestors; widest first). An element inside a box within the article that scrolls
#   or clips sideways (a table's or an equation's), or in a position:fixed panel (the theme's
#   off-canvas sidebars), widens neither.
# - overColumn: display equations (MathJax's containers), tables and images wider than the
#   article's content column, or whose content scrolls inside them.
_LAYOUT_JS = r"""() => {
  const describe = (el) => {
    const box = el.getBoundingClientRect();
    return {tag: el.tagName.toLowerCase(), class: el.getAttribute('class') || '',
            width: Math.round(box.width), right: Math.round(box.right),
            text: (el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 60)};
  };
  const articleBox = document.querySelector('.bd-article-container');
  const contained = (el) => {
    let inArticle = articleBox !== null && articleBox.contains(el) && el !== articleBox;
    for (let node = el; node && node !== document.documentElement; node = node.parentElement) {
      const style = getComputedStyle(node);
      if (style.position === 'fixed') return true;
      if (node === articleBox) inArticle = false;
      if (inArticle && node !== el && style.overflowX !== 'visible') return true;
    }
    return false;
  };
  // The right edge an element must stay within: the article container's for what it holds.
  const pageEdge = window.innerWidth + 1;
  const articleEdge = articleBox ? articleBox.getBoundingClientRect().right + 1 : pageEdge;
  // An element sticks out when its box does, or when text overflows it (a long URL, say).
  const past = Array.from(document.body.querySelectorAll('*')).filter(el => {
    const box = el.getBoundingClientRect();
    const edge = articleBox && articleBox.contains(el) ? articleEdge : pageEdge;
    const overflowing = getComputedStyle(el).overflowX === 'visible'
      && box.left + el.scrollWidth > edge;
    return box.width > 0 && (box.right > edge || overflowing) && !contained(el);
  });
  const causes = past.filter(el => !past.some(other => other !== el && el.contains(other)))
    .sort((a, b) => b.getBoundingClientRect().width - a.getBoundingClientRect().width);
  // A page without the theme's article (a 404, say: the status test reports it) is judged whole.
  const article = document.querySelector('article.bd-article') || document.body;
  const column = article.getBoundingClientRect();
  const pad = getComputedStyle(article);
  const left = column.left + parseFloat(pad.paddingLeft) - 1;
  const right = column.right - parseFloat(pad.paddingRight) + 1;
  const overColumn = Array.from(
    article.querySelectorAll('mjx-container[display="true"], table, img')).filter(el => {
      const box = el.getBoundingClientRect();
      return box.width > 0 && (box.left < left || box.right > right
                               || el.scrollWidth > el.clientWidth + 1);
    });
  return {
    pageScroll: Math.max(document.documentElement.scrollWidth - window.innerWidth,
                         articleBox ? articleBox.scrollWidth - articleBox.clientWidth : 0),
    causes: causes.slice(0, 3).map(describe),
    causeCount: causes.length,
    column: Math.round(right - left - 2),
    overColumn: overColumn.map(describe),
  };
}"""

# Run in each page after _SETTLE_JS: report what the page holds.
_INSPECT_JS = r"""() => {
  const math = Array.from(document.querySelectorAll('.math'));
  // TeX that MathJax could not typeset: an <merror>, or (package noundefined) an unknown macro
  // shown as red text.
  const mathErrors = [];
  if (window.MathJax && window.MathJax.startup && window.MathJax.startup.document) {
    for (const item of window.MathJax.startup.document.math) {
      const mml = window.MathJax.startup.toMML(item.root);
      if (/<merror|<mtext[^>]*mathcolor="red"[^>]*>\\/.test(mml)) mathErrors.push(item.math);
    }
  }
  return {
    links: Array.from(document.querySelectorAll('a[href]'), a => a.href),
    ids: Array.from(document.querySelectorAll('[id]'), e => e.id)
      .concat(Array.from(document.querySelectorAll('a[name]'), a => a.name)),
    images: document.images.length,
    // Figure captions' numbers ("Figure 3"), in the page's order.
    figureNumbers: Array.from(document.querySelectorAll('figure span.caption-number'),
                              span => span.textContent.trim()),
    math: math.length,
    mathUntypeset: math.filter(m => !m.querySelector('mjx-container')).length,
    mjxContainers: document.querySelectorAll('mjx-container').length,
    mathErrors: mathErrors,
    mathjaxScripts: Array.from(document.scripts, s => s.src)
      .filter(src => /mathjax/i.test(src)),
    // Code blocks wider than their box (they should wrap: _assets/book.css).
    scrollingCode: Array.from(document.querySelectorAll('div.highlight pre'))
      .filter(pre => pre.scrollWidth > pre.clientWidth + 1)
      .map(pre => pre.textContent.split('\n').reduce((a, b) => a.length >= b.length ? a : b)),
  };
}"""


@pytest.fixture(scope="module")
def site(book):
    """The built book served on 127.0.0.1 (a free port) and a headless Chromium opened on it."""
    assert (book.html / "index.html").is_file(), "the book did not build:\n" + book.log[-3000:]
    assert Path(CHROMIUM).is_file(), f"no {CHROMIUM}: apt-get install -y chromium (.ci/run does)"
    handler = functools.partial(_QuietHandler, directory=str(book.html))
    server = http.server.ThreadingHTTPServer((HOST, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://{HOST}:{server.server_address[1]}/"

    external: list[tuple[str, str]] = []  # (page, url) of every blocked request
    state = {"page": None}  # the page being tested, to file what the browser reports under

    def leaves_machine(url: str) -> bool:
        parsed = urlparse(url)
        return parsed.scheme in ("http", "https", "ws", "wss") and parsed.hostname != HOST

    def block(route):
        external.append((state["page"], route.request.url))
        route.abort()

    playwright = sync_playwright().start()
    try:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)

        def new_context(viewport: dict[str, int]):
            """A browser context at ``viewport`` whose requests off the machine are blocked."""
            context = browser.new_context(viewport=viewport)
            context.route(leaves_machine, block)
            return context

        context = new_context(DESKTOP)
        yield {"base": base, "html": book.html, "context": context, "new_context": new_context,
               "external": external, "state": state}
        context.close()
        browser.close()
    finally:
        playwright.stop()
        server.shutdown()
        server.server_close()


def _watched_page(site, context=None) -> tuple:
    """A new browser tab (in ``context``, by default the desktop one) and the problems it reports,
    by page name: console errors, uncaught exceptions, local requests that fail or answer
    4xx/5xx."""
    page = (context or site["context"]).new_page()
    problems: dict[str, list[str]] = {}

    def note(text: str) -> None:
        problems.setdefault(site["state"]["page"], []).append(text)

    page.on("console", lambda msg: note(f"console {msg.type}: {msg.text}")
            if msg.type == "error" else None)
    page.on("pageerror", lambda error: note(f"uncaught exception: {error}"))
    page.on("response", lambda response: note(f"HTTP {response.status}: {response.url}")
            if response.status >= 400 else None)
    # A local request that fails outright (a 404 is a "response" above). ERR_ABORTED is the
    # browser cancelling what is still in flight when the test moves to the next page.
    page.on("requestfailed", lambda request: note(
        f"request failed ({request.failure}): {request.url}")
        if urlparse(request.url).hostname == HOST and request.failure != "net::ERR_ABORTED"
        else None)
    return page, problems


@pytest.fixture(scope="module")
def crawl(site):
    """Visit every page of the table of contents once; return what the browser saw on each."""
    page, problems = _watched_page(site)
    axe = Axe()
    pages: dict[str, dict] = {}
    text_styles: set[str] = set()
    start_s = time.perf_counter()
    for name in toc_pages():
        site["state"]["page"] = name
        response = page.goto(site["base"] + name + ".html", wait_until="load")
        broken_images = page.evaluate(_SETTLE_JS)
        info = page.evaluate(_INSPECT_JS)
        info["brokenImages"] = broken_images
        info["layout"] = page.evaluate(_LAYOUT_JS)
        info["status"] = response.status if response else None
        info["url"] = page.url
        info["axe"] = (axe.run(page, options=AXE_WITHOUT_CONTRAST).response["violations"]
                       + contrast_of_new_styles(page, axe, text_styles))
        _screenshot_if_listed(page, name, "")
        pages[name] = info
    site["state"]["page"] = None
    page.close()
    print(f"\nbrowser crawl: {len(pages)} pages in {time.perf_counter() - start_s:.1f} s; colour "
          f"contrast checked once for each of {len(text_styles)} text styles")
    return {"pages": pages, "problems": problems, "text_styles": text_styles}


def _screenshot_if_listed(page, name: str, suffix: str) -> None:
    """Save what the viewport shows as ``<label><suffix>.png`` when ``name`` is a
    SCREENSHOT_PAGES page."""
    for label, listed in SCREENSHOT_PAGES.items():
        if listed == name:
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / f"{label}{suffix}.png"))


@pytest.fixture(scope="module")
def phone_crawl(site):
    """Visit every page of the table of contents at a phone's 390 px; return each page's layout
    (``_LAYOUT_JS``) and save the SCREENSHOT_PAGES as ``<label>-390.png``."""
    context = site["new_context"](PHONE)
    page, problems = _watched_page(site, context)
    layouts: dict[str, dict] = {}
    start_s = time.perf_counter()
    for name in toc_pages():
        site["state"]["page"] = name
        page.goto(site["base"] + name + ".html", wait_until="load")
        page.evaluate(_SETTLE_JS)
        layouts[name] = page.evaluate(_LAYOUT_JS)
        _screenshot_if_listed(page, name, f"-{PHONE['width']}")
    site["state"]["page"] = None
    context.close()
    print(f"\nphone crawl: {len(layouts)} pages in {time.perf_counter() - start_s:.1f} s")
    return {"layouts": layouts, "problems": problems}


def sideways_scroll(layouts: dict[str, dict]) -> dict[str, str]:
    """The pages that scroll sideways, each with the elements that widen it (widest first)."""
    return {name: f"scrolls {layout['pageScroll']} px sideways; {layout['causeCount']} elements "
                  f"stick out, widest: {json.dumps(layout['causes'])}"
            for name, layout in layouts.items()
            if layout["pageScroll"] > 1 or layout["causeCount"]}


def wider_than_column(layouts: dict[str, dict], excused: set | None = None) -> dict[str, str]:
    """The pages with display equations, tables or images wider than the article's column,
    less the WIDTH_EXCLUSIONS; those met are added to ``excused`` when it is given."""
    found = {}
    for name, layout in layouts.items():
        wide = []
        for element in layout["overColumn"]:
            key = next((key for key in WIDTH_EXCLUSIONS
                        if key[0] == name and element["text"].startswith(key[1])), None)
            if key is None:
                wide.append(element)
            elif excused is not None:
                excused.add(key)
        if wide:
            found[name] = f"column {layout['column']} px; {json.dumps(wide)}"
    return found


def test_every_toc_page_loads_without_errors(crawl):
    pages = crawl["pages"]
    assert list(pages) == toc_pages() and len(pages) >= 20
    assert all(info["status"] == 200 for info in pages.values()), {
        name: info["status"] for name, info in pages.items() if info["status"] != 200}
    assert not crawl["problems"], json.dumps(crawl["problems"], indent=1)


def _static_ids(url: str) -> set[str] | None:
    """The ids of a local page the crawl did not visit; None when it does not load."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read()
            kind = response.headers.get_content_type()
    except urllib.error.URLError:
        return None
    parser = _Ids()
    if kind == "text/html":
        parser.feed(body.decode("utf-8", errors="replace"))
    return parser.ids


def test_no_broken_internal_link_anchor_or_image(site, crawl):
    base = site["base"]
    ids_by_url = {base + name + ".html": set(info["ids"]) for name, info in crawl["pages"].items()}
    broken, internal = [], 0
    for name, info in crawl["pages"].items():
        broken += [f"{name}: image {src} does not load" for src in info["brokenImages"]]
        for href in set(info["links"]):
            if not href.startswith(base):
                continue  # external (not fetched: nothing leaves the machine) or mailto:
            internal += 1
            target, fragment = urldefrag(href)
            if target.endswith("/"):
                target += "index.html"
            if target not in ids_by_url:
                ids_by_url[target] = _static_ids(target)
            ids = ids_by_url[target]
            if ids is None:
                broken.append(f"{name}: {href} does not load")
            elif fragment and unquote(fragment) not in ids:
                broken.append(f"{name}: {href} has no element with id {unquote(fragment)!r}")
    assert internal > 100  # the crawl did see the navigation, cross-references and citations
    assert not broken, "\n".join(sorted(broken))


def test_math_renders_from_the_book_itself(site, crawl):
    pages = crawl["pages"]
    with_math = [name for name, info in pages.items() if info["math"]]
    assert len(with_math) >= 5, with_math
    for name in with_math:
        info = pages[name]
        assert info["mjxContainers"] >= info["math"] and info["mathUntypeset"] == 0, (name, info)
        assert not info["mathErrors"], (name, info["mathErrors"])
        # One MathJax, from the book's _static/ (not a CDN, not every file under _static/).
        assert len(info["mathjaxScripts"]) == 1, (name, info["mathjaxScripts"])
        assert info["mathjaxScripts"][0].startswith(site["base"] + "_static/mathjax/")
    assert not site["external"], "requests that would have left the machine:\n" + "\n".join(
        f"{page}: {url}" for page, url in site["external"])


def test_long_code_lines_wrap_instead_of_scrolling(crawl):
    scrolling = {name: info["scrollingCode"] for name, info in crawl["pages"].items()
                 if info["scrollingCode"]}
    assert not scrolling, json.dumps(scrolling, indent=1)


def test_no_equation_table_or_image_wider_than_the_column_at_1280_px(crawl):
    layouts = {name: info["layout"] for name, info in crawl["pages"].items()}
    assert all(layout["column"] > 500 for layout in layouts.values()), layouts  # a desktop column
    excused: set = set()
    wide = wider_than_column(layouts, excused)
    assert not wide, json.dumps(wide, indent=1)
    assert not sideways_scroll(layouts), json.dumps(sideways_scroll(layouts), indent=1)
    # An exclusion that no longer matches anything must go.
    assert excused == set(WIDTH_EXCLUSIONS), set(WIDTH_EXCLUSIONS) - excused


def test_no_page_scrolls_sideways_at_390_px(phone_crawl):
    layouts = phone_crawl["layouts"]
    assert list(layouts) == toc_pages()
    assert not sideways_scroll(layouts), json.dumps(sideways_scroll(layouts), indent=1)
    assert not phone_crawl["problems"], json.dumps(phone_crawl["problems"], indent=1)


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280px", "390px"])
def test_the_width_checks_name_an_element_that_sticks_out(site, viewport):
    """Negative control: a 2,000 px table put into a chapter is named by both checks."""
    context = site["new_context"](viewport)
    page = context.new_page()
    page.goto(site["base"] + SCREENSHOT_PAGES["chapter"] + ".html", wait_until="load")
    page.evaluate(_SETTLE_JS)
    assert not sideways_scroll({"before": page.evaluate(_LAYOUT_JS)})
    page.evaluate("""() => {
      const wide = document.createElement('table');
      wide.className = 'injected-wide';
      wide.innerHTML = '<tr><td class="injected-wide" style="min-width: 2000px">wide</td></tr>';
      document.querySelector('article.bd-article').append(wide);
    }""")
    layout = page.evaluate(_LAYOUT_JS)
    context.close()
    scroll, column = sideways_scroll({"page": layout}), wider_than_column({"page": layout})
    print(f"\n{viewport['width']} px, injected table: {scroll} {column}")
    assert layout["pageScroll"] > 1000 and "injected-wide" in scroll["page"], layout
    assert "injected-wide" in column["page"], layout


def test_figures_are_numbered_from_one_on_each_page(crawl):
    numbered = {name: info["figureNumbers"] for name, info in crawl["pages"].items()
                if info["figureNumbers"]}
    for name, numbers in numbered.items():
        assert numbers == [f"Figure {n}" for n in range(1, len(numbers) + 1)], (name, numbers)
    # The restart is seen: at least two pages with several figures each.
    assert sum(len(numbers) >= 2 for numbers in numbered.values()) >= 2, numbered
    print(f"\nfigures numbered per page: {numbered}")


def test_no_serious_accessibility_violations(crawl):
    found, excused = [], set()
    for name, info in crawl["pages"].items():
        for violation in info["axe"]:
            if violation["impact"] not in AXE_FAILING_IMPACTS:
                continue
            for node in violation["nodes"]:
                selector = " ".join(map(str, node["target"]))
                key = (violation["id"], selector)
                if key in AXE_EXCLUSIONS:
                    excused.add(key)
                    continue
                found.append(f"{name}: {violation['id']} ({violation['impact']}) at {selector}: "
                             f"{violation['help']}")
    assert not found, "\n".join(found)
    # An exclusion that no longer matches anything must go.
    assert excused == set(AXE_EXCLUSIONS), set(AXE_EXCLUSIONS) - excused


def test_the_contrast_check_names_a_pale_span(site):
    """Negative control for the once-per-style contrast check: on a chapter, a copy of a paragraph
    adds no text style, and a pale grey span adds exactly one, which axe names."""
    page = site["context"].new_page()
    page.goto(site["base"] + SCREENSHOT_PAGES["chapter"] + ".html", wait_until="load")
    page.evaluate(_SETTLE_JS)
    axe, seen = Axe(), set()
    assert not contrast_of_new_styles(page, axe, seen) and seen
    styles_before = len(seen)
    page.evaluate("""() => {
      const first = document.querySelector('article.bd-article p');
      first.after(first.cloneNode(true));
      const pale = document.createElement('p');
      pale.innerHTML = '<span id="injected-pale" style="color: #d0d0d0">pale</span>';
      first.after(pale);
    }""")
    violations = contrast_of_new_styles(page, axe, seen)
    page.close()
    named = [" ".join(map(str, node["target"])) for violation in violations
             if violation["id"] == "color-contrast" for node in violation["nodes"]]
    print(f"\n{styles_before} text styles on the chapter; the injected span: {named}")
    assert len(seen) == styles_before + 1, sorted(seen)[-3:]
    assert named == ["#injected-pale"], violations


def test_search_finds_a_term(site):
    page, problems = _watched_page(site)
    site["state"]["page"] = "search"
    page.goto(site["base"] + "search.html?q=" + SEARCH_TERM)
    results = page.locator("#search-results ul.search li a")
    results.first.wait_for(timeout=30_000)
    hrefs = [results.nth(i).get_attribute("href") for i in range(results.count())]
    page.close()
    assert any(SEARCH_HIT in href for href in hrefs), hrefs
    assert not problems, problems


def test_exercise_solution_opens_on_click(site):
    page, problems = _watched_page(site)
    site["state"]["page"] = SOLUTION_PAGE
    page.goto(site["base"] + SOLUTION_PAGE + ".html")
    solution = page.locator(".solution.dropdown").first
    body = solution.locator("section").first
    button = solution.locator("button.toggle-button")
    assert body.is_hidden() and button.get_attribute("aria-expanded") == "false"
    solution.locator(".admonition-title").click()
    body.wait_for(state="visible", timeout=5_000)
    assert button.get_attribute("aria-expanded") == "true"
    page.close()
    assert not problems, problems


def test_every_lab_page_offers_its_notebook(site):
    page, problems = _watched_page(site)
    labs = [name for name in toc_pages() if name.startswith("labs/")]
    assert labs
    for name in labs:
        site["state"]["page"] = name
        page.goto(site["base"] + name + ".html")
        page.locator(".dropdown-download-buttons button.dropdown-toggle").click()
        link = page.locator(".dropdown-download-buttons a.btn-download-source-button")
        link.wait_for(state="visible", timeout=5_000)
        href = link.get_attribute("href")
        assert href.endswith(Path(name).name + ".ipynb"), (name, href)
        with urllib.request.urlopen(urljoin(page.url, href), timeout=10) as r:
            notebook = json.loads(r.read())
        assert notebook["nbformat"] == 4 and notebook["cells"], name
    page.close()
    assert not problems, problems


def test_screenshots_written(crawl, phone_crawl):
    for label in SCREENSHOT_PAGES:
        for path in (SCREENSHOTS / f"{label}.png", SCREENSHOTS / f"{label}-{PHONE['width']}.png"):
            assert path.stat().st_size > 10_000, path
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
