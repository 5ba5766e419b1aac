"""The Deployments pages' data (console/deployment_view.py) on a real SQLite store: who
sees which deployment, the counts by state, the filter and pages, a replica's in-flight count
from live gateways only, its measured VRAM against its claim, and env values never shown."""

from __future__ import annotations

import pathlib
import time
from datetime import timedelta

import pytest
from sqlmodel import Session

from console import deployment_view as dv
from console.access import OPEN, Caller
from console.web import ENV
from store import db, pd_counts
from store.pd_counts import PDCounts
from store.serving import GatewayLoadRow, GatewayRow
from store.tables import DeploymentRow, InstanceRow, utcnow
from store.usage import InstanceUsageRow

GIB = 2**30
ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def engine(tmp_path):
    e = db.make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    db.init_db(e)
    now = utcnow()
    with Session(e) as s:
        s.add_all([
            DeploymentRow(name="a-chat", replicas=3, spec={"backend": "vllm", "tenant": "team-a",
                                                           "routing": "cache-aware", "env": {"HF_TOKEN": "hf_secret"}}),
            DeploymentRow(name="b-chat", replicas=1, spec={"backend": "custom", "tenant": "team-b"}),
            DeploymentRow(name="b-shared", replicas=1, spec={"backend": "custom", "tenant": "team-b", "shared_with": [
                "team-a"], "autoscaling": {"max_replicas": 2}}),
            DeploymentRow(name="open", replicas=1, spec={"backend": "custom"}),  # tenant default: everyone's
            DeploymentRow(name="old", replicas=0, state="deleted", spec={"backend": "custom"}),
            InstanceRow(name="a-chat-0", deployment="a-chat", state="running", worker="h1", gpu_indexes=[0, 1],
                        address="10.0.0.5", port=8001),
            InstanceRow(name="a-chat-1", deployment="a-chat", state="running", worker="h2", gpu_indexes=[0],
                        address="10.0.0.6", port=8001),
            InstanceRow(name="a-chat-2", deployment="a-chat", state="pending", reason="no GPU has 80 GiB free"),
            InstanceRow(name="a-chat-9", deployment="a-chat", state="deleted"),
            GatewayRow(id="g1", url="http://g1/v1", updated_at=now),
            GatewayRow(id="g2", url="http://g2/v1", updated_at=now - timedelta(seconds=60)),  # gone
            GatewayLoadRow(gateway="g1", instance="a-chat-0", in_flight=2),
            GatewayLoadRow(gateway="g2", instance="a-chat-0", in_flight=5),  # a gone gateway's count: not held
            InstanceUsageRow(instance="a-chat-0", host="h1", measured="nvml",
                             gpus=[{"index": 0, "used": 7 * GIB, "peak": 7 * GIB, "claimed": 8 * GIB},
                                   {"index": 1, "used": 9 * GIB, "peak": 9 * GIB, "claimed": 8 * GIB}]),
        ])
        s.commit()
    return e


@pytest.mark.parametrize("caller, seen", [
    (OPEN, ["a-chat", "b-chat", "b-shared", "open"]),  # the open console: all but the deleted
    (Caller(tenant="team-b", keyed=True, scope="cluster-admin"), ["a-chat", "b-chat", "b-shared", "open"]),  # all
    (Caller(tenant="team-b", keyed=True, scope="tenant-admin"), ["b-chat", "b-shared", "open"]),  # as its tenant's keys
    (Caller(tenant="team-a", keyed=True, scope="tenant"), ["a-chat", "b-shared", "open"]),  # its own, shared, default's
    (Caller(tenant="team-c", keyed=True, scope="tenant"), ["open"]),
])
def test_who_sees_which(engine, caller, seen):
    ls = dv.listing(engine, caller)
    assert [r.name for r in ls.rows] == seen and ls.total == len(seen)
    assert (dv.detail(engine, caller, "b-chat") is not None) == ("b-chat" in seen)  # its page: the same rule


def test_a_line_of_the_list(engine):
    row = {r.name: r for r in dv.listing(engine, OPEN).rows}
    a = row["a-chat"]
    # 3 wanted, 2 running, 1 pending; the deleted replica counts nowhere
    assert (a.tenant, a.backend, a.running, a.desired, a.by_state, a.routing, a.autoscaled) == \
        ("team-a", "vllm", 2, 3, {"pending": 1, "running": 2}, "cache-aware", False)
    assert (row["b-shared"].autoscaled, row["b-shared"].routing, row["open"].tenant) == \
        (True, "gateway default", "default")


def test_filter_and_pages(engine, monkeypatch):
    assert [r.name for r in dv.listing(engine, OPEN, q="CHAT").rows] == ["a-chat", "b-chat"]
    monkeypatch.setattr(dv, "PAGE", 3)
    # 4 deployments, 3 a page: 2 pages; page 2 holds the fourth; a page past the end shows the last
    ls = dv.listing(engine, OPEN, page=2)
    assert (ls.pages, ls.page, [r.name for r in ls.rows], ls.matched) == (2, 2, ["open"], 4)
    assert dv.listing(engine, OPEN, page=9).page == 2


def test_replicas_in_flight_vram_and_the_spec(engine):
    d = dv.detail(engine, OPEN, "a-chat")
    by = {r.name: r for r in d.replicas}
    assert list(by) == ["a-chat-0", "a-chat-1", "a-chat-2"]
    r0 = by["a-chat-0"]
    # in flight: g1's 2; g2 reported 60 s ago (LIVE_S is 5 s), its 5 no longer count
    assert (r0.address, r0.gpus, r0.in_flight) == ("10.0.0.5:8001", [0, 1], 2)
    # used 7 + 9 = 16 GiB of 8 + 8 = 16 claimed; card 1 holds 9 of its 8: over its claim
    assert r0.vram == "16.0/16.0 GiB"
    assert r0.vram_warning == "VRAM over its claim: 16.0 GiB used of 16.0 GiB claimed"
    assert (by["a-chat-1"].vram, by["a-chat-1"].in_flight, by["a-chat-2"].address) == ("-", 0, "-")
    assert by["a-chat-2"].reason == "no GPU has 80 GiB free"
    assert "HF_TOKEN: '***'" in d.spec_yaml and "hf_secret" not in d.spec_yaml
    assert dv.detail(engine, OPEN, "old") is None and dv.detail(engine, OPEN, "nope") is None


def test_a_groups_page_shows_each_role_and_its_degradations(tmp_path):
    # a 2P1D group: both prefills running, the decode still pending -> prefill 2/2, decode 0/1,
    # ratio_unmet; every replica row says its role
    e = db.make_engine(f"sqlite:///{tmp_path / 'g.db'}")
    db.init_db(e)
    with Session(e) as s:
        s.add_all([DeploymentRow(name="pd", replicas=1, spec={"backend": "vllm", "roles": [
                       {"name": "prefill", "replicas": 2}, {"name": "decode"}]}),
                   InstanceRow(name="pd-0", deployment="pd", state="running", role="prefill", group_name="pd"),
                   InstanceRow(name="pd-1", deployment="pd", state="running", role="prefill", group_name="pd"),
                   InstanceRow(name="pd-2", deployment="pd", state="pending", role="decode", group_name="pd")])
        s.commit()
    d = dv.detail(e, OPEN, "pd")
    assert [(r.role, r.running, r.wanted) for r in d.roles] == [("prefill", 2, 2), ("decode", 0, 1)]
    assert d.degradations == ["ratio_unmet"]
    assert [r.role for r in d.replicas] == ["prefill", "prefill", "decode"]
    # a gateway's counts 10 s apart: 0 disaggregated, +4 fallbacks (no prefill could serve): 4 of 4 without
    # remote KV, pd_ineffective, and the card says why
    now = time.time()
    pd_counts.report(e, "gw", {"pd": PDCounts(disaggregated=7)}, now - 12)
    pd_counts.report(e, "gw", {"pd": PDCounts(disaggregated=7, fallback=4)}, now - 2)
    d = dv.detail(e, OPEN, "pd")
    assert d.degradations == ["ratio_unmet", "pd_ineffective"]
    assert d.degraded_why == {"pd_ineffective": "gateway: 4 of 4 requests in the last 30 s served without remote KV"}
    # the Roles card's line, as the page's template renders it (autoescaped)
    line = next(x for x in (ROOT / "console/templates/deployment.html").read_text().splitlines() if "d.degradations %}" in x)
    assert ENV.from_string(line.strip().removesuffix("{% endif %}")).render(d=d) == (
        '<p class="error" id="degraded">degraded: ratio_unmet, pd_ineffective (gateway: 4 of 4 requests in the last 30 s '
        'served without remote KV)</p></div>')
    e.dispose()


def test_a_plain_deployment_has_no_roles(engine):
    d = dv.detail(engine, OPEN, "a-chat")
    assert d.roles == [] and d.degradations == [] and all(r.role is None for r in d.replicas)
