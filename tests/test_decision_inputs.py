"""A decision's inputs kept and re-run (scheduler/decision_inputs.py, store/decision_codec.py and
store/decision_log.py): what
is kept decodes to what the policy saw, the policy re-run on it gives the same record, consecutive
snapshots share their chunks, and the store keeps what the retention says."""

from __future__ import annotations

from datetime import timedelta

import pytest

from activities.decision_keeper import DecisionKeeper
from contracts.decision_of import differences, run_policy
from scheduler.decision_inputs import DecisionInputs
from scheduler.errors import InvalidInput
from scheduler.estimate import estimate_request, gguf_request
from scheduler.policy_config import PolicyConfig
from scheduler.request_codec import decode as decode_request, encode as encode_request
from scheduler.spec import ModelSpec
from scheduler.tenancy.config import TenantsFile
from scheduler.tenancy.preemption import Owners
from store import decision_log, records
from store.decision_codec import Encoder, decode
from contracts.control import InstanceRecord
from tests.conftest import cluster, gpu, inst, worker
from scheduler.units import GiB

SPEC = ModelSpec.model_validate({"name": "m", "backend": "custom", "run_command": "serve", "source": {"local_path": "/m"},
                                 "resources": {"vram": 20 * GiB, "ram": GiB}})
REQ = estimate_request(SPEC)
OWNERS = Owners({"m": "default", "old": "default"}, {"m": 0, "old": 0}, {})


def hosts(n: int):
    return [worker(f"h{i:02d}", 64, [gpu(0, 24), gpu(1, 24)]) for i in range(n)]


def inputs(snap, names=("m-0",), policy=PolicyConfig()):
    return DecisionInputs(snap, SPEC, REQ, TenantsFile(), OWNERS, list(names), policy, {w.name: 1 for w in snap.workers})


def kept(enc, encoded) -> DecisionInputs:
    """Decode through a blob lookup over what ``encoded`` (a list of Encoded) handed out."""
    blobs = {k: v for e in encoded for k, v in e.blobs.items()}
    return decode(encoded[-1].manifest, blobs.__getitem__)


def test_what_is_kept_replays_to_the_same_record():
    # 6 hosts x 2 GPUs of 24 GiB; 4 replicas of "old" (20 GiB each) on h00-h01: m-0 (20 GiB) goes elsewhere
    snap = cluster(hosts(6), [inst(f"old-{i}", "old", f"h0{i // 2}", [i % 2], vram={i % 2: 20 * GiB})
                              for i in range(4)])
    inp = inputs(snap)
    rec = run_policy(inp)[0]
    assert rec.scheduled and rec.plan.worker not in ("h00", "h01")
    e = Encoder()
    got = kept(e, [e.encode(inp)])
    assert got.snapshot.model_dump() == snap.model_dump() and got.names == ["m-0"] and got.gens == inp.gens
    assert differences(rec, run_policy(got)[0]) == []
    # the digest is the manifest's: the same inputs encode to the same digest, another name to another
    assert Encoder().encode(inp).digest == e.encode(inp).digest != e.encode(inputs(snap, ["m-1"])).digest


def test_a_changed_weight_shows_as_a_different_decision():
    # spread (placement weight 0, fragmentation favouring whole GPUs) against the default binpack
    snap = cluster(hosts(3), [inst("old-0", "old", "h00", [0], vram={0: 4 * GiB})])
    rec = run_policy(inputs(snap))[0]
    other = run_policy(inputs(snap, policy=PolicyConfig(placement=0, fragmentation=0, locality=0, topology=0)))[0]
    diff = differences(rec, other)
    assert diff and any(d.startswith("score") or d.startswith("candidates") for d in diff)


def test_consecutive_snapshots_share_their_chunks():
    # 100 hosts, 1,000 replicas. One more replica changes one instance chunk (a chunk starts at a
    # row whose name's CRC32 is 0 mod 16: inserting a row never moves the other boundaries)
    insts = [inst(f"d{i // 10}-{i % 10}", f"d{i // 10}", f"h{i % 100:02d}", [i % 2], vram={i % 2: GiB})
             for i in range(1000)]
    e = Encoder()
    first = e.encode(inputs(cluster(hosts(100), insts)))
    snap2 = cluster(hosts(100), insts + [inst("m-0", "m", "h05", [1], vram={1: GiB})])
    second = e.encode(inputs(snap2))
    assert len(first.blobs) > 50  # every chunk and part is new the first time
    # the second hands out only what is new: the one instance chunk the new row joined (the
    # generations are a new dict with the same content: the same digest, known already)
    assert len(second.blobs) == 1
    assert len(second.manifest) < 8_000  # ~130 digests of 64 hex characters
    blobs = {**first.blobs, **second.blobs}
    assert decode(second.manifest, blobs.__getitem__).snapshot.model_dump() == snap2.model_dump()


def test_a_gguf_request_round_trips(llama3_gguf):
    # the items are computed again from the model and options: the same as those first estimated
    req = gguf_request(llama3_gguf, ["--ctx-size", "4096", "-ngl", "20"])
    back = decode_request(encode_request(req))
    assert back.model == req.model and back.options == req.options and back.gpu_layers == req.gpu_layers
    assert back.items == req.items


@pytest.mark.parametrize("bad, says", [
    ({"kind": "other"}, "kind 'flat' or 'gguf'"),
    ({"kind": "flat"}, "a recorded flat request does not decode"),
    ([1, 2], "must be an object"),
])
def test_a_bad_recorded_request_is_named(bad, says):
    with pytest.raises(InvalidInput, match=says):
        decode_request(bad)


def test_a_missing_or_altered_blob_is_named():
    snap = cluster(hosts(2))
    e = Encoder()
    enc = e.encode(inputs(snap))
    blobs = dict(enc.blobs)
    spec_digest = next(k for k, v in blobs.items() if b'"run_command":"serve"' in v)
    with pytest.raises(InvalidInput, match="lack"):
        decode(enc.manifest, {k: v for k, v in blobs.items() if k != spec_digest}.__getitem__)
    blobs[spec_digest] = blobs[spec_digest].replace(b"serve", b"evil!")
    with pytest.raises(InvalidInput, match="does not match its digest"):
        decode(enc.manifest, blobs.__getitem__)


def test_the_store_keeps_decisions_and_prunes_past_the_retention(store):
    engine = store[2]  # SQLite and PostgreSQL
    keeper = DecisionKeeper(engine, keep_days=30, every_s=0.01)
    snap = cluster(hosts(4))
    for n in ("m-0", "m-1", "m-2"):
        inp = inputs(snap, [n])
        keeper.keep(inp, run_policy(inp))
    keeper.flush()
    n, blobs, size = decision_log.sizes(engine)
    assert n == 3 and blobs > 0 and size > 0
    row = decision_log.latest(engine, "m-1")
    assert decision_log.latest(engine, "m-1", row.digest[:6]).id == row.id
    assert decision_log.latest(engine, "m-1", "%") is None  # a LIKE wildcard is a literal, matching no digest
    inp = decode(decision_log.blob(engine, row.digest), lambda d: decision_log.blob(engine, d))
    assert inp.names == ["m-1"] and differences(run_policy(inp)[0], run_policy(inputs(snap, ["m-1"]))[0]) == []
    # m-1 still placed in the store (a live row): its placing decision outlives the retention;
    # m-0 and m-2 have no row (gone): 40 days later their decisions and the blobs only they named go
    records.create_instance(engine, InstanceRecord(name="m-1", deployment="m", model="m", state="running"))
    later = decision_log.utcnow() + timedelta(days=40)
    dropped, _ = decision_log.prune(engine, 30, now=later)
    assert dropped == 2 and [r.instance for r in decision_log.history(engine, "m")] == ["m-1"]
    still = decision_log.latest(engine, "m-1")
    decode(decision_log.blob(engine, still.digest), lambda d: decision_log.blob(engine, d))  # every part still there
    # the keeper's own prune: the blobs it dropped are written again by the next decision that
    # names them (its encoder no longer takes them for stored)
    records.mark_gone(engine, "m-1", "ended")
    assert keeper.prune(now=later)[1] > 0 and decision_log.sizes(engine)[:2] == (0, 0)
    inp = inputs(snap, ["m-3"])
    keeper.keep(inp, run_policy(inp))
    keeper.flush()
    row = decision_log.latest(engine, "m-3")
    assert decode(decision_log.blob(engine, row.digest), lambda d: decision_log.blob(engine, d)).names == ["m-3"]
    keeper.close()


def test_an_autoscaler_step_is_kept_and_replays_the_same(store):
    # queue 8 >= 8 and TPOT 121 ms > 120 ms over two 15 s samples (with histograms): up by 1, 2 -> 3;
    # kept (it voted), replayed from the store to the same decision, votes and reason included
    from scheduler.autoscale import kept as autoscale_inputs
    from gpuflow.cli.explain import replay
    from scheduler.autoscale.policy import PolicyState, decide
    from tests.test_autoscale_policy import cfg, s

    engine = store[2]
    hist = [s(0, 8.0, 0.121, p95=2.0), s(15, 8.0, 0.121, p95=2.0)]
    d, _ = decide(cfg(), hist, current=2, starting=0, now=15, state=PolicyState())
    assert d.desired == 3 and autoscale_inputs.worth_keeping(d)
    data = autoscale_inputs.encode(cfg(), hist, 2, 0, 15, PolicyState())
    assert autoscale_inputs.replay(data) == autoscale_inputs.decision_of(d)
    keeper = DecisionKeeper(engine, every_s=0.01)
    keeper.keep_step("web", data, autoscale_inputs.decision_of(d), d.direction, d.reason)
    keeper.flush()
    r = replay(engine, "web", None)
    assert r["same"] and r["kind"] == "autoscale" and r["now"].startswith("up to 3 replica(s) by queue_tpot")
    # a hold with every rule content is not worth keeping: it happens every interval
    calm = [s(0, 4.0, 0.09), s(15, 4.0, 0.09)]
    assert not autoscale_inputs.worth_keeping(decide(cfg(), calm, current=2, starting=0, now=15)[0])
    with pytest.raises(InvalidInput, match="do not decode"):
        autoscale_inputs.replay(b'{"v": 1, "config": {}}')
    keeper.close()


def _tamper(engine, what: str, row) -> None:
    """Change one kept part of ``row``'s decision the way somebody with the database could."""
    import json
    import zlib

    from sqlmodel import Session

    with Session(engine) as s:
        if what == "manifest: rewritten":  # valid zlib and JSON, other content: the same key, another decision
            b = s.get(decision_log.DecisionBlobRow, row.digest)
            m = json.loads(zlib.decompress(b.data))
            m["names"] = ["m-1"]
            b.data = zlib.compress(json.dumps(m).encode())
            s.add(b)
        elif what == "chunk: not zlib":
            m = json.loads(zlib.decompress(s.get(decision_log.DecisionBlobRow, row.digest).data))
            b = s.get(decision_log.DecisionBlobRow, m["workers"][0])
            b.data = b"not zlib at all"
            s.add(b)
        else:
            r = s.get(decision_log.DecisionRow, row.id)
            if what == "record: edited":  # the recorded outcome moved to another host
                rec = json.loads(zlib.decompress(r.record))
                rec["plan"]["worker"] = "h03"
                r.record = zlib.compress(json.dumps(rec).encode())
            else:  # "record: not zlib"
                r.record = b"\x00garbage"
            s.add(r)
        s.commit()


@pytest.mark.parametrize("what, says", [
    # each kept part is checked against what names it; an altered one is named, never replayed as
    # "a different decision", and bytes that are not zlib are named, never a traceback
    ("manifest: rewritten", r"the manifest \w{12} was altered: its bytes hash to \w{12}"),
    ("chunk: not zlib", r"kept blob \w{12} is damaged: it is not zlib data"),
    ("record: edited", r"the kept record of decision \d+ \(m-0\) was altered"),
    ("record: not zlib", r"the kept record of decision \d+ \(m-0\) is damaged: it is not zlib data"),
])
def test_an_altered_or_damaged_kept_decision_is_named(store, what, says):
    from store.decision_replay import replay

    engine = store[2]
    keeper = DecisionKeeper(engine, keep_days=30, every_s=0.01)
    inp = inputs(cluster(hosts(4)), ["m-0"])
    keeper.keep(inp, run_policy(inp))
    keeper.flush()
    keeper.close()
    row = decision_log.latest(engine, "m-0")
    assert replay(engine, "m-0", None)["same"]  # untouched: the same decision
    _tamper(engine, what, row)
    with pytest.raises(InvalidInput, match=says):
        replay(engine, "m-0", None)


@pytest.mark.parametrize("load", [
    "import gpuflow.cli.explain",  # gpuflow explain --replay / --history / --snapshot
    "import store.decision_replay",  # the replay itself, as a control-plane worker runs it for the audit read
    "import runpy, sys; sys.argv = ['replay_all', '--help']\ntry:\n    runpy.run_path('bench/replay_all.py', "
    "run_name='__main__')\nexcept SystemExit:\n    pass",
])
def test_a_replay_imports_no_activity_module(load):
    # the policy, its inputs and the record diff are pure (scheduler/, contracts/), the kept format
    # the store's: replaying a decision loads nothing of the control plane's I/O package
    import subprocess
    import sys

    code = f"{load}\nimport sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'activities'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    assert out.stdout.strip().splitlines()[-1] == "[]"
