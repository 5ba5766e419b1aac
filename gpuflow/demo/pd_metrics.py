"""The stand-in engine's ``GET /metrics`` with its simulated GPU (issue 35), in Prometheus text,
under vLLM's own names where vLLM publishes one (labels ``model_name`` and ``engine``, as vLLM's):

- ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` (0-1:
  the blocks booked, a prefill's held KV included), ``vllm:prompt_tokens_total``,
  ``vllm:generation_tokens_total``, ``vllm:request_success_total{finished_reason}``;
- ``vllm:prompt_tokens_by_source_total{source}``: ``local_compute`` (prefilled here) or
  ``external_kv_transfer`` (pulled from a prefill), vLLM's split in its later releases: a decode
  whose ``local_compute`` grows while ``external_kv_transfer`` stands still prefills everything
  itself (issue 35's silent collapse);
- ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
  ``vllm:e2e_request_latency_seconds`` (histograms);
- NIXL's: ``vllm:nixl_xfer_time_seconds`` (a decode's pulls), ``vllm:nixl_num_failed_transfers``
  (its failed pulls), ``vllm:nixl_num_kv_expired_reqs`` (a prefill's holds no decode pulled in time).

Stand-in only (no vLLM name counts requests rather than tokens):
``gpuflow_standin_prefills_total{source="remote|local"}``, a decode's requests by where their KV
came from, and ``gpuflow_standin_kv_transfer_failures_total{reason="unreachable|refused|mismatch"}``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

LATENCY = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
ITL = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


class Metrics:
    def __init__(self, model: str, gpu, held=None):
        disable_created_metrics()  # no *_created samples: the engine process's only registry is this one
        self.registry = r = CollectorRegistry()
        lab = ("model_name", "engine")
        self.labels = {"model_name": model, "engine": "0"}

        def gauge(name: str, doc: str, fn) -> None:
            Gauge(name, doc, lab, registry=r).labels(**self.labels).set_function(fn)

        gauge("vllm:num_requests_running", "Sequences in the running batch (or prefilling).", lambda: gpu.counts()[0])
        gauge("vllm:num_requests_waiting", "Sequences waiting for KV blocks or a batch slot.", lambda: gpu.counts()[1])
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage: 1 means 100 percent.", gpu.usage)
        one = {**self.labels}
        self.prompt = Counter("vllm:prompt_tokens", "Prompt tokens of finished prefills.", lab, registry=r).labels(**one)
        self.generation = Counter("vllm:generation_tokens", "Generated tokens.", lab, registry=r).labels(**one)
        self.by_source = Counter("vllm:prompt_tokens_by_source", "Prompt tokens by where their KV came from.",
                                 (*lab, "source"), registry=r)
        self.success = Counter("vllm:request_success", "Finished requests.", (*lab, "finished_reason"), registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to the first token.", lab,
                              buckets=LATENCY, registry=r).labels(**one)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between a sequence's tokens.", lab,
                             buckets=ITL, registry=r).labels(**one)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "A request's time on the engine.", lab,
                             buckets=LATENCY, registry=r).labels(**one)
        self.xfer = Histogram("vllm:nixl_xfer_time_seconds", "A KV pull's time.", lab,
                              buckets=LATENCY, registry=r).labels(**one)
        self.failed = Counter("vllm:nixl_num_failed_transfers", "Failed KV pulls.", lab, registry=r).labels(**one)
        self.expired = Counter("vllm:nixl_num_kv_expired_reqs", "Held KV that no decode pulled in time.", lab,
                               registry=r).labels(**one)
        self.prefills = Counter("gpuflow_standin_prefills", "Requests by where their KV came from (stand-in only).",
                                (*lab, "source"), registry=r)
        self.failures = Counter("gpuflow_standin_kv_transfer_failures", "Failed KV pulls by reason (stand-in only).",
                                (*lab, "reason"), registry=r)
        for s in ("local_compute", "external_kv_transfer"):
            self.by_source.labels(**one, source=s)
        for s in ("remote", "local"):
            self.prefills.labels(**one, source=s)
        for reason in ("unreachable", "refused", "mismatch"):
            self.failures.labels(**one, reason=reason)
        if held is not None:
            gauge("gpuflow_standin_kv_held_requests", "Prefills whose KV waits for a decode (stand-in only).",
                  held.count)

    def prefilled(self, tokens: int, remote: bool) -> None:
        self.prompt.inc(tokens)
        self.by_source.labels(**self.labels, source="external_kv_transfer" if remote else "local_compute").inc(tokens)
        self.prefills.labels(**self.labels, source="remote" if remote else "local").inc()

    def failure(self, reason: str) -> None:
        self.failed.inc()
        self.failures.labels(**self.labels, reason=reason).inc()

    def finished(self, reason: str) -> None:
        self.success.labels(**self.labels, finished_reason=reason).inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)
