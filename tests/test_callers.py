"""The control plane's activities act only for the workflow their input names (activities/callers.py):
the caller's workflow type and id, as the Temporal server names them in ``activity.info()``. A
workflow of anybody's, on their own worker, can schedule any activity registered on gpuflow-control
(a local one too: how it is run is the caller's choice); here each writer is called, for real, in
Temporal's ActivityEnvironment with the caller named, and refuses another caller before it reads or
writes anything. Every registered activity is a writer with a rule or a read said to be one."""

from __future__ import annotations

import pytest
from sqlmodel import Session, SQLModel, select
from temporalio.exceptions import ApplicationError

from activities import callers
from activities.worker_set import control_activities
from contracts import cluster as cc
from contracts.autoscale import ApplyAsk, DeploymentRef, StepAsk
from contracts.control import InstanceNames, InstanceRecord, InstanceRef
from contracts.decision import DecisionRecord
from contracts.drain import DrainAsk
from contracts.host_auth import ReportCheck
from contracts.hosts import HostCordon, HostLost, HostRef, ModelPaths
from contracts.placement import PlaceAsk, PreemptAsk
from contracts.records import SaveDeployment, StartInstances
from contracts.usage import UsageBatch
from store import ledger, records
from tests.callers_env import called_by
from tests.store_fixtures import want
from tests.test_ledger import host, plan

I, D, H, A = "ModelInstanceWorkflow", "ModelDeploymentWorkflow", "HostWorkflow", "AutoscalerWorkflow"
RAW = {"name": "a", "backend": "custom", "run_command": "x {port}", "source": {"local_path": "/m/a"},
       "resources": {"vram": 2**30, "ram": 2**30}}


def test_every_activity_is_a_writer_with_a_rule_or_a_read_said_so(sqlite_engine):
    acts = control_activities(sqlite_engine, None)
    try:
        names = {fn.__temporal_activity_definition.name for fn in acts.all()}
    finally:
        acts.runner.shutdown()
    assert names == set(callers.RULES) | set(callers.READS), "a new activity: give it a rule, or say why it reads"
    assert not set(callers.RULES) & set(callers.READS)


def test_the_sweeps_id_is_the_sweep_workflows():
    from workflows.queue_sweep import SWEEP_ID

    assert callers.SWEEP_ID == SWEEP_ID


# (activity, its input, the caller's type and id, None when allowed, else what the refusal names)
RULE = [
    ("place_replica", PlaceAsk(instance="a-0", spec=RAW), I, "instance/a-0", None),
    ("place_replica", PlaceAsk(instance="a-0", spec=RAW), I, "instance/a-1", "'instance/a-0'"),  # a sibling
    ("place_replica", PlaceAsk(instance="a-0", spec=RAW), "Ghost", "instance/a-0", "called by Ghost"),  # the type too
    ("record_instance", InstanceRecord(name="a-0", deployment="a", model="a", state="pending"), I, "instance/a-0", None),
    ("record_instance", InstanceRecord(name="a-0", deployment="a", model="a", state="pending"), D, "deployment/a",
     "(ModelInstanceWorkflow 'instance/a-0')"),
    ("record_model_paths", ModelPaths(path="/m/a"), I, "instance/a-0", "'instance/'"),  # names no instance: nobody's
    ("start_instances", StartInstances(instances=[]), D, "deployment/a", None),  # nothing named: its type suffices
    ("start_instances", StartInstances(instances=[]), "Ghost", "deployment/a", "called by Ghost"),
    # closed_workflows: the deployment's own replicas, <deployment>-<n>; "a-1-0" is deployment a-1's
    ("closed_workflows", InstanceNames(names=["a-0", "a-1"]), D, "deployment/a", None),
    ("closed_workflows", InstanceNames(names=["a-1-0"]), D, "deployment/a-1", None),
    ("closed_workflows", InstanceNames(names=["a-0", "b-0"]), D, "deployment/a", "'deployment/b'"),
    ("closed_workflows", InstanceNames(names=["a-1-0"]), D, "deployment/a", "'deployment/a-1'"),
    ("closed_workflows", InstanceNames(names=["a-x"]), D, "deployment/a", "no deployment names a replica 'a-x'"),
    ("autoscale_apply", ApplyAsk(deployment="a", replicas=9), A, "autoscaler/a", None),
    ("autoscale_apply", ApplyAsk(deployment="a", replicas=9), D, "deployment/a", "'autoscaler/a'"),
    ("host_seen", ReportCheck(host="h1", purpose="hello", now_ms=0), H, "host/h1", None),
    ("host_seen", ReportCheck(host="h1", purpose="hello", now_ms=0), H, "host/hfake", "'host/h1'"),
    ("cluster_add_key", None, "ClusterWorkflow", "cluster", None),
    ("cluster_add_key", None, "ClusterWorkflow", "cluster-2", "'cluster'"),
    ("sweep_queue", None, "QueueSweepWorkflow", "queue-sweep", None),
    ("sweep_queue", None, "QueueSweepWorkflow", "queue-sweep-mine", "'queue-sweep'"),
]


@pytest.mark.parametrize("name, arg, kind, wid, refused", RULE)
def test_the_rule(name, arg, kind, wid, refused):
    got = callers.problem(name, kind, wid, arg)
    if refused is None:
        assert got is None
    else:
        assert got is not None and refused in got and f"{name} acts only for the workflow its input names" in got


def rows(engine) -> dict:
    """Every row of every table: a refused call leaves them all as they were."""
    with Session(engine) as s:
        return {t.name: sorted(map(repr, s.connection().execute(select(t)))) for t in SQLModel.metadata.sorted_tables}


DECISION = DecisionRecord(scheduled=True)
# (activity's class and method, its input, the workflow id it acts for); each is called by a
# workflow of its type with another id ("…-forged"), and by its own (the next table)
WRITERS = [
    ("placement", "place_replica", PlaceAsk(instance="a-0", spec=RAW), "instance/a-0"),
    ("placement", "preempt_placement", PreemptAsk(instance="a-0", decision=DECISION), "instance/a-0"),
    ("placement", "release_placement", InstanceRef(instance="a-0"), "instance/a-0"),
    ("drain", "drain_instance", DrainAsk(instance="a-0", timeout_s=0), "instance/a-0"),
    ("records", "record_instance", InstanceRecord(name="a-0", deployment="a", model="a", state="stopping"),
     "instance/a-0"),  # a local activity, run here as the plain one anybody may schedule
    ("hosts", "record_model_paths", ModelPaths(instance="a-0", path="/m/a", present=["h1"]), "instance/a-0"),
    ("records", "save_deployment", SaveDeployment(name="a", spec=RAW, replicas=0, state="deleted"), "deployment/a"),
    ("records", "start_instances", StartInstances(instances=[{"name": "a-5", "deployment": "a", "spec": RAW}]),
     "deployment/a"),
    ("records", "closed_workflows", InstanceNames(names=["a-0"]), "deployment/a"),
    ("autoscale", "start_autoscaler", DeploymentRef(deployment="a"), "deployment/a"),
    ("autoscale", "autoscale_step", StepAsk(deployment="a", now=1.0), "autoscaler/a"),
    ("autoscale", "autoscale_apply", ApplyAsk(deployment="a", replicas=0), "autoscaler/a"),
    ("hosts", "host_seen", ReportCheck(host="h1", purpose="hello", report={"name": "h1", "ram_total": 2**50},
                                       now_ms=0), "host/h1"),
    ("hosts", "host_lost", HostLost(name="h1", reason="forged"), "host/h1"),
    ("hosts", "host_forget", HostRef(name="h1"), "host/h1"),
    ("hosts", "host_cordon", HostCordon(name="h1", on=True), "host/h1"),
    ("hosts", "record_usage", UsageBatch(host="h1"), "host/h1"),
    ("host_auth", "check_host_report", ReportCheck(host="h1", purpose="hello", now_ms=0), "host/h1"),
    ("cluster", "apply_tenants", cc.TenantsApply(file={"tenants": []}), "cluster"),
    ("cluster", "add_key", cc.KeyAdd(id="0123456789ab", tenant="default", salt="0" * 32, hash="0" * 64), "cluster"),
    ("cluster", "revoke_key", cc.KeyRevoke(id="0123456789ab"), "cluster"),
    ("queue", "sweep_queue", None, "queue-sweep"),
]


def seeded(engine):
    records.upsert_worker(engine, host("h1", gpus=1, gib=24))
    want(engine, "a-0", spec=RAW)
    return control_activities(engine, None)


@pytest.mark.parametrize("group, method, arg, wid", WRITERS, ids=[w[1] for w in WRITERS])
async def test_a_writer_refuses_another_caller_and_touches_nothing(sqlite_engine, group, method, arg, wid):
    acts = seeded(sqlite_engine)
    try:
        before = rows(sqlite_engine)
        kind = callers.RULES[getattr(getattr(acts, group), method).__temporal_activity_definition.name].workflow
        fn = getattr(getattr(acts, group), method)
        for caller in (called_by(kind, wid + "-forged"), called_by("Ghost", wid)):
            with pytest.raises(ApplicationError) as e:
                await (caller.run(fn, arg) if arg is not None else caller.run(fn))
            assert e.value.type == "InvalidInput" and e.value.non_retryable, e.value
            assert f"({kind} {wid!r})" in e.value.message and "called by" in e.value.message, e.value.message
        assert rows(sqlite_engine) == before
    finally:
        acts.runner.shutdown()


# the writers that need no Temporal to act: called by their own workflow, each does its work (a-0
# holds GPU 0 of h1; drain_instance only waits: nothing in flight, so it writes nothing)
OWN = [
    ("placement", "release_placement", InstanceRef(instance="a-0"), I, "instance/a-0"),
    ("records", "record_instance", InstanceRecord(name="a-0", deployment="a", model="a", state="stopping"),
     I, "instance/a-0"),
    ("hosts", "record_model_paths", ModelPaths(instance="a-0", path="/m/a", present=["h1"]), I, "instance/a-0"),
    ("records", "save_deployment", SaveDeployment(name="a", spec=RAW, replicas=0, state="deleted"), D, "deployment/a"),
    ("hosts", "host_cordon", HostCordon(name="h1", on=True), H, "host/h1"),
    ("hosts", "record_usage", UsageBatch(host="h1", replicas=[{"instance": "a-0", "rss": 2**30, "measured": "nvml"}]),
     H, "host/h1"),
    ("cluster", "revoke_key", cc.KeyRevoke(id="0123456789ab"), "ClusterWorkflow", "cluster"),
]


@pytest.mark.parametrize("group, method, arg, kind, wid", OWN, ids=[w[1] for w in OWN])
async def test_a_writer_acts_for_its_own_caller(sqlite_engine, group, method, arg, kind, wid):
    acts = seeded(sqlite_engine)
    ledger.reserve(sqlite_engine, "a-0", plan("h1", 0, 1))
    try:
        before = rows(sqlite_engine)
        try:
            await called_by(kind, wid).run(getattr(getattr(acts, group), method), arg)
        except ApplicationError as e:  # the store's own refusal (an unknown key), never the caller rule
            assert e.type != "InvalidInput" or "acts only for" not in e.message, e.message
            return
        assert rows(sqlite_engine) != before  # it wrote
    finally:
        acts.runner.shutdown()


async def test_drain_waits_for_its_own_caller(sqlite_engine):
    acts = seeded(sqlite_engine)
    try:
        assert await called_by(I, "instance/a-0").run(acts.drain.drain_instance, DrainAsk(instance="a-0",
                                                                                          timeout_s=0)) == 0
    finally:
        acts.runner.shutdown()


async def test_model_paths_are_recorded_only_for_a_replica_its_deployment_wants(sqlite_engine):
    """The id alone is free when no workflow of it runs: ``instance/zz-9`` names no wanted replica."""
    acts = seeded(sqlite_engine)
    try:
        before = rows(sqlite_engine)
        with pytest.raises(ApplicationError, match="only for a replica its deployment wants: instance zz-9 was not "
                                                   "started by a deployment"):
            await called_by(I, "instance/zz-9").run(acts.hosts.record_model_paths,
                                                     ModelPaths(instance="zz-9", path="/m/a", present=["h1"]))
        assert rows(sqlite_engine) == before
    finally:
        acts.runner.shutdown()
