"""Issue 36's console frictions, in a real browser (Playwright, Debian's chromium) on a fresh
``gpuflow dev`` whose console is open (no key yet): the playground leaves no aborted request per
answer (llama-cpp-python's ``cache-control: no-store`` made Chromium end each finished stream as
``net::ERR_ABORTED``) and says an empty answer is one; the overview's headline counts leave deleted
deployments and replicas out; the spec shows its sizes in GiB (and ``gpuflow status`` too); an
action's result shows beside the form that asked; the first key is warned of before it closes the
open gateway, and the page never shows it beside "no API key exists"; once signed in, the
playground says "/v1/chat/completions with your key"."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

from tests.console_browser import Watched, browser
from tests.dev_stack import Dev, until

ENGINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_engine.py")


def spec(name: str, command: str) -> dict:
    return {"name": name, "backend": "custom", "source": {"local_path": f"/models/{name}"}, "run_command": command,
            "resources": {"vram": "4 GiB", "ram": "1 GiB"}}


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("frictions")
    d = Dev(tmp, gpus=(24, 24))
    try:
        until("the host is ready", lambda: re.search(r"^box\s.*ready", d.run("hosts"), re.M | re.I), timeout=60)
        for name, command in (
                ("chat", "gpuflow standin --port {port} --host {host}"),  # gpuflow's own stand-in, on the agent's PATH
                ("llamaish", f"{sys.executable} {ENGINE} --port {{port}} --host {{host}} --mode llama"),
                ("empty", f"{sys.executable} {ENGINE} --port {{port}} --host {{host}} --mode empty")):
            (tmp / f"{name}.json").write_text(json.dumps(spec(name, command)))
            d.run("deploy", str(tmp / f"{name}.json"), "--wait", "--timeout", "120")
        yield d
    finally:
        d.stop()


def base(dev: Dev) -> str:
    return f"http://127.0.0.1:{dev.gw_port}"


def ask(page, model: str, text: str):
    page.select_option("#model", model)
    page.fill("#message", text)
    page.click("#send")
    turn = page.locator(".turn.assistant").last
    until("the answer ends", lambda: turn.locator(".figures").count() or "failed" in (turn.get_attribute("class") or ""),
          timeout=30, every=0.2)
    return turn


def test_the_playground_leaves_no_aborted_request_and_says_an_empty_answer_is_one(dev):
    with browser() as b:
        w = Watched(b, base(dev))
        aborted = []  # the harness lets ERR_ABORTED pass (a page may cut its own requests short): not this one
        w.page.on("requestfailed", lambda r: "/console/playground/chat" in r.url and aborted.append(r.failure))
        page = w.open("/console/playground")
        turn = ask(page, "llamaish", "hello")
        assert turn.locator(".text").text_content() == "tok0 tok1 tok2 tok3 "
        assert ask(page, "chat", "hi there").locator(".text").text_content().startswith(
            "This is gpuflow's stand-in engine")
        empty = ask(page, "empty", "anyone?")
        assert "failed" in empty.get_attribute("class")
        assert empty.locator(".text").text_content().startswith("The model answered with no text (finish_reason: length)")
        assert aborted == [], aborted
        w.check()
        w.close()


def test_the_overview_counts_leave_deleted_deployments_and_replicas_out(dev):
    (dev.tmp / "gone.json").write_text(json.dumps(spec("gone", "gpuflow standin --port {port} --host {host}")))
    dev.run("deploy", str(dev.tmp / "gone.json"), "--wait", "--timeout", "120")
    dev.run("delete", "gone", "--wait")
    with browser() as b:
        w = Watched(b, base(dev))
        cards = w.open("/console/").locator("#counts")
        deployments = cards.locator(".card", has_text="Deployments")
        replicas = cards.locator(".card", has_text="Replicas")
        # chat, llamaish and empty, a replica each; gone's deployment and replica are deleted: not counted
        assert deployments.locator(".big").inner_text() == "3" and replicas.locator(".big").inner_text() == "3"
        assert "deleted" not in deployments.inner_text() + replicas.inner_text()
        w.check()
        w.close()


def test_the_spec_shows_gib_and_an_action_s_result_shows_by_its_form(dev):
    assert "  resources: 4 GiB VRAM, 1 GiB RAM a replica (the spec's)" in dev.run("status", "chat").splitlines()
    with browser() as b:
        w = Watched(b, base(dev))
        page = w.open("/console/deployments/chat")
        shown = page.locator("pre.spec").inner_text()
        assert "vram: 4 GiB" in shown and "ram: 1 GiB" in shown and "4294967296" not in shown
        page.fill("form.scale input[name=replicas]", "2")
        page.click("form.scale button")
        page.locator("#notice", has_text="chat: 2 replica(s) wanted").wait_for(timeout=30_000)
        assert page.evaluate("document.getElementById('notice').previousElementSibling.matches('form.scale')")
        assert page.locator("#notice").is_visible() and page.evaluate(
            "(() => { const r = document.getElementById('notice').getBoundingClientRect();"
            " return r.top >= 0 && r.bottom <= window.innerHeight; })()")  # beside the form, on screen
        w.check()
        w.close()
    dev.run("scale", "chat", "1")


def test_the_first_key_is_warned_of_and_the_page_then_says_the_gateway_is_closed(dev):
    with browser() as b:
        w = Watched(b, base(dev))
        page = w.open("/console/keys")
        warning = page.locator("#first-key").inner_text()
        assert "The first key you create closes it" in warning and "get 401" in warning
        assert page.input_value("#create-key input[name=tenant]") == "default"
        assert page.locator("#create-key select[name=scope]").input_value() == "cluster-admin"
        asked = []
        page.once("dialog", lambda d: (asked.append(d.message), d.accept()))
        page.click("#create-key button")
        page.wait_for_selector("#new-key:not([hidden])", timeout=30_000)
        key = page.locator("#new-key .secret").inner_text().strip()
        assert asked and "first API key" in asked[0] and key.startswith("gpuflow-")
        text = page.locator("body").inner_text()
        for stale in ("no API key exists", "no API keys yet", "0 keys", "open console"):
            assert stale not in text, stale  # never beside the new key
        assert page.locator("header .who").inner_text() == "the gateway now needs an API key"
        assert "sign in with it" in page.locator("#key-list").inner_text()
        w.check()
        w.close()

        w = Watched(b, base(dev))
        page = until("the console asks for a key", lambda: w.open("/console/playground").url.endswith(
            "login?next=/console/playground") and w.page, timeout=10)
        page.fill("input[name=key]", key)
        page.click("form.login button")
        page.wait_for_url(base(dev) + "/console/playground")
        said = " ".join(page.locator("main p.muted").inner_text().split())
        assert "/v1/chat/completions with your key (tenant default)" in said, said
        w.check()
        w.close()
