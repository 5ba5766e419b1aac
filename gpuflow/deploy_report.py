"""What ``gpuflow deploy`` says it changed, and where the replica count comes from. Pure.

The replica count follows ``kubectl apply``: a field the file names is the file's, every time it is
applied, so a file that says ``replicas: 2`` takes a deployment scaled to 3 (``gpuflow scale``, the
autoscaler) back to 2; a file that leaves ``replicas`` out keeps the count the deployment has (a
new one starts with the spec's default, 1). Kubernetes' advice for an autoscaled Deployment is the
same: leave ``replicas`` out of the manifest. What the file undoes is said, on stderr, as a warning.

A spec change outside ``NO_ROLL`` (workflows/rollout_steps.py) replaces every replica: deploy
warns before the command returns, naming the fields that changed and how they roll.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FLAG, FILE, KEPT, DEFAULT = "the --replicas flag", "the file", "kept", "the spec's default"


def replicas_to_apply(named_in_file: bool, file_replicas: int, flag: int | None,
                      current: int | None) -> tuple[int, str]:
    """(the replica count to deploy, where it comes from): the flag, else the file when it names
    ``replicas``, else the running deployment's count, else the spec's default."""
    if flag is not None:
        return flag, FLAG
    if named_in_file:
        return file_replicas, FILE
    if current is not None:
        return current, KEPT
    return file_replicas, DEFAULT


@dataclass
class Report:
    said: list[str] = field(default_factory=list)  # stdout: what changed
    warnings: list[str] = field(default_factory=list)  # stderr


def changed_fields(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Top-level spec fields whose values differ (``replicas`` aside: it is reported on its own)."""
    return sorted(k for k in set(old) | set(new) if k != "replicas" and old.get(k) != new.get(k))


def report(name: str, before: dict[str, Any] | None, after_spec: dict[str, Any], after_replicas: int,
           source: str, rolls: bool) -> Report:
    """``before``: the deployment as it was ({"spec", "replicas"}, and for a group its ``members``
    named now, both generations' while it rolls), None when it is new. ``rolls``:
    the spec change replaces the replicas (rollout_steps.rolls)."""
    r = Report()
    if before is None:
        off = " (the group is off: replicas 0, nothing starts)" if after_spec.get("roles") and after_spec.get("replicas") == 0 else ""
        r.said.append(f"deployment {name}: created, {after_replicas} replica(s) wanted ({source}){off}")
        return r
    was, last_file = before["replicas"], before["spec"].get("replicas")
    if after_spec.get("roles") and (last_file == 0) != (after_spec.get("replicas") == 0):  # a group off or on
        live = before.get("members", was)  # mid-roll, both generations' members
        r.said.append(f"deployment {name}: the group switched off (replicas 0): its {live} member(s) stop, its roles "
                      f"kept" if after_spec.get("replicas") == 0 else
                      f"deployment {name}: the group switched on (replicas 1): {after_replicas} member(s) form whole")
    elif was != after_replicas:
        r.said.append(f"deployment {name}: replicas {was} -> {after_replicas} from {source}")
        if source == FILE and last_file is not None and was != last_file:
            r.warnings.append(
                f"warning: deployment {name} was scaled to {was} since its last deploy (gpuflow scale or its "
                f"autoscaler); the file's replicas: {after_replicas} wins. Leave replicas out of the file to "
                f"keep the current count")
    fields = changed_fields(before["spec"], after_spec)
    if fields:
        r.said.append(f"deployment {name}: spec changed ({', '.join(fields)})")
        if after_spec.get("roles") and (last_file == 0 or after_spec.get("replicas") == 0):
            # off before or after: no member runs the old spec, so nothing rolls
            r.said.append(f"deployment {name}: the group is off: no member rolls; its members start with this spec "
                          "when it is switched on" if after_spec.get("replicas") == 0 else
                          f"deployment {name}: its members form with this spec: nothing rolls")
        elif rolls and after_spec.get("roles"):
            from scheduler.groups.compat import way_of  # which way a group's edit rolls, and why

            j = way_of(before["spec"], after_spec)
            r.warnings.append(f"warning: this change of group {name} {j.said() if j else 'replaces its members'}; "
                              f"follow it with 'gpuflow rollout status {name}'")
        elif rolls:
            how = (after_spec.get("rollout") or {}).get("strategy", "rolling")
            r.warnings.append(
                f"warning: this change replaces every replica of {name}: "
                + ("strategy recreate stops them all now, then starts new ones" if how == "recreate" else
                   "a rolling upgrade (a new replica surges in, then an old one drains), "
                   f"followed by 'gpuflow rollout status {name}'"))
    if not r.said:
        r.said.append(f"deployment {name}: nothing changed ({after_replicas} replica(s))")
    return r
