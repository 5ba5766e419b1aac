"""The check every host report passes before it changes anything (contracts/host_proof.py, run by
activities/host_auth.py on a real SQLite store), as a table of reports: signed by h1's agent, by a
second agent started with h1's name, by a stranger; replayed, altered, renamed, stale, or with an
auth that is not one. Then: what a check records (a join, the last hello) and what a refusal leaves
(nothing), the refusals counted by kind, and a watch report that crossed the data converter."""

from __future__ import annotations

import json

import pytest
from temporalio.testing import ActivityEnvironment

from activities.host_auth import HostAuthActivities
from activities.runner import Runner
from contracts import credential as cr
from contracts.host import HostReport
from contracts.host_auth import HELLO_SKEW_S, ReportCheck, WatchAsk
from gpuflow.converter import DATA_CONVERTER
from store import db, host_credentials
from tests.callers_env import called_by
from worker_agent.activities import HostActivities
from worker_agent.bookings import HeldBookings
from worker_agent.credential import open_credential
from worker_agent.processes import ProcessTable

GiB = 2**30
NOW = 1_700_000_000_000  # the workflow's clock, in ms
JOINED = NOW - 10_000  # h1 joined with a hello stamped 10 s ago


def body(name: str = "h1", vram_gib: float = 16) -> dict:
    """A report as the agent sends it before signing: model_dump(mode="json") without auth."""
    r = HostReport(name=name, ram_total=64 * GiB, gpus=[{"index": 0, "vram_total": int(vram_gib * GiB)}], boot="run-a")
    return r.model_dump(mode="json", exclude={"auth"})


class World:
    """A store with h1 joined; h1's agent, a second agent with h1's name, and another host h2."""

    def __init__(self, tmp_path):
        self.engine = db.make_engine(db.sqlite_url(str(tmp_path / "gpuflow.db")))
        db.init_db(self.engine)
        token = host_credentials.join_token(self.engine)
        self.h1 = open_credential(str(tmp_path / "a" / "h1"), "h1", token)
        self.intruder = open_credential(str(tmp_path / "b" / "h1"), "h1", token)  # same name, its own key
        self.h2 = open_credential(str(tmp_path / "a" / "h2"), "h2", token)
        other = cr.join_token(b"\1" * 32, cr.public_of(b"\2" * 32))
        self.stranger = open_credential(str(tmp_path / "c" / "hfake"), "hfake", other)  # another cluster's token
        self.acts = HostAuthActivities(self.engine, db.reader(self.engine), Runner(2))
        self.first = self.hello(self.h1, JOINED)
        assert self.acts.check(check(self.first)).ok

    def hello(self, cred, stamp: int, b: dict | None = None) -> dict:
        return cred.signed(b or body(cred.name), "hello", str(stamp))

    def close(self) -> None:
        for c in (self.h1, self.intruder, self.h2, self.stranger):
            c.close()
        self.engine.dispose()


def check(raw, purpose="hello", host="h1", nonce="", now=NOW, after=0) -> ReportCheck:
    return ReportCheck(host=host, purpose=purpose, report=raw, nonce=nonce, now_ms=now, after_ms=after)


def renamed(raw: dict, name: str) -> dict:
    return {**raw, "name": name}


def with_auth(raw: dict, **auth) -> dict:
    return {**raw, "auth": {**raw["auth"], **auth}}


S = 1000  # ms in a second
CASES = [
    # (case, the check of it, the verdict: "" passes, else the refusal's kind)
    ("a newer hello from h1's agent", lambda w: check(w.hello(w.h1, NOW)), ""),
    ("the accepted hello checked again (its local activity ran twice)", lambda w: check(w.first), ""),
    ("the accepted hello again, to the workflow that took it", lambda w: check(w.first, after=JOINED), "replay"),
    ("an older hello replayed (20 s ago < the 10 s ago accepted)", lambda w: check(w.hello(w.h1, NOW - 20 * S)),
     "replay"),
    # 301 s either way is past the 300 s HELLO_SKEW_S
    ("a hello stamped 301 s ago", lambda w: check(w.hello(w.h1, NOW - (HELLO_SKEW_S + 1) * S)), "stale"),
    ("a hello stamped 301 s ahead", lambda w: check(w.hello(w.h1, NOW + (HELLO_SKEW_S + 1) * S)), "stale"),
    ("a hello stamped 299 s ahead", lambda w: check(w.hello(w.h1, NOW + (HELLO_SKEW_S - 1) * S)), ""),
    ("h1's hello with its GPU made 800 GiB after signing (the probe's H1)",
     lambda w: check({**w.hello(w.h1, NOW), "gpus": body("h1", 800)["gpus"]}), "mac"),
    ("h1's hello naming its engines' KV connectors", lambda w: check(w.hello(w.h1, NOW, {**body(), "kv_connectors":
                                                                                       ["nixl"]})), ""),
    ("h1's hello with a KV connector it never reported added after signing (a member placed where it cannot run)",
     lambda w: check({**w.hello(w.h1, NOW), "kv_connectors": ["nixl"]}), "mac"),
    ("h1's hello with another stamp than it was signed with",
     lambda w: check(with_auth(w.hello(w.h1, NOW), stamp=str(NOW + 1))), "mac"),
    ("h1's hello renamed h2, sent to host/h1", lambda w: check(renamed(w.hello(w.h1, NOW), "h2")), "mac"),
    ("h1's hello renamed h2, sent to host/h2 (not joined: h1's proof is h1's)",
     lambda w: check(renamed(w.hello(w.h1, NOW), "h2"), host="h2"), "not_joined"),
    ("h2's own hello sent to host/h1", lambda w: check(w.hello(w.h2, NOW)), "other_credential"),
    ("a second agent started with h1's name (its own key, the right token)",
     lambda w: check(w.hello(w.intruder, NOW)), "other_credential"),
    ("a forged host/hfake: no proof", lambda w: check(with_auth(w.hello(w.stranger, NOW), proof=""), host="hfake"),
     "not_joined"),
    ("a forged host/hfake: a proof made with another cluster's token",
     lambda w: check(w.hello(w.stranger, NOW), host="hfake"), "not_joined"),
    ("no auth (an older agent, or `temporal workflow signal`)", lambda w: check(body()), "unsigned"),
    ("an auth that is a string", lambda w: check({**body(), "auth": "x"}), "garbage"),
    ("an auth with a short key", lambda w: check(with_auth(w.hello(w.h1, NOW), public="abc")), "garbage"),
    ("an auth with a field it has not", lambda w: check(with_auth(w.hello(w.h1, NOW), role="admin")), "garbage"),
    ("a report that is not an object", lambda w: check(None), "garbage"),
    ("a hello stamped with a word, not a time", lambda w: check(w.h1.signed(body(), "hello", "soon")), "garbage"),
    ("a watch's answer with its nonce", lambda w: check(w.h1.signed(body(), "watch", "n-1"), "watch", nonce="n-1"), ""),
    ("a watch's answer to another watch", lambda w: check(w.h1.signed(body(), "watch", "n-0"), "watch", nonce="n-1"),
     "replay"),
    ("a hello presented as a watch's answer", lambda w: check(w.hello(w.h1, NOW), "watch", nonce=str(NOW)), "mac"),
    ("a second agent's watch answer (it polls h1's queue)",
     lambda w: check(w.intruder.signed(body(), "watch", "n-1"), "watch", nonce="n-1"), "other_credential"),
]


@pytest.mark.parametrize("case,make,kind", CASES, ids=[c[0] for c in CASES])
def test_a_report_passes_only_when_signed_fresh_and_whole(tmp_path, case, make, kind):
    w = World(tmp_path)
    try:
        c = make(w)
        verdict = w.acts.check(c)
        assert (verdict.ok, verdict.kind) == (kind == "", kind), verdict
        assert verdict.ok or f"host {c.host}" in verdict.why  # every refusal names the host
        assert host_credentials.known(w.engine, "h1").public == w.h1.public  # h1's credential stands
    finally:
        w.close()


def test_what_a_check_records_and_what_a_refusal_leaves(tmp_path):
    w = World(tmp_path)
    try:
        assert host_credentials.known(w.engine, "h1").hello_ms == JOINED  # the join recorded the hello
        v = w.acts.check(check(w.hello(w.h2, NOW), host="h2"))
        assert (v.ok, v.joined, v.stamp_ms) == (True, True, NOW)  # h2 joins with its first hello
        assert host_credentials.known(w.engine, "h2").public == w.h2.public
        assert not w.acts.check(check(w.hello(w.stranger, NOW), host="hfake")).ok
        assert host_credentials.known(w.engine, "hfake") is None  # a forged host workflow wrote nothing
        assert not w.acts.check(check(w.hello(w.intruder, NOW + 1))).ok
        assert host_credentials.known(w.engine, "h1").hello_ms == JOINED  # a refusal moves nothing
        v = w.acts.check(check(w.h1.signed(body(), "watch", "n"), "watch", nonce="n"))
        assert (v.ok, v.joined, v.stamp_ms) == (True, False, 0)
        assert host_credentials.forget(w.engine, "h1")  # forgotten: the same agent joins again, with its proof
        assert w.acts.check(check(w.hello(w.h1, NOW + 2))).joined
    finally:
        w.close()


async def test_refusals_are_counted_by_kind(tmp_path):
    w = World(tmp_path)
    try:
        env = called_by("HostWorkflow", "host/h1")  # its own host workflow (activities/callers.py)
        for raw, host in [(body(), "h1"), (body(), "h1"), (w.hello(w.intruder, NOW), "h1"), (w.first, "h1")]:
            await env.run(w.acts.check_host_report, check(raw, host=host, after=JOINED))
        count = {s.labels["reason"]: s.value for m in w.acts.refused.collect() for s in m.samples
                 if s.name.endswith("_total")}
        assert count == {"unsigned": 2, "other_credential": 1, "replay": 1}
    finally:
        w.close()


async def test_the_agents_watch_report_passes_after_the_data_converter(tmp_path):
    """The agent's own watch activity signs what it returns; through the pydantic converter (what
    Temporal carries) the control plane's check of it passes, and it validates as the report."""
    w = World(tmp_path)
    try:
        gpus = [{"index": 0, "vram_total": 24 * GiB, "name": "Simulated 24G", "vram_used": 0, "numa_node": 0}]
        report = HostReport(name="h1", ram_total=64 * GiB, gpus=gpus, labels={"zone": "a"}, backends=["custom"])
        acts = HostActivities("h1", ProcessTable(str(tmp_path / "t")), lambda: report, bookings=HeldBookings({}),
                              credential=w.h1)
        out = await ActivityEnvironment().run(acts.watch_host, WatchAsk(known="", nonce="n-7"))
        payload = (await DATA_CONVERTER.encode([out]))[0]
        raw = (await DATA_CONVERTER.decode([payload], [dict]))[0]
        assert json.loads(payload.data) == raw
        assert w.acts.check(check(raw, "watch", nonce="n-7")).ok
        assert HostReport.model_validate(raw).model_copy(update={"auth": None}) == report
    finally:
        w.close()
