"""Dry runs on a snapshot, for policies that place several replicas in a row or ask "what if
these were gone": book a decided placement as an instance, or leave instances out. The snapshot
given is never changed; a new one is returned."""

from __future__ import annotations

from scheduler.cluster import Claim, ClusterSnapshot, Instance, InstanceState, Subordinate
from scheduler.decision import Candidate


def book(snap: ClusterSnapshot, c: Candidate, name: str, model: str) -> ClusterSnapshot:
    """``snap`` with ``c`` held by a SCHEDULED instance ``name`` of ``model``."""
    inst = Instance(name=name, model=model, state=InstanceState.SCHEDULED, worker=c.worker,
                    gpu_indexes=list(c.gpu_indexes), claim=Claim(**c.claim.model_dump()),
                    subordinates=[Subordinate(worker=s.worker, gpu_indexes=list(s.gpu_indexes),
                                              claim=Claim(**s.claim.model_dump())) for s in c.subordinates])
    return snap.model_copy(update={"instances": [*snap.instances, inst]})


def without(snap: ClusterSnapshot, gone: set[str]) -> ClusterSnapshot:
    """``snap`` without the instances named in ``gone``."""
    return snap.model_copy(update={"instances": [i for i in snap.instances if i.name not in gone]})
