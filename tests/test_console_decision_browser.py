"""A replica's decision, the queue, the tenants and the cordon action in the console, in a real
browser (Playwright, Debian's chromium) on a fresh ``gpuflow dev`` with two hosts: ``box`` (dev's
own agent) and ``box2`` (a second agent started as an operator adds a host, labelled pool=b).
A replica that asks for pool=b is placed on box2 (the labels filter removes box, saying why); one
that asks for 200 GiB fits no GPU and waits, its reason on its page and in the queue; the tenants
file applied with ``gpuflow tenants apply`` shows its tenant's use; a host cordoned from the
overview is marked so. The pure parts (candidates marked, bars, the cordon body, the link) are
tables below."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import zlib
from datetime import datetime, timezone

import pytest
import yaml

from console.hosts_actions import cordon_ask
from console.queue_page import visible_preemption
from console.replica import candidates, ui_link
from console.tenants_page import Bar, bar
from views.tenancy import Preemption, preemptions
from scheduler.errors import InvalidInput
from store import decision_log
from worker_agent.processes import ProcessTable
from tests.console_browser import Watched, browser
from tests.dev_stack import Dev, until
from tests.live import write_inventory

ENGINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_engine.py")
TENANTS = {"tenants": [{"name": "team-a", "priority": 10, "guarantee": {"gpus": 1}, "limit": {"gpus": 2}},
                       {"name": "team-b"}]}


def spec(name: str, vram_gib: float, **kw) -> dict:
    return {"name": name, "backend": "custom", "tenant": "team-a", "source": {"local_path": f"/models/{name}"},
            "run_command": f"{sys.executable} {ENGINE} --port {{port}} --host {{host}} --name {name}",
            "resources": {"vram": int(vram_gib * 2**30), "ram": 2**30}, **kw}


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console-decision")
    d = Dev(tmp, gpus=(24, 24))
    agent = None
    try:
        inv = write_inventory(str(tmp / "inv2.yaml"), [24, 24])
        with open(tmp / "agent-box2.log", "ab") as log:  # a second host, added as an operator adds one
            agent = subprocess.Popen(
                [sys.executable, "-m", "gpuflow", "agent", "--name", "box2", "--inventory", inv, "--label", "pool=b",
                 "--allow-custom", "--data-dir", str(tmp / "box2"), "--metrics-address", "off",
                 "--address", d.address], stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **d.join_env()})
        until("both hosts READY", lambda: {"box", "box2"} <= {
            ln.split()[0] for ln in d.run("hosts").splitlines() if " READY" in ln.upper()}, timeout=60)
        d.tmp_dir = tmp
        yield d
    finally:
        if agent is not None:
            agent.terminate()
            try:
                agent.wait(30)
            except subprocess.TimeoutExpired:
                agent.kill()
            # an agent that stops leaves its servers running (a restarted agent adopts them); the dev
            # stack stops those of its own agents only, so box2's are stopped here
            table = ProcessTable(os.path.join(str(tmp / "box2"), "agent", "box2"))
            for r in table.records():
                table.signal_group(r.pid, signal.SIGTERM)
                table.forget(r.instance)
        d.stop()


def base(dev: Dev) -> str:
    return f"http://127.0.0.1:{dev.gw_port}"


def ui_of(dev: Dev) -> str:
    return re.search(r"\(UI (http://[0-9.]+:\d+),", dev.out).group(1)


def deploy(dev: Dev, doc: dict) -> None:
    path = dev.tmp_dir / f"{doc['name']}.yaml"
    path.write_text(json.dumps(doc))
    dev.run("deploy", str(path))


def state_of(dev: Dev, instance: str) -> str:
    return next((i["state"] for d in dev.status()["deployments"] for i in d["instances"] if i["name"] == instance), "")


def test_a_placed_replica_shows_its_filters_candidates_reservation_and_workflow_link(dev):
    (dev.tmp_dir / "tenants.yaml").write_text(yaml.safe_dump(TENANTS))
    assert "tenants file applied" in dev.run("tenants", "apply", str(dev.tmp_dir / "tenants.yaml"))
    deploy(dev, spec("fits", 10, worker_selector={"pool": "b"}))
    until("fits-0 placed", lambda: state_of(dev, "fits-0") in ("starting", "running"), timeout=90)
    with browser() as b:
        w = Watched(b, base(dev))
        page = w.open("/console/replicas/fits-0")
        assert page.locator("h1").inner_text() == "Replica fits-0"
        # the labels filter removed box, naming the label; box2 was kept
        labels = page.locator("tr[data-filter=labels]")
        assert "1 of 2" in labels.inner_text()
        assert "label pool wanted, worker has none" in labels.locator(".removed[data-worker=box]").inner_text()
        # the chosen candidate: box2, with each scorer's points and its total
        chosen = page.locator("table.candidates tr.chosen")
        assert chosen.count() == 1 and chosen.get_attribute("data-worker") == "box2"
        scorers = [s.get_attribute("data-scorer") for s in chosen.locator("td.score[data-scorer]").all()]
        assert scorers, chosen.inner_text()
        assert all(re.fullmatch(r"\d+\.\d\d", t) for t in chosen.locator("td.score").all_inner_texts())
        # the ledger holds 10 GiB of one of box2's GPUs for it
        ledger = page.locator("#ledger tbody tr")
        assert ledger.count() == 1 and re.search(r"box2\s+\d\s+10\.00", ledger.inner_text()), ledger.inner_text()
        # the CLI's own words, and the link to the workflow in the Temporal UI
        assert "placed on box2 GPUs" in page.locator("details pre").text_content()  # folded: not rendered
        link = page.locator("a.temporal-ui").get_attribute("href")
        assert link == f"{ui_of(dev)}/namespaces/default/workflows/instance%2Ffits-0"
        w.check()
        w.close()
        ui = b.new_page()  # the Temporal UI opens the workflow's latest run there
        ui.goto(link)
        ui.wait_for_url(re.compile(r"/workflows/instance%2Ffits-0/[0-9a-f-]{36}"), timeout=30_000)
        ui.close()


def test_a_pending_replica_shows_its_reason_on_its_page_and_in_the_queue_and_tenants_show_use(dev):
    deploy(dev, spec("big", 200))
    queue = until("big-0 in the queue", lambda: json.loads(dev.run("queue", "--json"))["queue"], 60)
    reason = queue[0]["reason"]
    assert queue[0]["instance"] == "big-0" and reason, queue
    # the store's own read (the console's) says the same as the control plane's
    offline = json.loads(dev.run("queue", "--json", "--data-dir", str(dev.tmp_dir / "dev")))["queue"]
    assert [(q["instance"], q["reason"]) for q in offline] == [("big-0", reason)]
    with browser() as b:
        w = Watched(b, base(dev))
        page = until("big-0's reason on its page", lambda: (p := w.open("/console/replicas/big-0"))
                     .locator("#reason").count() and p, timeout=30)
        assert page.locator("#reason").inner_text().startswith("Waiting now:")
        assert "pending" in page.locator("#replica").inner_text()
        assert page.locator("#decision").inner_text().count("not placed") == 1
        # the queue: the same reason as gpuflow queue's, in its position
        page = w.open("/console/queue")
        row = page.locator("tr[data-instance=big-0]")
        assert row.locator("td").first.inner_text() == "1"
        assert row.locator("td.reason").inner_text() == reason
        # tenants: team-a holds 1 GPU of its guarantee of 1 and limit of 2; its bar half full
        page = w.open("/console/tenants")
        gpus = page.locator("tr[data-tenant=team-a] td[data-resource=gpus]")
        assert gpus.locator(".amounts").inner_text() == "1 / 1 / 2"
        assert "width: 50.0%" in gpus.locator(".claimed").get_attribute("style")
        assert page.locator("tr[data-tenant=team-b] td[data-resource=gpus] .amounts").inner_text() == "0 / - / -"
        w.check()
        w.close()


def test_an_admin_cordons_a_host_from_the_overview(dev):
    with browser() as b:
        w = Watched(b, base(dev))
        page = w.open("/console/")
        page.on("dialog", lambda d: d.accept())  # "Cordon box? ..."
        row = page.locator("tr[data-host=box]")
        assert "cordoned" not in row.inner_text()
        with page.expect_navigation():  # the form's data-then reloads once the update answered
            row.locator("form.cordon button").click()
        page.wait_for_load_state("networkidle")
        row = page.locator("tr[data-host=box]")
        assert "cordoned" in row.locator(".state.cordoned").inner_text()
        assert row.locator("form.cordon button").inner_text() == "Uncordon"
        assert "cordoned" not in page.locator("tr[data-host=box2]").inner_text()
        assert "CORDONED" in next(ln for ln in dev.run("hosts").splitlines() if ln.startswith("box "))
        with page.expect_navigation():
            row.locator("form.cordon button").click()
        page.wait_for_load_state("networkidle")
        assert page.locator("tr[data-host=box] form.cordon button").inner_text() == "Cordon"
        w.check()
        w.close()


def test_a_tenant_key_sees_its_own_and_may_not_cordon(dev):
    """Last: once a key exists the console needs one. team-b's key sees neither team-a's replicas
    nor its tenant row, and has no cordon button; its POST is refused."""
    key = dev.run("keys", "create", "--tenant", "team-b").split()[-1]
    with browser() as b:
        w = Watched(b, base(dev), headers={"authorization": f"Bearer {key}"})
        w.allow = ["/console/replicas/fits-0", "/cordon"]  # the refusals this test checks
        until("the console wants a key", lambda: w.open("/console/").locator("header").inner_text().count("team-b"),
              timeout=10)
        page = w.page
        assert page.locator("tr[data-host=box]").count() == 1 and page.locator("form.cordon").count() == 0
        refused = w.open("/console/replicas/fits-0", 404).inner_text("main")
        assert "no replica named 'fits-0' that you may see" in refused
        page = w.open("/console/queue")
        assert page.locator("tr[data-instance]").count() == 0
        assert "(1 more of other tenants)" in page.locator("main").inner_text()
        page = w.open("/console/tenants")
        assert [r.get_attribute("data-tenant") for r in page.locator("tr[data-tenant]").all()] == ["team-b", "default"]
        r = page.request.post(base(dev) + "/console/hosts/box/cordon", data=json.dumps({"on": True}),
                              headers={"x-gpuflow-console": "1", "content-type": "application/json"})
        assert r.status == 403 and "admin" in r.json()["error"], r.text()
        w.check()
        w.close()


# --- the pure parts ---------------------------------------------------------------------------

PLACED = {"scheduled": True, "placement": {"worker": "b", "gpu_indexes": [1]},
          "candidates": [{"worker": "b", "gpu_indexes": [1], "scores": {"binpack": 80.0, "locality": 0.0}},
                         {"worker": "b", "gpu_indexes": [0], "scores": {"binpack": 40.0, "locality": 0.0}},
                         {"worker": "a", "gpu_indexes": [1], "scores": {"binpack": 80.0, "locality": 0.0}}]}


@pytest.mark.parametrize("dec, names, chosen", [
    (PLACED, ["binpack", "locality"], [True, False, False]),  # same worker and GPUs only: b/[1]
    ({**PLACED, "scheduled": False}, ["binpack", "locality"], [False, False, False]),  # refused: none chosen
    ({"scheduled": False, "candidates": []}, [], []),
])
def test_candidates_name_the_scorers_and_mark_the_placement(dec, names, chosen):
    got_names, rows = candidates(dec)
    assert (got_names, [r["chosen"] for r in rows]) == (names, chosen)


@pytest.mark.parametrize("used, guarantee, limit, want", [
    (1, 1, 2, Bar(used=50.0, guarantee=50.0, over=False)),  # 1/2 of the limit; guarantee mark at 1/2
    (3, 1, 4, Bar(used=75.0, guarantee=25.0, over=True)),  # beyond its guarantee: borrowing
    (3, None, None, Bar(used=100.0, guarantee=None, over=False)),  # unbounded: full at its use
    (1, 4, None, Bar(used=25.0, guarantee=100.0, over=False)),  # no limit: the guarantee ends the bar
    (0, None, None, Bar(used=0.0, guarantee=None, over=False)),  # nothing at all
    (5, None, 4, Bar(used=100.0, guarantee=None, over=False)),  # over the limit (a tightened file): clipped
    (1, None, 3, Bar(used=33.3, guarantee=None, over=False)),  # 100/3 rounded
])
def test_bars_scale_to_the_limit(used, guarantee, limit, want):
    assert bar(used, guarantee, limit) == want


@pytest.mark.parametrize("body, want", [
    ({"on": True}, (True, "")), ({"on": "false"}, (False, "")), ({"on": "true", "reason": " disk "}, (True, "disk")),
])
def test_cordon_body(body, want):
    assert cordon_ask(body) == want


@pytest.mark.parametrize("body, why", [
    ({}, "'on' must be true or false, got 'None'"), ({"on": 1}, "got '1'"), ({"on": "yes"}, "got 'yes'"),
    ({"on": True, "by": "me"}, "it was given 'by'"), ({"on": True, "reason": 5}, "must be a string"),
])
def test_cordon_body_refused(body, why):
    with pytest.raises(InvalidInput, match=re.escape(why)):
        cordon_ask(body)


@pytest.mark.parametrize("ui, ns, name, want", [
    ("http://127.0.0.1:8233", "default", "chat-0",
     "http://127.0.0.1:8233/namespaces/default/workflows/instance%2Fchat-0"),  # the id's '/' quoted
    ("https://t.example/ui/", "prod ns", "a.b_c-1",
     "https://t.example/ui/namespaces/prod%20ns/workflows/instance%2Fa.b_c-1"),  # one '/' between, a space quoted
    ("", "default", "chat-0", None),  # no UI: no link
])
def test_the_temporal_ui_link(ui, ns, name, want):
    assert ui_link(ui, ns, name) == want


def _row(instance: str, outcome: str, record, kind: str = "placement") -> decision_log.DecisionRow:
    data = record if isinstance(record, bytes) else zlib.compress(json.dumps(record).encode())
    return decision_log.DecisionRow(kind=kind, digest="d" * 64, instance=instance,
                                    deployment=instance.rsplit("-", 1)[0], outcome=outcome, record=data)


def test_preemptions_are_the_kept_decisions_that_preempted_newest_first(store):
    _, _, engine = store
    victim = {"name": "low-0", "deployment": "low", "tenant": "dev", "plan": {}}
    decision_log.write(engine, {}, [
        _row("hi-0", "preempting", {"tenant": "prod", "victims": [victim], "preempt_why": "to reclaim prod's 1 GPU"}),
        _row("x-0", "placed", {"tenant": "prod"}),  # placed without victims: not a preemption
        _row("web", "up", {"victims": [victim]}, kind="autoscale"),  # an autoscaler step is none either
        _row("hi-1", "preempting", b"not zlib"),  # a damaged record: still listed, its details unknown
    ])
    got = preemptions(engine)
    assert [(p.instance, p.tenant, [v["name"] for v in p.victims], p.why) for p in got] == [
        ("hi-1", "default", [], ""), ("hi-0", "prod", ["low-0"], "to reclaim prod's 1 GPU")]
    assert [p.instance for p in preemptions(engine, limit=1)] == ["hi-1"]


P = Preemption(at=datetime(2025, 1, 1, tzinfo=timezone.utc), instance="hi-0", deployment="hi", tenant="prod",
               victims=[{"name": "low-0", "deployment": "low", "tenant": "dev"},
                        {"name": "mine-0", "deployment": "mine", "tenant": "prod"}], why="why")


@pytest.mark.parametrize("seen, victims", [
    ({"hi", "low", "mine"}, ["low-0", "mine-0"]),  # an admin sees every name
    ({"hi", "mine"}, ["a replica of tenant dev", "mine-0"]),  # another tenant's victim: by tenant only
    ({"low", "mine"}, None),  # the preemptor's deployment unseen: not shown at all
])
def test_a_preemption_as_the_caller_may_see_it(seen, victims):
    got = visible_preemption(P, lambda d: d in seen)
    assert (got and got["victims"]) == victims
