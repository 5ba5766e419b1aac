"""A stand-in inference server with a prefix cache (a real process, for the routing tests and
bench/bench_routing.py), in the spirit of Dynamo's mocker: no model, but the timing that makes
cache-aware routing matter.

- The prompt (chat messages in order, or the completion's prompt) is cut into blocks of
  ``--block-chars`` characters (4 characters a token); each block's hash covers everything before
  it, as vLLM's do. The cache is an LRU of ``--cache-blocks`` blocks, freed tail first (vLLM's
  order): a prefix that is half evicted keeps its head.
- Prefill takes ``--prefill-block-s`` per uncached block (a partial last block counts in
  proportion) and prefills run one at a time per engine, as the compute-bound phase does on a
  GPU; decoding then takes ``--token-s`` per token, side by side with other requests.
- ``usage.prompt_tokens_details.cached_tokens`` says what the cache saved, and ``/metrics`` has
  vLLM's prefix-cache counters in tokens: ``vllm:prefix_cache_queries_total`` and
  ``vllm:prefix_cache_hits_total``.
- ``POST /reset`` empties the cache (a bench starts each phase cold); every answer names the
  replica (``system_fingerprint``, ``x-replica``).

    python tests/standin_cache_engine.py --port P [--name N] [--block-chars 64] [--cache-blocks 256]
                                         [--prefill-block-s 0.004] [--token-s 0.01]"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import OrderedDict

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

CHARS_PER_TOKEN = 4


def prompt_of(body: dict) -> str:
    """What the engine prefills: each message as "role: text", or the prompt."""
    msgs = body.get("messages")
    if isinstance(msgs, list):
        parts = []
        for m in msgs:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, list):
                c = "".join(p.get("text", "") for p in c if isinstance(p, dict))
            parts.append(f"{m.get('role') if isinstance(m, dict) else ''}: {c or ''}\n")
        return "".join(parts)
    p = body.get("prompt")
    return p if isinstance(p, str) else json.dumps(p)


class Cache:
    def __init__(self, blocks: int, block_chars: int):
        self.capacity, self.block_chars = blocks, block_chars
        self.lru: OrderedDict[int, None] = OrderedDict()

    def lookup_and_fill(self, text: str) -> int:
        """The characters of ``text`` already cached (whole leading blocks); then every whole
        block of it is cached, the head freshest."""
        hashes, h = [], 0
        for i in range(0, len(text) - self.block_chars + 1, self.block_chars):
            h = hash((h, text[i:i + self.block_chars]))
            hashes.append(h)
        hit = 0
        for h in hashes:
            if h not in self.lru:
                break
            hit += 1
        for h in reversed(hashes[:self.capacity]):
            self.lru[h] = None
            self.lru.move_to_end(h)
        while len(self.lru) > self.capacity:
            self.lru.popitem(last=False)
        return hit * self.block_chars


def make_app(name: str, block_chars: int, cache_blocks: int, prefill_block_s: float, token_s: float) -> Starlette:
    hdr = {"x-replica": name}
    cache = Cache(cache_blocks, block_chars)
    prefill_lock = asyncio.Lock()  # one prefill at a time
    reg = CollectorRegistry()
    queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache", registry=reg)
    hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache", registry=reg)

    async def prefill(text: str) -> tuple[int, int]:
        """(prompt tokens, cached tokens), after the time the uncached part takes."""
        async with prefill_lock:
            cached = cache.lookup_and_fill(text)
            await asyncio.sleep((len(text) - cached) / block_chars * prefill_block_s)
        tokens = len(text) // CHARS_PER_TOKEN + 1
        queries.inc(tokens)
        hits.inc(cached // CHARS_PER_TOKEN)
        return tokens, cached // CHARS_PER_TOKEN

    async def generate(request: Request) -> Response:
        body = await request.json()
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 4)
        chat = request.url.path.endswith("chat/completions")
        base = {"id": f"cmpl-{name}-{time.monotonic_ns()}", "created": int(time.time()), "model": body.get("model"),
                "system_fingerprint": name}
        text = prompt_of(body)
        if body.get("stream"):
            return StreamingResponse(_stream(base, n, chat, body, prefill(text), token_s),
                                     media_type="text/event-stream", headers=hdr)
        prompt, cached = await prefill(text)
        await asyncio.sleep(token_s * n)
        out = "".join(f"tok{i} " for i in range(n))
        choice = ({"index": 0, "message": {"role": "assistant", "content": out}, "finish_reason": "length"} if chat
                  else {"index": 0, "text": out, "finish_reason": "length"})
        return JSONResponse({**base, "object": "chat.completion" if chat else "text_completion", "choices": [choice],
                             "usage": usage(prompt, cached, n)}, headers=hdr)

    async def reset(request: Request) -> Response:
        cache.lru.clear()
        return JSONResponse({"cleared": True}, headers=hdr)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(reg), media_type=CONTENT_TYPE_LATEST)

    async def health(request: Request) -> Response:
        return Response(b"", 200)

    return Starlette(routes=[Route("/v1/chat/completions", generate, methods=["POST"]),
                             Route("/v1/completions", generate, methods=["POST"]),
                             Route("/reset", reset, methods=["POST"]), Route("/metrics", metrics),
                             Route("/health", health)])


def usage(prompt: int, cached: int, n: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n,
            "prompt_tokens_details": {"cached_tokens": cached}}


async def _stream(base, n, chat, body, prefilled, token_s):
    obj = "chat.completion.chunk" if chat else "text_completion"
    prompt, cached = await prefilled  # the first token comes after the prefill
    for i in range(n):
        if i:
            await asyncio.sleep(token_s)
        delta = {"content": f"tok{i} "} if i else {"role": "assistant", "content": "tok0 "}
        choice = {"index": 0, "delta": delta} if chat else {"index": 0, "text": f"tok{i} "}
        yield _event({**base, "object": obj, "choices": [choice]})
    yield _event({**base, "object": obj, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    if (body.get("stream_options") or {}).get("include_usage"):
        yield _event({**base, "object": obj, "choices": [], "usage": usage(prompt, cached, n)})
    yield b"data: [DONE]\n\n"


def _event(d) -> bytes:
    return b"data: " + json.dumps(d).encode() + b"\n\n"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--name", default="standin-cache")
    p.add_argument("--block-chars", type=int, default=64)
    p.add_argument("--cache-blocks", type=int, default=256)
    p.add_argument("--prefill-block-s", type=float, default=0.004)
    p.add_argument("--token-s", type=float, default=0.01)
    a = p.parse_args()
    uvicorn.run(make_app(a.name, a.block_chars, a.cache_blocks, a.prefill_block_s, a.token_s), host=a.host,
                port=a.port, log_level="warning", access_log=False, loop="uvloop", http="httptools",
                timeout_graceful_shutdown=2)


if __name__ == "__main__":
    main()
