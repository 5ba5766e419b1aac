"""The console's Deployments pages in a real browser (Playwright, Debian's chromium) on a fresh
``gpuflow dev`` with stand-in engines (custom backend): the list, a deployment's replicas, spec
(env values hidden), rollout and serving figures after requests sent with the official ``openai``
client; scaling from 1 to 2 from the page, the second replica seen RUNNING in the page's live
table; deleting another deployment from its page; actions refused without the console's header
or with a bad count."""

from __future__ import annotations

import json
import os
import re
import sys

import httpx2 as httpx
import pytest

from tests.console_browser import Watched, browser
from tests.dev_stack import Dev, until

openai = pytest.importorskip("openai")

ENGINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_engine.py")
SECRET = "hf_not_for_the_page_42"


def spec(name: str) -> dict:
    return {"name": name, "backend": "custom", "tenant": "default", "source": {"local_path": f"/models/{name}"},
            "run_command": f"{sys.executable} {ENGINE} --port {{port}} --host {{host}} --name {name} --token-s 0.01",
            "resources": {"vram": 4 * 2**30, "ram": 2**28}, "env": {"HF_TOKEN": SECRET}}


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console-deploy")
    d = Dev(tmp, gpus=(24, 24))
    try:
        until("the host is ready", lambda: re.search(r"^box\s.*ready", d.run("hosts"), re.M | re.I), timeout=60)
        for name in ("chat", "gone"):
            (tmp / f"{name}.json").write_text(json.dumps(spec(name)))
            assert "RUNNING" in d.run("deploy", str(tmp / f"{name}.json"), "--wait", "--timeout", "120")
        yield d
    finally:
        d.stop()


def base(dev: Dev) -> str:
    return f"http://127.0.0.1:{dev.gw_port}"


def test_the_list_shows_each_deployment_and_filters_by_name(dev):
    with browser() as b:
        w = Watched(b, base(dev))
        page = w.open("/console/deployments")
        row = page.locator("tr[data-deployment=chat]")
        cells = [c.strip() for c in row.locator("td").all_inner_texts()]
        # name, tenant, backend, running / desired, by state, routing, autoscaled
        assert cells == ["chat", "default", "custom", "1 / 1", "running 1", "gateway default", "no"], cells
        assert page.locator("tr[data-deployment=gone]").count() == 1
        page.fill("input[name=q]", "cha")
        page.click("form.filter button")
        page.wait_for_load_state("networkidle")
        assert page.locator("tr[data-deployment]").count() == 1
        assert "1 of 2 deployments" in page.locator("form.filter").inner_text()
        page.click("tr[data-deployment=chat] a")
        page.wait_for_url(base(dev) + "/console/deployments/chat")
        w.check()
        w.close()


def test_a_deployments_page_replicas_spec_rollout_and_serving_figures(dev):
    client = openai.OpenAI(base_url=dev.gateway, api_key="none")
    for _ in range(3):  # streamed, so the gateway measures time to first token too
        got = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True) if c.choices)
        assert got == "tok0 tok1 tok2 ", got
    with browser() as b:
        w = Watched(b, base(dev))
        page = w.open("/console/deployments/chat")
        r = page.locator("tr[data-replica=chat-0]")
        text = r.inner_text()
        assert "running" in text and "box" in text, text
        assert re.search(r"127\.0\.0\.1:\d+", text), text  # where the gateway reaches it
        assert r.locator("a").get_attribute("href") == "/console/replicas/chat-0"
        assert re.search(r"\d+\.\d/4\.0 GiB|-", r.locator("td").nth(6).inner_text())  # measured / claimed 4 GiB
        spec_text = page.locator("pre.spec").inner_text()
        assert "HF_TOKEN: '***'" in spec_text and SECRET not in page.content(), spec_text
        assert "run_command" in spec_text
        # the first spec is version 0, deployed without a rollout, and the versions kept name it current
        assert page.locator("#rollout-status").inner_text().startswith("no rollout yet: version 0")
        assert "current" in page.locator("table.rollout-versions tr", has_text="v0").inner_text()
        mine = page.locator("#serving tr[data-gateway]").first
        assert mine.locator(".requests").inner_text() == "3"
        assert re.fullmatch(r"\d+ ms · \d+ ms · \d+ ms", mine.locator(".ttft").inner_text()), mine.inner_text()
        assert re.fullmatch(r"\d+ ms · \d+ ms · \d+ ms", mine.locator(".latency").inner_text())
        # requests/s needs two readings: the live section reads again (3 s) and shows the rate
        rate = page.locator("#serving tr[data-gateway] .rate", has_text=re.compile(r"^\d+\.\d\d$"))
        rate.first.wait_for(timeout=15000)
        w.check()
        w.close()


def test_actions_need_the_consoles_header_and_a_whole_count(dev):
    url = base(dev) + "/console/deployments/chat/scale"
    r = httpx.post(url, json={"replicas": "2"})  # no x-gpuflow-console header: another site's form could send this
    assert r.status_code == 403 and "console's own page" in r.json()["error"], r.text
    for bad in ("-1", "2.5", "two", True):
        r = httpx.post(url, json={"replicas": bad}, headers={"x-gpuflow-console": "1"})
        assert r.status_code == 400 and "whole number" in r.json()["error"], (bad, r.text)
    r = httpx.post(base(dev) + "/console/deployments/nope/scale", json={"replicas": "1"},
                   headers={"x-gpuflow-console": "1"})
    assert r.status_code == 400 and "no deployment named 'nope'" in r.json()["error"], r.text
    assert dev.instances("chat")[0]["name"] == "chat-0" and len(dev.instances("chat")) == 1  # nothing changed


def test_scale_from_the_page_and_see_the_second_replica_running(dev):
    with browser() as b:
        w = Watched(b, base(dev))
        page = w.open("/console/deployments/chat")
        assert page.locator("tr[data-replica]").count() == 1
        page.fill("form.scale input[name=replicas]", "2")
        page.click("form.scale button")
        page.locator("#notice", has_text="chat: 2 replica(s) wanted").wait_for(timeout=30000)
        # no reload: the replica table reads itself again every 2 s
        page.locator("tr[data-replica=chat-1] .state.running").wait_for(timeout=90000)
        assert page.locator("#counts").inner_text().strip() == "2 / 2"
        w.check()
        w.close()


def test_delete_another_deployment_from_its_page(dev):
    with browser() as b:
        w = Watched(b, base(dev))
        page = w.open("/console/deployments/gone")
        asked = []
        page.on("dialog", lambda d: (asked.append(d.message), d.accept()))
        page.click("form.delete button")
        page.wait_for_url(base(dev) + "/console/deployments", timeout=30000)
        assert asked == ["Delete deployment gone? Its replicas stop."], asked
        # the list reads itself again: gone is marked deleting, then leaves once its replica stopped
        page.locator("tr[data-deployment=gone]").wait_for(state="detached", timeout=90000)
        assert page.locator("tr[data-deployment=chat]").count() == 1
        w.check()
        w.close()
    until("gone is gone from gpuflow status", lambda: all(d["name"] != "gone" for d in dev.status()["deployments"]),
          timeout=60)


def test_the_autoscalers_chart_and_steps_after_a_cold_start(dev):
    d = {**spec("scaler"), "replicas": 0, "autoscaling": {"min_replicas": 0, "max_replicas": 1, "interval_s": 1}}
    path = dev.tmp / "scaler.json"
    path.write_text(json.dumps(d))
    dev.run("deploy", str(path))
    client = openai.OpenAI(base_url=dev.gateway, api_key="none", timeout=120)
    until("the gateway knows scaler", lambda: "scaler" in [m.id for m in client.models.list()], timeout=30)
    # no replica yet: the gateway holds the request and wakes the autoscaler, which adds one (cold_start)
    got = client.chat.completions.create(model="scaler", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert got.choices[0].message.content == "tok0 tok1 ", got
    with browser() as b:
        w = Watched(b, base(dev))
        page = until("the autoscaler's step on the page", lambda: (p := w.open("/console/deployments/scaler"))
                     .locator("table.autoscale-steps tr", has_text="up by cold_start").count() and p, timeout=30)
        assert "autoscaled: yes" in page.locator("#summary").inner_text()
        chart = page.locator("svg#autoscale-chart")
        assert chart.locator("polyline.desired").count() == 1 and chart.locator("polyline.running").count() == 1
        assert "up by cold_start: 0 -> 1" in chart.locator("circle.mark.up title").first.text_content()
        w.check()
        w.close()


def test_a_groups_page_scales_one_role_and_keeps_the_others(dev):
    # a 1P1D group of stand-in engines (4 GiB each), deployed as users do: gpuflow deploy --wait
    g = {**spec("pd"), "disaggregation": {"mode": "custom"}, "roles": [{"name": "prefill"}, {"name": "decode"}]}
    (dev.tmp / "pd.json").write_text(json.dumps(g))
    assert "the group RUNNING (prefill 1/1, decode 1/1)" in dev.run("deploy", str(dev.tmp / "pd.json"), "--wait",
                                                                     "--timeout", "120")
    rows = {i["name"]: i for i in dev.instances("pd")}
    assert sorted(i["role"] for i in rows.values()) == ["decode", "prefill"]  # status --json: every row's role
    decode = next(n for n, i in rows.items() if i["role"] == "decode")
    with browser() as b:
        w = Watched(b, base(dev))
        page = w.open("/console/deployments/pd")
        assert page.locator("#roles").inner_text().count("1/1") == 2
        assert page.locator(f"tr[data-replica={decode}] .role").inner_text() == "decode"
        page.fill("form.scale-role:has(input[value=prefill]) input[name=replicas]", "2")
        page.click("form.scale-role:has(input[value=prefill]) button")
        page.locator("#notice", has_text="pd: prefill 2 replica(s) wanted").wait_for(timeout=30000)
        page.locator("tr[data-replica] .state.running").nth(2).wait_for(timeout=90000)  # the third member runs
        w.check()
        w.close()
    after = {i["name"]: i for i in dev.instances("pd")}
    assert sorted(i["role"] for i in after.values()) == ["decode", "prefill", "prefill"]
    assert after[decode]["state"] == "running" and after[decode].get("pid") == rows[decode].get("pid")
    assert "a group: prefill 2/2, decode 1/1" in dev.run("status", "pd")
