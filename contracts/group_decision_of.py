"""A prefill/decode group member's decision as the record keeps it (issue 41): its own placement,
filters and candidates as any replica's (contracts/decision_of.py ``decision_record``), with its
group's decision on top (``GroupNote``: the kind, the domain it gathered into, every member's role,
host and GPUs, the degradations, or why it did not fit naming the role). ``note`` annotates the
records the control plane's group activity made; ``group_records`` re-makes them from kept inputs
(scheduler/group_inputs.py) so ``gpuflow explain MEMBER --replay`` compares the two.

Pure: the record is the contract's shape; the policy it runs is the scheduler's."""

from __future__ import annotations

from contracts.decision import DecisionRecord, GroupMember, GroupNote, RequestSummary
from contracts.decision_of import decision_record
from scheduler.decision import Decision
from scheduler.group_inputs import SCALE_OUT, GroupInputs, placed, run_group
from scheduler.groups.decision import GroupDecision
from scheduler.summary import request_summary


def group_note(inp: GroupInputs, out: GroupDecision | Decision, name: str) -> GroupNote:
    """``name``'s view of its group's decision ``out`` (made on ``inp``)."""
    got = placed(inp, out)
    role = inp.role_of(name)
    members = [GroupMember(name=n, role=inp.role_of(n), worker=d.placement.worker,
                           gpu_indexes=list(d.placement.gpu_indexes)) for n, d in got.items()]
    if isinstance(out, Decision):  # one member placed alone: the others are where the snapshot has them
        return GroupNote(kind=SCALE_OUT, group=inp.group, role=role, scheduled=out.scheduled, members=members,
                         reasons=[] if out.scheduled else list(out.reasons[:max(out.decisive, 1)]),
                         blocked=None if out.scheduled else role)
    layer, domain = out.domain if out.domain else (None, None)
    return GroupNote(kind="group", group=inp.group, role=role, scheduled=out.scheduled, layer=layer, domain=domain,
                     path=list(out.path), members=members, degradations=list(out.degradations),
                     reasons=list(out.reasons), blocked=out.role)


def note(rec: DecisionRecord, inp: GroupInputs, out: GroupDecision | Decision, name: str) -> DecisionRecord:
    """``rec`` (``name``'s record) with its group's decision."""
    rec.group = group_note(inp, out, name)
    return rec


def member_record(inp: GroupInputs, out: GroupDecision | Decision, name: str) -> DecisionRecord:
    """``name``'s record of the group's decision ``out``: placed, the ordinary record of its own
    Decision; not placed, the group's reasons (the role that does not fit first) with, for that
    role's members, the filters and candidates where the group came closest."""
    role = inp.role_of(name)
    req, workers = inp.requests[role], len(inp.snapshot.workers)
    d = placed(inp, out).get(name)
    if d is None:
        blocked = out if isinstance(out, Decision) else out.blocked if out.role == role else None
        reasons = list(out.reasons)
        if blocked is not None:
            rec = decision_record(blocked, req, workers, inp.gens)
        else:
            rec = DecisionRecord(scheduled=False, request=RequestSummary.model_validate(request_summary(req)),
                                 workers_seen=workers, generations=dict(inp.gens))
        rec.scheduled, rec.plan, rec.placement, rec.strategy, rec.score = False, None, None, None, None
        rec.reasons, rec.decisive = reasons, len(reasons) if isinstance(out, GroupDecision) else out.decisive
    else:
        rec = decision_record(d, req, workers, inp.gens)
    rec.tenant = inp.owners.tenant_of.get(inp.spec.name, "default")
    return note(rec, inp, out, name)


def group_records(inp: GroupInputs) -> dict[str, DecisionRecord]:
    """The group policy on ``inp`` as each member's record, by name."""
    out = run_group(inp)
    return {n: member_record(inp, out, n) for n in inp.members()}
