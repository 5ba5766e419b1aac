"""A watch's nonce bound to the workflow run that sent it, so a report signed for it proves itself
to that run only (pure: the host workflow makes the nonce, activities/hosts.py ``host_seen`` checks it).

The host workflow's check knows the nonce it sent; ``host_seen``, which anybody's workflow named
``host/<name>`` may call while the host's own is not running, does not. So the nonce starts with a
digest of the sending run's id, which the Temporal server gives each activity (``activity.info()
.workflow_run_id``) and no caller can choose: a watch report replayed from an older run's history,
however well signed, names another run. A report the host's agent signs for a workflow of one's own
is the host's own inventory, now."""

from __future__ import annotations

import hashlib

TAG = 32  # hex characters of the run's digest; a nonce is the tag and 32 more (64: WatchAsk's limit)


def tag(run_id: str) -> str:
    return hashlib.sha256(f"gpuflow-watch/1\0{run_id}".encode()).hexdigest()[:TAG]


def nonce(run_id: str, fresh: str) -> str:
    """A watch's nonce for run ``run_id``; ``fresh``: 32 hex characters (workflow.uuid4().hex)."""
    return tag(run_id) + fresh


def of_run(value: str, run_id: str) -> bool:
    """Whether ``value`` is a nonce made by run ``run_id``."""
    return isinstance(value, str) and len(value) > TAG and value.startswith(tag(run_id))
