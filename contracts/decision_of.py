"""A placement decision as the record keeps it (``DecisionRecord``, contracts/decision.py): the
policy's Decision with each part typed, and the tenant's verdict on top (the quota, the victims
and why). ``run_policy`` is the policy (scheduler/decision_inputs.py) on kept inputs, as records:
the decider makes them, and ``gpuflow explain --replay`` re-makes them and compares
(``differences``).

Pure: the record is the contract's shape, so the glue that fills it lives beside it; the policy
it runs is the scheduler's."""

from __future__ import annotations

from contracts.decision import CandidateView, DecisionRecord, FilterView, PlacementPlan, RequestSummary, Victim
from contracts.control import PreemptNotice
from scheduler.cluster import ClusterSnapshot
from scheduler.decision_inputs import DecisionInputs, admissions, dict_differences
from scheduler.request import Request
from scheduler.spec import ModelSpec
from scheduler.summary import request_summary
from scheduler.tenancy.admit import Admission
from scheduler.tenancy.preemption import Owners

TOP_CANDIDATES = 10


def decision_record(d, req: Request, workers: int, gens: dict[str, int]) -> DecisionRecord:
    """The policy's Decision as the record keeps it: each part typed (contracts/decision.py), the
    best TOP_CANDIDATES candidates listed (by rounded score, ties in the policy's order)."""
    plan = None
    if d.placement is not None:
        p = d.placement
        plan = PlacementPlan(worker=p.worker, gpu_indexes=list(p.gpu_indexes),
                             claim=p.claim.model_dump(exclude_none=True),
                             subordinates=[s.model_dump(exclude_none=True) for s in p.subordinates],
                             cpus=p.cpus, numa_nodes=p.numa_nodes)
    return DecisionRecord(
        scheduled=d.scheduled, plan=plan, strategy=d.strategy, score=d.score, reasons=list(d.reasons),
        request=RequestSummary.model_validate(request_summary(req)),
        placement=CandidateView.model_validate(d.placement.to_dict(with_scores=False)) if d.placement else None,
        candidates=[CandidateView.model_validate(c.to_dict()) for c in d.top(TOP_CANDIDATES)],
        candidates_total=len(d.candidates), filters=[FilterView.model_validate(f.to_dict()) for f in d.filters],
        decisive=d.decisive, workers_seen=workers, generations=gens)


def plan_of(i) -> PlacementPlan:
    """What an instance of the snapshot holds, as a plan."""
    return PlacementPlan(worker=i.worker, gpu_indexes=list(i.gpu_indexes), claim=i.claim,
                         subordinates=list(i.subordinates))


def amend(rec: DecisionRecord, adm: Admission, owners: Owners, snap: ClusterSnapshot, spec: ModelSpec) -> DecisionRecord:
    """The record with the tenant's verdict: a quota leads the reasons (and is the one decisive
    reason); a preemption lists its victims with what each holds; notes on why preemption did
    not help follow the decisive reasons."""
    rec.tenant = owners.tenant_of.get(spec.name, "default")
    if adm.quota:
        rec.scheduled, rec.plan, rec.placement, rec.strategy, rec.score = False, None, None, None, None
        rec.reasons = [adm.quota] + [r for r in rec.reasons if r != adm.quota]
        rec.quota, rec.decisive = adm.quota, 1
    elif adm.preemption is not None:
        held = {i.name: i for i in snap.instances}
        rec.victims = [Victim(name=v, deployment=held[v].model, tenant=owners.tenant_of.get(held[v].model, "default"),
                              plan=plan_of(held[v])) for v in adm.victims]
        rec.preempt_why = adm.preemption.why
    elif adm.notes:
        k = rec.decisive
        rec.reasons = rec.reasons[:k] + adm.notes + rec.reasons[k:]
    return rec


def notice(rec: DecisionRecord, instance: str) -> PreemptNotice:
    """What a preempting decision tells each of its victims."""
    return PreemptNotice(by=f"{rec.tenant}/{instance}", instance=instance, why=rec.preempt_why)


def run_policy(inp: DecisionInputs) -> list[DecisionRecord]:
    """The records of ``inp.names``, in order: each replica's admission as the record keeps it."""
    snap, spec = inp.snapshot, inp.spec
    return [amend(decision_record(a.decision, inp.request, len(snap.workers), inp.gens), a, inp.owners, snap, spec)
            for a in admissions(inp)]


def differences(recorded: DecisionRecord, now: DecisionRecord) -> list[str]:
    """Where ``now`` differs from ``recorded`` (the digest aside), as 'field: was -> now' lines;
    [] when it is the same decision."""
    return dict_differences(recorded.model_dump(mode="json", exclude={"inputs"}),
                            now.model_dump(mode="json", exclude={"inputs"}))
