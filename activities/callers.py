"""Who may call each control-plane activity that writes: the workflow its input names, and only it.

Every activity registered on ``gpuflow-control`` can be scheduled by any workflow of anybody's, run
on their own worker, and our control-plane worker runs it: Temporal checks no caller. A local
activity is no exception: how it is run is the caller's choice, and a workflow of one's own may
schedule ``record_instance`` as a plain activity on our queue. So each writer checks its caller
here, whether run locally or not: the caller's workflow type and id, as the Temporal server names
them (``activity.info()``, which no input can forge), against the workflow its input names.

The id is the rule; the type says what the message names (a workflow of one's own may take any
type's name). While the real workflow of an id runs, nobody else can run one of that id; an id no
workflow holds is free, so the writes that give capacity or traffic are proven besides: a host's
inventory by its report's MAC (activities/hosts.py ``host_seen``), a replica's address by its
launch's MAC (store/engine_keys.py ``check_launches``).

``READS`` are left open, each with why: they change nothing (and what they return, a workflow's
history shows to anyone who can read it anyway). ``tests/test_callers.py`` fails on an activity in
neither table."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from contracts import activity_names as c
from contracts import cluster as cc
from contracts.autoscale import AUTOSCALE_APPLY, AUTOSCALE_STEP, START_AUTOSCALER
from contracts.group import FORM_GROUP, PLACE_MEMBER, SCALE_IN_MEMBER
from contracts.pd_health import GROUP_PD_HEALTH
from contracts.ids import (CLUSTER_ID, CLUSTER_WORKFLOW, DEPLOYMENT_WORKFLOW, HOST_WORKFLOW, INSTANCE_WORKFLOW,
                          autoscaler_id, deployment_id, host_id, instance_id)
from contracts.rollout import ROLLOUT_METRICS, ROLLOUT_PROBE
from contracts.usage import RECORD_USAGE

log = logging.getLogger("gpuflow.callers")

INSTANCE, DEPLOYMENT, HOST, CLUSTER = INSTANCE_WORKFLOW, DEPLOYMENT_WORKFLOW, HOST_WORKFLOW, CLUSTER_WORKFLOW
AUTOSCALER, SWEEP = "AutoscalerWorkflow", "QueueSweepWorkflow"
SWEEP_ID = "queue-sweep"  # workflows/queue_sweep.py SWEEP_ID (activities import no workflow)


@dataclass(frozen=True)
class Rule:
    """The caller an activity acts for: of type ``workflow``, with each id ``ids(input)`` names."""

    workflow: str
    ids: Callable[[Any], list[str]]


def of_deployment(instance: str) -> str:
    """The workflow id of the deployment an instance ``<deployment>-<n>`` belongs to."""
    head, _, n = instance.rpartition("-")
    return deployment_id(head) if head and n.isdigit() else f"(no deployment names a replica {instance!r})"


def _instance(a: Any) -> list[str]:
    return [instance_id(a.instance)]


def _deployment(a: Any) -> list[str]:
    return [deployment_id(a.deployment)]


def _autoscaler(a: Any) -> list[str]:
    return [autoscaler_id(a.deployment)]


def _host(a: Any) -> list[str]:
    return [host_id(a.name)]


RULES: dict[str, Rule] = {
    # the instance workflow, for its own replica
    c.PLACE_REPLICA: Rule(INSTANCE, _instance),
    c.PREEMPT_PLACEMENT: Rule(INSTANCE, _instance),
    c.RELEASE_PLACEMENT: Rule(INSTANCE, _instance),
    c.DRAIN_INSTANCE: Rule(INSTANCE, _instance),
    c.RECORD_INSTANCE: Rule(INSTANCE, lambda r: [instance_id(r.name)]),  # local
    c.RECORD_MODEL_PATHS: Rule(INSTANCE, lambda p: [instance_id(p.instance or "")]),
    # the deployment workflow, for itself and its own replicas
    c.SAVE_DEPLOYMENT: Rule(DEPLOYMENT, lambda r: [deployment_id(r.name)]),
    GROUP_PD_HEALTH: Rule(DEPLOYMENT, _deployment),  # writes its decodes' witness samples
    c.START_INSTANCES: Rule(DEPLOYMENT, lambda b: [deployment_id(i.deployment) for i in b.instances]),
    c.CLOSED_WORKFLOWS: Rule(DEPLOYMENT, lambda n: [of_deployment(x) for x in n.names]),
    START_AUTOSCALER: Rule(DEPLOYMENT, _deployment),
    FORM_GROUP: Rule(DEPLOYMENT, lambda a: [deployment_id(a.deployment)] + [of_deployment(m.name) for m in a.members]),
    PLACE_MEMBER: Rule(DEPLOYMENT, lambda a: [deployment_id(a.deployment), of_deployment(a.member.name)]),
    # the autoscaler, for its deployment (a step keeps its inputs and may call the capacity hook)
    AUTOSCALE_STEP: Rule(AUTOSCALER, _autoscaler),
    AUTOSCALE_APPLY: Rule(AUTOSCALER, _autoscaler),
    # the host workflow, for its own host
    c.HOST_SEEN: Rule(HOST, lambda k: [host_id(k.host)]),
    c.HOST_LOST: Rule(HOST, _host),
    c.HOST_FORGET: Rule(HOST, _host),
    c.HOST_CORDON: Rule(HOST, _host),
    c.CHECK_HOST_REPORT: Rule(HOST, lambda k: [host_id(k.host)]),  # local; records a host's join
    RECORD_USAGE: Rule(HOST, lambda b: [host_id(b.host)]),  # local
    # the one cluster workflow and the one queue sweep
    cc.APPLY_TENANTS: Rule(CLUSTER, lambda _: [CLUSTER_ID]),
    cc.ADD_KEY: Rule(CLUSTER, lambda _: [CLUSTER_ID]),
    cc.REVOKE_KEY: Rule(CLUSTER, lambda _: [CLUSTER_ID]),
    cc.KEY_LIMITS: Rule(CLUSTER, lambda _: [CLUSTER_ID]),
    c.SWEEP_QUEUE: Rule(SWEEP, lambda _: [SWEEP_ID]),
}

READS: dict[str, str] = {
    c.ESTIMATE_MODEL: "costs a spec (CPU, the hub's headers); writes nothing",
    c.VICTIMS_LEFT: "which preempted replicas may still run",
    c.RANK_SCALE_DOWN: "an order of replicas to remove; the deployment removes them",
    c.MODEL_READERS: "which hosts to ask for a local path",
    c.DEPLOYMENT_LIMITS: "this server's settings",
    c.TENANT_PROBLEM: "whether the tenants file names a tenant",
    c.BOOKING_ON: "the ledger's booking of one instance on one host (local)",
    c.BOOKINGS_ON: "the ledger's bookings on one host (local)",
    c.HELD_PLAN: "whether the ledger holds a placement (local)",
    ROLLOUT_PROBE: "the replicas' status queries and whether their ports answer",
    ROLLOUT_METRICS: "sums the gateways' counters for one deployment, as /metrics shows them",
    SCALE_IN_MEMBER: "the group member a role's scale-in removes; the deployment removes it",
}


def problem(name: str, workflow_type: str, workflow_id: str, arg: Any) -> str | None:
    """Why a caller (its workflow's type and id) may not run activity ``name`` on ``arg`` (None: it may)."""
    rule = RULES[name]
    for wid in rule.ids(arg) or [""]:
        if workflow_type != rule.workflow or (wid and workflow_id != wid):
            want = f"{rule.workflow} {wid!r}" if wid else rule.workflow
            return (f"{name} acts only for the workflow its input names ({want}); called by "
                    f"{workflow_type or 'no workflow'} {workflow_id!r}")
    return None


def check(name: str, arg: Any) -> None:
    """Refuse the running activity ``name`` (InvalidInput, non-retryable, logged) unless its caller
    is the workflow ``arg`` names; nothing is read or written before."""
    info = activity.info()
    why = problem(name, info.workflow_type or "", info.workflow_id or "", arg)
    if why:
        log.warning("refused a call: %s", why)
        raise ApplicationError(why, type="InvalidInput", non_retryable=True)
