"""The autoscaling decision: a pure function from (config, signal history, replicas, state,
``now``) to (decision, next state), in the style of Ray Serve's policy, with ``now`` passed in.

1. Bounds first: below ``min_replicas`` it scales up to it, above ``max_replicas`` down to it.
2. Cold start: at 0 replicas, any waiting request scales to max(1, min_replicas) at once, without
   waiting for a stabilization window (the gateway holds the request meanwhile).
3. The rules vote (rules.py; kpa.py for ``concurrency``) on the evidence of their windows
   (evidence.py): the stable window (``stable_window_s``, 60 s), or the panic window
   (``panic_window_s``) for a burst, each holding ``min_samples`` requests. A vote is a step from
   the RUNNING replicas: a threshold rule's ``up_step``, or the ``concurrency`` rule's computed
   desired count minus the running (KPA: desired = ceil(observed / target)). Any up wins with the
   largest step; down needs every rule, and takes the smallest step.
4. It moves to the desired count in ONE step, bounded by the step rates (KPA's): up to at most
   ceil(``max_scale_up_rate`` x running) (1000), down to at least floor(current /
   ``max_scale_down_rate``) (2: at most half), and by ``max_step`` where one is set (up_bound,
   down_bound). A rate that cuts a step is named in the reason (the other bounds are not, as before
   the rates, so that steps kept then replay with the same words).
5. A step is never taken twice on the same samples: every change of the replica count (``last_step_at``)
   starts the rules' windows afresh, so the next vote rests on samples that arrived after it. An up
   decision of which nothing could be placed is no step (``unstepped``): the windows go on, and
   the capacity-blocked re-checks decide on them again.
6. Anti-flap:
   - a direction must hold for its stabilization window; a change of direction restarts it;
   - replicas still starting count as capacity: up to running + step, and if what is already
     there (starting included) covers that, hold (one burst never scales up twice);
   - never down while a replica is still starting;
   - scale-in only after a stable window: no down until the signals cover the whole down window
     (``scale_down_stabilization_s``, 300 s) with complete samples, every vote in it down, and no
     replica added within it: a new replica or a failed scrape is no evidence of idleness;
   - every change restarts its direction's window (as Ray Serve resets its decision counter), so
     scale-down goes one step per window and never saws against the saturation point.
7. A down window with no traffic at all goes to ``min_replicas`` (0 for scale to zero) within the
   down bound; a busy one removes the rule's step (the ``concurrency`` rule's: down to its desired
   count).

The caller asks the scheduler whether the added replicas fit before creating them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from scheduler.autoscale.config import Autoscaling
from scheduler.autoscale import kpa
from scheduler.autoscale.rules import VOTERS as RULE_VOTERS
from scheduler.autoscale.rules import Vote, Windows
from scheduler.autoscale.evidence import evidence
from scheduler.autoscale.signals import Sample

UP, HOLD, DOWN = "up", "hold", "down"
RATE = "_scale_"  # in a bound's words when a step rate is what bounds it: max_scale_up_rate, max_scale_down_rate
VOTERS = {**RULE_VOTERS, "concurrency": kpa.kpa, "rps": kpa.kpa}


@dataclass(frozen=True)
class PolicyState:
    direction: int = 0  # the direction voted in a row
    since: float | None = None  # when that run of votes began
    last_up_at: float | None = None  # when replicas were last added
    last_step_at: float | None = None  # when the replica count last changed: no window reaches past it
    wanted: int | None = None  # the count a capacity-blocked step wanted and did not get (the caller sets it)


@dataclass(frozen=True)
class Decision:
    current: int  # replicas the deployment has, starting ones included
    starting: int
    desired: int
    direction: str  # up | hold | down
    rule: str  # the rule (or bound) that decided
    reason: str
    votes: list[Vote] = field(default_factory=list)

    @property
    def delta(self) -> int:
        return self.desired - self.current


def _hold(cur: int, starting: int, rule: str, why: str, votes: list[Vote]) -> Decision:
    return Decision(cur, starting, cur, HOLD, rule, why, votes)


def _covered(cfg: Autoscaling, history: list[Sample], now: float, since_up: float | None) -> str | None:
    """Why the history is no evidence for scaling down yet (None when it is)."""
    window = max(cfg.scale_down_stabilization_s, cfg.interval_s)
    if not history or now - history[0].at < window:
        return f"signals cover {now - history[0].at if history else 0:.0f} of {window:.0f} s"
    if any(not s.complete for s in history if now - window < s.at <= now):
        return "a scrape failed within the down window"
    if since_up is not None and now - since_up < window:
        return f"a replica was added {now - since_up:.0f} s ago (< {window:.0f} s)"
    return None


def decide(cfg: Autoscaling, history: list[Sample], current: int, starting: int, now: float,
           state: PolicyState = PolicyState()) -> tuple[Decision, PolicyState]:
    """The desired replica count now, why, and the state to pass to the next call."""
    lo, hi = cfg.min_replicas, cfg.max_replicas
    if current < lo:
        want = lo if cfg.max_step is None else min(lo, current + cfg.max_step)
        return Decision(current, starting, want, UP, "min_replicas", f"{current} < min_replicas {lo}"), \
            replace(state, last_up_at=now, last_step_at=now)
    if current > hi:
        want = hi if cfg.max_step is None else max(hi, current - cfg.max_step)
        return Decision(current, starting, want, DOWN, "max_replicas", f"{current} > max_replicas {hi}"), \
            replace(state, last_step_at=now)
    if current == 0 and history and history[-1].queue > 0:
        want = max(1, lo)
        return Decision(current, starting, want, UP, "cold_start",
                        f"{history[-1].queue:g} request(s) waiting with no replica"), \
            replace(state, direction=1, since=now, last_up_at=now, last_step_at=now)

    w = Windows(interval_s=cfg.interval_s, stable_s=cfg.stable_window_s, panic_s=cfg.panic_window_s,
                panic_threshold=cfg.panic_threshold, last_step_at=state.last_step_at, running=current - starting)
    votes = [VOTERS[r.kind](r, history, now, w) for r in cfg.rules]
    ups = [v for v in votes if v.direction > 0]
    direction = 1 if ups else (-1 if all(v.direction < 0 for v in votes) else 0)
    since = state.since if direction == state.direction and state.since is not None else now
    state = replace(state, direction=direction, since=since)
    held = now - since
    if direction == 0:
        if state.wanted is not None and state.wanted > current and not _fresh(w, history, now):
            return _still_wanted(cfg, current, starting, now, state, votes)
        return _hold(current, starting, "-", "; ".join(f"{v.rule}: {v.why}" for v in votes), votes), state

    if direction > 0:
        v = max(ups, key=lambda v: v.step)
        if held < cfg.scale_up_stabilization_s:
            return _hold(current, starting, v.rule, f"up for {held:.0f} of {cfg.scale_up_stabilization_s:.0f} s: "
                                                    f"{v.why}", votes), state
        running = current - starting
        cap, capped = up_bound(cfg, running, current)
        target = min(running + v.step, cap)
        if target <= current:
            why = f"{starting} replica(s) still starting cover +{v.step}" if starting else capped
            return _hold(current, starting, v.rule, f"{why}: {v.why}", votes), state
        why = f"{v.why}; {capped}" if target < running + v.step and RATE in capped else v.why  # as before the rates
        return Decision(current, starting, target, UP, v.rule, why, votes), \
            replace(state, since=now, last_up_at=now, last_step_at=now)

    v = min(votes, key=lambda v: v.step)
    if starting:
        return _hold(current, starting, v.rule, f"{starting} replica(s) still starting: no scale-down", votes), state
    if held < cfg.scale_down_stabilization_s:
        return _hold(current, starting, v.rule, f"down for {held:.0f} of {cfg.scale_down_stabilization_s:.0f} s: "
                                                f"{v.why}", votes), state
    lacking = _covered(cfg, history, now, state.last_up_at)
    if lacking:
        return _hold(current, starting, v.rule, f"{lacking}: {v.why}", votes), state
    window = max(cfg.scale_down_stabilization_s, cfg.interval_s)
    idle = all(s.idle for s in history if now - window < s.at <= now)
    floor, floored = down_bound(cfg, current)
    want = lo if idle else current - v.step
    target = max(want, floor)
    if target >= current:
        return _hold(current, starting, v.rule, floored, votes), state
    why = f"no traffic for {window:.0f} s" if idle else v.why
    why = f"{why}; {floored}" if target > max(want, lo) and RATE in floored else why  # as before the rates
    return Decision(current, starting, target, DOWN, "idle" if idle else v.rule, why, votes), \
        replace(state, since=now, last_step_at=now)


def _fresh(w: Windows, history: list[Sample], now: float) -> bool:
    """Whether the rules have seen a panic window of samples taken after the last step."""
    return evidence(history, now, w.panic(), w.last_step_at).covered


def _still_wanted(cfg: Autoscaling, current: int, starting: int, now: float, state: PolicyState,
                  votes: list[Vote]) -> tuple[Decision, PolicyState]:
    """A step placed part of what it wanted (capacity-blocked): until fresh samples say otherwise,
    the rest is still wanted, and each re-check asks the scheduler for it again."""
    cap, capped = up_bound(cfg, current - starting, current)
    target = min(state.wanted, cap)
    why = f"{state.wanted} wanted at the last step, {current} placed; no fresh samples since"
    if target <= current:
        return _hold(current, starting, "wanted", f"{capped}: {why}", votes), state
    return Decision(current, starting, target, UP, "wanted", why, votes), \
        replace(state, direction=1, since=now, last_up_at=now, last_step_at=now)


def up_bound(cfg: Autoscaling, running: int, current: int) -> tuple[int, str]:
    """The most replicas one step may go to, and what bounds it: ``max_replicas``, ``max_step``
    (when set) and ``max_scale_up_rate`` x the RUNNING replicas (1 when none runs), as KPA's
    maxScaleUp = ceil(rate x ready)."""
    caps = [(cfg.max_replicas, f"at max_replicas {cfg.max_replicas}")]
    if cfg.max_step is not None:
        caps.append((current + cfg.max_step, f"max_step {cfg.max_step} from {current}"))
    if cfg.max_scale_up_rate is not None:
        caps.append((math.ceil(cfg.max_scale_up_rate * max(running, 1) - 1e-9),
                     f"max_scale_up_rate {cfg.max_scale_up_rate:g} x {max(running, 1)} running"))
    return min(caps, key=lambda c: c[0])


def down_bound(cfg: Autoscaling, current: int) -> tuple[int, str]:
    """The fewest replicas one step may go to, and what bounds it: ``min_replicas``, ``max_step``
    (when set) and the replicas / ``max_scale_down_rate`` (floor), as KPA's maxScaleDown."""
    floors = [(cfg.min_replicas, f"at min_replicas {cfg.min_replicas}")]
    if cfg.max_step is not None:
        floors.append((current - cfg.max_step, f"max_step {cfg.max_step} from {current}"))
    if cfg.max_scale_down_rate is not None:
        floors.append((math.floor(current / cfg.max_scale_down_rate + 1e-9),
                       f"max_scale_down_rate {cfg.max_scale_down_rate:g}: {current} keep at least "
                       f"{math.floor(current / cfg.max_scale_down_rate + 1e-9)}"))
    return max(floors, key=lambda c: c[0])


def unstepped(before: PolicyState, after: PolicyState, now: float) -> PolicyState:
    """The state after an up decision of which nothing could be placed (capacity-blocked): no step
    was taken, so the windows go on from the step before and the next re-check decides on the same
    evidence again (the block, and its reason, hold for as long as it does)."""
    return replace(after, last_up_at=before.last_up_at, last_step_at=before.last_step_at,
                   since=before.since if before.direction == 1 and before.since is not None else now)
