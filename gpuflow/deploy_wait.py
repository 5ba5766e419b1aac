"""``gpuflow deploy --wait``: look at the deployment until it is done, and say how it ended.

``judge`` is the rule, pure, over what ``gpuflow status`` shows (the deployment's instances) and
the ``rollout`` query; ``wait`` asks Temporal once a second and prints a progress line on stderr
whenever the counts change. Exit codes, as ``gpuflow schedule``'s, and a CI can trust them
(issue 38):

- 1: a replica is ERROR (its reason; a replica whose engine fails at start is ERROR between its
  restarts), or the version this deploy made was rolled back (a failing step, a failed bake, the
  progress deadline), halted or replaced by a newer one, or ``--timeout`` passed;
- 3: a replica waits PENDING because no host can take it (``unschedulable: ...``, the decisive
  reasons) or its tenant's quota is full (``quota: ...``), and no rollout step can make room for it:
  no old replica is left to stop (a stop-first rollout stops one after ``surge_timeout_s``) and none
  is still stopping (``strategy: recreate`` frees the GPUs as its old replicas stop), on every
  look for ``STUCK_S`` (5 s: a replica placed in the room a step just made is not said stuck);
- 0: the rollout (any strategy) has finished and its bake passed: every wanted replica is RUNNING,
  no rollout (nor bake) is under way and no old replica is left; or the deployment is a group
  switched off (its ``replicas`` 0): said at once.

The first verdict that holds decides, in that order: a failure is reported even while another
replica waits for room.

Without ``--wait``, deploy looks a few seconds (``first_look``) for the first decisions: a replica
that no host can take is said at once, with its reason (issue 36: it printed only "created"),
and the exit code stays 0.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable

from views.render.cluster import counts

WAITING = ("unschedulable", "quota:")  # a PENDING reason that says no placement can be made now
# A verdict 3 stands once every look for this long said it: a replica's PENDING reason is its last
# decision's, and the store and the rollout query are two reads, so one look can see a rollout with
# no old replica left while the replica it just stopped to make room is not placed yet (it is, a
# moment later: the freed GPU wakes the queue).
STUCK_S = 5.0


@dataclass
class Verdict:
    code: int | None  # None: not done yet
    lines: list[str]


FAILED = ("rolled back", "halted", "replaced")  # how the version a deploy made may end, and fail


def judge(dep: dict[str, Any], rollout: dict[str, Any] | None, version: int | None = None) -> Verdict:
    """The verdict on one deployment row of ``ops.status`` and its rollout view; ``version``: the
    version this deploy made (the rollout view's at the first look), judged by how it ended."""
    insts = dep.get("instances", [])
    if (dep.get("group") or {}).get("off"):  # switched off: nothing to wait for
        left = f" ({len(insts)} member(s) still stopping)" if insts else ""
        return Verdict(0, [f"deployment {dep['name']}: the group is off (replicas 0){left}; "
                           f"'gpuflow scale {dep['name']} 1' switches it on"])
    failed = [i for i in insts if i["state"] == "error"]
    if failed:
        return Verdict(1, [f"{i['name']}: ERROR: {i.get('reason') or 'no reason recorded'}" for i in failed])
    ended = _ended(dep["name"], rollout, version)
    if ended:
        return Verdict(1, [ended])
    stuck = [i for i in insts if i["state"] == "pending" and (i.get("reason") or "").startswith(WAITING)]
    room = rollout is not None and bool(rollout.get("rolling") and rollout.get("old") or rollout.get("stopping"))
    if stuck and not room:  # a rollout that will stop an old replica (or is stopping one) makes room: it waits
        return Verdict(3, [f"{i['name']}: PENDING: {i['reason']}" for i in stuck])
    busy = rollout is not None and (rollout.get("rolling") or rollout.get("old") or rollout.get("stopping"))
    wanted = dep.get("wanted", dep["replicas"])  # a group's: every role's replicas
    if not busy and len(insts) == wanted and all(i["state"] == "running" for i in insts):
        if dep.get("group"):
            return Verdict(0, [f"deployment {dep['name']}: the group RUNNING ({dep['group']['roles']})"])
        return Verdict(0, [f"deployment {dep['name']}: {dep['replicas']} of {dep['replicas']} replica(s) RUNNING"])
    return Verdict(None, [progress_line(dep, rollout)])


def _ended(name: str, rollout: dict[str, Any] | None, version: int | None) -> str:
    """The line saying how the version this deploy made failed, or "" (not failed, or not known)."""
    if not rollout:
        return ""
    mine = [h for h in rollout.get("history") or [] if version is not None and h.get("version") == version]
    if mine and mine[-1].get("result") in FAILED:
        h = mine[-1]
        return (f"deployment {name}: version {version} was {h['result']}"
                + (f": {h['reason']}" if h.get("reason") else ""))
    status = str(rollout.get("status") or "")
    if version is None and status.startswith(("rolled back", "halted")):  # no version known: the status says
        last = (rollout.get("history") or [{}])[-1]
        why = status if ":" in status else status + (f": {last['reason']}" if last.get("reason") else "")
        return f"deployment {name}: its rollout was {why}"
    return ""


def clock(stuck: bool, since: float | None, now: float) -> float | None:
    """When the looks began to say a replica is stuck: ``since`` kept while they still say it,
    started ``now`` by the first that does, None once one does not (``held``, ``said_long``)."""
    return (now if since is None else since) if stuck else None


def held(v: Verdict, since: float | None, now: float, line: str) -> tuple[Verdict, float | None]:
    """A verdict 3 only once it has held on every look since ``since`` for ``STUCK_S`` (until then
    the progress ``line``); any other verdict as it is. Returns the verdict and the new ``since``."""
    since = clock(v.code == 3, since, now)
    if since is None or now - since >= STUCK_S:
        return v, since
    return Verdict(None, [line]), since


def said_long(since: float, now: float, deadline: float) -> bool:
    """Whether a look without ``--wait`` (``first_look``, ``deploy_look.first_look``) has said which
    replicas no host can take since ``since`` long enough to say it: for ``STUCK_S``, as ``held``
    holds exit 3, or until that long past the look's ``deadline``."""
    return now - since >= STUCK_S or now > deadline + STUCK_S


def progress_line(dep: dict[str, Any], rollout: dict[str, Any] | None) -> str:
    roll = " (rolling)" if rollout and rollout.get("rolling") else ""
    if rollout and rollout.get("baking"):
        roll = f" (baking: {rollout.get('bake_left_s', 0):.0f} s left)"
    insts = dep.get("instances", [])
    have = counts(insts) if insts else "no replica made yet"
    if dep.get("group"):
        return f"deployment {dep['name']}: {have}; the group: {dep['group']['roles']}{roll}"
    return f"deployment {dep['name']}: {have} of {dep['replicas']} wanted{roll}"


async def wait(client, name: str, timeout_s: float, say: Callable[[str], None], every_s: float = 1.0) -> Verdict:
    """Ask until ``judge`` decides or ``timeout_s`` passes; ``say`` gets each new progress line."""
    from contracts.ids import DEPLOYMENT_ROLLOUT, deployment_id
    from gpuflow import broken, ops

    deadline, last, version, stuck = time.monotonic() + timeout_s, None, None, None
    while True:
        dep = (await ops.status(client, name))["deployments"][0]
        if dep.get("broken"):
            return Verdict(1, [f"deployment {name}: BROKEN: {dep['broken']}"])
        h = client.get_workflow_handle(deployment_id(name))
        try:
            rollout = await broken.query(h, DEPLOYMENT_ROLLOUT)
        except Exception:  # noqa: BLE001  judged without it; the next look asks again
            rollout = {"rolling": True}
        if version is None and "version" in rollout:  # the version this deploy made: judged by how it ends
            version = rollout["version"]
        v, stuck = held(judge(dep, rollout, version), stuck, time.monotonic(), progress_line(dep, rollout))
        if v.code is not None:
            return v
        if v.lines[0] != last:
            say(v.lines[0])
            last = v.lines[0]
        if time.monotonic() > deadline:
            return Verdict(1, [f"deployment {name}: not done within {timeout_s:g} s: {last}"])
        await asyncio.sleep(every_s)


async def rollout_view(client, name: str) -> dict | None:
    """The deployment's rollout view (its ``rollout`` query), or None when it does not answer: a
    rolling update whose next step stops an old replica makes room for one that waits."""
    from contracts.ids import DEPLOYMENT_ROLLOUT, deployment_id
    from gpuflow import broken

    try:
        return await broken.query(client.get_workflow_handle(deployment_id(name)), DEPLOYMENT_ROLLOUT)
    except Exception:  # noqa: BLE001  judged without it, as before
        return None


async def first_look(client, name: str, look_s: float, every_s: float = 1.0) -> Verdict:
    """Within ``look_s``, the replicas of ``name`` that wait because nothing can take them (the
    lines of a verdict 3), once every replica has had its first decision; no line when all are
    placed or starting, when one failed (``--wait`` says that), or when they are still deciding.
    Said once the looks have said it for ``STUCK_S`` (``said_long``)."""
    from gpuflow import ops

    deadline, since = time.monotonic() + look_s, None
    while True:
        dep = (await ops.status(client, name))["deployments"][0]
        insts = dep.get("instances", [])
        v = judge(dep, None)
        decided = len(insts) >= dep.get("wanted", dep.get("replicas", 0)) and all(i["state"] != "pending" or i.get("reason") for i in insts)
        now = time.monotonic()
        late = now > deadline
        if v.code == 3 and (decided or late):  # as --wait judges it: with the rollout, which may make room
            v = judge(dep, await rollout_view(client, name))
        stuck = v.code == 3 and (decided or late) and not dep.get("broken")
        since = clock(stuck, since, now)
        if stuck and said_long(since, now, deadline):
            return Verdict(0, [*v.lines, "the replica(s) wait in the queue ('gpuflow queue'); "
                                         "'gpuflow deploy --wait' exits 3 for this"])
        if not stuck and (v.code is not None or decided or late or dep.get("broken")):
            return Verdict(0, [])
        await asyncio.sleep(every_s)
