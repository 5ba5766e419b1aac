"""An ActivityEnvironment whose activity is called by a given workflow (its type and id, as the
Temporal server names the caller in ``activity.info()``): activities/callers.py checks it."""

from __future__ import annotations

import dataclasses
import uuid

from temporalio.testing import ActivityEnvironment


def called_by(workflow_type: str, workflow_id: str, run_id: str | None = None) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, workflow_type=workflow_type, workflow_id=workflow_id,
                                   workflow_run_id=run_id or str(uuid.uuid4()))
    return env
