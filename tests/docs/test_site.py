"""The documentation site: built with ``mkdocs build --strict``, served on loopback and loaded in
headless Chromium (Debian's package, driven over the DevTools protocol with websocket-client).

* every internal link and resource of every built page resolves to a file of the site, and every
  ``#fragment`` to an id in the page it names (no browser needed);
* the home page, a guide, "How it works" (SVG diagrams) and the benchmarks (PNG charts) load in
  Chromium with no failed request to the site, every image decoded (``naturalWidth > 0``) and
  every link the browser sees resolving as above.

``STREAMING_MERGE_DOCS_SITE`` names a site already built (``.ci/run`` builds it once, strictly,
before the tests); without it the test builds one into a temporary folder. Chromium missing: a
failure under CI (``CI=true``, which installs it), a skip elsewhere.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

import pytest

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["", "guides/streaming-sink/", "how-it-works/", "benchmarks/"]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
IN_CI = os.environ.get("CI", "").lower() == "true"


def _missing(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI installs it: see .ci/run)")
    pytest.skip(reason)


# ------------------------------------------------------------------ the site


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = os.environ.get("STREAMING_MERGE_DOCS_SITE")
    if built:
        path = Path(built)
        assert (path / "index.html").is_file(), f"STREAMING_MERGE_DOCS_SITE={built} holds no built site"
        return path
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
    except ImportError:
        _missing("mkdocs-material is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                             str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    return out


class _Refs(HTMLParser):
    """The ids of a page, and the links and resources it names."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.refs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"] or "")
        for name in ("href", "src"):
            value = values.get(name)
            if value and not (tag == "link" and values.get("rel") in ("preconnect", "dns-prefetch")):
                self.refs.append(value)


@functools.cache
def _parse(path: Path) -> _Refs:
    parser = _Refs()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return parser


def _file_for(site: Path, url_path: str) -> Path | None:
    """The site's file serving ``url_path`` (a path under the site's root), as a static server
    would: a folder serves its index.html."""
    target = (site / unquote(url_path).lstrip("/")).resolve()
    if site.resolve() not in (target, *target.parents):
        return None
    if target.is_dir():
        target = target / "index.html"
    return target if target.is_file() else None


def broken_refs(site: Path, page_url: str, refs: list[str], base: str) -> list[str]:
    """The internal refs of the page at ``page_url`` (under ``base``) that do not resolve to a
    file of the site, or whose #fragment is no id of that file."""
    broken = []
    for ref in refs:
        absolute = urljoin(page_url, ref)
        parts = urlsplit(absolute)
        if parts.scheme not in ("http", "https", "file") or not absolute.startswith(base):
            continue  # another site, mailto:, data:, javascript:
        target = _file_for(site, parts.path[len(urlsplit(base).path):])
        if target is None:
            broken.append(f"{ref} -> no file")
        elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in _parse(target).ids:
            broken.append(f"{ref} -> no id {parts.fragment!r} in {target.relative_to(site)}")
    return broken


def test_every_page_links_resolve(site: Path) -> None:
    base = "http://docs.test/"
    problems = {}
    pages = [p for p in site.rglob("*.html") if p.name != "404.html"]  # 404.html links from the root
    assert len(pages) >= 20, f"only {len(pages)} pages built"
    for page in pages:
        relative = page.relative_to(site).as_posix()
        page_url = base + (relative[: -len("index.html")] if relative.endswith("index.html") else relative)
        broken = broken_refs(site, page_url, _parse(page).refs, base)
        if broken:
            problems[relative] = broken
    assert not problems, json.dumps(problems, indent=1)


# ------------------------------------------------------------------ Chromium


@pytest.fixture(scope="module")
def server(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class DevTools:
    """One page target of a headless Chromium, over its DevTools websocket."""

    def __init__(self, websocket_url: str) -> None:
        import websocket

        self._ws = websocket.create_connection(websocket_url, timeout=30, suppress_origin=True)
        self._next = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._next += 1
        ident = self._next
        self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, event: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, message in enumerate(self.events):
                if message.get("method") == event:
                    return self.events.pop(i)
            self._ws.settimeout(max(0.1, deadline - time.monotonic()))
            self.events.append(json.loads(self._ws.recv()))
        raise TimeoutError(f"no {event} within {timeout} s")

    def close(self) -> None:
        self._ws.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[DevTools]:
    executable = next((found for name in BROWSERS if (found := shutil.which(name))), None)
    if executable is None:
        _missing("Chromium is not installed (apt-get install chromium)")
    try:
        import websocket  # noqa: F401
    except ImportError:
        _missing("websocket-client is not installed (pip install -e '.[docs]')")
    profile = tempfile.mkdtemp(prefix="docs-chromium-")
    process = subprocess.Popen(
        [executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", f"--user-data-dir={profile}",
         "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tools = None
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert process.poll() is None, f"{executable} exited with {process.returncode} at start"
            assert time.monotonic() < deadline, f"{executable} opened no DevTools port within 60 s"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
            targets = json.load(response)
        page = next(t for t in targets if t.get("type") == "page")
        tools = DevTools(page["webSocketDebuggerUrl"])
        tools.call("Page.enable")
        tools.call("Network.enable")
        yield tools
    finally:
        if tools is not None:
            with contextlib.suppress(Exception):
                tools.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        shutil.rmtree(profile, ignore_errors=True)


# What the page holds once loaded: its title, every image and whether it decoded, every link and
# resource the browser resolved.
_INSPECT = """(() => ({
  title: document.title,
  h1: (document.querySelector('article h1') || {}).textContent || '',
  images: [...document.images].map(i => ({src: i.currentSrc || i.src, complete: i.complete,
                                          width: i.naturalWidth})),
  refs: [...document.querySelectorAll('a[href], link[href], script[src], img[src]')]
          .map(e => e.href || e.src),
}))()"""


@pytest.mark.parametrize("page", PAGES)
def test_page_loads_in_chromium(site: Path, server: str, browser: DevTools, page: str) -> None:
    url = server + page
    browser.events.clear()
    browser.call("Page.navigate", url=url)
    browser.wait_for("Page.loadEventFired")
    deadline = time.monotonic() + 15  # images decode after the load event at the latest
    while True:
        found = browser.call("Runtime.evaluate", expression=_INSPECT, returnByValue=True)["result"]["value"]
        if all(i["complete"] for i in found["images"]) or time.monotonic() > deadline:
            break
        time.sleep(0.2)

    failed = [e["params"] for e in browser.events
              if e.get("method") == "Network.loadingFailed" and not e["params"].get("canceled")]
    bad_status = [(e["params"]["response"]["url"], e["params"]["response"]["status"]) for e in browser.events
                  if e.get("method") == "Network.responseReceived" and e["params"]["response"]["status"] >= 400]
    assert not failed, f"{url}: requests failed: {failed}"
    assert not bad_status, f"{url}: HTTP errors: {bad_status}"
    assert found["h1"].strip(), f"{url}: no page heading (title {found['title']!r})"
    broken_images = [i for i in found["images"] if not i["complete"] or i["width"] <= 0]
    assert not broken_images, f"{url}: images not loaded: {broken_images}"
    if page in ("how-it-works/", "benchmarks/"):
        own = [i for i in found["images"] if i["src"].startswith(server + "img/")]
        assert len(own) >= 2, f"{url}: expected the page's diagrams or charts, found {found['images']}"
    broken = broken_refs(site, url, found["refs"], server)
    assert not broken, f"{url}: broken links: {broken}"


def test_reference_tables_are_generated(site: Path) -> None:
    """The markers of the reference pages were replaced by the tables the code gives."""
    for page, expected in (("reference/merge-options/index.html", "interpreted_max_rows"),
                           ("reference/merge-sink/index.html", "apply_as_truncates"),
                           ("reference/metrics/index.html", "lastMerge_numTargetFilesBeforeSkipping_Value"),
                           ("reference/cli/index.html", "--subscribe-pattern"),
                           ("benchmarks/index.html", "spark-floor")):
        html = (site / page).read_text()
        assert "<!-- reference:" not in html, f"{page}: a reference marker was left in place"
        assert expected in html, f"{page}: {expected!r} missing from the generated table"
