"""The console's overview and its access rule, in a real browser (Playwright, Debian's chromium)
on a fresh ``gpuflow dev``: the hosts with their GPUs, the counts by state, the gateway; a name
with markup in it shown as text; the open console on loopback while no key exists, then the
sign-in once one does."""

from __future__ import annotations

import re

import pytest

from tests.console_browser import Watched, browser
from tests.dev_stack import Dev, until


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    d = Dev(tmp_path_factory.mktemp("console"), gpus=(24, 24, 80))
    try:
        yield d
    finally:
        d.stop()


def console(dev: Dev) -> str:
    return f"http://127.0.0.1:{dev.gw_port}"


def test_dev_prints_the_console_url(dev):
    assert f"web console: http://127.0.0.1:{dev.gw_port}/console/" in dev.out


def test_overview_shows_hosts_gpus_counts_and_the_gateway(dev):
    with browser() as b:
        w = Watched(b, console(dev))
        page = w.page  # the agent says hello a moment after dev is up
        until("the host is on the overview", lambda: w.open("/console/").locator("tr[data-host=box]").count() == 1,
              timeout=30)
        row = page.locator("tr[data-host=box]")
        # the inventory's three GPUs: 24, 24 and 80 GiB, nothing claimed yet
        gpus = row.locator(".gpu")
        assert gpus.count() == 3
        assert re.search(r"80\.0 · 0\.0", gpus.nth(2).inner_text()), gpus.nth(2).inner_text()
        assert "mock-gpus" in row.inner_text()  # inventory GPUs, real engine processes (contracts/host.py HOST_KINDS)
        assert "ready" in row.inner_text()
        cards = page.locator("#counts").inner_text()
        assert re.search(r"GPUs\s+3\s", cards), cards
        assert f"127.0.0.1:{dev.gw_port}" in cards  # the live gateway
        # the filter: no host matches, then this one does
        page.fill("input[name=q]", "nope")
        page.click("form.filter button")
        page.wait_for_load_state("networkidle")
        assert "no hosts match" in page.locator("#hosts").inner_text()
        w.open("/console/?q=bo&state=ready")
        assert page.locator("tr[data-host=box]").count() == 1
        w.check()
        w.close()


def test_console_escapes_what_it_shows_and_signs_in_once_a_key_exists(dev):
    base = console(dev)
    with browser() as b:
        w = Watched(b, base)
        # a query string with markup comes back as text in the filter box, never as markup
        page = w.open("/console/?q=%3Cscript%3Ealert(1)%3C/script%3E")
        assert page.locator("input[name=q]").input_value() == "<script>alert(1)</script>"
        assert page.locator("script:not([src])").count() == 0
        w.check()
        w.close()
        key = dev.run("keys", "create", "--tenant", "default", "--admin").split()[-1]  # --admin on default: cluster-admin
        assert key.startswith("gpuflow-"), key
        w = Watched(b, base)
        w.allow = ["/console/login"]  # the wrong key's 401 is expected
        page = until("the console asks for a key", lambda: w.open("/console/").url.endswith("login?next=/console/")
                     and w.page, timeout=10)
        page.fill("input[name=key]", "gpuflow-000000000000-" + "x" * 43)
        page.click("form.login button")
        assert "not a valid API key" in page.locator("main").inner_text()
        page.fill("input[name=key]", key)
        page.click("form.login button")
        page.wait_for_url(base + "/console/")
        assert "tenant default (cluster-admin)" in page.locator("header").inner_text()
        assert page.locator("tr[data-host=box]").count() == 1
        w.check()
        w.close()
