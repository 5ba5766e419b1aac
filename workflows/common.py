"""What the workflows share: search attribute keys, activity names, timeouts, error reading."""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError

from contracts.search import SA_DEPLOYMENT, SA_MODEL, SA_STATE, SA_WORKER, SEARCH_ATTRIBUTES  # noqa: F401

from contracts.activity_names import *  # noqa: F401,F403  (activity names, one home)

# Control activities heartbeat while they work (activities/runner.py), so one that was running on
# a control-plane worker that died is retried elsewhere within seconds.
CONTROL_HEARTBEAT = timedelta(seconds=5)
STORE_CALL = dict(start_to_close_timeout=timedelta(seconds=120), heartbeat_timeout=CONTROL_HEARTBEAT,
                  retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200),
                                           maximum_interval=timedelta(seconds=10)))
# A store write run as a local activity (no heartbeat timeout there): the same patience and retries.
STORE_LOCAL = dict(start_to_close_timeout=timedelta(seconds=120),
                   retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200),
                                            maximum_interval=timedelta(seconds=10)))


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
