"""What the CLI (and the demo, and Python users) do against Temporal: deploy, scale, delete,
status, explain, hosts (and cordon them). Only Temporal is needed; the store is the control plane's business."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable

from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.common import Priority, WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from contracts import control_run, ui_text
from contracts.ids import (DEPLOYMENT_ACCEPTED, DEPLOYMENT_DELETE, DEPLOYMENT_PRIORITY_KEY, DEPLOYMENT_SCALE,
                          DEPLOYMENT_STATUS, DEPLOYMENT_UPDATE_SPEC, DEPLOYMENT_WORKFLOW, HOST_CORDON, HOST_FORGET,
                          HOST_STATUS, HOST_UNCORDON, HOST_WORKFLOW, INSTANCE_STATUS, autoscaler_id,
                          deployment_id, host_id, host_logs_id, instance_id)
from contracts.deployment import DeploymentInput, DeploymentView
from contracts.timings import CONTROL_QUEUE, Timings
from gpuflow import broken, delete_wait
from views.group_status import group_view
from gpuflow.runtime import Unreachable
from gpuflow.visibility import listed
from scheduler.errors import InvalidInput
from scheduler.limits import REPLICAS_CEILING
from scheduler.naming import name_problem, natural_key  # noqa: F401  (natural_key: the callers' too)
from scheduler.spec import ModelSpec

if TYPE_CHECKING:  # the instance's and the host's views are imported by their calls: `gpuflow deploy` starts
    from contracts.control import HostView, InstanceView  # without contracts/control.py's rest (issue 37)


UPDATE_TIMEOUT_S = 60.0


async def run_update(handle, update, *args, result_type: type | None = None):
    """Run an update (a name from contracts/ids.py, answered as ``result_type``; or a workflow's
    method); a workflow that does not answer is named instead of waited on forever, and a
    refusal (its validator's, or its handler's) is an InvalidInput with the workflow's words."""
    try:
        return await asyncio.wait_for(handle.execute_update(update, *args, result_type=result_type), UPDATE_TIMEOUT_S)
    except WorkflowUpdateFailedError as e:
        raise _update_error(e) from None
    except (asyncio.TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):  # ours, or the server's RPC deadline
        raise Unreachable(f"{handle.id} did not answer within {UPDATE_TIMEOUT_S:g} s; "
                           "is a control-plane worker (gpuflow server) running? Its history in the UI says more") from None


def _update_error(e: WorkflowUpdateFailedError) -> InvalidInput:
    return InvalidInput(broken.cause_message(e))  # the innermost cause's words, never "Activity task failed"


async def deploy(client: Client, spec: ModelSpec, timings: Timings | None = None,
                 replicas: int | None = None) -> DeploymentView:
    """Create the deployment, or update a running one to this spec. The operator's maximum
    (GPUFLOW_LIMITS__MAX_REPLICAS) is the control plane's to check: its workers' settings decide,
    not this client's environment, and its refusal names the limit."""
    _check_replicas(spec.replicas if replicas is None else replicas)
    raw = spec.model_dump(mode="json", exclude_none=True)
    wid = deployment_id(spec.name)
    handle = await client.start_workflow(
        DEPLOYMENT_WORKFLOW, DeploymentInput(spec=raw, replicas=replicas, **({"timings": timings} if timings else {})),
        id=wid,
        task_queue=CONTROL_QUEUE, id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        priority=Priority(priority_key=DEPLOYMENT_PRIORITY_KEY),
        static_summary=f"deployment of {spec.name} ({spec.backend.value})",
        static_details=ui_text.deployment_details(raw, replicas))
    # a workflow of somebody else's holding the id (the start adopts whatever runs there): named, asked nothing
    await _described(handle, f"no deployment named {spec.name!r}", DEPLOYMENT_WORKFLOW)
    try:
        view = await run_update(handle, DEPLOYMENT_ACCEPTED, result_type=DeploymentView)
    except Exception:  # noqa: BLE001  refused by the control plane's checks: its reason, if it failed
        await deployment_handle(client, spec.name)
        raise
    if view.spec != raw or (replicas is not None and view.replicas != replicas):
        view = await run_update(handle, DEPLOYMENT_UPDATE_SPEC, raw, result_type=DeploymentView)
        if replicas is not None and view.replicas != replicas:
            view = await run_update(handle, DEPLOYMENT_SCALE, replicas, result_type=DeploymentView)
    return view


async def _described(handle, missing: str, workflow_type: str, asked: bool = True):
    """The workflow's description; ``missing`` (an InvalidInput) when Temporal has no such workflow,
    Squatted when its run is not the control plane's ``workflow_type`` on the control plane's queue
    (contracts/control_run.py). ``asked`` False: its type alone is checked, for a caller that asks
    it nothing before it has read whether it is broken (broken.failing: a run on another queue is
    shown BROKEN by status, and ended by delete)."""
    try:
        d = await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise InvalidInput(missing) from None
        raise
    why = control_run.problem(d, handle.id, workflow_type)
    if why and (asked or d.workflow_type != workflow_type):
        raise control_run.squatted(why, handle.id)
    return d


async def deployment_handle(client: Client, name: str, asked: bool = True):
    """The running deployment ``name``'s handle; InvalidInput saying why when there is none (never
    deployed, deleted, failed: its reason); Squatted when it is not the control plane's
    (``asked``: see ``_described``)."""
    handle = client.get_workflow_handle(deployment_id(name), result_type=DeploymentView)
    d = await _described(handle, f"no deployment named {name!r}", DEPLOYMENT_WORKFLOW, asked)
    if d.status is not None and d.status.name == "FAILED":  # e.g. its input was refused: say why
        try:
            await handle.result()
        except WorkflowFailureError as e:
            raise InvalidInput(f"deployment {name!r} failed: {broken.cause_message(e)[:1000]}") from None
    if d.status is None or d.status.name != "RUNNING":
        raise InvalidInput(f"no deployment named {name!r}: " + ENDED.get(d.status.name if d.status else "", "it is gone"))
    return handle


ENDED = {"COMPLETED": "it was deleted",  # a deployment's workflow completes only when it is deleted
         "TERMINATED": "its workflow was terminated (a broken deployment's delete, or by hand)",
         "CANCELED": "its workflow was cancelled", "TIMED_OUT": "its workflow timed out"}


async def current(client: Client, name: str) -> DeploymentView | None:
    """The running deployment ``name`` as it is now; None when there is none (never deployed,
    deleted, failed)."""
    try:
        h = await deployment_handle(client, name)
    except InvalidInput:
        return None
    return await broken.query(h, DEPLOYMENT_STATUS, DeploymentView)


def _check_replicas(replicas: int) -> None:
    """A whole number (not true, "3" or 3.0) within the ceiling; the control plane checks the operator's maximum."""
    if type(replicas) is not int:
        raise InvalidInput(f"replicas must be a whole number >= 0, got {str(replicas)[:20]!r} ({type(replicas).__name__})")
    if replicas < 0:
        raise InvalidInput(f"replicas must be >= 0, got {replicas}")
    if replicas > REPLICAS_CEILING:
        raise InvalidInput(f"replicas {replicas} is more than the ceiling of {REPLICAS_CEILING}")


async def scale(client: Client, name: str, replicas: int) -> DeploymentView:
    _check_replicas(replicas)
    h = await deployment_handle(client, name)
    return await run_update(h, DEPLOYMENT_SCALE, replicas, result_type=DeploymentView)


async def delete(client: Client, name: str, wait: bool = False,
                 progress: Callable[[int], None] | None = None, every_s: float = 5.0) -> DeploymentView:
    """Delete the deployment; with ``wait``, return once every instance has stopped and its workflow
    has closed (gpuflow/delete_wait.py), telling ``progress`` how many are left every
    ``every_s`` meanwhile (500 replicas take about a minute)."""
    h = await deployment_handle(client, name, asked=False)
    why = await broken.task_failing(h)
    if why:  # it cannot take the delete update (a queue no worker polls...): end it, stop its instances directly
        await h.terminate(f"gpuflow delete: the deployment was broken: {why}")
        stopped = broken.stop_instances_of(client, name)
        return DeploymentView(name=name, replicas=0, instances=await stopped, deleting=True,
                              broken=why)
    view = await run_update(h, DEPLOYMENT_DELETE, result_type=DeploymentView)
    if not wait:
        return view
    return await delete_wait.until_gone(client, h, view, progress, every_s)


async def instance(client: Client, name: str, timeout_s: float | None = None) -> InstanceView:
    """Replica ``name``'s status (its workflow's query, given up after ``timeout_s``: broken.query)."""
    from contracts.control import InstanceView

    h = client.get_workflow_handle(instance_id(name))
    try:
        return await broken.query(h, INSTANCE_STATUS, InstanceView, timeout_s)
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise InvalidInput(f"no instance named {name!r}") from None
        raise


async def download_progress(client: Client, name: str) -> dict[str, Any] | None:
    """A download under way for this instance: the last progress its prepare_model activity
    heartbeated ({what, done, total}), read off the workflow's pending activities."""
    from contracts.agent import PREPARE_MODEL

    try:
        desc = await client.get_workflow_handle(instance_id(name)).describe()
    except RPCError:
        return None
    for act in desc.raw_description.pending_activities:
        if act.activity_type.name == PREPARE_MODEL and act.heartbeat_details.payloads:
            details = await client.data_converter.decode(act.heartbeat_details.payloads)
            return details[0] if details and isinstance(details[0], dict) else None
    return None


async def _running(client: Client, wtype: str) -> list[str]:
    q = f"WorkflowType = '{wtype}' AND ExecutionStatus = 'Running'"
    return sorted(await listed(client, q))  # ids only (gpuflow/visibility.py)


async def status(client: Client, name: str | None = None,
                 known_states: Callable[[str], dict[str, str] | None] | None = None) -> dict[str, Any]:
    """Every deployment (or ``name``) with its instances, and the hosts. ``known_states(deployment)``
    (``gpuflow status --summary`` with the store at hand) gives instance -> state from the store's
    projection: where it names every instance the deployment lists, those states stand in for a
    query to each instance's workflow (a thousand replicas, a thousand queries, each answered by a
    control-plane worker); where it does not (another cluster's store), the queries are made."""
    names = [name] if name else [w.split("/", 1)[1] for w in await _running(client, DEPLOYMENT_WORKFLOW)]
    deployments = []
    for n in names:
        try:
            h = await deployment_handle(client, n, asked=False)  # one on another queue: shown BROKEN below
        except InvalidInput:
            if name:
                raise
            continue  # ended since it was listed
        try:  # one deployment that does not answer is reported broken; the rest are still shown
            why = await broken.task_failing(h)
            if why:
                raise InvalidInput(why)
            view = await broken.query(h, DEPLOYMENT_STATUS, DeploymentView)
        except Exception as e:  # noqa: BLE001
            deployments.append({"name": n, "broken": broken.reason(e), "instances": []})
            continue
        listed = view.instances + [i for i in view.stopping if i not in view.instances]
        known = known_states(n) if known_states else None
        if known is not None and all(i in known for i in listed):
            insts = [{"name": i, "state": known[i]} for i in listed]
        else:
            insts = await bounded([_instance_row(client, i) for i in listed])
        deployments.append({"name": n, "replicas": view.replicas, "deleting": view.deleting,
                            "backend": view.spec.get("backend"), "resources": view.spec.get("resources"),
                            "instances": insts, **group_view(view, insts)})
    st = {"deployments": deployments, "hosts": [] if name else [h.model_dump(mode="json") for h in await hosts(client)]}
    from views.usage import with_usage  # each replica's measured memory, from its hosts' reports

    return await with_usage(client, st, _host)


async def autoscalers(client: Client, names: list[str]) -> dict[str, str | None]:
    """Deployment -> None where its ``autoscaler/NAME`` workflow can be queried now, or why not
    (failed, terminated, its workflow task failing, ...); deployments without one are left out.
    Asked of Temporal's description first (no worker needed, answered at once), so a workflow
    someone started under that id with a garbage input, which failed at once or whose task fails
    forever, is reported instead of queried: that query hung for about 30 s each."""

    async def one(n: str) -> tuple[str, str | None] | None:
        h = client.get_workflow_handle(autoscaler_id(n))
        try:
            d = await h.describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return None
            return n, broken.reason(e)
        why = await broken.closed(h, d)
        if why is None and d.status is not None and d.status.name == "RUNNING":
            why = broken.failing(d, h.id)
        return n, why

    return dict(filter(None, await bounded([one(n) for n in names])))


async def _instance_row(client: Client, name: str) -> dict[str, Any]:
    try:
        row = (await instance(client, name)).model_dump(mode="json", exclude={"decision"})
        if row["state"] == "downloading":
            row["download"] = await download_progress(client, name)
        return row
    except (InvalidInput, RPCError) as e:
        return {"name": name, "state": "unknown", "reason": broken.reason(e)}


async def hosts(client: Client) -> list[HostView]:
    """Every host, in natural order of name (sim-2 before sim-10)."""
    wids = sorted(await _running(client, HOST_WORKFLOW), key=natural_key)
    return await bounded([_host(client, wid) for wid in wids])


async def forget_host(client: Client, name: str) -> str:
    """End a host that is gone for good: its workflow's ``forget`` update removes it from the
    store (refused while it is READY or holds reservations), then its logs workflow is ended."""
    problem = name_problem(name)
    if problem:
        raise InvalidInput(f"host name {name!r}: {problem}")
    done = await run_update(await _host_handle(client, name, ": forgotten, or ended"), HOST_FORGET, result_type=str)
    try:
        await client.get_workflow_handle(host_logs_id(name)).terminate(f"host {name} forgotten")
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise
    return done


async def cordon(client: Client, name: str, on: bool, reason: str = "") -> str:
    """Cordon host ``name`` (``on``: no new replicas are placed there; those running there keep
    running) or uncordon it, through its workflow's ``cordon``/``uncordon`` update, which records it
    in the store and in the workflow's history. Idempotent; the answer says what it did."""
    problem = name_problem(name)
    if problem:
        raise InvalidInput(f"host name {name!r}: {problem}")
    from contracts.control import CordonAsk
    from contracts.host import cordon_reason_problem

    problem = cordon_reason_problem(reason)
    if problem:
        raise InvalidInput(f"the cordon reason {problem}")
    if reason and not on:
        raise InvalidInput("uncordon takes no reason")
    h = await _host_handle(client, name)
    if on:
        return await run_update(h, HOST_CORDON, CordonAsk(reason=reason), result_type=str)
    return await run_update(h, HOST_UNCORDON, result_type=str)


async def _host_handle(client: Client, name: str, ended: str = ""):
    """Host ``name``'s workflow, running and the control plane's; InvalidInput (or Squatted) saying why not."""
    h = client.get_workflow_handle(host_id(name))
    d = await _described(h, f"no host named {name!r}", HOST_WORKFLOW)
    if d.status is None or d.status.name != "RUNNING":
        raise InvalidInput(f"no host named {name!r} in the cluster (its workflow is "
                           f"{d.status.name.lower() if d.status else 'gone'}{ended})")
    return h


async def _host(client: Client, wid: str) -> HostView:
    from contracts.control import HostView

    h = client.get_workflow_handle(wid)
    try:
        why = await broken.task_failing(h)
        if why:
            raise InvalidInput(why)
        return await broken.query(h, HOST_STATUS, HostView)
    except Exception as e:  # noqa: BLE001  one host that does not answer is shown broken
        return HostView(name=wid.split("/", 1)[1], state="broken", reason=broken.reason(e))


AT_ONCE = 32  # queries in flight at a time: a listing of 1,000 replicas asks 1,000 workflows


async def bounded(calls: list) -> list:
    """Await ``calls`` (coroutines), at most AT_ONCE at a time; their results in order. One after
    another, ``gpuflow status`` of 300 replicas took 4.1 s here; 32 at a time, 2.5 s (the rest is
    the control-plane worker answering each query, and the command's own start)."""
    gate = asyncio.Semaphore(AT_ONCE)

    async def one(c):
        async with gate:
            return await c

    return list(await asyncio.gather(*(one(c) for c in calls)))


async def explain(client: Client, name: str) -> dict[str, Any]:
    v = await instance(client, name)
    if v.decision is None:
        return {"instance": name, "state": v.state, "reason": v.reason, "decision": None}
    from views.usage import with_usage

    row = {"name": name, "state": v.state, "worker": v.worker, "subordinate_workers": v.subordinate_workers}
    await with_usage(client, {"deployments": [{"instances": [row]}]}, _host)  # its measured memory, if reported
    return {"instance": name, "state": v.state, "worker": v.worker, "gpu_indexes": v.gpu_indexes,
            **v.decision.summary(), **({"vram": row["vram"]} if "vram" in row else {})}  # as explain has always shown

