"""``gpuflow schedule`` for a prefill/decode group: formation (every role's members placed together,
or nothing), ``--scale-out ROLE`` (one more member, placed alone beside the group's members in the
cluster file) and ``--scale-in ROLE`` (the member scale-in removes). Pure policy (scheduler/groups/)
on the files given; nothing is booked."""

from __future__ import annotations

import json

from gpuflow import files
from scheduler.cluster import ClusterSnapshot
from scheduler.errors import InvalidInput
from scheduler.estimate import estimate_request
from scheduler.groups.form import form
from scheduler.groups.layers import chain
from scheduler.groups.roles import role_spec
from scheduler.groups.scale_in import scale_in
from scheduler.groups.scale_out import scale_out
from scheduler.groups.spec import RoleName, gather_problems, role_of, router_ram
from scheduler.policy_config import PolicyConfig
from scheduler.request import FlatRequest
from scheduler.spec import ModelSpec
from scheduler.summary import request_summary, summary_text
from views.render import groups as render
from views.render.dryrun import decision as render_decision

EXIT_OK, EXIT_UNSCHEDULABLE = 0, 3
PLACED_ROLES = (RoleName.PREFILL, RoleName.DECODE)  # the roles whose requests are estimated from the model


def _role(spec: ModelSpec, name: str) -> RoleName:
    try:
        role = RoleName(name)
        role_of(spec.roles, role)
    except (ValueError, KeyError):
        have = ", ".join(r.name.value for r in spec.roles or [])
        raise InvalidInput(f"--scale-out/--scale-in {name!r}: not a role of {spec.name} (its roles: {have})") from None
    return role


def role_request(spec: ModelSpec, role: RoleName, model_path: str | None):
    """A role's request: its effective spec's estimate; the router's RAM and no GPU."""
    if role == RoleName.ROUTER:
        return FlatRequest(vram=0, ram=router_ram(spec.roles), basis="the router's RAM (it loads no weights)")
    return estimate_request(role_spec(spec, role), model_path)


def check(snapshot: ClusterSnapshot, spec: ModelSpec) -> None:
    if not spec.is_group:
        raise InvalidInput(f"{spec.name} has no roles: --scale-out and --scale-in are for prefill/decode groups")
    problems = gather_problems(spec.gather, snapshot.topology)
    if problems:
        raise InvalidInput("; ".join(problems))


def schedule(a, snapshot: ClusterSnapshot, spec: ModelSpec, config: PolicyConfig) -> int:
    """The group's dry run, as ``a`` (schedule's arguments) asks; its exit code."""
    check(snapshot, spec)
    path = files.model_files_path(spec, a.model, a.model_path)
    if a.scale_in:
        role = _role(spec, a.scale_in)
        choice = scale_in(snapshot, spec, role, spec.name, config)
        if choice.victim is None:
            raise InvalidInput(f"{a.cluster}: no {role.value} member of group {spec.name} to remove "
                               "(instances carry role and group)")
        print(json.dumps({"role": role.value, **choice.to_dict()}, indent=2) if a.json else render.scale_in(choice, role.value))
        return EXIT_OK
    if a.scale_out:
        role = _role(spec, a.scale_out)
        req = role_request(spec, role, path)
        d = scale_out(snapshot, spec, role, req, spec.name, config)
        summary = request_summary(req)
        print(json.dumps({"role": role.value, **d.to_dict(), "request": summary}, indent=2) if a.json
              else render_decision(d, summary_text(summary)))
        return EXIT_OK if d.scheduled else EXIT_UNSCHEDULABLE
    roles = [r.name for r in spec.roles if r.name in PLACED_ROLES]
    requests = {r: role_request(spec, r, path) for r in roles}
    g = form(snapshot, spec, requests, config)
    summaries = {r.value: request_summary(q) for r, q in requests.items()}
    if a.json:
        print(json.dumps({**g.to_dict(), "requests": summaries}, indent=2))
    else:
        names = {x.id: x.name for x in chain(snapshot.topology)}
        print(render.formation(g, {k: summary_text(v) for k, v in summaries.items()}, names))
    return EXIT_OK if g.scheduled else EXIT_UNSCHEDULABLE
