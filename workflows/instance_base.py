"""What every part of the instance workflow uses: its input, timings and state
(``InstanceState``, workflows/instance_state.py), the events its handlers answer the machine with,
the store record of a state change with its search attributes, the stop of its processes on every
host, the release of its placement, and giving up. The concerns (placing, preempting, reading a
model path, launching, supervising) are classes on top of this one (``*_steps.py``,
model_read.py), and ModelInstanceWorkflow (workflows/instance.py) inherits them all: each reaches
only what is declared here or in the classes it names as its bases."""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from contracts import agent as hp, ui_text
    from contracts.control import InstanceInput, InstanceRecord, InstanceRef, Timings, host_queue
    from workflows import common as c
    from workflows.instance_state import Event, InstanceState


class InstanceBase:
    inp: InstanceInput
    t: Timings
    s: InstanceState

    @property
    def spec_name(self) -> str:
        return str(self.inp.spec.get("name", ""))

    @property
    def worker(self) -> str | None:
        return self.s.worker

    @property
    def subordinate_workers(self) -> list[str]:
        plan = self.s.plan
        return sorted({x.worker for x in plan.subordinates} - {plan.worker}) if plan else []

    @property
    def gpus(self) -> list[int]:
        return list(self.s.plan.gpu_indexes) if self.s.plan else []

    def _event(self, kind: str, **fields) -> Event:
        """What an action came to, for the machine: stamped with the workflow's clock, and whether
        Temporal suggests continue-as-new."""
        return Event(kind=kind, now=workflow.now(), split=workflow.info().is_continue_as_new_suggested(), **fields)

    # --- store and search attributes ------------------------------------------------------------
    def _recorded_by_store(self, state: str, reason: str, attributes: bool = False) -> None:
        """An activity wrote the row (the booking): this workflow's state follows. Its search
        attributes follow with the next record (the launch's STARTING, in the same workflow task),
        or now (``attributes``: the booking wrote STARTING itself, so that record is skipped)."""
        self.s.state, self.s.reason = state, reason
        self.s.recorded = self._row_key(state, reason)
        if attributes:
            self._attributes(state)
        self._show()

    def _row_key(self, state: str, reason: str) -> tuple:
        """What a record of ``state`` would write now: a record equal to the last one is skipped."""
        s = self.s
        return (state, reason, self.worker, tuple(self.gpus), s.restarts, s.pid, s.port, s.address)  # kv port: with port

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
        s = self.s
        key = self._row_key(state, reason)
        if key == s.recorded and decision is None and file_state is None:
            s.state, s.reason = state, reason
            self._show()
            return
        s.recorded = key
        self._attributes(state)
        rec = InstanceRecord(
            name=self.inp.name, deployment=self.inp.deployment, model=self.spec_name, state=state, reason=reason,
            worker=self.worker, gpu_indexes=self.gpus, restarts=s.restarts, pid=s.pid, port=s.port,
            address=s.address, kv_events_port=s.kv_events_port, bootstrap_port=s.bootstrap_port, decision=decision, model_source=s.source_key, model_file_state=file_state,
            key_id=s.key_id, launch_mac=s.launch_mac)
        # A local activity: run by this worker inside the workflow task, no round trip through the
        # task queue, no history events of its own (a marker). Its semantics fit this write: it is
        # short (one row and one change-log line), needs no heartbeat and no other host, and it is
        # idempotent (it sets the whole row to what this workflow holds now), so the at-least-once
        # of a local activity (re-run when the task that ran it is lost before it was recorded) writes
        # the same row again. It is awaited before the workflow goes on, so the store still shows
        # each state before the next step's activity starts.
        await workflow.execute_local_activity(c.RECORD_INSTANCE, rec, **c.STORE_LOCAL)
        s.state, s.reason = state, reason
        self._show()

    def _show(self) -> None:
        """Its current details in the Temporal UI: state, reason, host, GPUs, claim (contracts/ui_text.py)."""
        s = self.s
        workflow.set_current_details(ui_text.instance_current(s.state, s.reason, s.plan, s.restarts,
                                                              s.decision.inputs if s.decision else None))

    # --- hosts and the ledger -------------------------------------------------------------------
    def _host_timeouts(self, worker: str, sts: float) -> dict:
        return dict(task_queue=host_queue(worker), schedule_to_start_timeout=c.secs(sts),
                    heartbeat_timeout=c.secs(self.t.host_heartbeat_s))

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

    async def _release(self) -> None:
        """Whatever the ledger holds for it is released; it holds no placement and runs nothing."""
        await workflow.execute_activity(c.RELEASE_PLACEMENT, InstanceRef(instance=self.inp.name), result_type=int,
                                        **c.STORE_CALL)
        self.s.plan, self.s.pid, self.s.port, self.s.address, self.s.kv_events_port = None, None, None, None, None
        self.s.bootstrap_port = None
        self.s.key_id, self.s.launch_mac = None, ""

    async def _give_up(self, reason: str) -> None:
        """The spec's fault, which no retry mends: ERROR with the reason, the reservation (if any)
        released, and nothing more until ``stop`` (a new spec replaces the instance)."""
        if self.s.plan is not None:
            if self.s.plan.subordinates:
                await self._stop_everywhere()  # helpers that did start
            await self._release()
        await self._record("error", reason)
        await workflow.wait_condition(lambda: self.s.stop_requested)
