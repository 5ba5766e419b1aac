"""Rolling a deployment's replicas to a new spec, one recorded step per loop pass.

The deployment workflow (workflows/deployment.py) keeps a :class:`RolloutState` (carried across
continue-as-new) and, while a rollout runs, calls :func:`step` instead of its scale-up/down: look
at the replicas (activities/rollout_probe.py), ask the pure policy (scheduler/rollout.py) and do
what it says: start one new-version instance, stop one old one through the workflow's stop path
(the instance drains first), wait, finish, or roll back to the last good spec. What to do next
is derived from the instances every time, so a restarted worker that replays the history
resumes without an extra stop."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from temporalio import workflow

from activities.rollout_probe import ROLLOUT_PROBE, ReplicaProbe
from scheduler.bounds import Count, Flag, Name, Text
from scheduler.rollout import DONE, ROLLBACK, START, STOP, WAIT, Replica, next_step
from scheduler.spec import ModelSpec
from workflows import common as c
from workflows.inputs import compact, invalid

POLL_S = 2.0  # between looks at the replicas while a rollout runs
SEEN_S = 2.0  # a replica answers this long before it counts as ready (the gateways re-read every 0.5 s)
KEEP_STEPS = 100
NO_ROLL = {"replicas", "autoscaling", "rollout", "tenant", "priority"}  # changing only these restarts nothing


class RolloutState(BaseModel):
    model_config = ConfigDict(extra="forbid")  # carried across continue-as-new, and untrusted: nothing unknown

    version: Count = 0  # the target spec's version
    latest: Count = 0  # the highest version handed out
    versions: dict[Name, Count] = Field({}, max_length=4000)  # instance -> the version it runs (absent: 0)
    rolling: Flag = False
    from_version: Count = 0
    good: dict[str, Any] | None = None  # the last good spec while a rollout runs
    good_version: Count = 0
    previous: dict[str, Any] | None = None  # the spec before the last change: `gpuflow rollout undo`
    rolled_back: Flag = False
    status: Text = ""
    steps: list[dict[str, Any]] = Field([], max_length=KEEP_STEPS)
    pending_since: dict[Name, Annotated[float, Field(ge=0, le=1e11)]] = Field({}, max_length=4000)
    answering_since: dict[Name, Annotated[float, Field(ge=0, le=1e11)]] = Field({}, max_length=4000)


def state_from(raw: dict | None) -> RolloutState:
    """The state carried in DeploymentInput (untrusted, like every input): a bad one fails the
    workflow at once with the problem named, never a workflow task retried forever."""
    try:
        r = RolloutState.model_validate(raw or {})
        for spec in (r.good, r.previous):
            if spec is not None:
                ModelSpec.model_validate(spec)
    except ValidationError as e:
        raise invalid(f"ModelDeploymentWorkflow: invalid input: rollout: {compact(e)}") from None
    return r


def rolls(old: ModelSpec, new: ModelSpec) -> bool:
    """Whether going from ``old`` to ``new`` replaces the replicas."""
    return old.model_dump(mode="json", exclude=NO_ROLL) != new.model_dump(mode="json", exclude=NO_ROLL)


def change_spec(wf: Any, raw: dict, new: ModelSpec, old: ModelSpec) -> None:
    """Make ``raw`` the deployment's spec: a new version to roll to, unless nothing that runs changed."""
    r: RolloutState = wf.ro
    if not rolls(old, new):
        wf.raw = raw
        return
    r.previous = wf.raw
    if not r.rolling:  # every replica runs the current spec: it is the good one to fall back on
        r.good, r.good_version, r.from_version = wf.raw, r.version, r.version
    r.latest = max(r.latest, r.version) + 1
    r.version, r.rolled_back = r.latest, False
    wf.raw = raw
    if new.rollout.strategy == "recreate":
        wf.recreate, r.rolling, r.good = True, False, None
        r.status = f"recreated as version {r.version}"
        _log(r, "recreate", [], f"strategy recreate: every replica stopped, version {r.version} started")
        return
    r.rolling = True
    r.status = f"rolling from version {r.from_version} to {r.version}"
    _log(r, "begin", [], r.status)


def _log(r: RolloutState, action: str, names: list[str], reason: str, fallback: bool = False) -> None:
    last = r.steps[-1] if r.steps else None
    if action == WAIT and last and last["action"] == WAIT and last["reason"] == reason:
        return
    r.steps.append({"at": workflow.now().isoformat(timespec="seconds"), "action": action, "names": names,
                    "reason": reason, "fallback": fallback, "version": r.version})
    del r.steps[:-KEEP_STEPS]


def _replicas(r: RolloutState, probes: list[ReplicaProbe], now: float) -> dict[str, Replica]:
    """An old replica that answers is ready at once (the gateways route it already); a new one
    once it has answered for SEEN_S, so the gateways have seen it before an old one goes."""
    out = {}
    for p in probes:
        if p.state == "pending" and p.reason.startswith("unschedulable"):
            r.pending_since.setdefault(p.name, now)
        else:
            r.pending_since.pop(p.name, None)
        if p.answers:
            r.answering_since.setdefault(p.name, now)
        else:
            r.answering_since.pop(p.name, None)
        fresh = r.versions.get(p.name, 0) == r.version
        ready = p.answers and (not fresh or now - r.answering_since[p.name] >= SEEN_S)
        out[p.name] = Replica(p.name, p.state, ready, p.restarts, r.pending_since.get(p.name))
    return out


async def step(wf: Any) -> None:
    """One step of the running rollout."""
    r: RolloutState = wf.ro
    cfg = ModelSpec.model_validate(wf.raw).rollout
    now = workflow.now().timestamp()
    probes = await workflow.execute_activity(ROLLOUT_PROBE, list(wf.instances), result_type=list[ReplicaProbe],
                                             **c.STORE_CALL)
    reps = _replicas(r, probes, now)
    live = [n for n in wf.instances if n in reps]
    old = [reps[n] for n in live if r.versions.get(n, 0) != r.version]
    new = [reps[n] for n in live if r.versions.get(n, 0) == r.version]
    s = next_step(cfg, wf.replicas or 0, old, new, now)
    if s.action == START:
        names = await wf._start_new(1)
        _log(r, START, names, s.reason)
    elif s.action == STOP:
        _log(r, STOP, s.names, s.reason, s.fallback)
        await wf._stop(s.names)
    elif s.action == DONE:
        _log(r, DONE, [], s.reason)
        r.rolling, r.good = False, None
        if not r.rolled_back:
            r.status = f"version {r.version} rolled out"
        _prune(r, wf)
    elif s.action == ROLLBACK:
        _log(r, ROLLBACK, [], s.reason)
        if r.rolled_back or r.good is None:  # the good spec fails too: stop here, keep what serves
            r.rolling, r.status = False, f"halted: {s.reason.removeprefix('rolled back: ')} while rolling back"
            return
        r.previous, wf.raw = wf.raw, r.good
        r.version, r.rolled_back, r.status = r.good_version, True, s.reason
        wf.dirty = True
    else:
        _log(r, WAIT, [], s.reason)


def _prune(r: RolloutState, wf: Any) -> None:
    keep = set(wf.instances) | set(wf.stopping)
    r.versions = {n: v for n, v in r.versions.items() if n in keep}
    r.pending_since = {n: t for n, t in r.pending_since.items() if n in keep}
    r.answering_since = {n: t for n, t in r.answering_since.items() if n in keep}


def view(wf: Any) -> dict[str, Any]:
    """The ``rollout`` query: progress, old and new counts, the steps."""
    r: RolloutState = wf.ro
    new = [n for n in wf.instances if r.versions.get(n, 0) == r.version]
    old = [n for n in wf.instances if r.versions.get(n, 0) != r.version]
    return {"name": wf.name, "status": r.status or "no rollout yet", "rolling": r.rolling, "version": r.version,
            "from_version": r.from_version, "desired": wf.replicas or 0, "old": old, "new": new,
            "stopping": sorted(wf.stopping), "can_undo": r.previous is not None, "steps": list(r.steps)}


def timeout(wf: Any, reconcile_s: float) -> timedelta:
    return c.secs(POLL_S if wf.ro.rolling else reconcile_s)
