"""Which way an edit of a prefill/decode group rolls, and why (issue 35). Pure: the old and new
specs in, a :class:`Judgement` out; the deployment workflow carries it out (workflows/group_roll.py)
and ``gpuflow rollout status`` shows it.

- ``none``: nothing that runs changes (a role's replicas, the fields that restart nothing for any
  deployment, the gateway's disaggregation fields such as ``readiness``): no member restarts.
- ``roles``: only what a KV hand-off does not depend on changes (env, selectors, resources, a
  parameter outside the list below, ...). The changed roles roll one after the other (prefill,
  decode, router) with the ordinary rollout (surge, drain), so while it runs a new member of one
  role serves beside old members of the other: allowed because their KV still matches.
- ``whole``: an old and a new member could not hand KV across: a new generation of the whole group
  forms beside the old one, takes the traffic once it is ready, and the old one is drained.
- ``recreate``: a deployment becomes a group or stops being one, or asks ``rollout.strategy:
  recreate``: every member stopped, then the new ones formed.

What breaks the hand-off (``whole``), per role's effective spec (the deployment's fields with the
role's overrides; flags read from ``backend_parameters`` and a custom ``run_command`` alike):
the model (``source``), the engine or its version (the KV layout and the connector's handshake are
the engine's), the disaggregation mode or vendor, the roles themselves (one added or removed),
``gather`` (the group is placed together again), and a change of any of MUST_MATCH on any role
(dtype, KV cache dtype, block size, context length, quantization, KV layout, the connector's own
config). Tensor parallelism may differ between prefill and decode (vLLM's NixlConnector maps a
prefill's TP onto a decode's), so TP is judged by pairs: a role-by-role roll pairs a new prefill
with an old decode and an old prefill with a new decode; each such (prefill TP, decode TP) pair
must be one the old or the new spec declares. Changing only one role's TP passes; changing both
does not (the cross pairs were never declared)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Literal

from scheduler.groups.roles import role_spec
from scheduler.groups.spec import RoleName
from scheduler.params import tokens
from scheduler.spec import ModelSpec

Way = Literal["none", "roles", "whole", "recreate"]
ORDER = (RoleName.PREFILL, RoleName.DECODE, RoleName.ROUTER)  # the order roles roll in
# Fields that restart nothing for any deployment (workflows/rollout_steps.py NO_ROLL) and a role's replicas.
NO_ROLL = {"replicas", "autoscaling", "rollout", "tenant", "priority", "shared_with", "routing", "claims"}
GATEWAY_ONLY = {"readiness", "skip_prefill_below"}  # disaggregation fields read by the gateways only

# Engine flags both ends of a KV hand-off must agree on: any change on any role rolls the group whole.
MUST_MATCH = {
    "dtype": ("--dtype",),
    "KV cache dtype": ("--kv-cache-dtype",),
    "block size": ("--block-size", "--page-size"),
    "context length": ("--max-model-len", "--context-length", "--ctx-size"),
    "quantization": ("--quantization", "-q"),
    "KV connector config": ("--kv-transfer-config", "--disaggregation-transfer-backend",
                            "--disaggregation-ib-device"),
}
# vLLM's KV layout follows its attention backend (and MLA); VLLM_KV_CACHE_LAYOUT (HND/NHD) where an operator allows it
LAYOUT_ENV = ("VLLM_ATTENTION_BACKEND", "VLLM_MLA_DISABLE", "VLLM_KV_CACHE_LAYOUT")
TP_FLAGS = ("--tensor-parallel-size", "-tp", "--tp", "--tp-size")


@dataclass(frozen=True)
class Judgement:
    way: Way
    roles: tuple[RoleName, ...] = ()  # way roles: the roles whose members roll, in ORDER
    why: tuple[str, ...] = field(default_factory=tuple)  # each reason, naming the field and role

    def said(self) -> str:
        """One line for ``rollout status``."""
        head = {"none": "restarts nothing", "recreate": "recreates the group (every member stopped, then formed)",
                "whole": "rolls the group whole (a new generation beside the old)",
                "roles": f"rolls role by role ({', '.join(r.value for r in self.roles)})"}[self.way]
        return f"{head}: {'; '.join(self.why)}" if self.why else head


def _flag(words: list[str], names: tuple[str, ...]) -> str | None:
    """The value argparse ends with: the last ``--k v`` or ``--k=v`` of any of ``names``."""
    found = None
    for i, t in enumerate(words[:-1]):
        if t in names or t.replace("_", "-") in names:
            found = words[i + 1]
    return found


def _words(spec: ModelSpec) -> list[str]:
    """The engine's words: a custom ``run_command``'s and the ``backend_parameters``."""
    try:
        cmd = shlex.split(spec.run_command) if spec.run_command else []
    except ValueError:
        cmd = spec.run_command.split() if spec.run_command else []
    return tokens(cmd + list(spec.backend_parameters))


def _runs(spec: ModelSpec) -> dict:
    """What a role's member runs: its effective spec without the fields that restart nothing."""
    return spec.model_dump(mode="json", exclude=NO_ROLL | {"roles", "disaggregation", "gather"})


def _tp(spec: ModelSpec) -> str:
    return _flag(_words(spec), TP_FLAGS) or "1"


def _kv_changes(old: ModelSpec, new: ModelSpec) -> list[str]:
    """What a role's KV hand-off depends on that changes, each naming the field; ``{r}`` stands
    for the role (filled by ``_per_role``, which merges the roles a deployment-wide change hits)."""
    out = []
    if old.source != new.source:
        out.append("the model changes ({r}: source)")
    if (old.backend, old.backend_version) != (new.backend, new.backend_version):
        out.append(f"the engine changes ({{r}}: backend {old.backend.value} {old.backend_version or '-'} "
                   f"-> {new.backend.value} {new.backend_version or '-'}): its KV layout and handshake are its own")
    ow, nw = _words(old), _words(new)
    for label, flags in MUST_MATCH.items():
        a, b = _flag(ow, flags), _flag(nw, flags)
        if a != b:
            out.append(f"{label} changes ({{r}}: {flags[0]} {a or 'unset'} -> {b or 'unset'})")
    for k in LAYOUT_ENV:
        if old.env.get(k) != new.env.get(k):
            out.append(f"KV layout changes ({{r}}: env {k} {old.env.get(k) or 'unset'} -> {new.env.get(k) or 'unset'})")
    return out


def _per_role(found: dict[RoleName, list[str]]) -> list[str]:
    """Each reason once, naming every role it holds for ("prefill, decode: source")."""
    roles: dict[str, list[str]] = {}
    for r, whys in found.items():
        for w in whys:
            roles.setdefault(w, []).append(r.value)
    return [w.replace("{r}", ", ".join(rs)) for w, rs in roles.items()]


def _tp_pairs(old: dict[RoleName, ModelSpec], new: dict[RoleName, ModelSpec]) -> list[str]:
    """The (prefill TP, decode TP) pairs a role-by-role roll makes that neither spec declares."""
    p, d = RoleName.PREFILL, RoleName.DECODE
    if not {p, d} <= set(old) or not {p, d} <= set(new):
        return []
    declared = {(_tp(old[p]), _tp(old[d])), (_tp(new[p]), _tp(new[d]))}
    cross = [(_tp(new[p]), _tp(old[d])), (_tp(old[p]), _tp(new[d]))]
    bad = [c for c in cross if c not in declared]
    return [f"prefill TP against decode TP: an old and a new member would pair at TP {a} -> {b}, which neither "
            f"spec declares ({' and '.join(f'{x} -> {y}' for x, y in sorted(declared))})" for a, b in bad[:1]]


def _group_fields(old: ModelSpec, new: ModelSpec) -> list[str]:
    out = []
    od, nd = old.disaggregation, new.disaggregation
    for f in ("mode", "vendor"):
        a, b = getattr(od, f, None), getattr(nd, f, None)
        if a != b:
            out.append(f"disaggregation.{f} changes ({getattr(a, 'value', a)} -> {getattr(b, 'value', b)})")
    if old.gather != new.gather:
        out.append("gather changes: the members are placed together again")
    names = lambda s: sorted(r.name.value for r in s.roles or [])  # noqa: E731
    if names(old) != names(new):
        out.append(f"the roles change ({', '.join(names(old))} -> {', '.join(names(new))})")
    return out


def _no_gateway(spec: ModelSpec) -> dict:
    d = spec.disaggregation.model_dump(mode="json") if spec.disaggregation else {}
    return {k: v for k, v in d.items() if k not in GATEWAY_ONLY}


def judge(old: ModelSpec, new: ModelSpec) -> Judgement:
    """Which way going from ``old`` to ``new`` rolls a group, and why."""
    j = _judge(old, new)
    if j.way in ("roles", "whole") and new.rollout.strategy == "recreate":
        return Judgement("recreate", why=("rollout.strategy recreate", *j.why))
    return j


def _judge(old: ModelSpec, new: ModelSpec) -> Judgement:
    if old.is_group != new.is_group:
        return Judgement("recreate", why=("the deployment " + ("becomes a group" if new.is_group else
                                                               "stops being a group"),))
    whole = _group_fields(old, new)
    if whole:
        return Judgement("whole", why=tuple(whole))
    olds = {r.name: role_spec(old, r.name) for r in old.roles or []}
    news = {r.name: role_spec(new, r.name) for r in new.roles or []}
    changed = tuple(r for r in ORDER if r in news and _runs(olds[r]) != _runs(news[r]))
    kv = _per_role({r: _kv_changes(olds[r], news[r]) for r in changed if r != RoleName.ROUTER}) + _tp_pairs(olds, news)
    if kv:
        return Judgement("whole", why=tuple(kv))
    if _no_gateway(old) != _no_gateway(new):  # a disaggregation field none of the above names: safest whole
        return Judgement("whole", why=("disaggregation changes",))
    if not changed:
        return Judgement("none")
    fields = {r: sorted(k for k in _runs(news[r]) if _runs(olds[r]).get(k) != _runs(news[r]).get(k)) for r in changed}
    why = tuple(f"{r.value}: {', '.join(fields[r])} changes; the KV hand-off does not depend on it" for r in changed)
    return Judgement("roles", roles=changed, why=why)


def way_of(old: dict, new: dict) -> Judgement | None:
    """``judge`` on two specs as written (plain JSON); None when either does not validate."""
    try:
        return judge(ModelSpec.model_validate(old), ModelSpec.model_validate(new))
    except ValueError:
        return None
