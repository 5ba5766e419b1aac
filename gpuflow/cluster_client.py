"""The client side of the cluster's two workflows: what ``gpuflow keys``, ``tenants``, ``queue``,
``status`` and ``explain --replay/--history`` send through Temporal, so ``--address`` (with TLS /
an API key) is all they need. Changes are updates of the cluster workflow (workflows/cluster.py),
recorded in its history; reads are queries of the reads workflow (workflows/cluster_reads.py),
recorded nowhere. A key is made here and only its salted hash is sent (store/keys.py
``new_key``); a key given whole to revoke is cut to its id here."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from typing import Any, Awaitable, Callable

from temporalio.client import Client, WorkflowHandle, WorkflowQueryFailedError
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from contracts import cluster as cc
from contracts import ids
from contracts.control import CONTROL_QUEUE
from contracts.control_run import NotControlPlane, control_run, squatted
from contracts.ids import CLUSTER_ID, CLUSTER_READS_ID
from gpuflow import ops
from gpuflow.runtime import Unreachable
from scheduler.errors import GpuflowError, InvalidInput
from scheduler.tenancy.config import TenantsFile
from store import keys
from workflows.cluster import ClusterWorkflow
from workflows.cluster_reads import ClusterReadsWorkflow

READ_WAIT_S = 15.0  # a read no control-plane worker answers within this is Unreachable


async def start(client: Client) -> WorkflowHandle:
    """The cluster workflow's handle, started if it is not running."""
    return await client.start_workflow(ClusterWorkflow.run, id=CLUSTER_ID, task_queue=CONTROL_QUEUE,
                                       id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                                       static_summary="the cluster's configuration: tenants file, API keys")


async def start_reads(client: Client) -> WorkflowHandle:
    """The reads workflow's handle, started if it is not running."""
    return await client.start_workflow(ClusterReadsWorkflow.run, id=CLUSTER_READS_ID, task_queue=CONTROL_QUEUE,
                                       id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                                       static_summary="the cluster's reads: keys, usage, tenants, queue, serving, "
                                                      "audit (queries: no history)")


async def _ask(client: Client, update, arg: Any) -> Any:
    """The cluster workflow's ``update``, asked of its run once described as the control plane's
    (contracts/control_run.py); started first where none runs."""
    await start(client)
    try:
        handle = await control_run(client, CLUSTER_ID, ids.CLUSTER_WORKFLOW, timedelta(seconds=READ_WAIT_S))
    except NotControlPlane as e:
        raise squatted(str(e), CLUSTER_ID) from None
    return await ops.run_update(handle, update, arg)


async def _read(client: Client, query: str, arg: Any, result: type) -> Any:
    """The reads workflow's ``query`` on ``arg``: no history is written, no workflow task taken.
    Asked of its run once described as the control plane's (contracts/control_run.py); started
    first where it is missing (a cluster whose server predates it) or the id's last run was
    somebody else's. A refusal (bad input, the store's InvalidInput) is an InvalidInput with its
    words; no answer, Unreachable; a run of somebody else's holding the id, Squatted."""
    wait = timedelta(seconds=READ_WAIT_S)
    for first in (True, False):
        try:
            handle = await control_run(client, CLUSTER_READS_ID, ids.CLUSTER_READS_WORKFLOW, wait)
            return await handle.query(query, arg, result_type=result, rpc_timeout=wait)
        except WorkflowQueryFailedError as e:
            raise InvalidInput(e.message) from None
        except NotControlPlane as e:
            if first:  # a closed one is replaced by the control plane's; a running one stays, and is named
                await start_reads(client)
                continue
            raise squatted(str(e), CLUSTER_READS_ID) from None
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND and first:
                await start_reads(client)
                continue
            raise Unreachable(f"the cluster's {query} read got no answer ({e.message}): is a control-plane worker "
                              "(gpuflow server) running?") from None
    raise AssertionError("unreachable")  # the loop returns or raises


async def create_key(client: Client, tenant: str, name: str = "", scope: str = cc.TENANT,
                     limits: cc.KeyLimitFields | None = None) -> tuple[str, cc.KeyView]:
    """A new key for ``tenant`` with ``scope`` (contracts/cluster.py ``Scope``) and its own
    ``limits``: (the key, to show once; the control plane's record of it). A tenant the tenants
    file does not name is refused by the control plane, naming those it does."""
    key, k = keys.new_key(tenant, name, scope, limits)
    return key, await _ask(client, ClusterWorkflow.create_key, k)


async def key_limits(client: Client, ask: cc.KeyLimits) -> cc.KeyView:
    """``gpuflow keys edit``: a key's own limits set or cleared."""
    return await _ask(client, ClusterWorkflow.key_limits, ask)


async def revoke_key(client: Client, key_or_id: str) -> cc.KeyView:
    kid = keys.key_id(key_or_id)
    if not re.match(cc.KEY_ID, kid):
        raise InvalidInput("give a key's id (12 hex digits, as 'gpuflow keys list' shows it) or the whole key "
                           "(gpuflow-<id>-<secret>)")
    return await _ask(client, ClusterWorkflow.revoke_key, cc.KeyRevoke(id=kid))


async def apply_tenants(client: Client, tf: TenantsFile) -> cc.TenantsApplied:
    return await _ask(client, ClusterWorkflow.apply_tenants, cc.TenantsApply(file=tf.model_dump(mode="json", exclude_none=True)))


async def _pages(read: Callable[[cc.Page], Awaitable[Any]], rows_of: Callable[[Any], list]) -> tuple[Any, list]:
    """Every row, page after page: (the first page, for what it says besides its rows; the rows)."""
    first = page = await read(cc.Page())
    rows = list(rows_of(page))
    while rows_of(page) and len(rows) < page.total:
        page = await read(cc.Page(offset=len(rows)))
        rows += rows_of(page)
    return first, rows


async def settings(client: Client) -> cc.SettingsView:
    """The cluster's timings and limits, as a control-plane worker's settings hold them (``gpuflow settings``)."""
    return await _read(client, ids.CLUSTER_SETTINGS, cc.SettingsAsk(), cc.SettingsView)


async def claims(client: Client, limit: int = 500) -> cc.ClaimsView:
    """The learned memory claims (``gpuflow claims``), as a control-plane worker's settings judge them."""
    return await _read(client, ids.CLUSTER_CLAIMS, cc.ClaimsAsk(limit=limit), cc.ClaimsView)


async def list_keys(client: Client) -> list[cc.KeyView]:
    return (await _pages(lambda p: _read(client, ids.CLUSTER_KEYS, p, cc.KeysPage), lambda pg: pg.keys))[1]


async def key_usage(client: Client) -> list[cc.UsageRow]:
    """Requests and tokens per tenant and key, over the last hour and day (activities/cluster_reads.py)."""
    return (await _pages(lambda p: _read(client, ids.CLUSTER_KEY_USAGE, p, cc.UsagePage), lambda pg: pg.rows))[1]


async def tenants(client: Client) -> tuple[str, list[dict]]:
    """(the queueing mode, one row per tenant)."""
    first, rows = await _pages(lambda p: _read(client, ids.CLUSTER_TENANTS, p, cc.TenantsPage), lambda pg: pg.rows)
    return first.queueing, rows


async def queue(client: Client) -> tuple[str, list[dict]]:
    """(the queueing mode, the PENDING queue's rows in order)."""
    first, rows = await _pages(lambda p: _read(client, ids.CLUSTER_QUEUE, p, cc.QueuePage), lambda pg: pg.rows)
    return first.queueing, rows


async def serving(client: Client, instances: list[str]) -> cc.ServingView:
    """The live gateways, the requests in flight and the PENDING reasons of ``instances``, asked
    in batches of ``SERVING_MAX``."""
    out = cc.ServingView()
    for i in range(0, max(len(instances), 1), cc.SERVING_MAX):
        v = await _read(client, ids.CLUSTER_SERVING, cc.ServingAsk(instances=instances[i:i + cc.SERVING_MAX]),
                        cc.ServingView)
        out = cc.ServingView(gateways=v.gateways, in_flight={**out.in_flight, **v.in_flight},
                             reasons={**out.reasons, **v.reasons})
    return out


STATUS_WAIT_S = 15.0  # status shows what Temporal knows even when no control-plane worker answers


async def add_serving(client: Client, st: dict[str, Any], per_instance: bool = True) -> dict[str, Any]:
    """``st`` (ops.status's dict) with what the control plane reads from the store, as
    gpuflow/serving_view.py adds it on a machine that opens the store itself: ``gateways``, and,
    with ``per_instance``, each instance's ``in_flight`` and a PENDING instance's current reason.
    ``gateways_error`` says why not when the control plane does not answer."""
    names = [i["name"] for d in st["deployments"] for i in d.get("instances", [])] if per_instance else []
    try:
        view = await asyncio.wait_for(serving(client, names), STATUS_WAIT_S)
    except (GpuflowError, RPCError) as e:
        st["gateways_error"] = f"the control plane did not answer: {e}"
        return st
    except asyncio.TimeoutError:
        st["gateways_error"] = f"the control plane did not answer within {STATUS_WAIT_S:g} s (is gpuflow server running?)"
        return st
    st["gateways"] = view.gateways
    for d in st["deployments"] if per_instance else []:
        for i in d.get("instances", []):
            i["in_flight"] = view.in_flight.get(i["name"], 0)
            if i.get("state") == "pending" and view.reasons.get(i["name"]):
                i["reason"] = view.reasons[i["name"]]
    return st


async def audit(client: Client, name: str, history: bool, limit: int, decision: str,
                with_settings: bool, policy: dict[str, Any] | None = None) -> dict[str, Any]:
    """``gpuflow explain --replay/--history`` through the control plane: the replay's dict, or
    {"rows": [...]} for a history. ``with_settings``: replayed with ``policy``, the caller's
    scheduler settings (the control plane refuses it without them)."""
    v = await _read(client, ids.CLUSTER_AUDIT, cc.AuditAsk(name=name, history=history, limit=min(limit, 1000),
                                                          decision=decision, with_settings=with_settings,
                                                          policy=policy if with_settings else None), cc.AuditView)
    return {"rows": v.rows} if history else dict(v.replay or {})


async def pending_reason(client: Client, instance: str) -> str | None:
    """The store's current reason of a PENDING ``instance`` (``gpuflow explain``'s "waiting now"),
    read through the control plane; None when it has none or the control plane does not answer."""
    try:
        view = await asyncio.wait_for(serving(client, [instance]), STATUS_WAIT_S)
    except (GpuflowError, RPCError, asyncio.TimeoutError):
        return None
    return view.reasons.get(instance)
