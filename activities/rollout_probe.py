"""The rollout's look at its replicas: each instance workflow's state (its ``status`` query) and,
for a RUNNING one, whether its server answers HTTP on its advertised address. The deployment
workflow calls this between rollout steps (workflows/rollout_steps.py); the decision itself is
scheduler/rollout.py's, a pure function of what this returns.

``rollout_metrics`` sums every live gateway's counters for one deployment (answers, 5xx answers, the
request-duration histogram) for the bake's metric checks (scheduler/rollout_bake.py
``metric_check``); a gateway that does not answer is left out of that look, and counted out."""

from __future__ import annotations

import asyncio
import math

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import Engine
from temporalio import activity
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError

from contracts.ids import INSTANCE_STATUS, instance_id
from contracts.control import InstanceNames
from store import serving
from contracts.rollout import ROLLOUT_METRICS, ROLLOUT_PROBE, GatewayCounts, MetricsAsk, ReplicaProbe, ReplicaProbes

HTTP_TIMEOUT_S = 3.0
MAX_NAMES = 2000
QUERY_S = 10.0  # a workflow that does not answer in this long counts as gone for this look


async def answers(address: str | None, port: int | None) -> bool:
    if not address or not port:
        return False
    host = f"[{address}]" if ":" in address else address
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)) as s:
            async with s.get(f"http://{host}:{int(port)}/health") as r:
                return r.status < 500
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return False


MAX_METRICS_BYTES = 8 << 20  # a gateway's /metrics, at most
DURATION = "gpuflow_gateway_request_duration_seconds"


MAX_COUNT = 1e15  # GatewayCounts' bound on every figure


def _count(v: float) -> float:
    """A counter's value as the workflow may take it: NaN, infinite or negative (no gateway of ours
    says so) is 0; at most MAX_COUNT."""
    return min(float(v), MAX_COUNT) if math.isfinite(v) and v > 0 else 0.0


def _bound(le) -> str | None:
    """A bucket's upper bound as text the bake's quantile reads (a number, or +Inf); None: not one."""
    text = str(le)[:32]
    try:
        x = float(text)
    except ValueError:
        return None
    return text if not math.isnan(x) and (math.isfinite(x) or x > 0) else None


def counts_of(text: str, model: str) -> GatewayCounts:
    """One gateway's counters for ``model`` out of its Prometheus text (gateway/metrics.py). What a
    gateway serves is untrusted: every figure is bounded (``_count``) and a bucket bound that is
    not a number is left out, so the workflow's checks never see one (the activity's result is
    validated there, and a failing one would fail its task)."""
    out = GatewayCounts(gateways=1)
    for fam in text_string_to_metric_families(text):
        for x in fam.samples:
            if x.labels.get("model") != model:
                continue
            if x.name == "gpuflow_gateway_requests_total":
                v = _count(x.value)
                out.answered = _count(out.answered + v)
                out.errors = _count(out.errors + (v if str(x.labels.get("code", "")).startswith("5") else 0.0))
            elif x.name == DURATION + "_bucket" and len(out.buckets) < 64:
                le = _bound(x.labels.get("le", "+Inf"))
                if le is not None:
                    out.buckets[le] = _count(out.buckets.get(le, 0.0) + _count(x.value))
    return out


async def _metrics_text(url: str) -> str | None:
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)) as s:
            async with s.get(url) as r:
                return (await r.content.read(MAX_METRICS_BYTES)).decode(errors="replace") if r.status == 200 else None
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return None


class RolloutProbe:
    def __init__(self, client: Client, engine: Engine | None = None):
        self.client, self.engine = client, engine

    def all(self) -> list:
        return [self.rollout_probe, self.rollout_metrics]

    @activity.defn(name=ROLLOUT_METRICS)
    async def rollout_metrics(self, ask: MetricsAsk) -> GatewayCounts:
        """Every live gateway's counters for the deployment, summed (those that answer)."""
        gateways = await asyncio.to_thread(serving.live_gateways, self.engine) if self.engine is not None else []
        texts = await asyncio.gather(*(_metrics_text(serving.metrics_url(g.url)) for g in gateways))
        out = GatewayCounts()
        for text in texts:
            if text is None:
                continue
            try:
                one = counts_of(text, ask.deployment)
            except ValueError:  # not Prometheus text: that gateway is left out of this look
                continue
            out.answered, out.errors = _count(out.answered + one.answered), _count(out.errors + one.errors)
            out.gateways += 1
            for le, v in one.buckets.items():
                if le in out.buckets or len(out.buckets) < 64:
                    out.buckets[le] = _count(out.buckets.get(le, 0.0) + v)
        return GatewayCounts.model_validate(out.model_dump())  # as the workflow will take it

    @activity.defn(name=ROLLOUT_PROBE)
    async def rollout_probe(self, asked: InstanceNames) -> ReplicaProbes:
        """Each named replica's state and whether its server answers (the first MAX_NAMES)."""
        out = []
        for n in asked.names[:MAX_NAMES]:
            activity.heartbeat()
            try:
                v = await asyncio.wait_for(self.client.get_workflow_handle(instance_id(n)).query(INSTANCE_STATUS), QUERY_S)
            except (RPCError, WorkflowQueryFailedError, asyncio.TimeoutError) as e:
                out.append(ReplicaProbe(name=n, state="gone", reason=str(e)[:200]))
                continue
            v = v if isinstance(v, dict) else {}
            state = str(v.get("state", "unknown"))
            ok = state == "running" and await answers(v.get("address"), v.get("port"))
            out.append(ReplicaProbe(name=n, state=state, reason=str(v.get("reason", ""))[:300],
                                    restarts=int(v.get("restarts") or 0), answers=ok))
        return ReplicaProbes(probes=out)
