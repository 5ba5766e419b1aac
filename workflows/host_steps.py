"""Running a placed replica on its hosts, in the instance workflow: the model's files fetched
(a hub source: DOWNLOADING), the helpers of a placement across several workers started
(contracts/launch_parts.py), the server launched or adopted on the main worker (STARTING, then
RUNNING), then supervised (supervise_steps.py) until that run ends. Every call goes to the host's
own task queue; one the host does not take within the patience given is an unreachable host."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from contracts import agent as hp
    from contracts import launch_parts as topology
    from scheduler.spec import ModelSpec
    from scheduler.topology_policy import wants_pinning
    from workflows import common as c
    from workflows.supervise_steps import SuperviseSteps

# What an agent's refusal of a launch means: it cannot start there (failed), the spec's fault
# (invalid: no restart), or the ledger no longer holds the placement (unbooked); anything else
# (a timeout) is an unreachable host.
LAUNCH_FAILURES = {"LaunchFailed": "failed", "InvalidSpec": "invalid", "LaunchRefused": "invalid",
                   "InvalidName": "invalid", "NotBooked": "unbooked"}


class HostTrouble(Exception):
    """A launch on one host failed: ``kind`` failed (it cannot start there) or unreachable."""

    def __init__(self, kind: str, host: str, why: str):
        super().__init__(why)
        self.kind, self.host, self.why = kind, host, why


class HostSteps(SuperviseSteps):
    def _launch_request(self, spec: ModelSpec) -> hp.LaunchRequest:
        plan, t = self.s.plan, self.t
        claim = plan.claim
        return hp.LaunchRequest(instance=self.inp.name, model=spec.name, backend=spec.backend.value,
                                run_command=spec.run_command, model_path=spec.source.local_path,
                                gpu_indexes=self.gpus, env=dict(spec.env), ready_timeout_s=t.ready_timeout_s,
                                settle_s=t.settle_s, backend_parameters=list(spec.backend_parameters),
                                offload_layers=claim.offload_layers, tensor_split=claim.tensor_split,
                                vram_utilization=claim.vram_utilization, distributed=bool(plan.subordinates),
                                liveness_s=t.liveness_s, liveness_failures=t.liveness_failures,
                                cpu_pinning=wants_pinning(spec), cpus=plan.cpus, numa_nodes=plan.numa_nodes,
                                vram_claim=dict(claim.vram), ram_claim=claim.ram, source=spec.source.key,
                                vram_stated=spec.resources.vram or 0 if spec.resources else 0,
                                **self._pd_fields())

    def _pd_fields(self) -> dict:
        """A prefill/decode group's member: its role and the group's mode, for the agent's flags and
        KV ports (worker_agent/pd_argv.py); a router, or a plain replica, hands no KV."""
        role = self.inp.role if self.inp.role in hp.PD_ROLES else None
        return {"pd_role": role, "pd_mode": self.inp.pd_mode if role else None}

    async def _launch(self, worker: str, req: hp.LaunchRequest, sts: float) -> hp.LaunchResult:
        try:
            res = await workflow.execute_activity(
                hp.LAUNCH_INSTANCE, req, result_type=hp.LaunchResult, **self._host_timeouts(worker, sts),
                start_to_close_timeout=c.secs(self.t.ready_timeout_s + 60),
                retry_policy=RetryPolicy(maximum_attempts=2, non_retryable_error_types=["LaunchFailed", "InvalidSpec"]),
                summary=f"launch {req.key} on {worker}")
        except ActivityError as e:
            kind, msg = c.cause(e)
            raise HostTrouble(LAUNCH_FAILURES.get(kind, "unreachable"), worker, msg) from None
        self.s.pids[req.key] = res.pid  # its host's agent supervises it: its end names this pid
        return res

    async def _start_helpers(self, req: hp.LaunchRequest, sts: float) -> tuple[hp.LaunchRequest, list]:
        """A placement across several workers: start the engine's helpers (launch_parts.py) and
        return the server's request pointing at them, with the (worker, request) of each."""
        subs = self.s.plan.subordinates
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

    def _with_proof(self, req: hp.LaunchRequest) -> hp.LaunchRequest:
        """The first launch after its booking carries the booking signed for its host
        (contracts/booking_proof.py), once: any later launch (a retry, a restart) has its agent ask
        the ledger, as a launch without one does."""
        proof, self.s.booking_proof = self.s.booking_proof, None
        if proof is None or proof.host != self.worker:
            return req
        return req.model_copy(update={"booking_proof": proof})

    async def _run_on_host(self, spec: ModelSpec, sts: float, quiet: bool) -> tuple[str, str, str, bool]:
        """Launch (or adopt) on the host, and the helpers on every host a placement across several
        workers uses, then supervise them all. Returns (outcome, why, host, reached): stopped,
        exited, failed (could not start), invalid, unbooked or unreachable; ``reached``: the host
        answered (a launch or adoption) before it ended."""
        s = self.s
        req = self._launch_request(spec)
        parts: list[tuple[str, hp.LaunchRequest]] = []
        s.processes_stopped = False
        for h in [self.worker] + self.subordinate_workers:  # news of its hosts from before this launch is old;
            s.news.pop(h, None)  # news that comes during it is acted on as it supervises (a restart: asked again)
        try:
            if s.hub:
                req = await self._fetch_model(spec, req, sts, quiet)
            if not quiet:
                await self._record("starting")
            if s.plan.subordinates:
                req, parts = await self._start_helpers(req, sts)
                s.parts = {r.key: w for w, r in parts}
            res = await self._launch(self.worker, self._with_proof(req), sts)
        except HostTrouble as t:
            if t.kind in ("failed", "invalid", "unbooked") and s.plan.subordinates:
                await self._stop_everywhere()  # the next attempt starts every part afresh
            return t.kind, t.why, t.host, False
        s.pid, s.port, s.address, s.kv_events_port = res.pid, res.port, res.address, res.kv_events_port
        s.bootstrap_port = res.bootstrap_port  # a prefill/decode member's KV hand-off port, recorded for the gateways
        s.key_id, s.launch_mac = res.key_id, res.mac
        sts = self.t.host_schedule_to_start_s  # the host answers: supervise with the full patience, not the grace left
        started_here = req.backend == "sglang" and bool(parts)  # rank 0 was started moments ago, then waited for
        why = "adopted the running process" if res.adopted and not started_here else ""
        unproven = await self._record_running("; ".join(x for x in (why, res.binding) if x))
        if unproven:
            return "unbooked", unproven, self.worker, True
        kind, why, host = await self._supervise([(self.worker, req)] + parts, sts)
        return kind, why, host, True

    async def _record_running(self, reason: str) -> str:
        """RUNNING recorded; or, when the store refuses the launch (its MAC does not verify with the
        booked host's credential, or the ledger no longer books it there: a preemptor took its GPUs
        meanwhile), why, with its processes stopped: the replica lets go of its placement and is
        placed again, and nothing routes to an address its host did not vouch for."""
        try:
            await self._record("running", reason)
        except ActivityError as e:
            kind, why = c.cause(e)
            if kind != "LaunchUnproven":
                raise
            await self._stop_everywhere()
            self.s.processes_stopped = True
            return why
        return ""

    async def _fetch_model(self, spec: ModelSpec, req: hp.LaunchRequest, sts: float, quiet: bool) -> hp.LaunchRequest:
        """A hub source: its files into the model cache of the main worker (and, for vLLM and SGLang
        across workers, of each subordinate: every node loads the weights). Recorded DOWNLOADING; ``gpuflow status``
        shows the bytes from the activity's heartbeats. A broken download is retried and resumes."""
        hosts = [self.worker] + (self.subordinate_workers if spec.backend.value in ("vllm", "sglang") else [])
        if not quiet:
            await self._record("downloading", f"fetching {self.s.source_key} on {', '.join(hosts)}",
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
                    summary=f"fetch {self.s.source_key} on {worker}")
            except ActivityError as e:
                kind, msg = c.cause(e)
                if kind in ("ModelNotFound", "DownloadFailed"):
                    await self._record("error", msg, file_state="error")
                    raise HostTrouble("failed", worker, msg) from None
                raise HostTrouble("unreachable", worker, msg) from None

        ready = await asyncio.gather(*(on(w) for w in hosts))
        return req.model_copy(update={"model_path": ready[0].path})
