"""``gpuflow deploy`` without ``--wait``: a look of a few seconds at the first decisions, so that a
replica no host can take is said at once with its reason (issue 36), the exit code staying 0.

What it costs the cluster (issue 37): ten deploys sent at once each asked the full status (the
deployment's description and query, a query to every replica's workflow, its hosts) once a
second for up to 10 s: with 50 replicas each, 500 queries a second for the control-plane
workers to answer, the queries of a replica's workflow that is not in a worker's cache each a
replay of its history, while those workers were placing the same replicas. The look now reads
the replicas' states from Temporal's visibility (the ``GpuflowState`` search attribute every
replica workflow keeps: one list call a second), and asks the PENDING replicas why they wait (a
query each, judged by ``deploy_wait.judge``: the same verdict and lines as before) only when a
reason can matter: when the number PENDING stopped falling for two looks (placing stalled: a
replica no host can take waits PENDING), or once when the look's time is up, the first four
PENDING (replicas are placed in about their order) and, only when one of those has had its
decision, the rest (the look's end had asked every one: ten deploys of 50 sent at once, about 400
queries at one moment, mid-burst). On a loaded cluster placing is slow and stalls often: asking
every PENDING replica at each stall had still cost each deploy a query per replica a second."""

from __future__ import annotations

import asyncio
import time

from contracts.ids import INSTANCE_WORKFLOW
from contracts.search import SA_DEPLOYMENT, SA_STATE
from gpuflow.visibility import listed
from scheduler.naming import natural_key

STALL_LOOKS = 2  # PENDING not falling over this many looks (a second apart): placing stalled
SAMPLE = 4  # on a stall, the first PENDING replicas asked; the rest only when one of them has its decision
# a PENDING replica asked why it waits, not answering within this, is taken as still deciding: a replica
# whose first workflow task has not run yet (queued behind a burst) answers only once it has, and the
# status query's own 10 s had kept ten deploys of 50 sent at once looking for 17-20 s, not their 10
ASK_S = 2.0


async def states(client, name: str) -> dict[str, str]:
    """The running replica workflows of deployment ``name``: instance -> its GpuflowState (lower
    case, as the status says states), from visibility: one list call, read without the SDK's
    decoding of every search attribute (gpuflow/visibility.py)."""
    q = (f"{SA_DEPLOYMENT.name} = '{name}' AND WorkflowType = '{INSTANCE_WORKFLOW}' "
         "AND ExecutionStatus = 'Running'")
    listing = await listed(client, q, SA_STATE)
    return {wid.partition("/")[2]: (state or "PENDING").lower() for wid, state in listing.items()}


def settled(seen: dict[str, str], wanted: int) -> bool:
    """Every wanted replica exists and none waits PENDING: nothing for the look to say."""
    return len(seen) >= wanted and "pending" not in seen.values()


async def judged(client, name: str, wanted: int, seen: dict[str, str], late: bool) -> list[str] | None:
    """The PENDING replicas asked why they wait (a query each; one that does not answer is taken
    as still deciding), judged as ``--wait`` judges the status: the lines of those no host can
    take (once every replica had its first decision, or ``late``), [] when there is nothing to
    say, None when they are still deciding."""
    from gpuflow import ops
    from gpuflow.deploy_wait import judge

    async def row(n: str) -> dict:
        try:
            v = await ops.instance(client, n, ASK_S)
        except Exception:  # noqa: BLE001  busy, not yet answering (ASK_S) or gone: still deciding, for the look
            return {"name": n, "state": "pending", "reason": ""}
        return {"name": n, "state": v.state, "reason": v.reason}

    waiting = sorted((n for n, st in seen.items() if st == "pending"), key=natural_key)
    first = await ops.bounded([row(n) for n in waiting[:SAMPLE]])  # placed in about this order
    if not any(i["reason"] for i in first):
        # the first of them are still deciding: so are the rest (at the look's end, nothing to say;
        # asking each of them then cost ten deploys of 50 sent at once 400 queries at one moment)
        return [] if late else None
    asked = first + await ops.bounded([row(n) for n in waiting[SAMPLE:]])
    insts = [{"name": n, "state": st} for n, st in sorted(seen.items()) if st != "pending"] + asked
    v = judge({"name": name, "replicas": wanted, "instances": insts}, None)
    decided = len(insts) >= wanted and all(i["state"] != "pending" or i.get("reason") for i in insts)
    if v.code == 3 and (decided or late):  # as --wait judges it: with the rollout, which may make room
        from gpuflow.deploy_wait import rollout_view

        v = judge({"name": name, "replicas": wanted, "instances": insts}, await rollout_view(client, name))
    if v.code == 3 and (decided or late):
        return [*v.lines, "the replica(s) wait in the queue ('gpuflow queue'); 'gpuflow deploy --wait' exits 3 for this"]
    if v.code == 3:
        return None  # one cannot be placed, others still deciding: said once all decided, or at the end
    if v.code is not None or decided or late:
        return []
    return None


async def first_look(client, name: str, wanted: int, look_s: float, every_s: float = 1.0) -> list[str]:
    """Within ``look_s``, the lines saying which replicas of ``name`` (``wanted`` of them) wait
    because nothing can take them, once every replica has had its first decision; none when all
    are placed or starting, when one failed (``--wait`` says that), or when they are still
    deciding at the end. Said once the looks have said it for ``STUCK_S`` (``deploy_wait.said_long``)."""
    from gpuflow import deploy_wait

    deadline = time.monotonic() + look_s
    counts: list[int] = []  # PENDING at each look since every wanted replica was there
    since = None  # when the looks began to say which replicas no host can take
    while True:
        seen = await states(client, name)
        if settled(seen, wanted) or "error" in seen.values():
            return []
        if len(seen) >= wanted:  # counted once every replica is there: their coming is not a stall
            counts.append(list(seen.values()).count("pending"))
        now = time.monotonic()
        late = now > deadline
        if late or (stalled(counts) and len(seen) >= wanted):
            # placing stalled (or the time is up): the PENDING replicas say why they wait
            said = await judged(client, name, wanted, seen, late)
            since = deploy_wait.clock(bool(said), since, now)
            if said is not None and (not said or deploy_wait.said_long(since, now, deadline)):
                return said
        await asyncio.sleep(every_s)


def stalled(counts: list[int], looks: int = STALL_LOOKS) -> bool:
    """The number PENDING did not fall over the last ``looks`` looks (after the first)."""
    return len(counts) > looks and min(counts[-looks:]) >= counts[-looks - 1]
