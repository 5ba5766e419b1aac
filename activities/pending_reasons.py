"""The one reason a PENDING replica shows (issue 36). ``gpuflow status``, ``explain`` and ``queue``
and the console's replica and queue pages all show the text the store holds for it, and only the
PENDING queue's verdicts write it (``shown``, by the wake: activities/wake_queue.py), so they agree
at any moment.

Why they differed: ``gpuflow queue`` (and the console's queue page) judged the queue afresh and
showed that verdict without recording it, while the others showed the store's, written by the last
wake or the replica's own last decision; and nothing judged again when capacity was *taken* (a
wake follows only capacity freed). A replica waiting for 200 GiB got "The largest allocatable GPU
has 80.0 GiB" from its decision; another deployment's replica then booked 10 GiB of that GPU, and
the queue said "70.0 GiB" while status, explain and the replica page still said 80. Now:

- the queue's verdict is the reason of every waiting replica it judges (``shown``): one it holds
  back, its verdict (after "preempted by ..." where a preemption put it there: ``current``); one
  it wakes, that it fits now (it then decides and records its own); one whose request is not
  known here, its own last decision, as it stands;
- whoever judges records what it judged (``changed``: the wake, ``gpuflow queue``), and the views
  show the store's text;
- a booking asks for a judgement too (``Waker.wake(taken=True)``, at most every TAKEN_S seconds),
  so the reasons follow the capacity as it is taken, not only as it is freed. That judgement leaves
  out a replica that has recorded no decision yet: it was just started, and its own first decision
  records its reason."""

from __future__ import annotations

from typing import Any

# Queued and Verdict are activities/wake_queue.py's, which imports this module: typed Any here
Queued = Verdict = Any

PREEMPTED = "preempted by "  # a victim's reason (PreemptNotice.reason), kept until it is placed again
NOW = "; now: "
FITS = "fits now: woken to place it"
RECLAIMS = "within its tenant's guarantee while another tenant borrows: woken to preempt"
TAKEN_S = 2.0  # after a booking, the waiting replicas' reasons are judged again within this


def current(old: str, verdict: str) -> str:
    """The reason a waiting replica shows: the queue's verdict, after what preempted it, if anything
    did (that part stays until the replica is placed again; the verdict after it is kept current)."""
    if old.startswith(PREEMPTED):
        return old.split(NOW, 1)[0] + NOW + verdict
    return verdict


def shown(r: Queued, v: Verdict) -> str:
    """The reason of waiting replica ``r`` under verdict ``v``: what every view shows once it is
    recorded. A replica whose request is not known here keeps its own last decision."""
    if r.instance in v.unknown:
        return r.reason
    if r.instance in v.wake.woken:
        return current(r.reason, FITS)
    if r.instance in v.wake.reclaim:
        return current(r.reason, RECLAIMS)
    held = v.wake.held.get(r.instance, "")
    return current(r.reason, held) if held else r.reason


def changed(v: Verdict) -> dict[str, tuple[str, str]]:
    """instance -> (its recorded reason, the one to record), for the waiting replicas whose reason
    the verdict moves (store/records.py set_pending_reasons writes them, compare-and-set)."""
    out = {}
    for r in v.order:
        new = shown(r, v)
        if new and new != r.reason:
            out[r.instance] = (r.reason, new)
    return out
