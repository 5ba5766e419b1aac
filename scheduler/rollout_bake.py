"""A rollout's bake and its progress deadline, as pure policy (issue 38).

**The bake.** Once the last step is taken (every replica runs the new version and answers, no old
one left), the version is not good yet: it runs on probation for ``bake_s``. A new replica that
goes ERROR or restarts (its restart count grew since it was first judged) in that window rolls the
deployment back, as a failing step does; a replica not ready at the end (restarting, say) holds the
verdict until it is, for at most ``progress_deadline_s`` without progress (then it is rolled back,
naming the replicas it waited for). Only a bake that passes makes the version good. This is Kubernetes'
``minReadySeconds`` for the whole version, and Argo Rollouts' and SkyServe's health checks after
the switch: a version that crashes 20 s after start is caught.

**The progress deadline.** A rollout in which nothing changes for ``progress_deadline_s`` (no new
replica started, placed, starting, ready, no old one stopped) is rolled back and what it waited
for is named: Kubernetes' ``progressDeadlineSeconds``, except that the rollout ends instead of
only being marked.

Both are pure functions of what the deployment workflow looked at, with ``now`` passed in."""

from __future__ import annotations

import hashlib

from scheduler.rollout import BAKE, DONE, ROLLBACK, Replica, RolloutConfig, Step


def bake_step(cfg: RolloutConfig, desired: int, since: float, now: float, new: list[Replica],
              base: dict[str, int]) -> Step:
    """The bake's verdict at ``now``, the bake having begun at ``since``: ``new`` are the new
    version's replicas; ``base`` each one's restart count when the bake first saw it."""
    for r in new:
        if r.state == "error":
            return Step(ROLLBACK, reason=f"rolled back: {r.name} is ERROR {now - since:.0f} s into the bake")
        grew = r.restarts - base.get(r.name, r.restarts)
        if grew > 0:
            return Step(ROLLBACK, reason=f"rolled back: {r.name} restarted {grew} time(s) "
                                         f"{now - since:.0f} s into the bake")
    names = ", ".join(r.name for r in new) or "-"
    ready = [r for r in new if r.ready]
    if now - since < cfg.bake_s:
        return Step(BAKE, reason=f"baking {cfg.bake_s:g} s: {names} must not go ERROR nor restart")
    if len(ready) >= desired and len(ready) == len(new):
        return Step(DONE, reason=f"baked {now - since:.0f} s: {len(ready)} replica(s) ran without a restart")
    waits = ", ".join(r.name for r in new if not r.ready) or f"{desired - len(ready)} more replica(s)"
    return Step(BAKE, reason=f"baked {cfg.bake_s:g} s; waiting for {waits} to be ready")


def metric_check(cfg: RolloutConfig, base: dict, cur: dict) -> tuple[str | None, str]:
    """The bake's metric checks over the gateways' counters since the bake began (``base``, ``cur``:
    GatewayCounts as dicts: answered, errors, buckets). (why it fails or None, what was judged)."""
    if cfg.bake_max_error_ratio is None and cfg.bake_max_latency_p90_s is None:
        return None, ""
    n = max(0.0, cur.get("answered", 0) - base.get("answered", 0))
    if n < cfg.bake_min_requests:
        return None, f"metrics not judged: {n:.0f} < {cfg.bake_min_requests} requests answered"
    errs = max(0.0, cur.get("errors", 0) - base.get("errors", 0))
    ratio, said = errs / n, [f"{n:.0f} requests"]
    if cfg.bake_max_error_ratio is not None:
        said.append(f"error ratio {ratio:.3f} (<= {cfg.bake_max_error_ratio:g})")
        if ratio > cfg.bake_max_error_ratio:
            return f"error ratio {ratio:.3f} > {cfg.bake_max_error_ratio:g} ({errs:.0f} of {n:.0f} answered 5xx)", ""
    if cfg.bake_max_latency_p90_s is not None:
        p90 = quantile(base.get("buckets", {}), cur.get("buckets", {}), 0.9)
        if p90 is not None:
            said.append(f"latency p90 <= {p90:g} s (<= {cfg.bake_max_latency_p90_s:g})")
            if p90 > cfg.bake_max_latency_p90_s:
                return f"latency p90 > {cfg.bake_max_latency_p90_s:g} s (in the bucket up to {p90:g} s) over {n:.0f} requests", ""
    return None, ", ".join(said)


def quantile(base: dict[str, float], cur: dict[str, float], q: float) -> float | None:
    """The upper bound of the histogram bucket holding quantile ``q`` of what was observed between
    two scrapes of cumulative buckets (bound as text -> count; +Inf counts as infinity). None: nothing
    observed."""
    bounds = sorted((float(k), max(0.0, v - base.get(k, 0.0))) for k, v in cur.items())
    total = bounds[-1][1] if bounds else 0.0
    if total <= 0:
        return None
    return next(le for le, c in bounds if c >= q * total)


def bake_left(cfg: RolloutConfig, since: float, now: float) -> float:
    """Seconds of the bake left (0 once it has run its time: the verdict then waits only for every
    replica to be ready)."""
    return max(0.0, cfg.bake_s - (now - since))


def progress_key(old: list[Replica], new: list[Replica]) -> str:
    """What counts as progress, as a short key: the new replicas' names, states and readiness, and
    the old replicas' names. Any change is progress."""
    text = "|".join([*(f"{r.name}:{r.state}:{int(r.ready)}" for r in sorted(new, key=lambda r: r.name)), "old",
                     *sorted(r.name for r in old)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stalled(cfg: RolloutConfig, progress_at: float, now: float, waiting: Step) -> Step | None:
    """A rollout that made no progress since ``progress_at`` for ``progress_deadline_s`` (0: no
    deadline) is rolled back, naming what it waited for (``waiting``: the step it would take)."""
    if cfg.progress_deadline_s <= 0 or now - progress_at < cfg.progress_deadline_s:
        return None
    return Step(ROLLBACK, reason=f"rolled back: no progress for {now - progress_at:.0f} s (progress_deadline_s "
                                 f"{cfg.progress_deadline_s:g}): {waiting.reason or waiting.action}")
