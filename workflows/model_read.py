"""Reading a local model path on the GPU hosts, for the instance workflow's estimate: ask the
hosts that could run the model (model_readers) in parallel, record which have the path (the
local-path filter then keeps only those), and return the first host's read. A path no host has
leaves the instance PENDING with the path and each host's answer, until a host joins or changes
(``capacity_changed``) or ``pending_recheck_s`` passes; a file that is there but not a model the
estimator reads is the spec's fault: ERROR, until the deployment gets a new spec."""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from contracts.control import host_queue
    from contracts.hosts import ModelPaths, ReadersAsk
    from contracts.estimate_inputs import EstimateInputs, HeaderRequest, ReaderHosts
    from scheduler.spec import ModelSpec
    from contracts import agent as hp
    from workflows import common as c
    from workflows.instance_base import InstanceBase

NOT_THERE = ("ModelPathMissing", "ModelPathRefused")


class ModelRead(InstanceBase):
    async def _read_on(self, host: str, req: HeaderRequest) -> EstimateInputs | tuple[str, str]:
        try:
            return await workflow.execute_activity(
                hp.READ_MODEL_HEADER, req, result_type=EstimateInputs, task_queue=host_queue(host),
                schedule_to_start_timeout=c.secs(self.t.host_schedule_to_start_s), start_to_close_timeout=c.secs(300),
                retry_policy=RetryPolicy(maximum_attempts=2, non_retryable_error_types=[*NOT_THERE, "ModelError"]),
                summary=f"read {req.path} on {host}")
        except ActivityError as e:
            return c.cause(e)

    async def _read_model(self, spec: ModelSpec) -> EstimateInputs | None:
        """What a host read of the spec's local path; None when the instance is stopping."""
        s = self.s
        path = spec.source.local_path
        req = HeaderRequest(path=path, gguf=spec.source.is_gguf or path.endswith(".gguf"))
        while not s.stop_requested:
            s.woken = False
            who: ReaderHosts = await workflow.execute_activity(c.MODEL_READERS, ReadersAsk(spec=self.inp.spec),
                                                               result_type=ReaderHosts, **c.STORE_CALL)
            got = await asyncio.gather(*(self._read_on(h, req) for h in who.hosts))
            answers = dict(zip(who.hosts, got))
            have = [h for h, a in answers.items() if isinstance(a, EstimateInputs)]
            missing = [h for h, a in answers.items() if isinstance(a, tuple) and a[0] in NOT_THERE]
            if have or missing:
                await workflow.execute_activity(c.RECORD_MODEL_PATHS, ModelPaths(instance=self.inp.name, path=path, present=have,
                                                                                     missing=missing),
                                                **c.STORE_CALL)
            if have:
                return answers[have[0]]
            bad = [a[1] for a in answers.values() if isinstance(a, tuple) and a[0] == "ModelError"]
            if bad:
                await self._record("error", f"cannot estimate the model: {bad[0]}")
                await workflow.wait_condition(lambda: s.stop_requested)
                return None
            why = "; ".join(f"{h}: {a[1]}" for h, a in answers.items()) or \
                "no READY host passes the filters" + (f" ({'; '.join(who.reasons[:3])})" if who.reasons else "")
            await self._record("pending", f"model path {path!r} is on no host that could run it: {why}")
            try:
                await workflow.wait_condition(lambda: s.woken or s.stop_requested,
                                              timeout=c.secs(self.t.pending_recheck_s))
            except asyncio.TimeoutError:
                pass
        return None
