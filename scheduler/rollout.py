"""Rolling a deployment to a new spec, as pure policy: what to do next, from the replicas of the
old and new versions as they are now. The deployment workflow calls it after every change and
carries out one step at a time, so a restart mid-rollout resumes from the replicas themselves.

Surge first (``max_surge`` 1, ``max_unavailable`` 0 by default): start a new replica; once it is
RUNNING and answers through the gateway, drain and stop one old replica; repeat. Availability is
``ready old + ready new >= desired - max_unavailable`` and the fleet never exceeds
``desired + max_surge``.

Where Kubernetes leaves a surge replica Pending forever on a full GPU cluster (kubernetes PR
#135993), a new replica that cannot be placed for ``surge_timeout_s`` makes that step stop-first:
one old replica is drained and stopped (``max_unavailable`` 1 for the step) so the new one gets
its GPUs; the gateway queues requests meanwhile. The fallback is recorded.

A new version that does not reach RUNNING (ERROR, or restarted ``failure_threshold`` times)
halts the rollout: ``rollback``. The caller makes the last good spec the target and rolls to it
the same way; the old replicas keep serving throughout."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import Field

from scheduler.fields import Strict  # not scheduler.cluster: it imports scheduler.spec, which imports this

START, STOP, WAIT, DONE, ROLLBACK = "start_new", "stop_old", "wait", "done", "rollback"
BAKE = "bake"  # the last step taken: the new version runs on probation (scheduler/rollout_bake.py)
FORM = "form_new"  # a prefill/decode group rolled whole: form its new generation beside the old


class RolloutConfig(Strict):
    strategy: str = Field("rolling", max_length=16, pattern="^(rolling|recreate)$", description="recreate: stop all, then start all at once, then bake.")
    max_surge: int = Field(1, ge=0, le=100, description="New replicas beyond the desired count at once. Default 1.")
    max_unavailable: int = Field(0, ge=0, le=100, description="Replicas below the desired count that may be unready. Default 0.")
    surge_timeout_s: float = Field(60, ge=0, le=86400, description="A surge replica unplaced this long makes the step stop-first. Default 60 s.")
    failure_threshold: int = Field(3, ge=1, le=100, description="Restarts of a new replica before the rollout is rolled back. Default 3.")
    bake_s: float = Field(60, ge=0, le=86400, description="After the last step, how long the new version runs on probation: "
                          "a new replica that goes ERROR or restarts in this window rolls it back; the version is good "
                          "only once its bake passes (Kubernetes' minReadySeconds, for the whole version). 0: no bake. "
                          "Default 60 s.")
    bake_max_error_ratio: float | None = Field(None, ge=0, le=1, description="During the bake, the most the "
                                               "gateways' answers of this deployment may be 5xx, as a fraction "
                                               "(gpuflow_gateway_requests); more rolls the version back. None: not judged.")
    bake_max_latency_p90_s: float | None = Field(None, gt=0, le=3600, description="During the bake, the most the "
                                                 "gateways' request duration p90 may be, in seconds "
                                                 "(gpuflow_gateway_request_duration_seconds); more rolls the version "
                                                 "back. None: not judged.")
    bake_min_requests: int = Field(20, ge=1, le=1_000_000, description="The metric checks judge only once the "
                                   "gateways answered this many requests of the deployment during the bake (fewer: "
                                   "not judged, and the bake says so). Default 20.")
    progress_deadline_s: float = Field(600, ge=0, le=86400, description="A rollout in which nothing changes for this "
                                       "long (no replica started, placed, ready or stopped) is rolled back, naming what "
                                       "it waited for (Kubernetes' progressDeadlineSeconds). 0: no deadline. Default 600 s.")


@dataclass(frozen=True)
class Replica:
    name: str
    state: str  # pending | analyzing | scheduled | downloading | starting | running | error | unreachable
    ready: bool = False  # RUNNING and answering through the gateway
    restarts: int = 0
    pending_since: float | None = None  # when it began waiting for capacity (None: placed)


@dataclass(frozen=True)
class Step:
    action: str
    names: list[str] = field(default_factory=list)  # the old replica to stop
    reason: str = ""
    fallback: bool = False  # stop-first because the surge could not be placed
    role: str = ""  # a group rolled role by role: the role this step is for
    count: int = 1  # START: how many new replicas (strategy recreate starts every missing one at once)


def next_step(cfg: RolloutConfig, desired: int, old: list[Replica], new: list[Replica], now: float) -> Step:
    """The next step of the rollout from ``old`` to ``new`` (both: the replicas that exist now)."""
    failed = [r for r in new if r.state == "error" or r.restarts >= cfg.failure_threshold]
    if failed:
        r = failed[0]
        why = f"{r.name} restarted {r.restarts} times" if r.restarts >= cfg.failure_threshold else f"{r.name} is ERROR"
        return Step(ROLLBACK, reason=f"rolled back: {why}")
    ready_old = [r for r in old if r.ready]
    ready_new = [r for r in new if r.ready]
    if not old and len(ready_new) >= desired:
        return Step(DONE, reason=f"{len(ready_new)} new replica(s) ready")
    idle_old = [r for r in old if not r.ready]
    if idle_old:  # an old replica that serves nothing can go without costing availability
        return Step(STOP, [idle_old[0].name], f"{idle_old[0].name} is not serving ({idle_old[0].state})")
    floor = desired - cfg.max_unavailable
    if old and len(ready_old) + len(ready_new) - 1 >= floor:
        return Step(STOP, [old[-1].name], f"{len(ready_old)} old + {len(ready_new)} new ready: one may go "
                                          f"and {floor} stay")
    if cfg.strategy == "recreate" and not old and len(new) < desired:  # every old one stopped: the rest at once
        return Step(START, reason=f"strategy recreate: {desired - len(new)} new replica(s) to start",
                    count=desired - len(new))
    if len(new) < desired and len(old) + len(new) < desired + cfg.max_surge:
        return Step(START, reason=f"{len(old)} old + {len(new)} new < {desired} + surge {cfg.max_surge}")
    stuck = [r for r in new if r.pending_since is not None and now - r.pending_since >= cfg.surge_timeout_s]
    if stuck and old:
        return Step(STOP, [old[-1].name],
                    f"{stuck[0].name} could not be placed for {now - stuck[0].pending_since:.0f} s "
                    f"(>= {cfg.surge_timeout_s:.0f} s): stop-first for this step", fallback=True)
    waiting = [r.name for r in new if not r.ready]
    return Step(WAIT, reason=f"waiting for {', '.join(waiting)}" if waiting else "waiting")


def next_whole_step(cfg: RolloutConfig, desired: int, old: list[Replica], new: list[Replica], named: int,
                    forming_since: float | None, now: float) -> Step:
    """The next step of a prefill/decode group rolled whole (issue 35): its new generation (``new``,
    the members placed; ``named``: members named for it and not placed yet) forms beside the old
    one (``old``, every member of an older generation), all ``desired`` members at once; once every
    one of them is ready (so the gateways serve it), the old generation is drained and stopped at
    once. A generation that cannot be placed for ``surge_timeout_s`` makes the roll stop-first: the
    old generation is stopped so the new one gets its GPUs (the fallback, recorded)."""
    failed = [r for r in new if r.state == "error" or r.restarts >= cfg.failure_threshold]
    if failed:
        r = failed[0]
        why = f"{r.name} restarted {r.restarts} times" if r.restarts >= cfg.failure_threshold else f"{r.name} is ERROR"
        return Step(ROLLBACK, reason=f"rolled back: {why}")
    ready = [r for r in new if r.ready]
    if not old and len(ready) >= desired:
        return Step(DONE, reason=f"the new generation's {len(ready)} member(s) ready")
    if not new:
        if forming_since is not None and now - forming_since >= cfg.surge_timeout_s and old:
            return Step(STOP, [r.name for r in old],
                        f"the new generation could not be placed for {now - forming_since:.0f} s "
                        f"(>= {cfg.surge_timeout_s:.0f} s): stop-first, the old generation goes", fallback=True)
        return Step(FORM, reason=f"forming the new generation ({desired} member(s)) beside {len(old)} old"
                    + (f"; {named} named, not placed yet" if named else ""))
    if len(ready) >= desired and old:
        return Step(STOP, [r.name for r in old], f"the new generation's {len(ready)} member(s) ready: the old "
                                                 f"generation ({len(old)}) drains and stops")
    waiting = [r.name for r in new if not r.ready]
    return Step(WAIT, reason=f"waiting for the new generation: {', '.join(waiting)}" if waiting else "waiting")
