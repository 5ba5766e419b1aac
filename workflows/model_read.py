"""Reading a local model path on the GPU hosts, for the instance workflow's estimate (the machine's
READ_MODEL): ask the hosts that could run the model (model_readers) in parallel, record which have
the path (the local-path filter then keeps only those), and give the first host's read. What
follows is the machine's (workflows/place_machine.py): a path no host has leaves the instance
PENDING with the path and each host's answer, until a host joins or changes (``capacity_changed``)
or ``pending_recheck_s`` passes; a file that is there but not a model the estimator reads is the
spec's fault: ERROR, until the deployment gets a new spec."""

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
    from workflows.instance_state import Action, Event

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

    async def _on_read_model(self, a: Action, spec: ModelSpec) -> Event:
        """One round: the hosts that could run the model read its path; which have it is recorded.
        ``read`` (the first host's read), ``model_bad`` (a file there is no model the estimator
        reads) or ``path_missing`` (the reason it waits PENDING, each host's answer in it)."""
        path = spec.source.local_path
        req = HeaderRequest(path=path, gguf=spec.source.is_gguf or path.endswith(".gguf"))
        who: ReaderHosts = await workflow.execute_activity(c.MODEL_READERS, ReadersAsk(spec=self.inp.spec),
                                                           result_type=ReaderHosts, **c.STORE_CALL)
        got = await asyncio.gather(*(self._read_on(h, req) for h in who.hosts))
        answers = dict(zip(who.hosts, got))
        have = [h for h, x in answers.items() if isinstance(x, EstimateInputs)]
        missing = [h for h, x in answers.items() if isinstance(x, tuple) and x[0] in NOT_THERE]
        if have or missing:
            await workflow.execute_activity(c.RECORD_MODEL_PATHS, ModelPaths(instance=self.inp.name, path=path, present=have,
                                                                             missing=missing),
                                            **c.STORE_CALL)
        if have:
            return self._event("read", inputs=answers[have[0]])
        bad = [x[1] for x in answers.values() if isinstance(x, tuple) and x[0] == "ModelError"]
        if bad:
            return self._event("model_bad", why=bad[0])
        why = "; ".join(f"{h}: {x[1]}" for h, x in answers.items()) or \
            "no READY host passes the filters" + (f" ({'; '.join(who.reasons[:3])})" if who.reasons else "")
        return self._event("path_missing", why=f"model path {path!r} is on no host that could run it: {why}")
