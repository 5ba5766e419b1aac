"""Reading the autoscaler's signals out of Prometheus text: an engine's own ``/metrics`` (vLLM,
SGLang, llama.cpp with ``--metrics``) or a gateway's, for one model. Parsing is prometheus-client's;
this module maps each engine's names to one shape and turns two scrapes into a window
(scheduler/autoscale/histogram.py: bucket deltas, resets handled).

| signal | vLLM | SGLang | llama.cpp | gateway |
| --- | --- | --- | --- | --- |
| waiting | num_requests_waiting | num_queue_reqs | requests_deferred | queue_depth |
| running | num_requests_running | num_running_reqs | requests_processing | in_flight |
| TPOT | inter_token_latency_seconds (older time_per_output_token_seconds) | the same two | - | inter_token_latency_seconds |
| latency | e2e_request_latency_seconds | e2e_request_latency_seconds | - | request_duration_seconds |
| queue time | request_queue_time_seconds | - | - | queue_wait_seconds |
| TTFT | time_to_first_token_seconds | time_to_first_token_seconds | - | time_to_first_token_seconds |
| KV usage | kv_cache_usage_perc (a fraction; older gpu_cache_usage_perc) | - | - | - |
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from scheduler.autoscale.histogram import Histogram, delta
from scheduler.autoscale.signals import Window

GAUGES = {
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred",
                "gpuflow_gateway_queue_depth"),
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing",
                "gpuflow_gateway_in_flight"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
HISTOGRAMS = {
    "tpot": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
             "sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds",
             "gpuflow_gateway_inter_token_latency_seconds"),
    "latency": ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds",
                "gpuflow_gateway_request_duration_seconds"),
    "queue_time": ("vllm:request_queue_time_seconds", "gpuflow_gateway_queue_wait_seconds"),
    "cold_start": ("gpuflow_gateway_cold_start_seconds",),  # a request that found no replica -> first token
    "ttft": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds",
             "gpuflow_gateway_time_to_first_token_seconds"),
}


@dataclass
class Scrape:
    """One scrape, reduced: gauges summed over label sets, histograms merged per signal."""

    gauges: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)


def _first(found: dict[str, object], names: tuple[str, ...]):
    """The first name present, in the table's order (newer names before deprecated ones)."""
    return next((found[n] for n in names if n in found), None)


def parse(text: str, model: str | None = None) -> Scrape:
    """``model``: keep only samples labelled ``model=<it>`` (a gateway serves many); engines' own
    label sets (model_name, engine) are summed."""
    gauges: dict[str, float] = defaultdict(float)
    buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if model is not None and s.labels.get("model", model) != model:
                continue
            if s.name.endswith("_bucket"):
                buckets[fam.name][float(s.labels["le"])] += s.value
            elif s.name.endswith("_count") and fam.type == "histogram":
                counts[fam.name][0] += s.value
            elif s.name.endswith("_sum") and fam.type == "histogram":
                counts[fam.name][1] += s.value
            elif fam.type in ("gauge", "untyped", "unknown"):
                gauges[fam.name] += s.value
    out = Scrape()
    for key, names in GAUGES.items():
        v = _first(gauges, names)
        if v is not None:
            out.gauges[key] = float(v)
    for key, names in HISTOGRAMS.items():
        name = next((n for n in names if n in buckets), None)
        if name:
            c, total = counts[name]
            out.histograms[key] = Histogram.of(dict(buckets[name]), count=c, total=total)
    return out


def window(prev: Scrape | None, cur: Scrape | None) -> Window:
    """What happened between two scrapes (``cur`` None: the scrape failed)."""
    if cur is None:
        return Window(ok=False)
    h = {k: delta(prev.histograms.get(k) if prev else None, v) if prev else None for k, v in cur.histograms.items()}
    return Window(waiting=cur.gauges.get("waiting"), running=cur.gauges.get("running"),
                  tpot=h.get("tpot"), latency=h.get("latency"), queue_time=h.get("queue_time"), ttft=h.get("ttft"),
                  kv_usage=cur.gauges.get("kv_usage"))
