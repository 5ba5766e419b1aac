"""What the workflows share: search attribute keys, activity names, timeouts, error reading."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError

from contracts.search import SA_DEPLOYMENT, SA_MODEL, SA_STATE, SA_WORKER, SEARCH_ATTRIBUTES  # noqa: F401

from contracts.activity_names import *  # noqa: F401,F403  (activity names, one home)

# Control activities heartbeat while they work (activities/control.py), so one that was running on
# a control-plane worker that died is retried elsewhere within seconds.
CONTROL_HEARTBEAT = timedelta(seconds=5)
STORE_CALL = dict(start_to_close_timeout=timedelta(seconds=120), heartbeat_timeout=CONTROL_HEARTBEAT,
                  retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200),
                                           maximum_interval=timedelta(seconds=10)))
# A store write run as a local activity (no heartbeat timeout there): the same patience and retries.
STORE_LOCAL = dict(start_to_close_timeout=timedelta(seconds=120),
                   retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200),
                                            maximum_interval=timedelta(seconds=10)))


# Instance workflow changes that a run of code generation 1 (InstanceInput.code, contracts/control.py)
# has without asking. ``workflow.patched`` records a marker and upserts TemporalChangeVersion in every
# new run that calls it: two history events and a visibility write per patch per replica, the cost
# of a trivial workflow's whole history for the two a replica meets on its way to RUNNING. A run
# whose input (in its first history event, so every replay sees it) says it was started by code
# that has these changes takes them at once. A run of generation 0 (started by an older release, or
# continued from one) still asks workflow.patched, so its history replays as recorded. A later change
# is a new patch (workflow.patched as usual) until the next generation lists it here.
CODE_1 = frozenset({"record-local", "place-in-one", "place-local", "queue-sweep", "preemption", "drain-before-stop",
                    "estimate-local-path-on-host"})


def patched(inp, name: str) -> bool:
    """``workflow.patched(name)``, unless the run's code generation already has the change."""
    return (getattr(inp, "code", 0) >= 1 and name in CODE_1) or workflow.patched(name)


# Generation 2: liveness per host (workflows/instance.py, host_news). A supervisor heartbeats every
# Timings.supervise_heartbeat_s (a fallback) rather than every host_heartbeat_s; the host's watch
# tells the instances when their host is lost or its agent restarted; the processes are stopped by
# an explicit stop on the host's queue, not by cancelling the supervisor (which would wait for its
# next heartbeat to hear it). It has no patch: a run of an older generation keeps the old way for
# its whole life (continue-as-new carries its generation), so no history mixes the two.
def generation(inp, at_least: int) -> bool:
    """The run was started by code of generation ``at_least`` or later (a change with no patch of
    its own: runs of older generations keep the old way, whatever this code has)."""
    return getattr(inp, "code", 0) >= at_least


def secs(s: float) -> timedelta:
    return timedelta(seconds=s)


def cause(e: BaseException) -> tuple[str, str]:
    """(kind, message) of an activity failure: the ApplicationError's type, or 'timeout'."""
    c = e.cause if isinstance(e, ActivityError) else e
    while c is not None:
        if isinstance(c, ApplicationError):
            return c.type or "ApplicationError", c.message
        if isinstance(c, TimeoutError):
            inner = f" ({c.cause.message})" if getattr(c, "cause", None) is not None and hasattr(c.cause, "message") else ""
            return "timeout", f"{c.message}{inner}"
        c = getattr(c, "cause", None)
    return "error", str(e)
