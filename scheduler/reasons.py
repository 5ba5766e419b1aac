"""Why a replica is not placed, the decisive reason first.

A decision collects reasons from every stage: each filter's summary line and per-worker verdicts,
then the selectors' messages. They used to be listed in that order, so a replica kept off a
GPU-less worker by its CPU rule was shown as failing the label selector that had only removed
*another* worker. The rule here: the stage that removed the last remaining workers decides.

- The filters emptied the list: that last filter decides. Its summary line, then its per-worker
  reasons (with their numbers), come first.
- Workers passed every filter but no strategy found a fit: the selectors decide. Their messages
  (what the model needs, why each strategy failed) come first, in their own order.
- Then the filters that removed other workers, in chain order (summary, then per worker), and
  last the summaries of filters that removed nobody ("Matched 3 workers by cluster selector.").

Nothing is dropped; only the order changes, and ``decisive`` says how many lines lead. A placed
replica has no decisive reasons (0) and keeps the same order for the rest.
"""

from __future__ import annotations

from scheduler.decision import FilterVerdict

NO_FIT = "No workers meet the resource requirements."


def _lines(v: FilterVerdict) -> list[str]:
    head = [v.note] if v.note else []
    return head + [f"{v.name}: worker {w}: {r}" for w, rs in v.removed.items() for r in rs]


def rank(verdicts: list[FilterVerdict], selector_msgs: list[str] | None = None,
         scheduled: bool = False) -> tuple[list[str], int]:
    """(reasons, how many of them are decisive). ``selector_msgs`` is None when the filters left
    no worker (the selectors never ran); a list, possibly empty, when they ran and found nothing."""
    decisive: list[str] = []
    rest = list(verdicts)
    if not scheduled:
        if verdicts and not verdicts[-1].kept:
            last = rest.pop()
            decisive = _lines(last) or [f"The {last.name} filter removed the last {last.before} worker(s)."]
        else:
            decisive = list(selector_msgs or [NO_FIT])
    removing = [line for v in rest if v.removed for line in _lines(v)]
    idle = [v.note for v in rest if v.note and not v.removed]
    return decisive + removing + idle, len(decisive)


def pending_text(reasons: list[str], decisive: int | None) -> str:
    """A PENDING replica's reason when a decision does not place it: ``unschedulable:`` and the
    decisive reasons, at most three. The instance workflow (workflows/place_steps.py) and the
    PENDING queue (tenancy/queue.py, written by every wake) both say it this way, so a replica's
    reason reads the same whoever judged it last."""
    return "unschedulable: " + (join(reasons[:min(3, decisive or 3)]) or "no candidate")


def join(reasons: list[str]) -> str:
    """Reasons on one line, '; ' between them: each one's closing full stop goes (it read '.;')."""
    return "; ".join(r.rstrip().removesuffix(".") for r in reasons)
