"""What clients feel, on the gateway's /metrics (its own prometheus-client registry). ``model``
is a deployment name the table knows (a request for an unknown one counts as ``model=""``), and
``tenant`` an API key's tenant (``anonymous`` on an open gateway, ``""`` before the key is
known), so every label has few values. Refusals for a tenant's limits are counted under the
tenants file's name (``default`` for an open gateway's requests)."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.usage_counter import tokens  # an answer's counts, clipped, as per-key usage takes them
from scheduler.groups.pd_health import PDCounts

LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
RATIOS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)
GAPS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("gpuflow_gateway_requests", "Requests answered, by model, tenant and HTTP status",
                                ["model", "tenant", "code"], registry=r)
        self.in_flight = Gauge("gpuflow_gateway_in_flight", "Requests sent to a replica and not finished",
                               ["model"], registry=r)
        self.queue_depth = Gauge("gpuflow_gateway_queue_depth", "Requests waiting for a free replica",
                                 ["model"], registry=r)
        self.queue_wait = Histogram("gpuflow_gateway_queue_wait_seconds", "Time a request waited for a replica",
                                    ["model"], buckets=LATENCY, registry=r)
        self.ttft = Histogram("gpuflow_gateway_time_to_first_token_seconds",
                              "Request received -> first chunk carrying content (streams)", ["model"],
                              buckets=LATENCY, registry=r)
        self.itl = Histogram("gpuflow_gateway_inter_token_latency_seconds",
                             "Gaps between content chunks of a stream", ["model"], buckets=GAPS, registry=r)
        self.cold_start = Histogram("gpuflow_gateway_cold_start_seconds", "Request received with no replica "
                                    "(scaled to zero) -> first content (response start when not streamed)",
                                    ["model"], buckets=LATENCY, registry=r)
        self.duration = Histogram("gpuflow_gateway_request_duration_seconds",
                                  "Request received -> last byte sent", ["model"], buckets=LATENCY, registry=r)
        self.tenant_rejections = Counter("gpuflow_gateway_tenant_rejections", "Requests refused with 429 because "
                                         "their tenant (the tenants file) or their API key was over a limit, "
                                         "by the request's tenant and the limit (requests_per_s, tokens_per_min, "
                                         "max_concurrent)", ["tenant", "reason"], registry=r)
        self.tokens = Counter("gpuflow_gateway_tokens", "Tokens reported in responses' usage (a stream without "
                              "usage: counted by the gateway, gateway/stream_tokens.py)", ["model", "kind"], registry=r)
        self.estimated = Counter("gpuflow_gateway_estimated_tokens", "Of gpuflow_gateway_tokens, those the "
                                 "gateway estimated (a stream's prompt, with no tokenizer at hand)", ["model"],
                                 registry=r)
        self.prefix_match = Histogram("gpuflow_gateway_prefix_match_ratio", "Of a routed prompt's whole blocks, "
                                      "the share its replica was thought to hold (prompts of a block or more, "
                                      "cache-aware deployments)", ["model"], buckets=RATIOS, registry=r)
        self.route_decisions = Counter("gpuflow_gateway_route_decisions", "Replicas chosen, by model and reason "
                                       "(prefix, imbalance, no-prefix, copy, least-outstanding; docs/routing.md)",
                                       ["model", "reason"], registry=r)
        self.kv_events = Counter("gpuflow_gateway_kv_event_batches", "Engines' KV-cache event messages read, by "
                                 "result (ok; malformed: dropped; gap: messages were lost, that replica's exact "
                                 "index was cleared)", ["result"], registry=r)
        self.pd_requests = Counter("gpuflow_gateway_pd_requests", "A prefill/decode group's requests handed to a "
                                   "decode, by model and path (disaggregated: decoded from a prefill's KV; skipped: "
                                   "a short prompt the decode prefilled itself; fallback: no prefill could serve, "
                                   "the decode served it whole)", ["model", "path"], registry=r)
        self.pd_failures = Counter("gpuflow_gateway_pd_transfer_failures", "A prefill/decode group's KV hand-offs "
                                   "that failed before the client saw a byte (then retried), by model and the end "
                                   "that failed (prefill: no usable KV; decode: it could not take the KV)",
                                   ["model", "end"], registry=r)
        self.index_capacity = Gauge("gpuflow_gateway_prefix_index_capacity_blocks", "Blocks of 128 characters the "
                                    "cache-aware index keeps for a replica, by model, replica and where the size "
                                    "came from (reported: its engine's cache size; learned: the length at which its "
                                    "answers' cached tokens stopped; default: --prefix-cache-blocks)",
                                    ["model", "replica", "source"], registry=r)
        self.index_held = Gauge("gpuflow_gateway_prefix_index_held_blocks", "Blocks the cache-aware index now "
                                "believes a replica holds, by model and replica", ["model", "replica"], registry=r)
        self.pd_counts: dict[str, PDCounts] = {}  # the same, per model, reported to the store (store/pd_counts.py)

    def route(self, model: str, choice) -> None:
        """One routing decision (gateway/cache_aware.py Choice)."""
        self.route_decisions.labels(model, choice.reason).inc()
        if choice.blocks and choice.reason != "least-outstanding":
            self.prefix_match.labels(model).observe(choice.matched / choice.blocks)

    def pd(self, model: str, path: str) -> None:
        """A group's request handed to a decode by ``path`` (gateway/pd_pick.py PATHS)."""
        self.pd_requests.labels(model, path).inc()
        c = self.pd_counts.setdefault(model, PDCounts())
        setattr(c, path, getattr(c, path) + 1)

    def pd_failed(self, model: str, end: str) -> None:
        self.pd_failures.labels(model, end).inc()
        self.pd_counts.setdefault(model, PDCounts()).transfer_failures += 1

    def index_sizes(self, rows) -> None:
        """The prefix index's sizes as of this scrape: ``rows`` of (model, replica, source, capacity,
        held) for the replicas in the routing table now (gateway/balance.py ``index_rows``); a replica
        gone from the table leaves the series."""
        self.index_capacity.clear()
        self.index_held.clear()
        for model, replica, source, capacity, held in rows:
            self.index_capacity.labels(model, replica, source).set(capacity)
            self.index_held.labels(model, replica).set(held)

    def usage(self, model: str, usage, estimated: int = 0) -> None:
        for kind, n in zip(("prompt", "completion"), tokens(usage)):
            if n:
                self.tokens.labels(model, kind).inc(n)
        if estimated > 0:
            self.estimated.labels(model).inc(estimated)


def content_pieces(event: dict) -> int:
    """How many of an event's choices carry content: a chat delta with content (or reasoning / a
    tool call), or a completion's text. An engine streams one token a piece (llama.cpp's servers,
    vLLM and SGLang without speculative decoding): gateway/stream_tokens.py counts them."""
    n = 0
    choices = event.get("choices")
    for c in choices if isinstance(choices, list) else ():
        if not isinstance(c, dict):
            continue
        d = c.get("delta")
        if isinstance(d, dict) and (d.get("content") or d.get("reasoning_content") or d.get("tool_calls")):
            n += 1
        elif c.get("text"):
            n += 1
    return n


class SSEWatch:
    """Reads a server-sent-event stream as it passes (the bytes are forwarded untouched): the
    time of each content chunk, the usage a final chunk may carry, and how many pieces of content
    went by (a stream's tokens when its engine sends no usage: gateway/stream_tokens.py)."""

    def __init__(self):
        self.tail = b""
        self.usage = None
        self.pieces = 0  # choices carrying content, over every event
        self.done = False  # the stream's closing ``data: [DONE]`` went by

    def feed(self, data: bytes) -> int:
        """How many events that carry content ``data`` completed."""
        buf = self.tail + data if self.tail else data
        *lines, self.tail = buf.split(b"\n")
        content = 0
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            if not payload:
                continue
            try:
                ev = json.loads(payload)
            except ValueError:
                continue
            if not isinstance(ev, dict):
                continue
            if ev.get("usage"):
                self.usage = ev["usage"]
            n = content_pieces(ev)
            self.pieces += n
            content += n > 0
        if len(self.tail) > 1 << 20:  # no newline for a MiB: not an event stream we can read
            self.tail = b""
        return content
