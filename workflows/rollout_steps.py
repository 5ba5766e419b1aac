"""Rolling a deployment's replicas to a new spec, one recorded step per loop pass.

The deployment workflow (workflows/deployment.py) keeps a :class:`RolloutState` (carried across
continue-as-new) and, while a rollout runs, takes a rollout step instead of its scale-up/down:
it looks at the replicas (activities/rollout_probe.py), :func:`decide` asks the pure policy
(scheduler/rollout.py) over them, and the workflow does what it says: start one new-version
instance, stop one old one through its stop path (the instance drains first), wait, finish
(:func:`done`), or roll back to the last good spec (:func:`roll_back`). What to do next is
derived from the instances every time, so a restarted worker that replays the history resumes
without an extra stop. Every function here works on the typed state and values it is given
(none reaches into the workflow); the workflow does the I/O.

The state keeps the last :data:`KEEP_HISTORY` versions, each with its spec and how it ended
(:class:`Outcome`). ``gpuflow rollout undo`` goes to the newest version older than the current one
that was good, never to one rolled back for failing (:func:`undo_choice`)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ValidationError
from temporalio import workflow

from contracts.control import InstanceNames
from contracts.rollout import (KEEP_HISTORY, KEEP_STEPS, ROLLOUT_METRICS, ROLLOUT_PROBE, GatewayCounts, MetricsAsk, Outcome,
                               OutcomeView, ReplicaProbe, ReplicaProbes, RolloutState, RolloutStep, RolloutView, UndoView)
from scheduler.bounds import MAX_TEXT
from scheduler.groups.compat import ORDER, Judgement, judge
from scheduler.groups.spec import RoleName
from scheduler.rollout import BAKE, DONE, FORM, ROLLBACK, START, STOP, WAIT, Replica, Step, next_step
from scheduler.rollout_bake import bake_left, bake_step, metric_check, progress_key, stalled
from scheduler.spec import ModelSpec
from workflows import common as c
from workflows.inputs import compact, invalid

POLL_S = 2.0  # between looks at the replicas while a rollout runs
SEEN_S = 2.0  # a replica answers this long before it counts as ready (the gateways re-read every 0.5 s)
KEEP_HISTORY_BYTES = 256 * 1024  # the kept versions' specs together, as JSON (they travel in continue-as-new's input)
GOOD = ("good", "deployed")  # results undo may go back to
FAILED = ("rolled back", "halted")  # results undo never goes back to
NO_ROLL = {"replicas", "autoscaling", "rollout", "tenant", "priority", "shared_with",  # changing only these restarts nothing
           "routing", "claims"}  # routing: read by the gateways only (from the deployment's row), never by a replica


def state_from(raw: RolloutState | dict | None) -> RolloutState:
    """The state carried in DeploymentInput (untrusted, like every input; validated field by field
    with the input): what its fields cannot say is checked here. A bad one fails the workflow at
    once with the problem named, never a workflow task retried forever."""
    try:
        r = raw if isinstance(raw, RolloutState) else RolloutState.model_validate(raw or {})
        if r.good is not None:
            ModelSpec.model_validate(r.good)
    except ValidationError as e:
        raise invalid(f"ModelDeploymentWorkflow: invalid input: rollout: {compact(e)}") from None
    seen = [h.version for h in r.history]
    if seen != sorted(set(seen)) or any(v > max(r.latest, r.version) for v in seen):
        raise invalid(f"ModelDeploymentWorkflow: invalid input: rollout: history: versions {seen} are not "
                      f"increasing up to the latest, {r.latest}")
    return r


def rolls(old: ModelSpec, new: ModelSpec) -> bool:
    """Whether going from ``old`` to ``new`` replaces the replicas (a group's: any of its members)."""
    if old.is_group or new.is_group:
        return judge(old, new).way != "none"
    return old.model_dump(mode="json", exclude=NO_ROLL) != new.model_dump(mode="json", exclude=NO_ROLL)


class Change(BaseModel):
    """What a spec change asks of the deployment: its spec is now ``raw``; ``recreate``: stop every
    replica now (strategy recreate); the new ones start at once with the rollout's next step and
    then bake (a group's: with the next scale-up)."""

    raw: dict[str, Any]
    recreate: bool = False


def change_spec(r: RolloutState, current: dict, raw: dict, new: ModelSpec, old: ModelSpec,
                undo: tuple[Outcome, str] | None = None) -> Change:
    """Make ``raw`` the deployment's spec (``current`` is the one it has): a new version to roll to,
    unless nothing that runs changed. ``undo``: the version whose spec this is and what undo said
    (``gpuflow rollout undo``)."""
    j = judge(old, new) if old.is_group or new.is_group else None
    if not rolls(old, new):
        cur = _entry(r, r.version)
        if cur is not None:  # the version's spec as it is now (replicas, autoscaling, ...)
            cur.spec = new
        return Change(raw=raw)
    if not r.rolling:  # every replica runs the current spec: it is the good one to fall back on
        r.good, r.good_version, r.from_version, r.good_gen = current, r.version, r.version, r.gen
    cur = _entry(r, r.version)
    r.latest = max(r.latest, r.version) + 1
    if cur is not None and cur.result in ("rolling", "baking"):
        _record(r, cur.version, "replaced", f"version {r.latest} came before its rollout finished")
    if undo is not None:
        log_step(r, "undo", [], f"from version {r.version} to {undo[1]}")
    r.version, r.rolled_back = r.latest, False
    _unbake(r)
    recreate = new.rollout.strategy == "recreate" if j is None else _group_way(r, j, new)
    baked = recreate and j is None  # a plain deployment's recreate starts the new replicas, then bakes them
    _add(r, r.version, new, "deployed" if recreate and not baked else "rolling", undo[0].version if undo else None)
    if recreate:
        r.rolling, r.good = (True, r.good) if baked else (False, None)
        r.status = f"recreated as version {r.version}" + (": its replicas start, then it bakes" if baked else "")
        log_step(r, "recreate", [], f"strategy recreate: every replica stopped, version {r.version} started")
        return Change(raw=raw, recreate=True)
    r.rolling = True
    r.status = f"rolling from version {r.from_version} to {r.version}"
    log_step(r, "begin", [], r.status)
    return Change(raw=raw)


def _group_way(r: RolloutState, j: Judgement, new: ModelSpec) -> bool:
    """A group's edit (``j``: judged from the current spec): record which way it rolls and why; a
    whole roll (or a recreate) makes a new generation for the members to come. A roll still under
    way has members of the spec before it too: the edit is judged from that one as well, and the
    stricter way wins (a whole roll under way stays whole; roles rolling stay rolling). True: recreate."""
    was = r.way if r.rolling else ""
    jg = judge(ModelSpec.model_validate(r.good), new) if r.rolling and r.good is not None else j
    ways = (j.way, jg.way, was)
    way = "recreate" if "recreate" in ways[:2] else "whole" if "whole" in ways else j.way
    mine = {*j.roles, *jg.roles, *(RoleName(x) for x in r.roles if was == "roles")}
    roles = tuple(x for x in ORDER if x in mine) if way == "roles" else ()
    why = j.why + tuple(f"from version {r.from_version}, before the roll under way: {w}" for w in jg.why
                        if jg is not j and w not in j.why) + (("the roll under way is whole",) if was == "whole" else ())
    r.why = Judgement(way, roles, why).said()
    r.roles = [x.value for x in roles]
    r.forming_since = None
    if way in ("whole", "recreate"):
        r.gen_latest = max(r.gen_latest, r.gen) + 1
        r.gen = r.gen_latest
    r.way = way
    return way == "recreate"


# --- the versions and `gpuflow rollout undo` -------------------------------------------------------

def begin(r: RolloutState, raw: dict) -> None:
    """As the workflow starts: a new deployment's history begins with its first spec (``raw``),
    deployed without a rollout (a continued run carries its history). A spec that does not
    validate is left to the workflow's own check, which fails it naming the problem."""
    if r.history:
        return
    try:
        current = ModelSpec.model_validate(raw)
    except ValidationError:
        return
    _add(r, r.version, current, "deployed")


def undo_choice(r: RolloutState) -> tuple[Outcome | None, str]:
    """Where ``gpuflow rollout undo`` goes, and what it says; or None and why there is nowhere.

    The rule: the newest kept version older than the current one whose result is good (or
    deployed: applied without a rollout), skipping every version that failed (rolled back or
    halted), one whose spec failed again in a later version, one never finished (replaced), and
    one with the current spec. Undo applies that spec as a new version; a second undo goes back
    to the version the first one left, as ``kubectl rollout undo`` does, a failure never among them."""
    cur = _entry(r, r.version)
    skipped: list[str] = []
    for h in reversed(r.history):
        if h is cur:
            continue
        why = None
        if h.version > r.version or h.result not in GOOD:
            why = _said(h)
        elif again := next((f for f in r.history if f.version > h.version and f.result in FAILED
                            and not rolls(f.spec, h.spec)), None):
            why = f"its spec failed again as version {again.version}"
        elif cur is not None and not rolls(h.spec, cur.spec):
            why = f"the same spec as version {cur.version}"
        if why is None:
            said = f"version {h.version}'s spec ({_said(h)}{' at ' + h.at if h.at else ''})"
            return h, said + (f"; skipped {'; '.join(skipped)}" if skipped else "")
        skipped.append(f"version {h.version} ({why})")
    kept = f" (the last {KEEP_HISTORY} versions are kept)" if len(r.history) >= KEEP_HISTORY else ""
    return None, (f"no version before version {r.version} was good{kept}"
                  + (f"; skipped {'; '.join(skipped)}" if skipped else ""))


def _said(h: Outcome) -> str:
    return f"{h.result}: {h.reason}" if h.reason else h.result


def _entry(r: RolloutState, version: int) -> Outcome | None:
    return next((h for h in reversed(r.history) if h.version == version), None)


def _record(r: RolloutState, version: int, result: str, reason: str = "") -> None:
    h = _entry(r, version)
    if h is not None:
        h.result, h.reason, h.at = result, reason[:MAX_TEXT], _now()


def _add(r: RolloutState, version: int, spec: ModelSpec, result: str, undo_of: int | None = None,
         reason: str = "") -> None:
    r.history.append(Outcome(version=version, result=result, reason=reason[:MAX_TEXT], at=_now(), undo_of=undo_of,
                             spec=spec))
    keep = {r.version, r.good_version}  # the current version, and the good one a rollback returns to
    sizes = [len(h.spec.model_dump_json(exclude_none=True)) for h in r.history]
    while len(r.history) > KEEP_HISTORY or sum(sizes) > KEEP_HISTORY_BYTES:  # the oldest go first
        i = next((i for i, h in enumerate(r.history) if h.version not in keep), None)
        if i is None:
            break
        del r.history[i], sizes[i]


def _now() -> str:
    return workflow.now().isoformat(timespec="seconds")


def log_step(r: RolloutState, action: str, names: list[str], reason: str, fallback: bool = False) -> None:
    """A step of the rollout, in its log (a WAIT, or a group's FORM still waiting for room,
    repeating the last one is not logged again)."""
    last = r.steps[-1] if r.steps else None
    if action in (WAIT, FORM) and last and (last.action, last.reason, last.names) == (action, reason, names):
        return
    r.steps.append(RolloutStep(at=_now(), action=action, names=names, reason=reason, fallback=fallback,
                               version=r.version))
    del r.steps[:-KEEP_STEPS]


def seen(r: RolloutState, probes: list[ReplicaProbe], now: float) -> dict[str, Replica]:
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


def decide(r: RolloutState, raw: dict, replicas: int, instances: list[str], probes: list[ReplicaProbe],
           now: float, bake: bool = True, counts: GatewayCounts | None = None) -> Step:
    """The rollout's next step, from a look at its replicas (``probes``, taken at ``now``): the
    pure policy's (scheduler/rollout.py ``next_step``) over the old and new versions' replicas.
    Once the last step is taken, the version bakes, and a rollout without progress for
    ``progress_deadline_s`` is rolled back (scheduler/rollout_bake.py); ``bake`` False: neither
    (the rollout as it was before issue 38, for tests that compare). ``counts``: the gateways'
    counters now (:func:`look`), for the bake's metric checks."""
    cfg = ModelSpec.model_validate(raw).rollout
    reps = seen(r, probes, now)
    live = [n for n in instances if n in reps]
    old = [reps[n] for n in live if r.versions.get(n, 0) != r.version]
    new = [reps[n] for n in live if r.versions.get(n, 0) == r.version]
    step = next_step(cfg, replicas, old, new, now)
    if not bake or step.action == ROLLBACK and r.bake_since is None:
        return step
    key = progress_key(old, new)
    if r.progress_at is None or key != r.progress_key or step.action in (START, STOP):
        r.progress_at, r.progress_key = now, key
    if step.action in (START, STOP):
        return step
    if r.bake_since is None and step.action != DONE:
        return stalled(cfg, r.progress_at, now, step) or step
    if r.rolled_back or cfg.bake_s <= 0:  # back to a good version (or no bake asked): done
        return step
    if r.bake_since is None:  # the last step is taken: the version runs on probation
        r.bake_since = now
        _record(r, r.version, "baking", f"for {cfg.bake_s:g} s from {_now()}")
    for x in new:
        r.bake_base.setdefault(x.name, x.restarts)
    verdict = bake_step(cfg, replicas, r.bake_since, now, new, r.bake_base)
    r.bake_counts = r.bake_counts or counts  # the metric checks count from the bake's start
    if verdict.action != ROLLBACK and counts is not None and r.bake_counts is not None:
        why, said = metric_check(cfg, r.bake_counts.model_dump(), counts.model_dump())
        if why:
            verdict = Step(ROLLBACK, reason=f"rolled back: {why}, {now - r.bake_since:.0f} s into the bake")
        elif said:
            verdict = Step(verdict.action, reason=verdict.reason if verdict.action == BAKE else f"{verdict.reason}; {said}")
    if step.action == ROLLBACK and verdict.action != ROLLBACK:  # failed before the bake saw it (restarts >= threshold)
        return step
    if verdict.action == BAKE and bake_left(cfg, r.bake_since, now) <= 0:  # its time is up, a replica not ready
        verdict = stalled(cfg, r.progress_at, now, verdict) or verdict
    if verdict.action == BAKE:
        left = bake_left(cfg, r.bake_since, now)
        r.status = (f"baking version {r.version}: {left:.0f} s left of {cfg.bake_s:g}; a new replica that goes "
                    f"ERROR or restarts rolls it back" if left > 0 else f"baking version {r.version}: {verdict.reason}")
    return verdict


def _unbake(r: RolloutState) -> None:
    r.bake_since, r.bake_base, r.progress_at, r.progress_key, r.bake_counts = None, {}, None, "", None


async def look(r: RolloutState, raw: dict, name: str, instances: list[str]
               ) -> tuple[list[ReplicaProbe], GatewayCounts | None]:
    """A look at the rollout's replicas (the rollout_probe activity) and, for a rollout whose spec
    sets a metric threshold, the gateways' counters for the bake's checks (rollout_metrics; None
    and no activity otherwise)."""
    probed = await workflow.execute_activity(ROLLOUT_PROBE, InstanceNames(names=list(instances)),
                                             result_type=ReplicaProbes, **c.STORE_CALL)
    cfg = ModelSpec.model_validate(raw).rollout
    if not r.rolling or r.rolled_back or cfg.bake_s <= 0 or (cfg.bake_max_error_ratio is None
                                                           and cfg.bake_max_latency_p90_s is None):
        return probed.probes, None
    return probed.probes, await workflow.execute_activity(ROLLOUT_METRICS, MetricsAsk(deployment=name),
                                                          result_type=GatewayCounts, **c.STORE_CALL)


def done(r: RolloutState, reason: str, keep: set[str]) -> None:
    """Every replica runs the target and answers: the rollout ends; the version was good. What it
    kept per replica is kept only for ``keep`` (the deployment's instances and those stopping)."""
    log_step(r, DONE, [], reason)
    r.rolling, r.good = False, None
    _unbake(r)
    if not r.rolled_back:
        r.status = f"version {r.version} rolled out"
        _record(r, r.version, "good")
    _prune(r, keep)


def roll_back(r: RolloutState, reason: str) -> dict | None:
    """A new replica failed: the last good spec is the target again (its version too; returned,
    to become the deployment's spec), and the failed version is recorded so undo never goes back
    to it. If the good spec fails as well (or none is known), the rollout halts where it is and
    keeps what serves (None)."""
    log_step(r, ROLLBACK, [], reason)
    _unbake(r)
    why = reason.removeprefix("rolled back: ")
    if r.rolled_back or r.good is None:
        r.rolling, r.status = False, f"halted: {why} while rolling back"
        _record(r, r.version, "halted", f"{why} while rolling back")
        return None
    _record(r, r.version, "rolled back", why)
    r.version, r.rolled_back, r.status = r.good_version, True, reason
    if r.way == "whole":  # a group rolled whole: back to the generation that serves the good spec
        r.gen = r.good_gen
    return r.good


def _prune(r: RolloutState, keep: set[str]) -> None:
    r.versions = {n: v for n, v in r.versions.items() if n in keep}
    r.gens = {n: g for n, g in r.gens.items() if n in keep}
    r.pending_since = {n: t for n, t in r.pending_since.items() if n in keep}
    r.answering_since = {n: t for n, t in r.answering_since.items() if n in keep}


def view(r: RolloutState, name: str, replicas: int, instances: list[str], stopping: set[str]) -> RolloutView:
    """The ``rollout`` query: progress, old and new counts, the steps."""
    new = [n for n in instances if r.versions.get(n, 0) == r.version]
    old = [n for n in instances if r.versions.get(n, 0) != r.version]
    to, said = undo_choice(r)
    cfg = _cfg(r)
    baking = r.rolling and r.bake_since is not None and cfg is not None
    left = bake_left(cfg, r.bake_since, workflow.now().timestamp()) if baking else 0.0
    return RolloutView(baking=baking, bake_left_s=round(left, 1),
                       bake_judged=_judged(cfg) if baking else "",
                       name=name, status=r.status or "no rollout yet", rolling=r.rolling, version=r.version,
                       from_version=r.from_version, desired=replicas, old=old, new=new, stopping=sorted(stopping),
                       can_undo=to is not None, undo=UndoView(to=to.version if to else None, says=said),
                       steps=list(r.steps), history=[OutcomeView(**h.model_dump(exclude={"spec"})) for h in r.history],
                       way=r.way, why=r.why, gen=r.gen)


def _judged(cfg) -> str:
    said = ["a new replica that goes ERROR or restarts rolls the version back"]
    if cfg.bake_max_error_ratio is not None:
        said.append(f"so does a 5xx ratio above {cfg.bake_max_error_ratio:g} at the gateways")
    if cfg.bake_max_latency_p90_s is not None:
        said.append(f"or a request duration p90 above {cfg.bake_max_latency_p90_s:g} s")
    return "; ".join(said) + (f" (once {cfg.bake_min_requests} requests were answered)" if len(said) > 1 else "")


def _cfg(r: RolloutState):
    """The target version's rollout config (None: its spec is not kept)."""
    h = _entry(r, r.version)
    return h.spec.rollout if h is not None else None


def undo_raw(to: Outcome, current: dict, replicas: int) -> dict:
    """The spec undo applies: ``to``'s, with today's replica count (a group's: each role's today,
    for the roles both specs have)."""
    raw = to.raw()
    if not raw.get("roles"):
        return {**raw, "replicas": replicas}
    now = {x.get("name"): x.get("replicas", 1) for x in current.get("roles") or []}
    return {**raw, "roles": [{**x, "replicas": now.get(x.get("name"), x.get("replicas", 1))} for x in raw["roles"]]}


def timeout(r: RolloutState, reconcile_s: float) -> timedelta:
    """How long the deployment's loop waits for news: a look every POLL_S while a rollout runs."""
    return c.secs(POLL_S if r.rolling else reconcile_s)
