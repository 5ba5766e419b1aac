"""The cluster workflow's door, without a server: what its validators refuse (the update is then
rejected and nothing enters the history; tests/test_one_address_live.py checks that on a real
one), and the key scheme split between the client that makes a key and the store that checks it."""

from __future__ import annotations

import pytest

from contracts import cluster as cc
from contracts.host import MAX_ASKED, BookingsAsk
from store import keys
from scheduler.errors import InvalidInput
from workflows.cluster import one, tenants_file

GOOD = {"id": "0123456789ab", "tenant": "team-a", "name": "ci job", "salt": "0" * 32, "hash": "f" * 64}


@pytest.mark.parametrize("args, why", [
    ((), "create_key takes one KeyAdd JSON object"),  # no input
    ((GOOD, GOOD), "create_key takes one KeyAdd JSON object"),  # two
    (("gpuflow-0123456789ab-secret",), "create_key takes one KeyAdd JSON object"),  # a bare string
    (({**GOOD, "secret": "s3cr3t"},), "secret: Extra inputs are not permitted"),  # the secret has no field
    (({**GOOD, "id": "0123456789AB"},), "id: String should match pattern"),  # 12 lowercase hex digits only
    (({**GOOD, "id": "0123456789a"},), "id: String should match pattern"),  # 11 digits
    (({**GOOD, "hash": "f" * 63},), "hash: String should match pattern"),  # a SHA-256 is 64 hex digits
    (({**GOOD, "salt": "g" * 32},), "salt: String should match pattern"),  # hex only
    (({**GOOD, "tenant": "../etc"},), "tenant: String should match pattern"),  # starts with a letter or digit
    (({**GOOD, "tenant": "a" * 65},), "tenant: String should have at most 64 characters"),
    (({**GOOD, "name": "x\n[fake log line]"},), "name: String should match pattern"),  # no control characters
    (({**GOOD, "name": "x" * 201},), "name: String should have at most 200 characters"),
    # the probe's low: admin "yes" or 1 made an admin key; a scope is exactly one of the four names
    (({**GOOD, "admin": "yes"},), "admin: Input should be a valid boolean"),
    (({**GOOD, "admin": 1},), "admin: Input should be a valid boolean"),
    (({**GOOD, "admin": "true"},), "admin: Input should be a valid boolean"),
    (({**GOOD, "scope": "root"},), "scope: Input should be 'tenant', 'tenant-admin', 'cluster-admin' or 'metrics'"),
    (({**GOOD, "scope": "Cluster-Admin"},), "scope: Input should be 'tenant'"),  # exact, case and all
    (({**GOOD, "scope": 2},), "scope: Input should be 'tenant'"),
    (({**GOOD, "scope": ["cluster-admin"]},), "scope: Input should be 'tenant'"),
    (({**GOOD, "admin": True, "scope": "cluster-admin"},), "admin: true means scope tenant-admin for tenant team-a"),
    (({**GOOD, "tenant": 7},), "tenant: Input should be a valid string"),
])
def test_a_bad_key_is_refused_by_the_validator_naming_the_field(args, why):
    with pytest.raises(ValueError, match=why.replace("[", r"\[")):
        one(args, cc.KeyAdd, "create_key")


@pytest.mark.parametrize("args, model, why", [
    (({"id": "gpuflow-0123456789ab-" + "s" * 43},), cc.KeyRevoke, "id: String should have at most 12"),  # never a whole key
    (({"offset": -1},), cc.Page, "offset: Input should be greater than or equal to 0"),
    (({"limit": cc.PAGE_MAX + 1},), cc.Page, "limit: Input should be less than or equal to 500"),  # PAGE_MAX = 500
    (({"instances": ["a"] * (cc.SERVING_MAX + 1)},), cc.ServingAsk, "instances: List should have at most 500"),
    (({"instances": ["../x"]},), cc.ServingAsk, "instances.0: String should match pattern"),
    (({"id": 123456789012},), cc.KeyRevoke, "id: Input should be a valid string"),  # strict: no number for an id
    (({"offset": True},), cc.Page, "offset: Input should be a valid integer"),  # strict: true is no count
    (({"limit": "5"},), cc.Page, "limit: Input should be a valid integer"),
    # the agents' orphan check (query bookings): a host's name and its instances' names, nothing else
    (({"instances": ["m-0"], "worker": "../h1"},), BookingsAsk, "worker: String should match pattern"),
    (({"instances": ["m-0/../x"], "worker": "h1"},), BookingsAsk, "instances.0: String should match pattern"),
    (({"instances": ["a"] * (MAX_ASKED + 1), "worker": "h1"},), BookingsAsk, "instances: List should have at most 1024"),
    (({"instances": [], "worker": "h1", "booked": True},), BookingsAsk, "booked: Extra inputs are not permitted"),
])
def test_reads_and_revocations_are_bounded_and_checked(args, model, why):
    with pytest.raises(ValueError, match=why):
        one(args, model, "update")


@pytest.mark.parametrize("file, why", [
    ({"tenants": [{"name": "Team A"}]}, "tenants.0.name: String should match pattern"),  # the tenants file's own rule
    ({"tenants": [{"name": "a", "limits": {"gpus": 1}}]}, "tenants.0.limits: Extra inputs are not permitted"),
    ({"tenants": [{"name": "a", "guarantee": {"gpus": 4}, "limit": {"gpus": 2}}]}, "guarantee gpus 4 is above its limit 2"),
    ({"queueing": "Random"}, "queueing: Input should be 'BestEffortFIFO' or 'StrictFIFO'"),
])
def test_a_bad_tenants_file_is_refused_by_the_validator(file, why):
    with pytest.raises(ValueError, match=why):
        tenants_file(({"file": file},))


@pytest.mark.parametrize("extra, granted", [
    ({}, "tenant"),  # the default
    ({"scope": "metrics"}, "metrics"),
    ({"scope": "tenant-admin"}, "tenant-admin"),
    ({"admin": True}, "tenant-admin"),  # an older CLI's admin key of team-a: its tenant's admin
    ({"admin": True, "tenant": "default"}, "cluster-admin"),  # of tenant default: the operator's, everything
    ({"admin": True, "scope": "tenant-admin"}, "tenant-admin"),  # both, agreeing
    ({"admin": False, "scope": "cluster-admin"}, "cluster-admin"),
])
def test_the_scope_a_key_gets(extra, granted):
    assert one(({**GOOD, **extra},), cc.KeyAdd, "create_key").granted == granted


def test_a_good_tenants_file_passes():
    tf = tenants_file(({"file": {"tenants": [{"name": "a", "limit": {"vram": "2 GiB"}}]}},))
    assert tf.get("a").limit.vram == 2 * 2**30  # "2 GiB" = 2 x 1024^3 bytes


def test_a_key_made_by_the_client_is_honoured_by_the_store_that_only_got_its_hash(store):
    _, _, engine = store
    key, sent = keys.new_key("team-a", "ci job")
    secret = key.split("-", 2)[2]
    assert secret not in sent.model_dump_json()  # what crosses Temporal: id, tenant, name, salt, hash
    assert cc.KeyAdd.model_validate(sent.model_dump()) == sent  # and it passes the validator's model
    keys.add(engine, sent)
    assert keys.tenant_of(engine, key) == "team-a"  # the gateway's check, on the hash alone
    with pytest.raises(InvalidInput, match="exists already"):  # a key is never replaced
        keys.add(engine, sent.model_copy(update={"tenant": "team-b"}))
    assert keys.tenant_of(engine, key) == "team-a"
    assert keys.key_id(key) == sent.id and keys.key_id(sent.id) == sent.id


@pytest.mark.parametrize("tenant, name", [("-a", ""), ("a", "x\ny"), ("a", "x" * 201)])
def test_the_client_refuses_a_key_it_could_not_send(tenant, name):
    with pytest.raises(InvalidInput):
        keys.new_key(tenant, name)


def test_a_read_past_its_deadline_is_refused_naming_it(monkeypatch):
    # a query waits on the worker's workflow thread, which the SDK calls deadlocked at 2 s: the
    # reader gives up first (READ_S = 1.5 s; 0.05 s here) and says which read, instead of hanging
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from activities import cluster_reads

    monkeypatch.setattr(cluster_reads, "READ_S", 0.05)
    release = threading.Event()
    monkeypatch.setattr(cluster_reads, "keys_page", lambda engine, page: release.wait(5))  # a store that hangs
    with ThreadPoolExecutor(1) as pool:
        reads = cluster_reads.StoreReads(None, None, pool, lambda spec: None, None)
        with pytest.raises(InvalidInput, match="did not answer the keys read within 0.05 s"):
            reads.keys(cc.Page())
        release.set()


def test_a_queue_slow_to_judge_answers_the_stored_reasons(sqlite_engine, monkeypatch):
    # the queue is judged afresh (a decision per waiting replica) for at most JUDGE_S (1.0 s; 0.05 s
    # here); past it the answer is the reasons the store holds, said so (judged: false), and the
    # judgement goes on to record its own
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from activities import cluster_reads
    from contracts.control import InstanceRecord
    from store import records

    records.save_deployment(sqlite_engine, "big", {"name": "big"}, 1)
    row = InstanceRecord(name="big-0", deployment="big", model="big", state="pending", reason="0/0 hosts fit")
    records.create_instances(sqlite_engine, [row])
    records.record_instances(sqlite_engine, [row])  # its reason, as its decision records it
    monkeypatch.setattr(cluster_reads, "JUDGE_S", 0.05)
    release = threading.Event()
    monkeypatch.setattr(cluster_reads, "queue_page", lambda *a: release.wait(5))  # a judgement that takes long
    with ThreadPoolExecutor(2) as pool:
        got = cluster_reads.StoreReads(sqlite_engine, sqlite_engine, pool, lambda spec: None, None).queue(cc.Page())
        release.set()
    assert got.judged is False and [(r["instance"], r["reason"]) for r in got.rows] == [("big-0", "0/0 hosts fit")]
