"""The documentation site in a real browser: built with mkdocs, served on localhost, driven in headless Chromium.

Every page loads without console errors or failed requests; no table is clipped (it fits the text column or
scrolls sideways inside it); no page scrolls sideways at a phone's width (390 px); the search box finds a method by
name. Screenshots of the home page (desktop and phone width) and of the results page are kept in SCREENSHOTS for a
person to look at. Needs Debian's `chromium` (scripts/setup.sh installs it where apt exists and it runs as root) and
the `playwright` package (the `test` extra); skipped with a message naming what is missing otherwise.
"""

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "build" / "docs-screenshots"
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
# --no-sandbox: Chromium refuses to run as root (CI) without it; --disable-dev-shm-usage: containers often give
# /dev/shm 64 MB, too little for a tab; the rest keep Chromium from reaching for Google's services (updates, sync,
# safe browsing) at start and on every page, which a closed network answers with errors.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
CHROMIUM = shutil.which("chromium")
SEARCH_INDEX = "**/search/search_index.json"

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright
except ImportError:
    sync_playwright = None

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="the documentation's browser test needs Chromium on PATH as `chromium` (Debian: apt-get install "
        "chromium; scripts/setup.sh installs it where apt exists and it runs as root)",
    ),
    pytest.mark.skipif(
        sync_playwright is None,
        reason="the documentation's browser test needs the playwright package: pip install -e '.[test]'",
    ),
]

# Measured in the page after it loaded. A table is clipped when it is wider than the text column and no element
# between it and the column scrolls sideways, or when that scrolling element itself reaches outside the window.
# Outside such scrolling elements, nothing in the text column may reach past the window's right edge (the page could
# hide it with overflow rules without scrolling), and the page must not scroll sideways.
MEASURE = """(phone) => {
  const article = document.querySelector('article.md-content__inner');
  const column = article.getBoundingClientRect();
  const viewport = document.documentElement.clientWidth;
  const scrollerOf = (el) => {
    for (let a = el.parentElement; a && a !== article; a = a.parentElement) {
      const o = getComputedStyle(a).overflowX;
      if (o === 'auto' || o === 'scroll') return a;
    }
    return null;
  };
  const clipped = [];
  for (const table of article.querySelectorAll('table')) {
    const box = table.getBoundingClientRect();
    const scroller = scrollerOf(table);
    const header = table.querySelector('th, td');
    const name = header ? header.textContent.trim().slice(0, 40) : '';
    if (scroller) {
      const s = scroller.getBoundingClientRect();
      if (s.left < -1 || s.right > viewport + 1 || scroller.scrollWidth + 1 < table.scrollWidth)
        clipped.push(`table "${name}": its scrolling box spans ${s.left}-${s.right} px of a ${viewport} px window`);
    } else if (box.right > column.right + 1 || box.left < column.left - 1) {
      clipped.push(`table "${name}" is ${box.width} px wide in a ${column.width} px column and does not scroll`);
    }
  }
  const outside = [];
  for (const el of phone ? article.querySelectorAll('*') : []) {
    const box = el.getBoundingClientRect();
    if (box.width > 0 && box.right > viewport + 1 && !scrollerOf(el))
      outside.push(`<${el.tagName.toLowerCase()}> "${el.textContent.trim().slice(0, 40)}" ends at ${box.right} px`);
  }
  window.scrollTo(100000, window.scrollY);
  const scrolledX = window.scrollX;
  window.scrollTo(0, 0);
  return {clipped, outside: outside.slice(0, 3), scrolledX, pageWidth: document.documentElement.scrollWidth, viewport};
}"""


def _listing(lines: list[str], most: int = 20) -> str:
    """The first problems found, not hundreds of lines when one cause breaks every page."""
    more = f"\n... and {len(lines) - most} more" if len(lines) > most else ""
    return "\n".join(lines[:most]) + more


def _build_site(out: Path) -> Path:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"mkdocs build failed:\n{done.stdout}\n{done.stderr}"
    return out


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # one connection for a page's files, not one each

    def log_message(self, format, *args):
        pass


@pytest.fixture(scope="module")
def site_url(tmp_path_factory):
    site = _build_site(tmp_path_factory.mktemp("site") / "site")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    pages = sorted(p.relative_to(site).parent.as_posix() for p in site.rglob("index.html"))
    try:
        yield f"http://127.0.0.1:{server.server_port}/", ["" if p == "." else p + "/" for p in pages], site
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="module")
def browser_page(site_url):
    """One browser and one tab for every test here (starting Chromium costs about a second; a tab per page more)."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport=DESKTOP)
        try:
            yield page
        finally:
            browser.close()


@pytest.fixture(scope="module")
def visited(site_url, browser_page):
    """Every page of the site loaded once at desktop width and measured there and, resized, at phone width."""
    base, pages, site = site_url
    page = browser_page
    current = {"path": ""}
    problems: dict[str, list[str]] = {}

    def report(text: str) -> None:
        problems.setdefault(current["path"] or "(home)", []).append(text)

    def on_console(message) -> None:
        if message.type == "error":
            report(f"console error: {message.text}")

    def on_request_failed(request) -> None:
        # leaving a page aborts what it still loads (the favicon, the search worker): not the page's fault
        if request.failure != "net::ERR_ABORTED":
            report(f"request failed: {request.url} ({request.failure})")

    def on_response(response) -> None:
        if response.status >= 400:
            report(f"HTTP {response.status}: {response.url}")

    def on_page_error(error) -> None:
        report(f"uncaught exception: {error}")

    page.on("console", on_console)
    page.on("pageerror", on_page_error)
    page.on("requestfailed", on_request_failed)
    page.on("response", on_response)
    # Each page's search worker builds the search index (0.8 MB of JSON) when the page loads, which made the visits
    # take 40 s instead of 25 s on a busy 2-core machine. Here the pages get the index without its documents; the
    # search tests below use the real one.
    config = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))["config"]
    page.route(SEARCH_INDEX, lambda route: route.fulfill(json={"config": config, "docs": []}))
    measured = {}
    try:
        for path in pages:
            current["path"] = path
            page.set_viewport_size(DESKTOP)
            page.goto(base + path, wait_until="load")
            desktop = page.evaluate(MEASURE, False)
            page.set_viewport_size(PHONE)
            measured[path] = {"desktop": desktop, "phone": page.evaluate(MEASURE, True)}
    finally:
        page.unroute(SEARCH_INDEX)
        page.set_viewport_size(DESKTOP)
        page.remove_listener("console", on_console)
        page.remove_listener("pageerror", on_page_error)
        page.remove_listener("requestfailed", on_request_failed)
        page.remove_listener("response", on_response)
    return pages, measured, problems


def test_the_site_has_its_pages(visited):
    pages, _, _ = visited
    # the nav's pages and the results' quoted tables: a build that lost most of them is not a pass
    assert len(pages) >= 40 and "" in pages and "results/" in pages, pages


def test_every_page_loads_without_console_errors(visited):
    _, _, problems = visited
    assert not problems, _listing([f"{path}: {text}" for path, texts in problems.items() for text in texts])


def test_no_table_is_clipped(visited):
    _, measured, _ = visited
    clipped = [
        f"{path} at {width}: {text}"
        for path, widths in measured.items()
        for width, found in widths.items()
        for text in found["clipped"]
    ]
    assert not clipped, _listing(clipped)


def test_no_page_scrolls_sideways_at_phone_width(visited):
    _, measured, _ = visited
    wide = [
        f"{path}: page {m['pageWidth']} px in a {m['viewport']} px window, scrolls {m['scrolledX']} px; {m['outside']}"
        for path, widths in measured.items()
        if (m := widths["phone"])["scrolledX"] or m["pageWidth"] > m["viewport"] or m["outside"]
    ]
    assert not wide, _listing(wide)


@pytest.mark.parametrize("name, page", [("feddyn", "api/methods/"), ("ivon-admm", "api/methods/")])
def test_search_finds_a_method_by_name(site_url, browser_page, name, page):
    base, _, _ = site_url
    errors: list[str] = []
    # A context of its own, with an empty HTTP cache: the visits above served the pages an index without documents
    # (`visited`), which a page of the shared tab could still be given from its cache.
    context = browser_page.context.browser.new_context(viewport=DESKTOP)
    tab = context.new_page()
    tab.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    try:
        tab.goto(base, wait_until="load")
        search = tab.locator("input.md-search__input")
        hits = tab.locator(f'.md-search-result__item a[href*="{page}"]')
        # The theme builds its search index in a web worker and answers the keystrokes it sees once it listens; on a
        # loaded machine a query typed before then may go unanswered. So the query is typed again, key by key, until
        # the results show or 90 s have passed.
        deadline = time.monotonic() + 90
        while True:
            search.fill("")
            search.press_sequentially(name)
            try:
                hits.first.wait_for(state="visible", timeout=5_000)
                break
            except PlaywrightTimeout:
                if time.monotonic() > deadline:
                    raise
        titles = tab.locator(".md-search-result__item").all_inner_texts()
    finally:
        context.close()
    assert any(name in title.lower() for title in titles), titles
    assert not errors, errors


def test_screenshots_of_the_home_and_results_pages(site_url, browser_page):
    base, _, _ = site_url
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shots = [("home.png", "", DESKTOP), ("home-phone.png", "", PHONE), ("results.png", "results/", DESKTOP)]
    try:
        for filename, path, viewport in shots:
            browser_page.set_viewport_size(viewport)
            browser_page.goto(base + path, wait_until="load")
            browser_page.screenshot(path=SCREENSHOTS / filename, animations="disabled")
        # the first quoted `compare` table, wider than the column, scrolled to just below the page's fixed header
        table = browser_page.locator(".results-table").first
        table.evaluate("el => window.scrollTo(0, el.getBoundingClientRect().top + window.scrollY - 80)")
        browser_page.screenshot(path=SCREENSHOTS / "results-table.png", animations="disabled")
    finally:
        browser_page.set_viewport_size(DESKTOP)
    print(f"screenshots of the documentation site: {SCREENSHOTS}")
    for filename in ["home.png", "home-phone.png", "results.png", "results-table.png"]:
        assert (SCREENSHOTS / filename).stat().st_size > 10_000, filename
