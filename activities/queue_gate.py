"""The PENDING queue's order, kept at the decision as well as at the wake (activities/decider.py).

A wake signals, in queue order, only the replicas the capacity freed now holds
(activities/wake_queue.py). But a replica can be woken out of that order: by the sweep (the first
waiting replica of each deployment), by a wake whose snapshot had not seen another control-plane
worker's decisions yet, or as a replica whose request that worker did not know. Woken, it decides
by itself, and the first to book took the freed GPU, though a replica ahead of it in the queue was
woken for it too (a priority inversion; issue 37's flaky queue-order tests).

So a replica woken to decide again (PENDING after a decision of its own) is gated: when the policy
places it outright, the queue is judged on the same snapshot, and if a replica ranked ahead of it is
woken to take capacity freed now while it is not, it is not placed. Its record says who it waits
behind (DecisionRecord.held), and it waits for the next wake. A replica deciding for the first time
is not gated (a burst's replicas decide in the order they arrive, and reading the queue for each
would cost the burst a judgement a replica), nor is a preemption (its victims are the tenancy's).
Only the requests this worker knows are judged; a replica ahead whose request is not known here
does not hold anyone (it decides itself)."""

from __future__ import annotations

from typing import Callable

from sqlalchemy.engine import Engine

from activities.wake_queue import judge
from contracts.decision import DecisionRecord
from scheduler.cluster import ClusterSnapshot
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.spec import ModelSpec
from store.pending_queue import Queue, read, redeciding


def held_text(ahead: str) -> str:
    return f"held back while {ahead} (ahead of it in the queue) takes the capacity freed now"


class QueueGate:
    def __init__(self, reads: Engine, request_of: Callable[[ModelSpec], Request | None]):
        """``reads``: the store (read-only transactions); ``request_of``: what a waiting replica of
        a spec would book, as this worker knows it (wake_queue.Waker's), None when not known."""
        self.reads, self.request_of = reads, request_of

    def read(self, names: list[str]) -> tuple[Queue | None, set[str]]:
        """(the queue, the ``names`` woken to decide again); no queue when there are none."""
        again = redeciding(self.reads, names)
        return (read(self.reads) if again else None), again

    def ahead(self, q: Queue, snap: ClusterSnapshot, instance: str, spec: ModelSpec, req: Request,
              policy: PolicyConfig | None, assumed: set[str]) -> str | None:
        """The replica ahead of ``instance`` in ``q`` that takes the capacity freed on ``snap``, or
        None. ``assumed``: replicas whose placements ``snap`` already holds (decided, not yet
        booked): they no longer wait."""
        waiting = Queue([r for r in q.replicas if r.instance not in assumed or r.instance == instance],
                        q.specs, q.tenant_of, q.tenants)

        def request_of(s: ModelSpec) -> Request | None:
            return req if s.name == spec.name else self.request_of(s)  # this replica's own, as costed to place it

        return judge(waiting, snap, request_of, policy).ahead_of(instance)


def held(rec: DecisionRecord, ahead: str) -> DecisionRecord:
    """``rec`` (which placed its replica outright) not placed: it waits behind ``ahead``. The
    policy's candidates stay for explain; the record keeps no inputs (the policy's own decision
    was to place it: replaying them says so, not this)."""
    why = held_text(ahead)
    return rec.model_copy(update={"scheduled": False, "plan": None, "placement": None, "held": why,
                                  "reasons": [why, *rec.reasons], "decisive": 1, "inputs": None})
