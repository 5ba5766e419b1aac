"""A kept decision replayed, and a deployment's kept decisions listed (store/decision_log.py): the
work behind ``gpuflow explain --replay/--history``, done by the CLI on a store it names
(gpuflow/cli/explain.py) or by a control-plane worker for the cluster workflow's ``audit`` update
(activities/cluster.py), and behind bench/replay_all.py. ``outcome`` and ``step`` say a decision
in one line.

It reads the store and runs pure code only: the inputs decoded (store/decision_codec.py), the
placement policy on them as records (contracts/decision_of.py over scheduler/decision_inputs.py),
an autoscaler step re-run (scheduler/autoscale/kept.py), a prefill/decode group member's decision
re-run with its group's policy (scheduler/group_inputs.py: the whole formation, or scale_out for a
member placed alone; contracts/group_decision_of.py makes the member's record). No activity module is imported: a
replay is the policy of this build on what was kept, whoever runs it."""

from __future__ import annotations

import json
from typing import Any, Callable

from sqlalchemy.engine import Engine

from contracts.decision import DecisionRecord
from contracts.decision_of import differences, run_policy
from contracts.group_decision_of import group_records
from scheduler.autoscale import kept
from scheduler.decision_inputs import DecisionInputs, dict_differences
from scheduler.errors import InvalidInput
from scheduler.group_inputs import KINDS, SCALE_OUT, GroupInputs
from scheduler.policy_config import PolicyConfig
from store import decision_log
from store.decision_codec import decode, decode_group


def outcome(rec) -> str:
    """A decision in one line: where it placed the replica (and whom it preempts), or why not."""
    if rec.scheduled and rec.plan is not None:
        where = f"{rec.plan.worker} GPU {','.join(map(str, rec.plan.gpu_indexes)) or '-'}"
        score = f" (score {rec.score:.2f})" if rec.score is not None else ""
        victims = f", preempting {', '.join(v.name for v in rec.victims)}" if rec.victims else ""
        return f"placed on {where}{score}{victims}"
    return "not placed: " + (rec.reasons[0] if rec.reasons else "no reason recorded")


def step(d: dict[str, Any]) -> str:
    """An autoscaler step in one line (scheduler/autoscale/kept.decision_of)."""
    return f"{d.get('direction', '?')} to {d.get('desired', '?')} replica(s) by {d.get('rule', '?')}: {d.get('reason', '')}"


def load(engine: Engine, digest: str) -> DecisionInputs:
    try:
        manifest = decision_log.manifest(engine, digest)
    except KeyError:
        raise InvalidInput(f"the inputs {digest[:12]} are not kept in this store (pruned past the retention, "
                           "written by another store, or decided before gpuflow kept them)") from None
    except decision_log.Damaged as e:
        raise InvalidInput(str(e)) from None
    return decode(manifest, lambda d: _blob(engine, d))


def _blob(engine: Engine, digest: str) -> bytes:
    try:
        return decision_log.blob(engine, digest)
    except decision_log.Damaged as e:
        raise InvalidInput(str(e)) from None


def _record(row: decision_log.DecisionRow) -> dict[str, Any]:
    try:
        return decision_log.record_of(row)
    except decision_log.Damaged as e:
        raise InvalidInput(str(e)) from None


def replay(engine: Engine, instance: str, recorded: DecisionRecord | None, digest: str | None = None,
           policy: PolicyConfig | None = None) -> dict[str, Any]:
    """The replay of ``instance``'s decision: the one ``recorded`` (the workflow's record) names,
    else the store's newest (or the one whose digest starts with ``digest``). ``policy``: weights
    to replay with instead of the recorded ones. A record the PENDING queue held (``held``:
    activities/queue_gate.py) is no decision of the policy's: the newest kept one is replayed."""
    if recorded is not None and recorded.held:
        recorded = None
    want = digest or (recorded.inputs if recorded is not None else None)
    row = decision_log.latest(engine, instance, want)
    if row is None:
        if recorded is not None and recorded.inputs is None:
            raise InvalidInput(f"{instance}'s decision was made before gpuflow kept decisions' inputs: nothing to replay")
        raise InvalidInput(f"no kept decision of {instance}" + (f" with inputs {want[:12]}" if want else ""))
    if recorded is not None and digest and recorded.inputs != row.digest:
        recorded = None  # an older decision than the workflow's: the store's copy of its record
    return replay_row(engine, row, recorded, policy)


def replay_row(engine: Engine, row: decision_log.DecisionRow, recorded: DecisionRecord | None = None,
               policy: PolicyConfig | None = None,
               inputs: Callable[[str], DecisionInputs] | None = None) -> dict[str, Any]:
    """One kept decision re-run, compared with ``recorded`` (default: the store's copy of its
    record). ``inputs``: how a placement's inputs are loaded (default ``load``; bench/replay_all.py
    shares one load among the replicas decided together)."""
    if row.kind == "autoscale":
        return _replay_step(engine, row)
    if row.kind in KINDS:
        return _replay_member(engine, row, recorded, policy)
    if recorded is None:
        recorded = DecisionRecord.model_validate(_record(row))
    inp = (inputs or (lambda d: load(engine, d)))(row.digest)
    if row.instance not in inp.names:
        raise InvalidInput(f"the inputs {row.digest[:12]} are not {row.instance}'s (they decided {', '.join(inp.names)})")
    if policy is not None:
        inp.policy = policy
    now = run_policy(inp)[inp.names.index(row.instance)]
    diff = differences(recorded, now)
    return {"instance": row.instance, "kind": "placement", "inputs": row.digest, "at": row.at.isoformat(),
            "names": inp.names, "same": not diff, "differences": diff,
            "recorded": outcome(recorded), "now": outcome(now),
            "saw": f"{len(inp.snapshot.workers)} hosts, {len(inp.snapshot.instances)} replicas",
            **_learned(inp)}


def _learned(inp: DecisionInputs) -> dict[str, Any]:
    """The learned claim the decision booked (issue 42), as its inputs keep it: {"learned": {...}}."""
    got = getattr(inp.request, "learned", None)
    return {"learned": got.to_dict()} if got is not None else {}


def load_group(engine: Engine, digest: str) -> GroupInputs:
    """A group decision's kept inputs (store/decision_codec.py ``decode_group``), each part checked."""
    try:
        manifest = decision_log.manifest(engine, digest)
    except KeyError:
        raise InvalidInput(f"the group inputs {digest[:12]} are not kept in this store (pruned past the retention, "
                           "or written by another store)") from None
    except decision_log.Damaged as e:
        raise InvalidInput(str(e)) from None
    return decode_group(manifest, lambda d: _blob(engine, d))


def group_outcome(rec: DecisionRecord) -> str:
    """A group member's decision in one line: its own, then its group's (where it gathered, or why not)."""
    g = rec.group
    head = outcome(rec)
    if g is None:
        return head
    if g.kind == SCALE_OUT:
        return f"{head} ({g.role.value} of {g.group}, placed alone after formation)"
    if not g.scheduled:
        return f"{head} (group {g.group} not formed" + (f": {g.blocked.value} does not fit)" if g.blocked else ")")
    where = f"{g.domain} ({g.layer})" if g.domain else "the cluster"
    members = ", ".join(f"{m.role.value} {m.name} on {m.worker} GPU {','.join(map(str, m.gpu_indexes)) or '-'}"
                        for m in g.members)
    return f"{head} ({g.role.value} of {g.group}, gathered in {where}: {members})"


def _replay_member(engine: Engine, row: decision_log.DecisionRow, recorded: DecisionRecord | None,
                   policy: PolicyConfig | None) -> dict[str, Any]:
    """A prefill/decode group member's decision re-run: its group's whole formation (form) or its
    placement alone (scale_out) on the kept inputs, the member's record compared with the recorded one."""
    if recorded is None:
        recorded = DecisionRecord.model_validate(_record(row))
    inp = load_group(engine, row.digest)
    if row.instance not in inp.members():
        raise InvalidInput(f"the inputs {row.digest[:12]} are not {row.instance}'s (they decided "
                           f"{', '.join(inp.members())})")
    if policy is not None:
        inp.policy = policy
    now = group_records(inp)[row.instance]
    diff = differences(recorded, now)
    return {"instance": row.instance, "kind": row.kind, "inputs": row.digest, "at": row.at.isoformat(),
            "names": inp.members(), "group": inp.group, "same": not diff, "differences": diff,
            "recorded": group_outcome(recorded), "now": group_outcome(now),
            "saw": f"{len(inp.snapshot.workers)} hosts, {len(inp.snapshot.instances)} replicas",
            "record": recorded.summary()}  # gpuflow explain of a member whose group has not formed (no workflow yet)


def _replay_step(engine: Engine, row: decision_log.DecisionRow) -> dict[str, Any]:
    """An autoscaler step re-run on its kept inputs (scheduler/autoscale/kept.py)."""
    try:
        data = _blob(engine, row.digest)
    except KeyError:
        raise InvalidInput(f"the inputs {row.digest[:12]} of {row.deployment}'s autoscaler step are not kept "
                           "(pruned past the retention)") from None
    recorded, now = _record(row), kept.replay(data)
    diff = dict_differences(recorded, now)
    return {"instance": row.instance, "kind": "autoscale", "inputs": row.digest, "at": row.at.isoformat(),
            "names": [row.deployment], "same": not diff, "differences": diff,
            "recorded": step(recorded), "now": step(now),
            "saw": f"{len(json.loads(data).get('samples', []))} samples"}


def history(engine: Engine, deployment: str, limit: int) -> list[dict[str, Any]]:
    """The deployment's kept decisions, oldest first: placements, refusals (the decisive reason),
    preemptions and autoscaler steps. A replica's name is refused, naming its deployment (a
    history is kept per deployment: a replica's name found none, which read as "none kept")."""
    owner = decision_log.replica_of(engine, deployment)
    if owner is not None:
        raise InvalidInput(f"{deployment} is a replica of deployment {owner}: decisions are kept per deployment; "
                           f"use 'gpuflow explain {owner} --history' (and 'gpuflow explain {deployment} --replay' "
                           "for this replica's own decision)")
    return [{"at": r.at.isoformat(), "kind": r.kind, "instance": r.instance, "outcome": r.outcome, "reason": r.reason,
             "inputs": r.digest} for r in decision_log.history(engine, deployment, limit)]
