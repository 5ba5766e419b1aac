"""Checks every workflow makes on its input before it does anything: anyone who can reach
Temporal can start a workflow with any id and any input, so names are checked with the one name
rule (scheduler/naming.py) and the workflow id must be the one gpuflow derives from those names.
A failed check fails the workflow at once, non-retryable, naming what was wrong."""

from __future__ import annotations

import re

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from scheduler.naming import name_problem


def refuse(message: str) -> ApplicationError:
    return ApplicationError(message, type="InvalidInput", non_retryable=True)


def names(**given: object) -> None:
    """Each keyword is a kind of name (deployment, instance, worker) and the name given."""
    for kind, value in given.items():
        why = name_problem(value)
        if why:
            raise refuse(f"{kind} name {value!r} {why}")


def workflow_id(expected: str, what: str) -> None:
    """The running workflow's id must be ``expected`` (derived from ``what``, e.g. "spec name 'legit'")."""
    got = workflow.info().workflow_id
    if got != expected:
        raise refuse(f"workflow id {got!r} does not match its {what}: this workflow's id must be {expected!r}")


def instance_names(deployment: str, instances: list[str]) -> None:
    """A deployment's instances are DEPLOYMENT-<n>: it may not adopt another deployment's."""
    pattern = re.compile(re.escape(deployment) + r"-[0-9]+")
    for n in instances:
        if not isinstance(n, str) or not pattern.fullmatch(n):
            raise refuse(f"instance {n!r} is not one of deployment {deployment!r}'s (they are named {deployment}-<n>)")
