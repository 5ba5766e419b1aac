"""The console's browser tests' harness: Playwright driving Debian's ``chromium`` (the pip
package's own browser download cannot work here: ``CHROMIUM`` points it at the system binary,
which the Makefile installs where it is missing). ``Watched`` is a page that records every
console error, uncaught exception, failed request and HTTP error answer; ``check()`` fails the
test on any of them, so a page that half-works does not pass."""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest

CHROMIUM = os.environ.get("GPUFLOW_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


@contextlib.contextmanager
def browser():
    """A headless Chromium; the test fails (not skipped) where it cannot start."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is a test dependency (pyproject)")
    assert os.path.exists(CHROMIUM), f"no chromium at {CHROMIUM}: 'make test' installs Debian's package 'chromium'"
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield b
        finally:
            b.close()


class Watched:
    """A page (with its own browser context: cookies apart) whose errors are kept. ``allow``:
    substrings of URLs whose HTTP error answers are expected (a test that checks a refusal)."""

    def __init__(self, b, base: str, headers: dict[str, str] | None = None):
        self.base = base.rstrip("/")
        self.ctx = b.new_context(extra_http_headers=headers or {}, viewport={"width": 1400, "height": 900})
        self.page = self.ctx.new_page()
        self.problems: list[str] = []
        self.allow: list[str] = []
        p = self.page
        p.on("console", lambda m: m.type == "error" and not self._allowed(m.location.get("url") or "-")
             and self.problems.append(f"console: {m.text} ({m.location.get('url')})"))
        p.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        p.on("requestfailed", lambda r: self._failed(r))
        p.on("response", lambda r: r.status >= 400 and not self._allowed(r.url)
             and self.problems.append(f"HTTP {r.status}: {r.request.method} {r.url}"))

    def _allowed(self, url: str) -> bool:
        return any(a in url for a in self.allow)

    def _failed(self, r) -> None:
        # a streamed or refreshed request the page itself cut short when it navigated away is not a fault,
        # nor a web worker's script (the docs' search worker, started in the background) cut short likewise
        if r.failure and "ERR_ABORTED" in r.failure and (not r.url.endswith((".js", ".css")) or "/workers/" in r.url):
            return
        self.problems.append(f"request failed: {r.method} {r.url}: {r.failure}")

    def open(self, path: str, status: int = 200):
        """Go to ``path`` (under the gateway's base), wait for it to settle, check its status."""
        r = self.page.goto(self.base + path, wait_until="networkidle")
        assert r is not None and r.status == status, (path, r and r.status, r and r.text()[:500])
        return self.page

    def check(self) -> None:
        assert not self.problems, "\n".join(self.problems)

    def close(self) -> None:
        self.ctx.close()
