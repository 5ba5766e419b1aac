"""ClusterWorkflow (id ``cluster``): the one door to the cluster's configuration, one per cluster.

Every change to the configuration is an update here, so the control plane validates it and its
history audits it: the tenants file (``apply_tenants``), API keys (``create_key``: a scope each,
for a tenant the tenants file names) and their revocation (``revoke_key``). Their messages are
strict (contracts/cluster.py ``StrictMessage``): ``"yes"`` is no boolean, ``"3"`` no number. Each update's validator refuses bad input before anything enters
the history; an activity then writes the store (the control plane's workers own the database).
A key arrives as its id, salt and salted hash (contracts/cluster.py): its secret was made on the
client and stays there. Writes run one at a time, in the order the history shows.

The reads (keys, key usage, tenants, the queue, serving, the audit) are not here: they are queries
of the reads workflow (workflows/cluster_reads.py), which add nothing to any history. Updates are
for changes (Temporal's samples, message_passing/safe_message_handlers, use them so).

Every ``gpuflow server`` starts it at boot, keeping one already running; the CLI starts it too
when it is missing. Nothing lives in its state: it continues as new when its history grows long."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, ValidationError

    from contracts import cluster as cc
    from contracts import ids
    from scheduler.tenancy.config import TenantsFile
    from workflows import common as c
    from workflows import guards
    from workflows.inputs import compact


def one(args: tuple, model: type[BaseModel], update: str) -> Any:
    """``args`` as exactly one ``model``; ValueError naming the problem otherwise (a validator's
    refusal: the update is rejected and nothing enters the history)."""
    if len(args) != 1 or not isinstance(args[0], (dict, model)):
        raise ValueError(f"{update} takes one {model.__name__} JSON object")
    if isinstance(args[0], model):
        return args[0]
    try:
        return model.model_validate(args[0])
    except ValidationError as e:
        raise ValueError(f"{update}: {compact(e)}"[:2000]) from None


def tenants_file(args: tuple) -> TenantsFile:
    ask = one(args, cc.TenantsApply, ids.CLUSTER_APPLY_TENANTS)
    try:
        return TenantsFile.model_validate(ask.file)
    except ValidationError as e:
        raise ValueError(f"the tenants file: {compact(e)}"[:2000]) from None


@workflow.defn(name=ids.CLUSTER_WORKFLOW)
class ClusterWorkflow:
    @workflow.init
    def __init__(self, *args: Any) -> None:
        self.writing = asyncio.Lock()

    @workflow.run
    async def run(self, *args: Any) -> None:
        guards.workflow_id(ids.CLUSTER_ID, "kind (the cluster workflow)")
        await workflow.wait_condition(lambda: workflow.info().is_continue_as_new_suggested())
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new()

    async def _write(self, name: str, arg: BaseModel, result: type, summary: str) -> Any:
        async with self.writing:
            try:
                return await workflow.execute_activity(name, arg, result_type=result, summary=summary, **c.STORE_CALL)
            except ActivityError as e:
                kind, message = c.cause(e)
                raise ApplicationError(message, type=kind, non_retryable=True) from None

    # --- changes ---------------------------------------------------------------------------

    @workflow.update(name=ids.CLUSTER_APPLY_TENANTS)
    async def apply_tenants(self, *args: Any) -> cc.TenantsApplied:
        tf = tenants_file(args)
        return await self._write(cc.APPLY_TENANTS, cc.TenantsApply(file=tf.model_dump(mode="json", exclude_none=True)),
                                 cc.TenantsApplied, f"tenants file: {len(tf.tenants)} tenant(s), {tf.queueing}")

    @apply_tenants.validator
    def _check_tenants(self, *args: Any) -> None:
        tenants_file(args)

    @workflow.update(name=ids.CLUSTER_CREATE_KEY)
    async def create_key(self, *args: Any) -> cc.KeyView:
        k = one(args, cc.KeyAdd, ids.CLUSTER_CREATE_KEY)
        return await self._write(cc.ADD_KEY, k, cc.KeyView, f"{k.granted} API key {k.id} for tenant {k.tenant}")

    @create_key.validator
    def _check_create(self, *args: Any) -> None:
        one(args, cc.KeyAdd, ids.CLUSTER_CREATE_KEY)

    @workflow.update(name=ids.CLUSTER_REVOKE_KEY)
    async def revoke_key(self, *args: Any) -> cc.KeyView:
        k = one(args, cc.KeyRevoke, ids.CLUSTER_REVOKE_KEY)
        return await self._write(cc.REVOKE_KEY, k, cc.KeyView, f"revoke API key {k.id}")

    @revoke_key.validator
    def _check_revoke(self, *args: Any) -> None:
        one(args, cc.KeyRevoke, ids.CLUSTER_REVOKE_KEY)

    @workflow.update(name=ids.CLUSTER_KEY_LIMITS)
    async def key_limits(self, *args: Any) -> cc.KeyView:
        k = one(args, cc.KeyLimits, ids.CLUSTER_KEY_LIMITS)
        return await self._write(cc.KEY_LIMITS, k, cc.KeyView, f"limits of API key {k.id}")

    @key_limits.validator
    def _check_key_limits(self, *args: Any) -> None:
        one(args, cc.KeyLimits, ids.CLUSTER_KEY_LIMITS)
