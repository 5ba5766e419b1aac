"""Where a burst's time goes, for bench/bench_fleet.py (issue 37): the CPU of each component's
process tree, and what the Temporal server did per replica, counted from the histories.

- ``tree_cpu(pid)``: CPU seconds of a process and every descendant, living or reaped (a reaped
  child's time is in its parent's cutime/cstime), read from /proc (Linux).
- ``server_work(client, t0, t1)``: the events of every workflow history written within
  [t0, t1], by workflow type: workflow tasks (WORKFLOW_TASK_COMPLETED), activities scheduled (by
  name), local activities (markers), updates accepted, signals, search-attribute upserts, timers,
  and visibility writes (a run's start and close, and each upsert: what Temporal writes to its
  visibility store). The same counts for one trivial one-activity workflow sit beside them.
- ``steps(events)``: how long a workflow's way to its first activity's end and the workflow task
  after it took, step by step (waits in a task queue, the tasks themselves, the activity), from the
  events' times; ``step_table`` prints each step's p50 and p90 over the burst's instances beside
  the trivial workflows'.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from datetime import datetime

from temporalio.api.enums.v1 import EventType as E

CLK = os.sysconf("SC_CLK_TCK")
CLOSED = {E.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, E.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
          E.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW, E.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
          E.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT, E.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED}
KINDS = {  # event type -> the column it counts in
    E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED: "wft", E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: "act",
    E.EVENT_TYPE_MARKER_RECORDED: "local", E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED: "upd",
    E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED: "sig", E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES: "upsert",
    E.EVENT_TYPE_TIMER_STARTED: "timer"}
COLUMNS = ("events", "wft", "act", "local", "upd", "sig", "upsert", "timer", "vis")
SHORT = {"ModelInstanceWorkflow": "instance", "ModelDeploymentWorkflow": "deployment", "HostWorkflow": "host",
         "BenchTrivialWorkflow": "trivial"}


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of it and its reaped children)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), sum(int(x) for x in fields[11:15]) / CLK


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and all its descendants, living or reaped."""
    stats = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st is not None:
                stats[int(d)] = st
    kids: dict[int, list[int]] = {}
    for p, (pp, _) in stats.items():
        kids.setdefault(pp, []).append(p)
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        if p in stats:
            total += stats[p][1]
            todo.extend(kids.get(p, []))
    return total


def _ts(ev) -> float:
    return ev.event_time.seconds + ev.event_time.nanos / 1e9


def count(events, t0: float, t1: float) -> Counter:
    """One history's events within [t0, t1], by column."""
    c: Counter = Counter()
    for ev in events:
        if not t0 <= _ts(ev) <= t1:
            continue
        c["events"] += 1
        kind = KINDS.get(ev.event_type)
        if kind:
            c[kind] += 1
        if ev.event_type == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            c["act:" + ev.activity_task_scheduled_event_attributes.activity_type.name] += 1
        if ev.event_type in CLOSED or ev.event_type in (E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
                                                        E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES):
            c["vis"] += 1
    return c


STEPS = ("queued for its first task", "first task", "activity queued on its worker", "activity",
         "queued for the next task", "next task")


def steps(events) -> dict[str, float] | None:
    """Seconds of each of STEPS on the way to the first activity's end and the workflow task after
    it (None: the history does not reach that far). For an instance: the first task decides and
    books (a local activity), the activity is the launch on its host, the next task records RUNNING."""
    at: dict[str, float] = {}
    for ev in events:
        t, k = _ts(ev), ev.event_type
        if k == E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            at["start"] = t
        elif k == E.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            if "wft1" not in at:
                at["wft1"] = t
            elif "act_done" in at and "wft2" not in at:  # the task after the activity, not one before its end
                at["wft2"] = t
        elif k == E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            if "wft1_done" not in at:
                at["wft1_done"] = t
            elif "wft2" in at and "wft2_done" not in at:
                at["wft2_done"] = t
        elif k == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED and "act" not in at:
            at["act"] = t
        elif k == E.EVENT_TYPE_ACTIVITY_TASK_STARTED and "act_started" not in at:
            at["act_started"] = t
        elif k == E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED and "act_done" not in at:
            at["act_done"] = t
    order = ("start", "wft1", "wft1_done", "act", "act_started", "act_done", "wft2", "wft2_done")
    if any(x not in at for x in order):
        return None
    gaps = [at["wft1"] - at["start"], at["wft1_done"] - at["wft1"], at["act_started"] - at["act"],
            at["act_done"] - at["act_started"], at["wft2"] - at["act_done"], at["wft2_done"] - at["wft2"]]
    return dict(zip(STEPS, gaps))


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def step_table(mine: list[dict[str, float]], trivial: list[dict[str, float]]) -> list[str]:
    """Each step's p50 and p90 (ms) over the instances' ``mine`` and the trivial workflows'."""
    lines = [f"  step (ms; {len(mine)} instances, {len(trivial)} trivial workflows)   instance p50   p90   trivial p50   p90"]
    for k in STEPS:
        a, b = [x[k] * 1000 for x in mine], [x[k] * 1000 for x in trivial]
        lines.append(f"    {k:<38}{_pct(a, .5):8.0f}{_pct(a, .9):8.0f}{_pct(b, .5):11.0f}{_pct(b, .9):8.0f}")
    return lines


async def _each_history(client, runs, visit) -> None:
    """``visit(run, its history)`` for each of ``runs``, 16 histories fetched at a time."""
    sem = asyncio.Semaphore(16)

    async def one(w) -> None:
        async with sem:
            h = await client.get_workflow_handle(w.id, run_id=w.run_id).fetch_history()
        visit(w, h)

    await asyncio.gather(*(one(w) for w in runs))


async def trivial_steps(client, limit: int = 500) -> list[dict[str, float]]:
    """STEPS of the last ``limit`` trivial workflows (the ceiling's)."""
    runs = [w async for w in client.list_workflows("WorkflowType = 'BenchTrivialWorkflow'", limit=limit)]
    found = []
    await _each_history(client, runs, lambda w, h: found.append(steps(h.events)))
    return [st for st in found if st is not None]


async def server_work(client, t0: float, t1: float, skip: tuple[str, ...] = ("BenchTrivialWorkflow",),
                      instance_steps: list | None = None) -> dict[str, Counter]:
    """Workflow type (short) -> its histories' counts within [t0, t1] (epoch seconds), every run
    open then or closed since. ``instance_steps``: where each instance's ``steps`` go."""
    since = datetime.utcfromtimestamp(t0).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    runs = [w async for w in client.list_workflows(f"ExecutionStatus = 'Running' OR CloseTime > '{since}'")
            if w.workflow_type not in skip]
    out: dict[str, Counter] = {}

    def visit(w, h) -> None:
        out.setdefault(SHORT.get(w.workflow_type, "other"), Counter()).update(count(h.events, t0, t1))
        if instance_steps is not None and w.workflow_type == "ModelInstanceWorkflow":
            st = steps(h.events)
            if st is not None:
                instance_steps.append(st)

    await _each_history(client, runs, visit)
    return out


async def trivial_work(client) -> Counter:
    """One trivial one-activity workflow's whole history, counted the same way."""
    async for w in client.list_workflows("WorkflowType = 'BenchTrivialWorkflow'", limit=1):
        h = await client.get_workflow_handle(w.id, run_id=w.run_id).fetch_history()
        return count(h.events, 0, float("inf"))
    return Counter()


def table(work: dict[str, Counter], n: int, trivial: Counter) -> list[str]:
    """Per replica (``n`` placed): each workflow type's row, the total, and the trivial workflow's."""
    lines = ["  per replica     " + " ".join(f"{c:>7}" for c in COLUMNS)]
    total: Counter = Counter()
    for kind in sorted(work):
        total.update(work[kind])
        lines.append(f"    {kind:<13}" + " ".join(f"{work[kind][c] / n:7.2f}" for c in COLUMNS))
    lines.append(f"    {'all':<13}" + " ".join(f"{total[c] / n:7.2f}" for c in COLUMNS))
    lines.append(f"    {'trivial wf':<13}" + " ".join(f"{trivial[c]:7.2f}" for c in COLUMNS))
    acts = sorted(((k[4:], v) for k, v in total.items() if k.startswith("act:")), key=lambda kv: -kv[1])
    lines.append("    activities per replica: " + ", ".join(f"{k} {v / n:.2f}" for k, v in acts))
    return lines
