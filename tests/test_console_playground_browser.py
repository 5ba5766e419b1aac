"""The console's playground in a real browser (Playwright, Debian's chromium) on a fresh
``gpuflow dev`` with stand-in engines (tests/standin_engine.py: token i is ``tok{i} ``, one
every ``--token-s``, 4 by default): pick a model, send, watch the answer stream in with its
TTFT and tokens/s; stop one midway; then, once keys exist, a tenant's key lists only the
models its tenant may use and chats with its own key. Plus the handed-on request's scope."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest
import yaml

from console.playground import handed_scope
from tests.console_browser import Watched, browser
from tests.dev_stack import Dev, until

ENGINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_engine.py")
TOKEN_S = 0.3
TENANTS = {"tenants": [{"name": "team-a"}, {"name": "team-b"}]}


def spec(name: str, tenant: str) -> dict:
    return {"name": name, "backend": "custom", "tenant": tenant, "source": {"local_path": f"/models/{name}"},
            "run_command": f"{sys.executable} {ENGINE} --port {{port}} --host {{host}} --name {name} --token-s {TOKEN_S}",
            "resources": {"vram": 4 * 2**30, "ram": 2**30}}


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("playground")
    d = Dev(tmp, gpus=(24,))
    try:
        (tmp / "tenants.yaml").write_text(yaml.safe_dump(TENANTS))
        d.run("tenants", "apply", str(tmp / "tenants.yaml"))
        for name, tenant in (("chat", "team-a"), ("other", "team-b")):
            (tmp / f"{name}.yaml").write_text(json.dumps(spec(name, tenant)))
            d.run("deploy", str(tmp / f"{name}.yaml"), "--wait", "--timeout", "120")
        yield d
    finally:
        d.stop()


def base(dev: Dev) -> str:
    return f"http://127.0.0.1:{dev.gw_port}"


def test_handed_scope_keeps_only_what_an_engine_needs():
    scope = {"type": "http", "path": "/console/playground/chat", "raw_path": b"/console/playground/chat",
             "root_path": "/console", "query_string": b"x=1",
             "headers": [(b"host", b"h:1"), (b"content-type", b"application/json"), (b"content-length", b"12"),
                         (b"cookie", b"gpuflow_console=gpuflow-abc"), (b"x-gpuflow-console", b"1"),
                         (b"origin", b"http://h:1"), (b"authorization", b"Bearer forged")]}
    rows = [  # (token, the headers the relay gets)
        ("gpuflow-abc", [(b"host", b"h:1"), (b"content-type", b"application/json"), (b"content-length", b"12"),
                         (b"authorization", b"Bearer gpuflow-abc")]),  # the cookie's key as Authorization, once
        ("", [(b"host", b"h:1"), (b"content-type", b"application/json"), (b"content-length", b"12")]),  # open console
    ]
    for token, headers in rows:
        s = handed_scope(scope, token)
        assert (s["path"], s["raw_path"], s["root_path"], s["query_string"]) == (
            "/v1/chat/completions", b"/v1/chat/completions", "", b"")
        assert s["headers"] == headers, token
    assert scope["path"] == "/console/playground/chat"  # a copy: the console's own request is unchanged


def send(page, text: str) -> None:
    page.fill("#message", text)
    page.click("#send")


def test_chat_streams_the_answer_with_ttft_and_tokens_per_second(dev):
    with browser() as b:
        w = Watched(b, base(dev))
        page = w.open("/console/playground?model=chat")
        # the open console (no key yet) lists every deployment, the asked one chosen
        assert page.locator("#model option").all_inner_texts() == ["chat (1 running)", "other (1 running)"]
        assert page.locator("#model").input_value() == "chat"
        send(page, "hello <b>there</b>")
        answer = page.locator(".turn.assistant .text").last
        # streamed: the first token shows while the last is still 3 x 0.3 s away
        page.wait_for_function("() => document.querySelector('.turn.assistant .text').textContent.includes('tok0')")
        assert "tok3" not in answer.inner_text()
        fig = page.locator(".turn.assistant .figures").last
        fig.wait_for(timeout=10_000)
        assert answer.text_content() == "tok0 tok1 tok2 tok3 "
        assert page.locator(".turn.user .text").first.inner_text() == "hello <b>there</b>"  # text, not markup
        assert page.locator(".turn.user b").count() == 0
        # TTFT: the stand-in sleeps 0.3 s before its first token -> 300 ms and up
        ttft = int(re.fullmatch(r"TTFT (\d+) ms", fig.locator(".ttft").inner_text()).group(1))
        assert 300 <= ttft < 3000, ttft
        # 4 tokens (the usage chunk's count), 3 after the first over 3 x 0.3 = 0.9 s -> 3.3 tokens/s
        assert fig.locator(".tokens").inner_text() == "4 tokens"
        tps = float(re.fullmatch(r"([\d.]+) tokens/s", fig.locator(".tps").inner_text()).group(1))
        assert 2.0 <= tps <= 5.0, tps
        # the conversation goes on: the second request carries both earlier turns
        with page.expect_request("**/console/playground/chat") as req:
            send(page, "again")
        assert [m["role"] for m in req.value.post_data_json["messages"]] == ["user", "assistant", "user"]
        page.locator(".turn.assistant .figures").nth(1).wait_for(timeout=10_000)
        # stop: 50 tokens would take 15 s; stopped after the first, what arrived stays
        page.fill("#max-tokens", "50")
        send(page, "a long one")
        page.wait_for_function("() => document.querySelectorAll('.turn.assistant .text')[2].textContent.includes('tok0')")
        page.click("#stop")
        third = page.locator(".turn.assistant").nth(2)
        third.locator(".figures .note").wait_for(timeout=5_000)
        assert third.locator(".note").inner_text() == "stopped"
        assert "tok0" in third.locator(".text").inner_text() and "tok49" not in third.locator(".text").inner_text()
        assert page.locator("#send").is_enabled()
        w.check()
        w.close()


def test_a_tenants_key_lists_only_its_models_and_chats_with_its_key(dev):
    key = dev.run("keys", "create", "--tenant", "team-a").split()[-1]
    assert key.startswith("gpuflow-"), key
    with browser() as b:
        w = Watched(b, base(dev))
        page = until("the console asks for a key",
                     lambda: w.open("/console/playground").url.endswith("login?next=/console/playground") and w.page,
                     timeout=10)
        page.fill("input[name=key]", key)
        page.click("form.login button")
        page.wait_for_url(base(dev) + "/console/playground")
        # team-a's key: chat (team-a's), not other (team-b's), as /v1/models says for the same key
        assert page.locator("#model option").all_inner_texts() == ["chat (1 running)"]
        send(page, "hi")
        page.locator(".turn.assistant .figures").wait_for(timeout=10_000)
        assert page.locator(".turn.assistant .text").text_content() == "tok0 tok1 tok2 tok3 "
        # a model this key may not use, asked by name: said so, never offered
        w.open("/console/playground?model=other")
        assert "No deployment named other that you may use." in page.locator("main").inner_text()
        assert page.locator("#model").input_value() == "chat"
        w.check()
        w.close()
