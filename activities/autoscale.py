"""The autoscaler's activities (task queue ``gpuflow-control``; workflows/autoscaler.py calls them).

``autoscale_step`` is one interval's I/O around the pure policy (scheduler/autoscale/):

1. the deployment's spec, desired replicas and instances, asked of its workflow (query);
2. each RUNNING replica's engine ``/metrics``, scraped directly at the address:port the routing
   table holds (the gateway reaches the engine the same way; going through the host's agent
   would add a Temporal round trip per replica per interval for the same bytes), and every live
   gateway's ``/metrics`` for this model;
3. windows against the previous scrapes (carried by the workflow), the sample, ``policy.decide``
   with the workflow's ``now``;
4. on an up decision, the scheduler's dry run (scheduler/autoscale/fit.py) on the control
   plane's snapshot: only the replicas that fit are added; for the rest the deployment is
   capacity-blocked, with the scheduler's reasons, and the capacity hook is called.

It returns an absolute replica count; ``autoscale_apply`` sets it through the deployment's
``scale`` update, so a step retried after a worker died never adds twice. A prefill/decode group
is scaled per role instead (activities/autoscale_group.py): one absolute count per role, set
through the deployment's ``scale_role`` update."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field, replace

import httpx2 as httpx  # httpx's maintained line (pyproject: httpx2)
from prometheus_client import CollectorRegistry
from sqlalchemy.engine import Engine
from sqlmodel import Session
from temporalio import activity
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from contracts import ui_text
from contracts.ids import DEPLOYMENT_SCALE, autoscaler_id, deployment_id
from activities import callers, capacity_hook
from activities.decision_keeper import DecisionKeeper
from contracts.autoscale import (AUTOSCALE_APPLY, AUTOSCALE_STEP, START_AUTOSCALER, ApplyAsk, AutoscalerInput,
                                 DeploymentRef, Step, StepAsk)
from activities.autoscale_group import GroupAutoscale
from activities.autoscale_metrics import AutoscalerMetrics
from scheduler.autoscale.scrape import Scrape, parse, window
from activities.autoscale_state import Carry
from activities.estimate_cache import EstimateCache
from activities.runner import Runner
from contracts.control import CONTROL_QUEUE, DeploymentView
from store import serving
from store.serving import metrics_url
from store.tables import DeploymentRow
from store.snapshot import load_snapshot
from scheduler.autoscale import kept
from scheduler.autoscale.fit import demand, fit
from scheduler.autoscale.config import keep_s
from scheduler.autoscale.histogram import delta, merge
from scheduler.autoscale.policy import UP, decide, unstepped
from scheduler.autoscale.signals import Window, combine
from scheduler.policy_config import PolicyConfig
from scheduler.spec import ModelSpec

SCRAPE_TIMEOUT_S = 3.0


async def _scrape(http: httpx.AsyncClient, url: str, model: str | None, engine_key: str | None = None
                  ) -> Scrape | None | str:
    """The parsed scrape; ``"none"`` when the server has no metrics (404): it then counts on the
    gateways' view; None when it could not be read (no evidence of idleness). An engine's scrape
    shows its ``engine_key`` (llama-server guards /metrics; vLLM and SGLang do not, and ignore it)."""
    try:
        r = await http.get(url, headers={"Authorization": f"Bearer {engine_key}"} if engine_key else None)
        if r.status_code == 404:
            return "none"
        r.raise_for_status()
        return parse(r.text, model)
    except (httpx.HTTPError, ValueError):
        return None


def _gateway_window(ws: list[Window]) -> Window | None:
    ok = [w for w in ws if w.ok]
    if not ok:
        return None

    def hist(f):
        got = [getattr(w, f) for w in ok if getattr(w, f) is not None]
        return merge(got) if got else None

    return Window(waiting=sum(w.waiting or 0.0 for w in ok), running=sum(w.running or 0.0 for w in ok),
                  tpot=hist("tpot"), latency=hist("latency"), queue_time=hist("queue_time"), ttft=hist("ttft"))


@dataclass
class Signals:
    """One interval's scrapes: each engine's window by instance, the gateways' merged window, the
    scrapes to carry, the gateways' cold starts (count, seconds summed)."""

    gateways: list
    scraped: int = 0  # engines whose /metrics was read
    engines: dict[str, Window] = field(default_factory=dict)
    gateway: Window | None = None
    scrapes: dict[str, Scrape] = field(default_factory=dict)
    cold: list[tuple[float, float]] = field(default_factory=list)


class AutoscaleActivities(GroupAutoscale):
    def __init__(self, engine: Engine, client: Client, runner: Runner, estimates: EstimateCache,
                 policy: PolicyConfig, registry: CollectorRegistry, capacity_hook_cmd: str | None = None,
                 keeper: DecisionKeeper | None = None):
        """``estimates``: the worker's estimate cache (the dry run costs a spec as the decisions
        did); ``registry``: where the autoscaler's series go (the control plane's, ControlMetrics)."""
        self.engine, self.client, self.runner, self.hook = engine, client, runner, capacity_hook_cmd
        self.estimates, self.policy, self.keeper = estimates, policy, keeper  # keeper: where steps' inputs are kept
        self.metrics = AutoscalerMetrics(registry)

    def all(self) -> list:
        return [self.autoscale_step, self.autoscale_apply, self.start_autoscaler]

    async def _view(self, name: str) -> DeploymentView | None:
        h = self.client.get_workflow_handle(deployment_id(name))
        try:
            if (await h.describe()).status.name != "RUNNING":
                return None
            return await h.query("status", result_type=DeploymentView)
        except RPCError:
            return None

    @activity.defn(name=START_AUTOSCALER)
    async def start_autoscaler(self, ref: DeploymentRef) -> None:
        callers.check(START_AUTOSCALER, ref)
        deployment = ref.deployment
        spec = await self.runner.run(_saved_spec, self.engine, deployment)
        await self.client.start_workflow(
            "AutoscalerWorkflow", AutoscalerInput(deployment=deployment), id=autoscaler_id(deployment),
            task_queue=CONTROL_QUEUE, id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary=f"autoscaler of {deployment}",
            static_details=ui_text.autoscaler_details((spec or {}).get("autoscaling")))

    @activity.defn(name=AUTOSCALE_APPLY)
    async def autoscale_apply(self, ask: ApplyAsk) -> int:
        """Set the deployment's replicas to ``ask.replicas`` (absolute: applying it twice is applying
        it once); the replicas the deployment then has."""
        callers.check(AUTOSCALE_APPLY, ask)
        deployment, replicas = ask.deployment, ask.replicas
        if ask.role is not None:
            return await self.apply_role(deployment, ask.role, replicas)
        h = self.client.get_workflow_handle(deployment_id(deployment))
        try:
            view = await h.execute_update(DEPLOYMENT_SCALE, replicas, result_type=DeploymentView)
        except WorkflowUpdateFailedError as e:
            raise ApplicationError(f"scale to {replicas} refused: {e.cause or e}", type="ScaleRefused",
                                   non_retryable=True) from None
        return view.replicas

    @activity.defn(name=AUTOSCALE_STEP)
    async def autoscale_step(self, ask: StepAsk) -> Step:
        callers.check(AUTOSCALE_STEP, ask)  # it keeps its inputs (the decision log), and may call the capacity hook
        deployment, carried, now = ask.deployment, ask.carried, ask.now
        view = await self._view(deployment)
        if view is None or view.deleting:
            return Step(done=f"deployment {deployment} is {'being deleted' if view else 'gone'}")
        try:
            spec = ModelSpec.model_validate(view.spec)
        except ValueError as e:
            return Step(done=f"its spec no longer validates: {e}")
        if spec.autoscaling is None:
            return Step(done="its spec has no autoscaling block any more")
        cfg = spec.autoscaling
        try:
            carry = Carry(carried)
        except (KeyError, TypeError, ValueError, AttributeError):  # arrived through Temporal: not trusted
            carry = Carry({})  # start afresh: no evidence of idleness until the window is covered again
        if spec.is_group:
            return await self.group_step(deployment, spec, view, carry, now)
        routes = [r for r in await self.runner.run(serving.routes, self.engine)
                  if r.deployment == deployment and r.instance in view.instances]
        got = await self._signals(deployment, routes, carry)
        engines, eng, gateways, cold = list(got.engines.values()), got.scraped, got.gateways, got.cold
        sample = combine(now, len(routes), engines, got.gateway)
        carry.scrapes, carry.samples = got.scrapes, carry.samples + [sample]
        carry.keep(now, keep_s(cfg))
        current = view.replicas
        starting = max(0, current - len(routes))
        before = carry.policy
        d, carry.policy = decide(cfg, carry.samples, current, starting, now, before)
        if self.keeper is not None and kept.worth_keeping(d):  # replayable (gpuflow explain --replay)
            self.keeper.keep_step(deployment, kept.encode(cfg, carry.samples, current, starting, now, before),
                                  kept.decision_of(d), d.direction, d.reason)
        target, outcome, blocked, reasons = d.desired, None, False, []
        if d.direction == UP and d.delta > 0:
            target, outcome, blocked, reasons = await self._fit(spec, current, d.delta, carry, now)
            if target == current:  # nothing placed, no step: the next re-check decides on the same windows
                carry.policy = unstepped(before, carry.policy, now)
        carry.policy = replace(carry.policy, wanted=d.desired if blocked else None)  # the rest, at each re-check
        record = {"at": now, "signals": sample.signals(),
                  "current": current, "starting": starting, "direction": d.direction, "rule": d.rule,
                  "reason": d.reason, "desired": d.desired, "target": target, "dry_run": outcome,
                  "gateways": len(gateways), "engines_scraped": eng}
        n = sum(c for c, _ in cold)
        if n > 0:  # mean request -> first token of the requests that arrived with no replica
            record["cold_start_first_token_s"] = round(sum(t for _, t in cold) / n, 3)
        self._count(deployment, target, d.direction, d.rule, blocked)
        return Step(carry=carry.out(), record=record, current=current, target=target, blocked=blocked,
                    reasons=reasons, interval_s=cfg.interval_s)

    async def _signals(self, deployment: str, routes: list, carry: Carry) -> Signals:
        """Every route's engine and every live gateway scraped, as windows against the carried scrapes."""
        gateways = await self.runner.run(serving.live_gateways, self.engine)
        async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S) as http:
            eng = await asyncio.gather(*(_scrape(http, f"http://{r.address}:{r.port}/metrics", None, r.engine_key)
                                         for r in routes))
            gws = await asyncio.gather(*(_scrape(http, metrics_url(g.url), deployment) for g in gateways))
        activity.heartbeat()
        out = Signals(gateways=gateways, scraped=sum(1 for x in eng if isinstance(x, Scrape)))
        for r, x in zip(routes, eng):
            if x == "none":
                out.engines[r.instance] = Window()
            else:
                out.engines[r.instance] = window(carry.scrapes.get(f"engine:{r.instance}"), x)
                if x is not None:
                    out.scrapes[f"engine:{r.instance}"] = x
        gw_windows = []
        for g, x in zip(gateways, gws):
            if isinstance(x, Scrape):
                prev = carry.scrapes.get(f"gateway:{g.id}")
                gw_windows.append(window(prev, x))
                out.scrapes[f"gateway:{g.id}"] = x
                if prev is not None and "cold_start" in x.histograms:
                    h = delta(prev.histograms.get("cold_start"), x.histograms["cold_start"])
                    out.cold.append((h.count, h.sum))
        out.gateway = _gateway_window(gw_windows)
        return out

    async def _fit(self, spec: ModelSpec, current: int, k: int, carry: Carry, now: float):
        """(target, dry-run outcome, blocked, reasons): add only what the scheduler can place. The
        hook hears a demand once per ``interval_s`` (or at once when the demand changes), not at
        every 3 s re-check while blocked."""
        def run():
            req = self.estimates.get(spec)
            return req, fit(load_snapshot(self.engine), spec, req, k, self.policy)

        req, f = await self.runner.run(run)
        outcome = {"asked": f.asked, "fits": f.fits, "placed_on": [p.worker for p in f.placed], "reasons": f.reasons}
        if f.blocked and self.hook:
            want = demand(spec, req, f)
            key = json.dumps(want, sort_keys=True, default=str)
            if key != carry.hooked.get("key") or now - carry.hooked.get("at", 0) >= spec.autoscaling.interval_s:
                res = await asyncio.to_thread(capacity_hook.call, self.hook, want)
                outcome["hook"] = {"ok": res.ok, "detail": res.detail}
                carry.hooked = {"key": key, "at": now}
        return current + f.fits, outcome, f.blocked, f.reasons

    def _count(self, deployment: str, desired: int, direction: str, rule: str, blocked: bool) -> None:
        self.metrics.observe(deployment, desired, direction, rule, blocked)


def _saved_spec(engine: Engine, deployment: str) -> dict | None:
    """The deployment's spec as the store saved it (its deployment workflow saves it first)."""
    with Session(engine) as s:
        row = s.get(DeploymentRow, deployment)
        return dict(row.spec) if row is not None else None
