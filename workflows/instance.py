"""ModelInstanceWorkflow (id ``instance/<name>``): one replica's whole life.

PENDING -> ANALYZING (estimate) -> decide and book (place_steps.py) -> SCHEDULED -> launch on the
host's queue -> STARTING -> RUNNING -> supervise. A process exit gives ERROR and a restart on the same host
after min(base * 2^(n-1), cap) seconds. A host that stops answering gives UNREACHABLE; if it is
back within the grace period the process is adopted (or restarted) there, otherwise the
reservation is released and the instance is placed elsewhere. An unschedulable instance waits
PENDING with its reasons until a ``capacity_changed`` signal (a release, a host joining or
changing, the queue's sweep). ``stop`` stops the process, releases the reservation and ends the workflow.

Preemption (scheduler/tenancy/preemption.py): a decision may place the replica by taking the GPUs
of victims. The ledger moves them in one transaction; the preemptor then signals each victim
``preempt`` and waits for ``victim_stopped`` from each (or the store showing it stopped) before it
launches on those GPUs. A victim drains, stops its processes, and waits PENDING in its own
deployment with the reason ``preempted by prod/chat-0 to reclaim prod's guarantee``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from contracts.control import (DecisionRecord, HostNews, InstanceInput, InstanceRecord, InstanceView, PreemptNotice,
                                     host_queue)
    from scheduler.naming import name_problem
    from scheduler.spec import ModelSpec
    from scheduler.topology_policy import wants_pinning
    from contracts import agent as hp
    from contracts import launch_parts as topology
    from workflows import common as c
    from workflows import guards
    from workflows.inputs import one_input
    from workflows import place_steps, preempt_steps, supervise_steps
    from workflows.place_steps import backoff

DEPLOYMENT_ENDED_SIGNAL = "instance_ended"
RECORD_LOCAL = "record-local"  # the store writes of _record are local activities
PREEMPTION = preempt_steps.PATCH


class HostTrouble(Exception):
    """A launch on one host failed: ``kind`` failed (it cannot start there) or unreachable."""

    def __init__(self, kind: str, host: str, why: str):
        super().__init__(why)
        self.kind, self.host, self.why = kind, host, why


@workflow.defn(name="ModelInstanceWorkflow")
class ModelInstanceWorkflow:
    @workflow.init
    def __init__(self, *args: Any) -> None:
        inp = one_input(args, InstanceInput, "ModelInstanceWorkflow")
        self.inp, self.t = inp, inp.timings
        self.state, self.reason = "pending", ""
        self.plan = inp.placement
        self.restarts = inp.restarts
        self.pid: int | None = None
        self.port: int | None = None
        self.address: str | None = None  # where the server listens (the host agent's advertised address)
        self.decision: DecisionRecord | None = inp.decision  # carried across continue-as-new, for explain
        self.stop_requested = False
        self.woken = False
        self._recorded: tuple | None = None
        self.parts: dict[str, str] = {}  # helper process key (instance@part) -> its worker
        self.source_key: str | None = None
        self.reached = False  # the last _run_on_host reached its host (a launch or adoption answered)
        self.preempted: PreemptNotice | None = None  # a preemption took its GPUs: stop, then wait PENDING
        self.preempted_why = ""  # shown first while it waits, until it is placed again
        self.victims_stopped: set[str] = set()
        self.news: dict[str, HostNews] = {}  # host -> what its watch last said (generation 2: host_news)
        self.processes_stopped = False  # its processes were stopped on every host since the last launch

    # --- messages -------------------------------------------------------------------------------
    @workflow.signal
    def stop(self) -> None:
        self.stop_requested = True

    @workflow.signal
    def capacity_changed(self) -> None:
        self.woken = True

    @workflow.signal
    def preempt(self, notice: PreemptNotice) -> None:
        """From a preemptor whose booking took this replica's GPUs (untrusted: its names are checked)."""
        if not name_problem(notice.instance) and len(notice.by) <= 300 and len(notice.why) <= 300:
            self.preempted = notice

    @workflow.signal
    def victim_stopped(self, name: str) -> None:
        if isinstance(name, str) and len(self.victims_stopped) < 1000 and not name_problem(name):
            self.victims_stopped.add(name)

    @workflow.signal
    def host_news(self, news: HostNews) -> None:
        """From the control plane (untrusted: checked): a host of the placement was lost, or its agent
        restarted. Runs of generation 2 act on it while they supervise."""
        if news.kind in ("lost", "restarted") and not name_problem(news.host) and len(news.why) <= 500 \
                and (news.host in self.news or len(self.news) < 64):
            self.news[news.host] = news

    @workflow.query
    def status(self) -> InstanceView:
        return InstanceView(name=self.inp.name, deployment=self.inp.deployment, model=self.spec_name,
                            state=self.state, reason=self.reason, worker=self.worker, gpu_indexes=self.gpus,
                            restarts=self.restarts, pid=self.pid, port=self.port, address=self.address, decision=self.decision,
                            subordinate_workers=self.subordinate_workers, parts=dict(self.parts))

    @property
    def spec_name(self) -> str:
        return str(self.inp.spec.get("name", ""))

    @property
    def worker(self) -> str | None:
        return self.plan.worker if self.plan else None

    @property
    def subordinate_workers(self) -> list[str]:
        return sorted({s.worker for s in self.plan.subordinates} - {self.plan.worker}) if self.plan else []

    @property
    def gpus(self) -> list[int]:
        return list(self.plan.gpu_indexes) if self.plan else []

    # --- store and search attributes ------------------------------------------------------------
    def _recorded_by_store(self, state: str, reason: str, attributes: bool = False) -> None:
        """An activity wrote the row (the booking): this workflow's state follows. Its search
        attributes follow with the next record (the launch's STARTING, in the same workflow task),
        or now (``attributes``: the booking wrote STARTING itself, so that record is skipped)."""
        self.state, self.reason = state, reason
        self._recorded = self._row_key(state, reason)
        if attributes:
            self._attributes(state)

    def _row_key(self, state: str, reason: str) -> tuple:
        """What a record of ``state`` would write now: a record equal to the last one is skipped."""
        return (state, reason, self.worker, tuple(self.gpus), self.restarts, self.pid, self.port, self.address)

    def _attributes(self, state: str) -> None:
        workflow.upsert_search_attributes([
            c.SA_STATE.value_set(state.upper()),
            c.SA_WORKER.value_set(self.worker) if self.worker else c.SA_WORKER.value_unset()])

    async def _record(self, state: str, reason: str = "", decision: dict | None = None,
                      file_state: str | None = None) -> None:
        """The store's row, then this workflow's ``status``: a state is shown once the store holds it.
        The rollout's probe reads ``status`` and then stops an old replica; the gateways route by the
        store. Shown first, a new replica's RUNNING could reach the probe while its row still said
        STARTING, and the old one left the routing table with no replica in it."""
        key = self._row_key(state, reason)
        if key == self._recorded and decision is None and file_state is None:
            self.state, self.reason = state, reason
            return
        self._recorded = key
        self._attributes(state)
        rec = InstanceRecord(
            name=self.inp.name, deployment=self.inp.deployment, model=self.spec_name, state=state, reason=reason,
            worker=self.worker, gpu_indexes=self.gpus, restarts=self.restarts, pid=self.pid, port=self.port,
            address=self.address, decision=decision, model_source=self.source_key, model_file_state=file_state)
        if c.patched(self.inp, RECORD_LOCAL):
            # A local activity: run by this worker inside the workflow task, no round trip through the
            # task queue, no history events of its own (a marker). Its semantics fit this write: it is
            # short (one row and one change-log line), needs no heartbeat and no other host, and it is
            # idempotent (it sets the whole row to what this workflow holds now), so the at-least-once
            # of a local activity (re-run when the task that ran it is lost before it was recorded) writes
            # the same row again. It is awaited before the workflow goes on, so the store still shows
            # each state before the next step's activity starts, as before.
            await workflow.execute_local_activity(c.RECORD_INSTANCE, rec, **c.STORE_LOCAL)
        else:  # a history from before the patch: the activity on the task queue
            await workflow.execute_activity(c.RECORD_INSTANCE, rec, **c.STORE_CALL)
        self.state, self.reason = state, reason

    # --- the life -------------------------------------------------------------------------------
    @workflow.run
    async def run(self, *args: Any) -> InstanceView:
        inp = self.inp
        try:
            spec = ModelSpec.model_validate(inp.spec)
        except ValidationError as e:
            raise ApplicationError(f"invalid model spec: {e}", type="InvalidSpec", non_retryable=True) from None
        self._check_names(spec)
        self.source_key = spec.source.key
        sa = workflow.info().typed_search_attributes  # as the run started (its first event): deterministic
        if inp.code < 1 or sa.get(c.SA_MODEL) != spec.name or sa.get(c.SA_DEPLOYMENT) != inp.deployment:
            # generation 0 always upserted them; since 1 the starter sets them (start_instances)
            workflow.upsert_search_attributes([c.SA_MODEL.value_set(spec.name),
                                               c.SA_DEPLOYMENT.value_set(inp.deployment)])
        try:
            await self._live(spec)
        except asyncio.CancelledError:
            self.stop_requested = True
            await self._teardown()
            raise
        await self._teardown()
        return self.status()

    def _check_names(self, spec: ModelSpec) -> None:
        """Names from whoever started this workflow: checked before any host hears them."""
        inp = self.inp
        guards.names(instance=inp.name, deployment=inp.deployment)
        if spec.name != inp.deployment:
            raise guards.refuse(f"spec name {spec.name!r} does not match deployment {inp.deployment!r}")
        guards.instance_names(inp.deployment, [inp.name])
        guards.workflow_id(f"instance/{inp.name}", f"instance name {inp.name!r}")
        if (self.plan is not None or inp.decision is not None) and not workflow.info().continued_run_id:
            # only this workflow's own continue-as-new carries a placement (booked in the ledger by an
            # earlier run): a new run with one in its input was started by somebody else
            raise guards.refuse(f"instance {inp.name}: a new instance workflow may not bring a placement or a decision "
                                "in its input; placements are booked by the control plane (start it through its "
                                "deployment: gpuflow deploy)")
        if self.plan is not None:
            guards.names(worker=self.plan.worker, **{f"subordinate worker {i}": s.worker
                                                      for i, s in enumerate(self.plan.subordinates)})

    async def _live(self, spec: ModelSpec) -> None:
        unreachable_since = None
        while not self.stop_requested:
            if self.preempted is not None and c.patched(self.inp, PREEMPTION):  # before continue-as-new: it holds nothing after
                await preempt_steps.give_way(self)
                continue
            if workflow.info().is_continue_as_new_suggested():
                workflow.continue_as_new(self.inp.model_copy(update={"restarts": self.restarts, "placement": self.plan,
                                                                     "decision": self.decision}))
            if self.plan is None and not await place_steps.place(self, spec):
                continue
            if self.preempted is not None:  # arrived while it was placing: give way first
                continue
            sts = self.t.host_schedule_to_start_s
            if unreachable_since is not None:
                sts = max(1.0, self.t.unreachable_grace_s - (workflow.now() - unreachable_since).total_seconds())
            self.reached = False
            kind, why, host = await self._run_on_host(spec, sts, quiet=unreachable_since is not None)
            if kind == "stopped" and not self.stop_requested and self.preempted is not None:
                continue  # stopped for a preemptor: give way at the top of the loop
            if kind == "stopped":
                return
            if kind == "invalid":  # the spec's fault: no restart, no re-placement
                await self._give_up(f"refused by {host}: {why}")
                return
            if kind == "unbooked":  # the ledger no longer holds its placement (taken by a preemptor, say)
                await self._let_go(f"{host} found no booking for it ({why}); placing it again")
                unreachable_since = None
                continue
            if self.reached:  # the host answered (launched or adopted): an outage after this is a new episode
                unreachable_since = None
            if kind == "unreachable":
                if unreachable_since is None:
                    unreachable_since = workflow.now()
                    await self._record("unreachable", f"host {host} stopped answering: {why}")
                    continue
                left = self.t.unreachable_grace_s - (workflow.now() - unreachable_since).total_seconds()
                if c.generation(self.inp, 2) and left > 0:
                    # failed again within the grace: a frozen or cut-off agent's poll, sent before it
                    # froze, can take the launch and never answer it. The placement is kept for the
                    # whole grace: try again (a second apart) with what is left of it.
                    await workflow.sleep(c.secs(min(1.0, left)))
                    continue
                await self._abandon_host(host)
                unreachable_since = None
                continue
            unreachable_since = None
            self.restarts += 1
            delay = backoff(self.restarts, self.t.restart_base_s, self.t.restart_cap_s)
            self.pid = None
            await self._record("error", f"{why}; restart {self.restarts} on {self.worker} in {delay:g} s")
            try:
                await workflow.wait_condition(lambda: self.stop_requested or self.preempted is not None,
                                              timeout=c.secs(delay))
            except asyncio.TimeoutError:
                pass

    def _launch_request(self, spec: ModelSpec) -> hp.LaunchRequest:
        claim = self.plan.claim
        return hp.LaunchRequest(instance=self.inp.name, model=spec.name, backend=spec.backend.value,
                                run_command=spec.run_command, model_path=spec.source.local_path,
                                gpu_indexes=self.gpus, env=dict(spec.env), ready_timeout_s=self.t.ready_timeout_s,
                                settle_s=self.t.settle_s, backend_parameters=list(spec.backend_parameters),
                                offload_layers=claim.offload_layers, tensor_split=claim.tensor_split,
                                vram_utilization=claim.vram_utilization, distributed=bool(self.plan.subordinates),
                                liveness_s=self.t.liveness_s, liveness_failures=self.t.liveness_failures,
                                cpu_pinning=wants_pinning(spec),
                                cpus=self.plan.cpus, numa_nodes=self.plan.numa_nodes,
                                stop_on_cancel=not c.generation(self.inp, 2))

    def _host_timeouts(self, worker: str, sts: float) -> dict:
        return dict(task_queue=host_queue(worker), schedule_to_start_timeout=c.secs(sts),
                    heartbeat_timeout=c.secs(self.t.host_heartbeat_s))

    async def _launch(self, worker: str, req: hp.LaunchRequest, sts: float) -> hp.LaunchResult:
        try:
            return await workflow.execute_activity(
                hp.LAUNCH_INSTANCE, req, result_type=hp.LaunchResult, **self._host_timeouts(worker, sts),
                start_to_close_timeout=c.secs(self.t.ready_timeout_s + 60),
                retry_policy=RetryPolicy(maximum_attempts=2, non_retryable_error_types=["LaunchFailed", "InvalidSpec"]),
                summary=f"launch {req.key} on {worker}")
        except ActivityError as e:
            kind, msg = c.cause(e)
            outcome = {"LaunchFailed": "failed", "InvalidSpec": "invalid", "LaunchRefused": "invalid",
                       "InvalidName": "invalid", "NotBooked": "unbooked"}.get(kind, "unreachable")
            raise HostTrouble(outcome, worker, msg) from None

    async def _start_helpers(self, req: hp.LaunchRequest, sts: float) -> tuple[hp.LaunchRequest, list]:
        """A placement across several workers: start the engine's helpers (topology.py) and
        return the server's request pointing at them, with the (worker, request) of each."""
        subs = self.plan.subordinates
        why = topology.unsupported(req)
        if why:
            raise HostTrouble("failed", self.worker, why)
        if req.backend == "llama.cpp":
            parts = topology.rpc_servers(req, subs)
            done = await asyncio.gather(*(self._launch(w, r, sts) for w, r in parts))
            return topology.server_over_rpc(req, [f"{d.address}:{d.port}" for d in done]), parts
        if req.backend == "sglang":  # rank 0 first (it picks the port the others meet it on), not waited for
            head = topology.sglang_head(req, subs)
            h = await self._launch(self.worker, head, sts)
            address = f"{h.address}:{h.dist_port}"
            parts = topology.sglang_nodes(head, subs, address)
            await asyncio.gather(*(self._launch(w, r, sts) for w, r in parts))
            return topology.sglang_server(head, address), parts
        head = topology.ray_head(req)
        h = await self._launch(self.worker, head, sts)
        address = f"{h.address}:{h.port}"
        parts = topology.ray_workers(req, subs, address)
        await asyncio.gather(*(self._launch(w, r, sts) for w, r in parts))
        return topology.server_over_ray(req, address, 1 + len(subs)), [(self.worker, head)] + parts

    async def _run_on_host(self, spec: ModelSpec, sts: float, quiet: bool) -> tuple[str, str, str]:
        """Launch (or adopt) on the host, and the helpers on every host a placement across several
        workers uses, then supervise them all. Returns (outcome, why, host): stopped, exited,
        failed (could not start) or unreachable."""
        req = self._launch_request(spec)
        parts: list[tuple[str, hp.LaunchRequest]] = []
        self.processes_stopped = False
        try:
            if place_steps.hub_source(spec):
                req = await self._fetch_model(spec, req, sts, quiet)
            if not quiet:
                await self._record("starting")
            if self.plan.subordinates:
                req, parts = await self._start_helpers(req, sts)
                self.parts = {r.key: w for w, r in parts}
            res = await self._launch(self.worker, req, sts)
        except HostTrouble as t:
            if t.kind in ("failed", "invalid", "unbooked") and self.plan.subordinates:
                await self._stop_everywhere()  # the next attempt starts every part afresh
            return t.kind, t.why, t.host
        self.pid, self.port, self.address, self.reached = res.pid, res.port, res.address, True
        sts = self.t.host_schedule_to_start_s  # the host answers: supervise with the full patience, not the grace left
        started_here = req.backend == "sglang" and bool(parts)  # rank 0 was started moments ago, then waited for
        why = "adopted the running process" if res.adopted and not started_here else ""
        await self._record("running", "; ".join(x for x in (why, res.binding) if x))
        watched = [(self.worker, req)] + parts
        if c.generation(self.inp, 2):
            return await supervise_steps.supervise(self, watched, sts)
        return await supervise_steps.supervise_v1(self, watched, sts)

    async def _drain(self, sups: list) -> None:
        """DRAINING: gateways route RUNNING replicas only, so this one gets no new request; the
        drain activity waits until the gateways have none in flight on it, at most
        drain_timeout_s. The process ending meanwhile ends the wait."""
        limit = self.t.drain_timeout_s
        if limit <= 0:
            return
        await self._record("draining", f"finishing the requests in flight (at most {limit:g} s)")
        drain = workflow.start_activity(
            c.DRAIN_INSTANCE, args=[self.inp.name, limit], result_type=int, start_to_close_timeout=c.secs(limit + 60),
            heartbeat_timeout=c.CONTROL_HEARTBEAT, retry_policy=RetryPolicy(maximum_attempts=3),
            summary=f"drain {self.inp.name}")
        await workflow.wait_condition(lambda: drain.done() or any(s.done() for s in sups))
        if not drain.done():
            drain.cancel()
        try:
            left = await drain
        except (ActivityError, asyncio.CancelledError):
            return
        if left:
            await self._record("draining", f"{left} request(s) still in flight after {limit:g} s; stopping")

    async def _fetch_model(self, spec: ModelSpec, req: hp.LaunchRequest, sts: float, quiet: bool) -> hp.LaunchRequest:
        """A hub source: its files into the model cache of the main worker (and, for vLLM and SGLang
        across workers, of each subordinate: every node loads the weights). Recorded DOWNLOADING; ``gpuflow status``
        shows the bytes from the activity's heartbeats. A broken download is retried and resumes."""
        hosts = [self.worker] + (self.subordinate_workers if spec.backend.value in ("vllm", "sglang") else [])
        if not quiet:
            await self._record("downloading", f"fetching {self.source_key} on {', '.join(hosts)}",
                               file_state="downloading")
        fetch = hp.ModelFetch(instance=self.inp.name, source=spec.source.model_dump(mode="json", exclude_none=True))

        async def on(worker: str) -> hp.ModelReady:
            try:
                return await workflow.execute_activity(
                    hp.PREPARE_MODEL, fetch, result_type=hp.ModelReady, **self._host_timeouts(worker, sts),
                    start_to_close_timeout=timedelta(days=2),
                    retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30),
                                             maximum_attempts=self.t.download_attempts,
                                             non_retryable_error_types=["ModelNotFound"]),
                    summary=f"fetch {self.source_key} on {worker}")
            except ActivityError as e:
                kind, msg = c.cause(e)
                if kind in ("ModelNotFound", "DownloadFailed"):
                    await self._record("error", msg, file_state="error")
                    raise HostTrouble("failed", worker, msg) from None
                raise HostTrouble("unreachable", worker, msg) from None

        ready = await asyncio.gather(*(on(w) for w in hosts))
        return req.model_copy(update={"model_path": ready[0].path})

    async def _stop_everywhere(self, skip: set[str] = frozenset()) -> None:
        """Stop the instance's processes on every host of the placement (but ``skip``); a host that
        does not answer is skipped (its processes went with it, or its agent reaps them on return)."""
        for w in [self.worker] + self.subordinate_workers:
            if w in skip:
                continue
            try:
                await workflow.execute_activity(
                    hp.STOP_INSTANCE, self.inp.name, task_queue=host_queue(w),
                    schedule_to_start_timeout=c.secs(self.t.host_schedule_to_start_s),
                    start_to_close_timeout=c.secs(120), retry_policy=RetryPolicy(maximum_attempts=2))
            except ActivityError:
                pass

    async def _abandon_host(self, lost: str) -> None:
        if self.plan.subordinates:
            await self._stop_everywhere()  # the hosts that still answer let go of their parts
        await workflow.execute_activity(c.RELEASE_PLACEMENT, self.inp.name, **c.STORE_CALL)
        self.plan, self.pid, self.port, self.address = None, None, None, None
        await self._record("pending", f"host {lost} unreachable for {self.t.unreachable_grace_s:g} s; "
                                      "reservation released, placing elsewhere")

    async def _let_go(self, reason: str) -> None:
        """The placement it holds is not what the ledger holds: drop it (whatever is left of the
        booking is released) and wait PENDING to be placed again."""
        await workflow.execute_activity(c.RELEASE_PLACEMENT, self.inp.name, **c.STORE_CALL)
        self.plan, self.pid, self.port, self.address = None, None, None, None
        await self._record("pending", reason)

    async def _give_up(self, reason: str) -> None:
        """The spec's fault, which no retry mends: ERROR with the reason, the reservation (if any)
        released, and nothing more until ``stop`` (a new spec replaces the instance)."""
        if self.plan is not None:
            if self.plan.subordinates:
                await self._stop_everywhere()  # helpers that did start
            await workflow.execute_activity(c.RELEASE_PLACEMENT, self.inp.name, **c.STORE_CALL)
            self.plan, self.pid, self.port, self.address = None, None, None, None
        await self._record("error", reason)
        await workflow.wait_condition(lambda: self.stop_requested)

    async def _teardown(self) -> None:
        await self._record("stopping")
        if self.plan is not None:
            if not self.processes_stopped:
                await self._stop_everywhere()
            await workflow.execute_activity(c.RELEASE_PLACEMENT, self.inp.name, **c.STORE_CALL)
            self.plan = None
        self.pid = self.port = self.address = None
        await self._record("deleted")
        try:
            await workflow.get_external_workflow_handle(f"deployment/{self.inp.deployment}").signal(
                DEPLOYMENT_ENDED_SIGNAL, self.inp.name)
        except Exception:  # noqa: BLE001  the deployment may be gone already
            pass
