"""A prefill/decode group's decision kept with its inputs and replayed (issue 41):
scheduler/group_inputs.py (the inputs, form or scale_out on them), contracts/group_decision_of.py
(each member's record with its group's decision), store/decision_codec.py ``encode_group`` /
``decode_group``, activities/decision_keeper.py ``keep_group`` and store/decision_replay.py, on
SQLite and PostgreSQL: what is kept replays to the same member record, a moved member shows as a
different decision, a part altered in the store is refused by name, and retention keeps a kept
group's parts.

Arithmetic used throughout: a custom member of 20 GiB takes one 24 GiB GPU (4 GiB left, so never two
on one GPU); the router books 2 GiB of RAM and no GPU (router_ram)."""

from __future__ import annotations

import json
import zlib
from datetime import timedelta

import pytest
from sqlmodel import Session

from activities.decision_keeper import DecisionKeeper
from contracts.group_decision_of import group_records, member_record
from scheduler.errors import InvalidInput
from scheduler.group_inputs import FORMATION, SCALE_OUT, GroupInputs, run_group
from scheduler.groups.layers import NODE_LAYER
from scheduler.groups.spec import RoleName, router_ram
from scheduler.policy_config import PolicyConfig
from scheduler.request import FlatRequest
from scheduler.tenancy.config import TenantsFile
from scheduler.tenancy.preemption import Owners
from scheduler.units import GiB
from store import decision_log
from store.decision_codec import Encoder, decode_group
from store.decision_replay import history, replay
from tests.conftest import cluster, inst
from tests.store_fixtures import store, want  # noqa: F401  (the store fixture: SQLite and PostgreSQL)
from tests.test_group_parity_formation import group, labelled, reqs
from views.render.explain import explain
from views.render.replay import history as history_text, replay as replay_text

P, D, R = RoleName.PREFILL, RoleName.DECODE, RoleName.ROUTER
OWNERS = Owners({"g": "lab"}, {"g": 0}, {})


def formation(snap, spec=None, names=None):
    spec = spec or group(router=True)
    names = names or {P: ["g-0"], D: ["g-1"], R: ["g-2"]}
    rq = {**reqs(), **({R: FlatRequest(vram=0, ram=router_ram(spec.roles))} if R in names else {})}
    return GroupInputs(FORMATION, snap, spec, "g", names, rq, TenantsFile(), OWNERS,
                       PolicyConfig(), {w.name: 3 for w in snap.workers})


def two_racks():
    # a (rack r1) has one 24 GiB GPU, b (rack r2) two: the host layer is tried first; a holds one member
    # (prefill or decode, not both), b holds both (b:0 and b:1), so the group gathers on host b, its
    # router (2 GiB of RAM, no GPU) beside them on b
    return cluster([labelled("a", [24], rack="r1"), labelled("b", [24, 24], rack="r2")])


def keep(engine, inp, times=1):
    """What the control plane's group activity keeps (one keeper, ``times`` decisions on ``inp``):
    each member's record of the policy's decision."""
    keeper = DecisionKeeper(engine, keep_days=30, every_s=0.01)
    for _ in range(times):
        out = run_group(inp)
        recs = {n: member_record(inp, out, n) for n in inp.members()}
        digest = keeper.keep_group(inp, recs)
    keeper.flush()
    keeper.close()
    return digest, recs


def test_a_formation_round_trips_through_the_codec():
    inp = formation(two_racks())
    enc = Encoder().encode_group(inp)
    got = decode_group(enc.manifest, {**enc.blobs, enc.digest: enc.manifest}.__getitem__)
    assert got.snapshot.model_dump() == inp.snapshot.model_dump() and got.names == inp.names
    assert got.requests == inp.requests and got.kind == FORMATION and got.group == "g" and got.gens == inp.gens
    assert group_records(got) == group_records(inp)
    # a plain replica's encoder shares the snapshot's chunks: the same rows, the same chunk digests
    assert json.loads(enc.manifest)["workers"] == json.loads(Encoder().encode_group(inp).manifest)["workers"]


def test_a_formation_is_kept_for_every_member_and_replays_the_same(store):  # noqa: F811
    engine = store[2]
    digest, recs = keep(engine, formation(two_racks()))
    g = recs["g-0"].group
    assert (g.kind, g.role, g.scheduled, g.layer, g.domain) == ("group", P, True, NODE_LAYER, "b")
    assert sorted((m.role.value, m.worker) for m in g.members) == [("decode", "b"), ("prefill", "b"), ("router", "b")]
    assert sorted(m.gpu_indexes[0] for m in g.members if m.role != R) == [0, 1]
    for name in ("g-0", "g-1", "g-2"):  # every member's row names the one manifest
        row = decision_log.latest(engine, name)
        assert (row.kind, row.digest, row.outcome) == ("group", digest, "placed") and recs[name].inputs == digest
        r = replay(engine, name, None)
        assert r["same"] and r["differences"] == [] and r["kind"] == "group" and sorted(r["names"]) == ["g-0", "g-1", "g-2"]
    assert "gathered in b (builtin-000004)" in r["now"] and "router g-2 on b" in r["now"]
    rows = history(engine, "g", 10)
    assert [(x["instance"], x["kind"]) for x in rows] == [("g-0", "group"), ("g-1", "group"), ("g-2", "group")]
    assert "placed (group)" in history_text("g", rows) and "group formation" in replay_text(r)
    # gpuflow explain g-1: its own placement, then its group's decision, every member
    text = explain({"instance": "g-1", "state": "running", **recs["g-1"].summary()})
    assert "decode of group g: the group formed whole, gathered in b (builtin-000004)" in text
    assert "prefill  g-0" in text and "router   g-2" in text


def test_a_member_that_moved_shows_as_a_different_decision(store):  # noqa: F811
    engine = store[2]
    _, recs = keep(engine, formation(two_racks()))
    moved = recs["g-0"].model_copy(deep=True)  # the workflow's record says prefill went to a:0
    moved.plan.worker = moved.group.members[0].worker = "a"
    r = replay(engine, "g-0", moved)
    assert not r["same"] and "plan.worker: \"a\" -> \"b\"" in r["differences"]
    assert "group.members[0].worker: \"a\" -> \"b\"" in r["differences"]


def test_a_group_that_does_not_form_is_kept_once_naming_the_role(store):  # noqa: F811
    # one host of two 24 GiB GPUs and two prefills and a decode of 20 GiB: three members, two GPUs
    engine = store[2]
    inp = formation(cluster([labelled("a", [24, 24])]), group(prefill=2), {P: ["g-0", "g-1"], D: ["g-2"]})
    keep(engine, inp, times=2)  # the same refusal again (the group's timer retries): kept once
    rows = history(engine, "g", 10)
    assert [(x["instance"], x["outcome"]) for x in rows] == [("g-0", "refused"), ("g-1", "refused"), ("g-2", "refused")]
    r = replay(engine, "g-2", None)
    rec = decision_log.record_of(decision_log.latest(engine, "g-2"))
    assert r["same"] and rec["group"]["blocked"] in ("prefill", "decode") and not rec["scheduled"]
    assert f"{rec['group']['blocked']} does not fit" in r["now"]


def test_a_member_placed_alone_replays_with_scale_out(store):  # noqa: F811
    # g-0 (prefill) on b:0 and g-1 (decode) on b:1; one more prefill: b is full, a:0 takes it
    engine = store[2]
    held = [inst("g-0", "g", "b", [0], {0: 20 * GiB}, role="prefill", group="g"),
            inst("g-1", "g", "b", [1], {1: 20 * GiB}, role="decode", group="g")]
    snap = two_racks().model_copy(update={"instances": held})
    inp = GroupInputs(SCALE_OUT, snap, group(), "g", {P: ["g-3"]}, {P: reqs()[P]}, TenantsFile(), OWNERS,
                      PolicyConfig(), {"a": 1, "b": 1})
    digest, recs = keep(engine, inp)
    assert recs["g-3"].plan.worker == "a" and recs["g-3"].group.kind == "scale_out"
    row = decision_log.latest(engine, "g-3")
    assert (row.kind, row.digest) == ("scale_out", digest)
    r = replay(engine, "g-3", None)
    assert r["same"] and r["kind"] == "scale_out" and "placed alone after formation" in r["now"]


def _tamper(engine, row, what):
    m = json.loads(decision_log.manifest(engine, row.digest))
    with Session(engine) as s:
        if what == "record":
            r = s.get(decision_log.DecisionRow, row.id)
            rec = json.loads(zlib.decompress(r.record))
            rec["group"]["domain"] = "a"
            r.record = zlib.compress(json.dumps(rec).encode())
            s.add(r)
        else:
            key = m["workers"][0] if what == "workers" else row.digest if what == "manifest" else m[what]
            b = s.get(decision_log.DecisionBlobRow, key)
            b.data = zlib.compress(zlib.decompress(b.data).replace(b"20", b"21").replace(b"[]", b"[ ]")
                                   .replace(b'"g"', b'"h"') + b" ")
            s.add(b)
        s.commit()


@pytest.mark.parametrize("what, says", [
    # every part is checked against the digest that names it; an altered one is named, never replayed
    ("spec", r"kept blob \w{12} \(the group's spec\) does not match its digest"),
    ("requests", r"kept blob \w{12} \(the group's requests\) does not match its digest"),
    ("topology", r"kept blob \w{12} \(the group's topology\) does not match its digest"),
    ("workers", r"kept chunk \w{12} \(workers of the snapshot\) does not match its digest"),
    ("manifest", r"the manifest \w{12} was altered"),
    ("record", r"the kept record of decision \d+ \(g-0\) was altered"),
])
def test_an_altered_group_input_is_refused_by_name(store, what, says):  # noqa: F811
    engine = store[2]
    keep(engine, formation(two_racks()))
    row = decision_log.latest(engine, "g-0")
    assert replay(engine, "g-0", None)["same"]  # untouched: the same decision
    _tamper(engine, row, what)
    with pytest.raises(InvalidInput, match=says):
        replay(engine, "g-0", None)


def test_retention_keeps_a_kept_groups_parts(store):  # noqa: F811
    # the members are live replicas placed by the formation: their newest placing decision is kept past
    # the retention, and with it every part its manifest names (a group's, like a replica's)
    engine = store[2]
    want(engine, "g-0", "g-1", "g-2")
    keep(engine, formation(two_racks()))
    dropped, _ = decision_log.prune(engine, keep_days=1, now=decision_log.utcnow() + timedelta(days=2))
    assert dropped == 0
    keep(engine, formation(two_racks(), names={P: ["x-0"], D: ["x-1"], R: ["x-2"]}))  # not live: dropped
    dropped, blobs = decision_log.prune(engine, keep_days=1, now=decision_log.utcnow() + timedelta(days=2))
    assert dropped == 3 and replay(engine, "g-1", None)["same"]


def test_a_kept_formation_writes_the_cluster_and_spec_a_dry_run_reads(store, tmp_path):  # noqa: F811
    # gpuflow explain MEMBER --snapshot F: the cluster the formation saw and the group's spec, which
    # gpuflow schedule --cluster F --model F.spec.json forms again (the same host b)
    from gpuflow.cli.explain import write_snapshot
    from scheduler.cluster import ClusterSnapshot
    from scheduler.groups.form import form
    from scheduler.spec import ModelSpec

    engine = store[2]
    digest, _ = keep(engine, formation(two_racks()))
    cluster_path, spec_path = write_snapshot(engine, digest, str(tmp_path / "seen.json"), "group")
    snap = ClusterSnapshot.model_validate_json(open(cluster_path).read())
    spec = ModelSpec.model_validate_json(open(spec_path).read())
    assert spec.is_group and [w.name for w in snap.workers] == ["a", "b"]
    assert {m.worker for m in form(snap, spec, reqs()).members} == {"b"}


def test_a_formation_by_preemption_replays_the_same(store):  # noqa: F811
    # tests/test_group_preempt.py's first row: poc's x-0..x-3 fill hosts a and b (20 GiB on each GPU), lab's
    # 1P1D group is within lab's guarantee of 2 GPUs: form() alone does not place it, the preemption takes the
    # two newest of poc's (x-2, x-3 on b) and the group forms on b; the replay decides it the same way
    from tests import test_group_preempt as gp

    owners = Owners({"x": "poc", "pd": "lab"}, {}, {"x-0": 1, "x-1": 2, "x-2": 3, "x-3": 4})
    snap = cluster(gp.HOSTS, gp.FULL)
    inp = GroupInputs(FORMATION, snap, gp.group(), "pd", {P: ["pd-0"], D: ["pd-1"]}, gp.REQ, gp.TENANTS, owners,
                      PolicyConfig(), {"a": 1, "b": 1})
    engine = store[2]
    _, recs = keep(engine, inp)
    assert {m.worker for m in recs["pd-0"].group.members} == {"b"} and recs["pd-0"].tenant == "lab"
    assert replay(engine, "pd-1", None)["same"]
