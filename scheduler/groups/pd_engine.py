"""A decode's own witness of where its prefills' KV came from, read out of its ``/metrics``
(Prometheus text; parsing is prometheus-client's), for scheduler/groups/pd_health.py.

| engine | counted in | from remote KV | prefilled locally | failed transfers |
| --- | --- | --- | --- | --- |
| gpuflow's stand-in | requests | ``gpuflow_standin_prefills_total{source="remote"}`` | ``{source="local"}`` | ``vllm:nixl_num_failed_transfers_total`` |
| vLLM (where it publishes the split: the name GPUStack 2.3.0 maps, its metrics_config.yaml) | prompt tokens | ``vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}`` | ``{source="local_compute"}`` | the same |

vLLM's ``local_cache_hit`` tokens (its own prefix cache) are neither: no prefill ran for them. An
engine that publishes neither (SGLang: its transfer counters sit on the prefill, and no token split)
gives no witness; the gateways' counts still judge its group."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from scheduler.groups.pd_health import REQUESTS, TOKENS, PDCounts

MAX_TEXT = 4 << 20  # a /metrics answer read at most this long (an engine is a process that runs a spec's code)
STANDIN = "gpuflow_standin_prefills_total"
BY_SOURCE = "vllm:prompt_tokens_by_source_total"
FAILED = ("vllm:nixl_num_failed_transfers_total", "vllm:mooncake_num_failed_transfers_total")
COUNT_MAX = 2**63 - 1


def _whole(v: float) -> int:
    return int(min(max(v, 0.0), COUNT_MAX)) if v == v else 0  # NaN -> 0


def engine_counts(text: str) -> tuple[str, PDCounts] | None:
    """(unit, cumulative counts: disaggregated = from remote KV, fallback = prefilled locally,
    transfer_failures) from a decode's metrics; None when it publishes no witness or the text is
    not Prometheus text."""
    sums: dict[tuple[str, str], float] = {}
    try:
        for fam in text_string_to_metric_families(text[:MAX_TEXT]):
            for s in fam.samples:
                key = (s.name, s.labels.get("source", ""))
                sums[key] = sums.get(key, 0.0) + float(s.value)
    except (ValueError, TypeError, IndexError):
        return None
    failed = _whole(sum(sums.get((n, ""), 0.0) for n in FAILED))
    if any(n == STANDIN for n, _ in sums):
        return REQUESTS, PDCounts(disaggregated=_whole(sums.get((STANDIN, "remote"), 0.0)),
                                  fallback=_whole(sums.get((STANDIN, "local"), 0.0)), transfer_failures=failed)
    if any(n == BY_SOURCE for n, _ in sums):
        return TOKENS, PDCounts(disaggregated=_whole(sums.get((BY_SOURCE, "external_kv_transfer"), 0.0)),
                                fallback=_whole(sums.get((BY_SOURCE, "local_compute"), 0.0)), transfer_failures=failed)
    return None
