"""A prefill/decode group autoscaled per role, as Dynamo's SLA planner sizes prefill from TTFT and
decode from ITL, independently. Pure, like the rest of the policy: each role's decision is
``policy.decide`` on that role's own config (``role_config``: its bounds and rules, the block's
windows), its own signal history (``role_gateway``: the members of that role, and of the
gateways' role-blind view only what measures that role), its own replicas and its own anti-flap
state, with ``now`` passed in. One role's evidence, steps and refusals never touch the other's:
a role blocked on capacity does not stop the other one scaling.

What the gateways measure per model is split by whose cost it is: time to first token, queueing
and the queue are the prefill's (a prompt waits for and runs on a prefill); the gaps between
tokens are the decode's. Both roles count the requests finished and in flight (the evidence gate
of ``min_samples``). KV-cache usage comes only from the members' engines."""

from __future__ import annotations

from dataclasses import replace

from scheduler.autoscale.config import ROLE_DEFAULT_RULE, Autoscaling
from scheduler.autoscale.policy import Decision, PolicyState, decide
from scheduler.autoscale.signals import Sample, Window

ROLES = ("prefill", "decode")  # the roles an autoscaler may scale; a router runs exactly one


def role_config(cfg: Autoscaling, role: str) -> Autoscaling:
    """The plain block ``policy.decide`` reads for ``role``: the role's bounds, rules, step and
    stabilization (the block's where the role leaves them out), the block's windows."""
    r = cfg.roles[role]
    rules = r.rules or [{"kind": ROLE_DEFAULT_RULE[role]}]
    return Autoscaling.model_validate({
        "min_replicas": r.min_replicas, "max_replicas": r.max_replicas, "interval_s": cfg.interval_s,
        "rules": [x if isinstance(x, dict) else x.model_dump() for x in rules],
        "max_step": r.max_step or cfg.max_step,
        "scale_up_stabilization_s": _or(r.scale_up_stabilization_s, cfg.scale_up_stabilization_s),
        "scale_down_stabilization_s": _or(r.scale_down_stabilization_s, cfg.scale_down_stabilization_s),
        "stable_window_s": cfg.stable_window_s, "panic_window_s": cfg.panic_window_s,
        "panic_threshold": cfg.panic_threshold, "max_scale_up_rate": cfg.max_scale_up_rate,
        "max_scale_down_rate": cfg.max_scale_down_rate})


def _or(v: float | None, default: float) -> float:
    return default if v is None else v


def autoscaling_problem(cfg: Autoscaling | None, group_roles: list[str] | None) -> str | None:
    """Why a spec's autoscaling block does not fit the spec (None: it does). ``group_roles``: the
    group's role names, None for a plain deployment."""
    if cfg is None:
        return None
    if group_roles is None:
        if cfg.roles:
            return "autoscaling.roles: only a prefill/decode group (a spec with roles) is autoscaled per role"
        return None
    if not cfg.roles:
        return ("autoscaling: a prefill/decode group is autoscaled per role: give autoscaling.roles.prefill "
                "and/or autoscaling.roles.decode (their own min_replicas, max_replicas and rules)")
    missing = [r for r in cfg.roles if r not in group_roles]
    if missing:
        return f"autoscaling.roles.{missing[0]}: the group has no {missing[0]} role (its roles: {', '.join(group_roles)})"
    return None


def role_gateway(role: str, gw: Window | None) -> Window | None:
    """What of the gateways' role-blind window measures ``role``."""
    if gw is None or not gw.ok:
        return gw
    if role == "prefill":
        return replace(gw, tpot=None)
    return replace(gw, waiting=None, ttft=None, queue_time=None)


def decide_roles(cfg: Autoscaling, history: dict[str, list[Sample]], current: dict[str, int],
                 starting: dict[str, int], now: float, state: dict[str, PolicyState]
                 ) -> dict[str, tuple[Decision, PolicyState]]:
    """Each autoscaled role's decision and next state, on its own history and state only."""
    return {role: decide(role_config(cfg, role), history.get(role, []), current[role], starting.get(role, 0), now,
                         state.get(role, PolicyState()))
            for role in ROLES if cfg.roles and role in cfg.roles and role in current}
