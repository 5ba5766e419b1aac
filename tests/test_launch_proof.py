"""Capacity and traffic are the host's word, proven (issue 40 follow-up), on a real SQLite store:

- a replica is recorded RUNNING at an address only when its host's agent MACed the launch with its
  host key and the ledger books it on that host (contracts/launch_proof.py, store/engine_keys.py
  check_launches), as a table: good, signed by another host, port or address or pid edited, no MAC,
  not booked there, host not joined; through the record_instance activity a refusal is
  LaunchUnproven, non-retryable, and writes nothing;
- host_seen writes a host's inventory only for a report that passes the host workflow's own rule
  again (contracts/host_proof.py judge against the store's credential), as a table: the hello the
  check took (twice), an older one, one rewritten, an unsigned one, a host never joined, and a watch
  report signed for a nonce of this run or of another (contracts/run_nonce.py)."""

from __future__ import annotations

import time
import uuid

import pytest
from sqlmodel import Session
from temporalio.exceptions import ApplicationError

from activities.worker_set import control_activities
from contracts import launch_proof, run_nonce
from contracts.control import InstanceRecord
from contracts.host import HostReport
from contracts.host_auth import ReportCheck
from store import host_credentials, records
from store.engine_keys import UnprovenLaunch
from store.tables import ReservationRow
from tests.callers_env import called_by
from tests.test_callers import rows
from worker_agent.credential import open_credential

GiB = 2**30
NONCE = "n" * 24


@pytest.fixture
def world(sqlite_engine, tmp_path):
    """A store whose cluster h1 and h2 joined; a-0 booked on h1. Yields (engine, h1's, h2's credential)."""
    token = host_credentials.join_token(sqlite_engine) or (host_credentials.ensure_cluster(sqlite_engine) and
                                                           host_credentials.join_token(sqlite_engine))
    creds = [open_credential(str(tmp_path / h), h, token) for h in ("h1", "h2")]
    for c in creds:
        assert host_credentials.accept(sqlite_engine, c.name, c.public)
    with Session(sqlite_engine) as s:
        s.add(ReservationRow(instance="a-0", worker="h1", gpu_index=0, vram=GiB))
        s.commit()
    yield sqlite_engine, creds[0], creds[1]
    for c in creds:
        c.close()


def launched(cred, **edit) -> InstanceRecord:
    """a-0 RUNNING on h1 as its workflow records a launch whose result ``cred`` MACed; ``edit``: the
    figures changed after the MAC was made (a forger's)."""
    fields = launch_proof.body("a-0", "", 4242, 8000, "10.0.0.1", NONCE, 8001)
    mac = launch_proof.sign(cred.key, cred.name, fields) if cred is not None else ""
    rec = dict(name="a-0", deployment="a", model="a", state="running", worker="h1", pid=4242, port=8000,
               address="10.0.0.1", kv_events_port=8001, key_id=NONCE, launch_mac=mac)
    return InstanceRecord(**{**rec, **edit})


# (who MACed the launch, what was edited after, whether the store writes it, what a refusal names)
LAUNCHES = [
    ("h1", {}, None),
    ("h1", {"state": "stopping", "address": "6.6.6.6"}, None),  # not RUNNING: routed nowhere, nothing to prove
    ("h1", {"port": None, "address": None, "launch_mac": ""}, None),  # RUNNING with no port: routed nowhere
    ("h2", {}, "does not verify with h1's credential"),  # another host's key: not h1's word
    ("h1", {"port": 6666}, "does not verify"),  # the port edited
    ("h1", {"address": "6.6.6.6"}, "does not verify"),  # the address edited: the gateways would send users there
    ("h1", {"pid": 1}, "does not verify"),
    ("h1", {"kv_events_port": 6667}, "does not verify"),
    ("h1", {"launch_mac": ""}, "carries no MAC"),
    ("h1", {"address": "6.6.6.6", "launch_mac": ""}, "carries no MAC"),
    ("h1", {"port": None, "launch_mac": ""}, "carries no MAC"),  # an address alone is the host's word too
    ("h1", {"name": "a-1"}, "a-1 is not booked on host h1"),  # a replica the ledger does not book there
    ("h1", {"worker": "h2"}, "a-0 is not booked on host h2"),
    ("h1", {"worker": "h3"}, "is not booked on host h3"),
]


@pytest.mark.parametrize("signer, edit, refused", LAUNCHES)
def test_a_running_record_is_written_only_with_its_hosts_proof(world, signer, edit, refused):
    engine, h1, h2 = world
    rec = launched({"h1": h1, "h2": h2}[signer], **edit)
    if refused is None:
        records.record_instance(engine, rec)
        row = records.instances_of(engine)[0]
        assert (row.state, row.address, row.port) == (rec.state, rec.address, rec.port)
        return
    before = rows(engine)
    with pytest.raises(UnprovenLaunch, match=refused):
        records.record_instance(engine, rec)
    assert rows(engine) == before


def test_a_host_forgotten_proves_nothing(world):
    engine, h1, _ = world
    host_credentials.forget(engine, "h1")
    with pytest.raises(UnprovenLaunch, match="host h1 has not joined"):
        records.record_instance(engine, launched(h1))


async def test_the_record_activity_refuses_an_unproven_launch_for_good(world):
    engine, h1, _ = world
    acts = control_activities(engine, None)
    env = called_by("ModelInstanceWorkflow", "instance/a-0")
    try:
        with pytest.raises(ApplicationError) as e:
            await env.run(acts.records.record_instance, launched(h1, address="6.6.6.6"))
        assert e.value.type == "LaunchUnproven" and e.value.non_retryable and "6.6.6.6" in e.value.message
        assert records.instances_of(engine) == []
        await env.run(acts.records.record_instance, launched(h1))
        assert records.instances_of(engine)[0].address == "10.0.0.1"
    finally:
        acts.runner.shutdown()


def body(name: str, gpus_gib: float = 16) -> dict:
    """A report as an agent sends it before signing."""
    r = HostReport(name=name, ram_total=64 * GiB, gpus=[{"index": 0, "vram_total": int(gpus_gib * GiB)}], boot="run-a")
    return r.model_dump(mode="json", exclude={"auth"})


def hello(cred, stamp: int, name: str | None = None) -> dict:
    return cred.signed(body(name or cred.name), "hello", str(stamp))


RUN, OTHER_RUN = str(uuid.uuid4()), str(uuid.uuid4())
HERE, THERE = run_nonce.nonce(RUN, "a" * 32), run_nonce.nonce(OTHER_RUN, "a" * 32)


def seen_cases(h1, now: int) -> list:
    """(the ReportCheck host_seen gets, its caller's host, None when it writes, else the kind refused)"""
    taken = hello(h1, now)  # the hello the host workflow's check took last (the store holds its stamp)

    def seen(report: dict, purpose: str = "hello", host: str = "h1", nonce: str = "", after: int = 0):
        return ReportCheck(host=host, purpose=purpose, report=report, nonce=nonce, now_ms=0, after_ms=after)

    return [
        (seen(taken), "h1", None),
        (seen(taken, after=now), "h1", None),  # the same hello again (the workflow's after_ms is not trusted)
        (seen(hello(h1, now - 1000)), "h1", "replay"),  # older than the last the check took
        (seen({**taken, "gpus": [{"index": 0, "vram_total": 800 * GiB}]}), "h1", "mac"),  # the probe's 800 GiB
        (seen({k: v for k, v in taken.items() if k != "auth"}), "h1", "unsigned"),
        (seen(hello(h1, now, name="hfake"), host="hfake"), "hfake", "not_joined"),  # a forged host/hfake
        (seen(h1.signed(body("h1"), "watch", HERE), "watch", nonce=HERE), "h1", None),  # this run's watch
        (seen(h1.signed(body("h1"), "watch", THERE), "watch", nonce=THERE), "h1", "replay"),  # another run's
    ]


async def test_host_seen_writes_only_a_report_that_passes_the_check_again(world):
    engine, h1, _ = world
    acts = control_activities(engine, None)
    now = int(time.time() * 1000)
    try:
        assert acts.host_auth.check(ReportCheck(host="h1", purpose="hello", report=hello(h1, now), now_ms=now)).ok
        for seen, host, refused in seen_cases(h1, now):
            env = called_by("HostWorkflow", f"host/{host}", run_id=RUN)
            before = rows(engine)
            if refused is None:
                await env.run(acts.hosts.host_seen, seen)
                row = records.workers(engine)[0]
                assert (row.name, row.state, [g["vram_total"] for g in row.gpus]) == ("h1", "ready", [16 * GiB])
                continue
            with pytest.raises(ApplicationError) as e:
                await env.run(acts.hosts.host_seen, seen)
            assert (e.value.type, e.value.non_retryable, e.value.details) == ("ReportRefused", True, (refused,)), \
                e.value
            assert rows(engine) == before, refused
        count = {s.labels["reason"]: s.value for m in acts.host_auth.refused.collect() for s in m.samples
                 if s.name.endswith("_total")}
        assert count == {"replay": 2, "mac": 1, "unsigned": 1, "not_joined": 1}
    finally:
        acts.runner.shutdown()
