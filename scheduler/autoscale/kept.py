"""What an autoscaler step's policy saw (scheduler/autoscale/policy.py ``decide``), kept beside the
placement decisions (store/decision_log.py, kind ``autoscale``) so the step can be re-run: the
autoscaling block, the samples in its windows, the replicas (current, starting), ``now`` and the
policy's state. ``decision_of`` is what a replay compares: the desired count, the direction, the
deciding rule, the reason and each rule's vote.

A step is kept when it did something or a rule voted (direction up or down, or the count moved):
a hold with every rule content happens every interval and is in the autoscaler's own history.
Pure (the store keeps the bytes; activities/autoscale.py decides what to keep): ``gpuflow explain
--replay`` and bench/replay_all.py re-run a step from here. The format is kept byte for byte
(VERSION): steps kept by earlier builds must replay.

A group's role step (scheduler/autoscale/roles.py) is kept the same way, with the role's own block
(``role_config``), its own samples and state, and ``role`` beside them (a key a plain step does not
have): it replays through the same ``decide``. Fields added since VERSION 1 (a sample's ``ttft``,
``itl``, ``kv_usage``, ``concurrency``; the block's ``roles``) decode to their defaults from older steps,
except the step rates (``max_scale_up_rate``, ``max_scale_down_rate``): a block kept without them
replays without them (no bound), as it was decided."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from scheduler.autoscale.codec import sample_in, sample_out, state_in
from scheduler.autoscale.config import Autoscaling
from scheduler.autoscale.policy import HOLD, Decision, PolicyState, decide
from scheduler.autoscale.signals import Sample
from scheduler.errors import InvalidInput

VERSION = 1


def worth_keeping(d: Decision) -> bool:
    return d.direction != HOLD or d.desired != d.current or any(v.direction for v in d.votes)


def encode(cfg: Autoscaling, samples: list[Sample], current: int, starting: int, now: float,
           state: PolicyState, role: str | None = None) -> bytes:
    m = {"v": VERSION, "config": cfg.model_dump(mode="json"),
         "samples": [sample_out(s) for s in samples], "current": current, "starting": starting, "now": now,
         "state": asdict(state)}
    if role is not None:
        m["role"] = role
    return json.dumps(m, sort_keys=True, separators=(",", ":")).encode()


def decision_of(d: Decision, role: str | None = None) -> dict[str, Any]:
    out = {"desired": d.desired, "direction": d.direction, "rule": d.rule, "reason": d.reason,
           "votes": [asdict(v) for v in d.votes]}
    return out if role is None else {**out, "role": role}


def replay(data: bytes) -> dict[str, Any]:
    """The step re-run on its kept inputs: ``decision_of`` its Decision. A part that does not
    decode raises InvalidInput naming it."""
    try:
        m = json.loads(data)
        if m.get("v") != VERSION:
            raise InvalidInput(f"autoscaler inputs of version {m.get('v')!r}; this gpuflow reads version {VERSION}")
        # a block kept before the step rates existed had none: replayed without them, as it decided
        config = {"max_scale_up_rate": None, "max_scale_down_rate": None, **m["config"]}
        d, _ = decide(Autoscaling.model_validate(config), [sample_in(s) for s in m["samples"]],
                      int(m["current"]), int(m["starting"]), float(m["now"]), state_in(m["state"]))
        role = m.get("role")
        if role is not None and role not in ("prefill", "decode"):
            raise ValueError(f"role {role!r} is not prefill or decode")
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidInput(f"the kept autoscaler inputs do not decode: {type(e).__name__}: {e}") from None
    return decision_of(d, role)
