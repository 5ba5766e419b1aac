"""How big each replica's prefix cache is, as its engine reports it: parsed here (pure), fetched
once per replica address in the background (``probe``), and used to size that replica's entries in
the prefix index (prefix_index.py, in blocks of text) and the token index (token_index.py).

Where each engine says it (checked against their code and docs):
- vLLM: ``/metrics``, the info gauge ``vllm:cache_config_info``, whose labels include
  ``num_gpu_blocks`` and ``block_size``: tokens = num_gpu_blocks x block_size.
- SGLang: ``/metrics``, the gauge ``sglang:max_total_num_tokens`` (tokens).
- llama.cpp's server: ``/props``, ``default_generation_settings.n_ctx`` (tokens, over every slot).

Tokens become blocks of text at ~4 characters a token (the prefix index's own estimate). An
answer that says nothing usable (no such series, a zero, a label that is not a number) is None:
the gateway keeps ``--prefix-cache-blocks`` for that replica. Every figure is untrusted and
bounded (``MAX_TOKENS``): a replica cannot make the gateway's index bigger than its caps."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Awaitable, Callable

log = logging.getLogger("gpuflow.gateway")

CHARS_PER_TOKEN = 4
MAX_TOKENS = 1 << 26  # 64 M tokens: more than any one engine's KV cache today
MAX_ANSWER = 4 << 20  # bytes of /metrics or /props read at most
PROBE_TIMEOUT_S = 3.0  # per request; a probe is two requests at most
VLLM_INFO, SGLANG_TOKENS = "vllm:cache_config_info", "sglang:max_total_num_tokens"


def tokens_from_metrics(text: str) -> tuple[int, int | None] | None:
    """(tokens, block size in tokens or None) from a Prometheus text page: vLLM's cache info,
    else SGLang's max total tokens; None when neither is there with a usable value."""
    from prometheus_client.parser import text_string_to_metric_families

    sglang = None
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == VLLM_INFO:
                    blocks, size = _count(s.labels.get("num_gpu_blocks")), _count(s.labels.get("block_size"))
                    if blocks and size and blocks * size <= MAX_TOKENS:
                        return blocks * size, size
                elif s.name == SGLANG_TOKENS and sglang is None:
                    v = s.value
                    if v == v and 1 <= v <= MAX_TOKENS:  # v == v: not NaN
                        sglang = int(v)
    except (ValueError, TypeError, IndexError, KeyError):
        return (sglang, None) if sglang else None
    return (sglang, None) if sglang else None


def tokens_from_props(body: str) -> int | None:
    """llama.cpp's ``/props``: its context in tokens (over every slot)."""
    try:
        d = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(d, dict):
        return None
    g = d.get("default_generation_settings")
    n = g.get("n_ctx") if isinstance(g, dict) else None
    n = n if n is not None else d.get("n_ctx")
    return n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_TOKENS else None


def text_blocks(tokens: int, block_chars: int) -> int:
    """Tokens of cache as blocks of ``block_chars`` characters of prompt text (at least 1)."""
    return max(1, tokens * CHARS_PER_TOKEN // block_chars)


def _count(v) -> int | None:
    if not isinstance(v, str) or not v.isdigit() or len(v) > 12:
        return None
    n = int(v)
    return n if n >= 1 else None


Fetch = Callable[[str], Awaitable[str | None]]  # URL -> its body (at most MAX_ANSWER), None on any failure


async def probe(base: str, fetch: Fetch) -> tuple[int, int | None] | None:
    """(tokens, block size or None) of the engine at ``base`` (http://host:port): ``/metrics``
    first (vLLM, SGLang), then ``/props`` (llama.cpp); None when neither says."""
    text = await fetch(f"{base}/metrics")
    got = tokens_from_metrics(text) if text else None
    if got:
        return got
    body = await fetch(f"{base}/props")
    n = tokens_from_props(body) if body else None
    return (n, None) if n else None


def aiohttp_fetch(session, timeout_s: float = PROBE_TIMEOUT_S, engine_key: str | None = None) -> Fetch:
    """``Fetch`` over an aiohttp session: a 200 answer's first MAX_ANSWER bytes, within ``timeout_s``;
    each request shows the replica's ``engine_key`` (llama-server guards /metrics and /props)."""
    import aiohttp

    headers = {"Authorization": f"Bearer {engine_key}"} if engine_key else None

    async def fetch(url: str) -> str | None:
        try:
            async with asyncio.timeout(timeout_s):
                async with session.get(url, allow_redirects=False, headers=headers) as r:
                    if r.status != 200:
                        return None
                    return (await r.content.read(MAX_ANSWER)).decode("utf-8", "replace")
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            log.debug("gateway: cache size probe %s: %s", url, e)
            return None
    return fetch
