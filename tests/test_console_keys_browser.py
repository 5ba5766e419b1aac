"""The console's API-keys page in a real browser (Playwright, Debian's chromium) on a fresh
``gpuflow dev`` with a stand-in engine deployed: an admin creates a key from the page (through
Temporal, shown once, in no cookie), the official ``openai`` client uses it, the page shows its
requests and tokens and its tenant's, the admin revokes it from the page and the gateway refuses
it; a tenant's key sees itself only and may not create one."""

from __future__ import annotations

import json
import os
import sys

import openai
import pytest

from tests import gateway_stack as gs
from tests.console_browser import Watched, browser
from tests.dev_stack import Dev, until

ENGINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_engine.py")
MSG = [{"role": "user", "content": "count my tokens"}]
PROMPT = len(json.dumps(MSG)) // 4 + 1  # the stand-in's prompt tokens: len(json.dumps(messages)) // 4 + 1


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console-keys")
    d = Dev(tmp)
    try:
        (tmp / "chat.json").write_text(json.dumps({
            "name": "chat", "backend": "custom", "replicas": 1, "source": {"local_path": "/models/chat"},
            "run_command": f"{sys.executable} {ENGINE} --port {{port}} --host {{host}} --name r1",
            "resources": {"vram": 2**30, "ram": 2**30}}))
        d.run("deploy", str(tmp / "chat.json"))
        (tmp / "tenants.json").write_text(json.dumps({"tenants": [{"name": "team-a"}, {"name": "team-b"}]}))
        d.run("tenants", "apply", str(tmp / "tenants.json"))  # a key is for a tenant that exists
        d.admin = d.run("keys", "create", "--tenant", "default", "--scope", "cluster-admin").split()[-1]
        d.team_b = d.run("keys", "create", "--tenant", "team-b", "--name", "b").split()[-1]
        gs.wait_model(f"http://127.0.0.1:{d.gw_port}", "chat", 1, timeout=90, every=0.3,
                      headers={"Authorization": f"Bearer {d.admin}"})
        yield d
    finally:
        d.stop()


def row(page, key_id: str) -> list[str]:
    return [c.strip() for c in page.locator(f"tr[data-key='{key_id}'] td").all_inner_texts()]


def test_an_admin_creates_a_key_sees_its_use_and_revokes_it(dev):
    base = f"http://127.0.0.1:{dev.gw_port}"
    with browser() as b:
        w = Watched(b, base, headers={"Authorization": f"Bearer {dev.admin}"})
        page = w.open("/console/keys")
        assert page.locator("tr[data-key]").count() == 2  # default's cluster-admin and team-b's, made on the CLI
        page.fill("#create-key input[name=tenant]", "team-a")
        page.fill("#create-key input[name=name]", "<b>ci</b>")  # refused by the name's allowlist, naming it
        w.allow = ["/console/keys/create"]
        page.click("#create-key button")
        until("the refusal shown", lambda: "key name '<b>ci</b>'" in page.locator("#notice").inner_text(), timeout=30)
        w.problems.clear()  # the browser's own log line for that expected 400
        w.allow = []
        page.fill("#create-key input[name=name]", "Tom & Jerry's ci #1")
        page.click("#create-key button")
        page.wait_for_selector("#new-key:not([hidden])", timeout=30_000)
        key = page.locator("#new-key .secret").inner_text().strip()
        kid = page.locator("#new-key .new-key-id").inner_text().strip()
        assert key.startswith(f"gpuflow-{kid}-"), key
        assert f"API key {kid} created for tenant team-a" in page.locator("#notice").inner_text()
        assert all(key not in c["value"] for c in w.ctx.cookies())  # shown once, kept nowhere

        page = w.open("/console/keys")
        assert key not in page.content()  # a reload forgets it
        cells = row(page, kid)
        assert cells[1:6] == ["team-a", "Tom & Jerry's ci #1", "tenant", cells[4], "active"]  # escaped, read back whole

        c = openai.OpenAI(base_url=dev.gateway, api_key=key, max_retries=0)
        assert c.chat.completions.create(model="chat", messages=MSG, max_tokens=3).usage.completion_tokens == 3
        assert len(list(c.chat.completions.create(model="chat", messages=MSG, max_tokens=5, stream=True))) >= 5
        # 2 requests; tokens: prompt PROMPT + PROMPT, completion 3 + 5 = 8 (the stream's asked for by the gateway)
        want = ["2", f"{2 * PROMPT} / 8"] * 2  # the last hour, then the last 24 h
        until("the key's use on the page", lambda: row(w.open("/console/keys"), kid)[6:10] == want, timeout=30)
        page = w.page
        tenant = [x.strip() for x in page.locator("tr[data-tenant=team-a] td").all_inner_texts()]
        assert tenant == ["team-a", *want]
        # the same counts through the control plane (the cluster workflow's key_usage update), and scopes in keys list
        used = {(r["tenant"], r["key_id"]): r["hour"] for r in json.loads(dev.run("keys", "usage", "--json"))}
        assert used[("team-a", kid)] == {"requests": 2, "prompt_tokens": 2 * PROMPT, "completion_tokens": 8,
                                         "estimated_tokens": 0}  # the engine reported every count
        listed = {r["id"]: r for r in json.loads(dev.run("keys", "list", "--json"))}
        assert (listed[kid]["scope"], listed[kid]["admin"]) == ("tenant", False)
        assert [r["scope"] for r in listed.values()].count("cluster-admin") == 1  # default's
        assert [r["admin"] for r in listed.values()].count(True) == 1  # what an older reader sees

        page.once("dialog", lambda d: d.accept())
        page.click(f"tr[data-key='{kid}'] form.revoke button")
        until("revoked on the page", lambda: "revoked" in " ".join(row(w.open("/console/keys"), kid)), timeout=30)
        until("the gateway refuses the key", lambda: _refused(c), timeout=10)
        w.check()
        w.close()


def _refused(c) -> bool:
    try:
        c.chat.completions.create(model="chat", messages=MSG, max_tokens=1)
    except openai.AuthenticationError:
        return True
    return False


def test_a_tenant_key_sees_its_tenant_only_and_may_not_create(dev):
    base = f"http://127.0.0.1:{dev.gw_port}"
    with browser() as b:
        w = Watched(b, base, headers={"Authorization": f"Bearer {dev.team_b}"})
        w.allow = ["/console/keys/create"]  # the refusal below is expected
        page = w.open("/console/keys")
        tenants = {t.strip() for t in page.locator("tr[data-key] td:nth-child(2)").all_inner_texts()}
        assert tenants == {"team-b"} and page.locator("tr[data-key]").count() == 1  # itself, no other key
        assert page.locator("#create-key").count() == 0 and page.locator("form.revoke").count() == 0
        status = page.evaluate("""async () => (await fetch('/console/keys/create', {method: 'POST',
            headers: {'content-type': 'application/json', 'x-gpuflow-console': '1'},
            body: JSON.stringify({tenant: 'team-b', name: 'mine'})})).status""")
        assert status == 403
        w.check()
        w.close()
