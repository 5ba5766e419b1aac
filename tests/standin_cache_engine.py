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
- ``/metrics`` reports the cache's size under vLLM's name, ``vllm:cache_config_info`` with the labels
  ``num_gpu_blocks`` and ``block_size`` (in tokens: a block of characters counts as a quarter as many
  tokens), which the gateway reads to size its index (gateway/engine_cache.py); ``--cache-info no``
  leaves it out, as an engine that does not report its cache size (the gateway must learn it).
- With ``--tokenizer DIR`` the cache holds blocks of ``--block-tokens`` token ids instead, the prompt
  tokenized as vLLM does (a chat through the tokenizer's chat template, with the generation prompt).
  With ``--kv-events-port`` too, it publishes its cache's changes as vLLM does
  (``--kv-events-config``): ``BlockStored`` for blocks it newly caches (with their tokens and the
  parent's hash), ``BlockRemoved`` for the ones its LRU evicts, ``AllBlocksCleared`` on ``/reset``,
  in vLLM's msgpack batches over a ZMQ PUB socket (``[topic, seq, payload]``). Its block hashes are
  its own (a keyed hash), so a reader that relied on them would fail.

    python tests/standin_cache_engine.py --port P [--name N] [--block-chars 64] [--cache-blocks 256]
                                         [--prefill-block-s 0.004] [--token-s 0.01] [--cache-info yes|no]
                                         [--tokenizer DIR [--block-tokens 16] [--kv-events-port Q]]"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import time
from collections import OrderedDict

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gpuflow.demo.engine_guard import guarded, key_from

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


class TokenCache:
    """The cache in token blocks (``--tokenizer``), telling ``publish`` what it stores and evicts
    as vLLM's events (gateway/kv_events.py's types)."""

    def __init__(self, blocks: int, block_tokens: int, publish):
        self.capacity, self.block_tokens, self.publish = blocks, block_tokens, publish
        self.key = os.urandom(16)  # this engine's own hash seed, as vLLM's is per process
        self.lru: OrderedDict[int, None] = OrderedDict()

    def hashes(self, ids: list[int]) -> list[int]:
        out, h, bs = [], b"", self.block_tokens
        for i in range(0, len(ids) - bs + 1, bs):
            h = hashlib.blake2b(h + repr(ids[i:i + bs]).encode(), key=self.key, digest_size=8).digest()
            out.append(int.from_bytes(h, "big") >> 1)  # a 63-bit integer, as vLLM's int hashes are
        return out

    def lookup_and_fill(self, ids: list[int]) -> int:
        """The tokens of ``ids`` already cached (whole leading blocks); then every whole block of
        it is cached (head freshest), and the changes published."""
        from gateway.kv_events import Batch, Removed, Stored

        hashes, bs = self.hashes(ids)[:self.capacity], self.block_tokens
        hit = 0
        for h in hashes:
            if h not in self.lru:
                break
            hit += 1
        new = [i for i, h in enumerate(hashes) if h not in self.lru]
        for h in reversed(hashes):
            self.lru[h] = None
            self.lru.move_to_end(h)
        gone = []
        while len(self.lru) > self.capacity:
            gone.append(self.lru.popitem(last=False)[0])
        events, run = [], []
        for i in new + [None]:  # runs of consecutive new blocks, each chained on the block before it
            if run and (i is None or i != run[-1] + 1):
                first = run[0]
                events.append(Stored(tuple(hashes[j] for j in run), hashes[first - 1] if first else None,
                                     tuple(ids[first * bs:(run[-1] + 1) * bs]), bs))
                run = []
            if i is not None:
                run.append(i)
        if gone:
            events.append(Removed(tuple(gone)))
        if events:
            self.publish(Batch(time.time(), tuple(events), 0))
        return hit * bs


class Publisher:
    """vLLM's ZmqEventPublisher's wire: PUB, multipart [topic, 8-byte big-endian seq, msgpack batch]."""

    def __init__(self, host: str, port: int, topic: str = "kv-events"):
        import zmq

        self.sock = zmq.Context.instance().socket(zmq.PUB)
        self.sock.bind(f"tcp://{host}:{port}")
        self.topic, self.seq, self.zmq = topic.encode(), 0, zmq

    def __call__(self, batch) -> None:
        from gateway.kv_events import encode

        self.sock.send_multipart([self.topic, self.seq.to_bytes(8, "big"), encode(batch)], flags=self.zmq.NOBLOCK)
        self.seq += 1


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def token_ids(tok, body: dict, chat: bool) -> list[int]:
    """The prompt's token ids as vLLM makes them: a chat through the chat template."""
    if chat:
        msgs = [{"role": m.get("role"), "content": _text(m.get("content"))}
                for m in body.get("messages") or [] if isinstance(m, dict)]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    p = body.get("prompt")
    return list(tok(p if isinstance(p, str) else json.dumps(p), add_special_tokens=True)["input_ids"])


def _text(c) -> str:
    if isinstance(c, list):
        return "".join(p.get("text", "") for p in c if isinstance(p, dict))
    return c if isinstance(c, str) else ""


def make_tokenizer(folder: str) -> str:
    """A small real tokenizer (byte-level BPE, trained here on a few sentences) with a chat
    template, saved where ``AutoTokenizer`` loads it offline: for tests that need the engine's
    and the gateway's tokenizer to be one and the same, with no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["You are a helpful assistant for a customer. Answer briefly and politely.",
            "What is the weather like today? Tell me about the system and the user."]
    tok.train_from_iterator(text * 20, trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>{% endfor %}"
                          "{% if add_generation_prompt %}<s>assistant\n{% endif %}")
    fast.save_pretrained(folder)
    return folder


def make_app(name: str, block_chars: int, cache_blocks: int, prefill_block_s: float, token_s: float,
             tokenizer: str | None = None, block_tokens: int = 16, kv_events_port: int | None = None,
             host: str = "127.0.0.1", cache_info: bool = True) -> Starlette:
    hdr = {"x-replica": name}
    tok = load_tokenizer(tokenizer) if tokenizer else None
    publish = Publisher(host, kv_events_port) if kv_events_port else (lambda batch: None)
    cache = TokenCache(cache_blocks, block_tokens, publish) if tok else Cache(cache_blocks, block_chars)
    prefill_lock = asyncio.Lock()  # one prefill at a time
    reg = CollectorRegistry()
    queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache", registry=reg)
    hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache", registry=reg)
    if cache_info:
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                     ["block_size", "num_gpu_blocks"], registry=reg)
        info.labels(str(block_tokens if tok else max(1, block_chars // CHARS_PER_TOKEN)), str(cache_blocks)).set(1)

    async def prefill(text: str, body: dict, chat: bool) -> tuple[int, int]:
        """(prompt tokens, cached tokens), after the time the uncached part takes."""
        if tok is not None:
            ids = token_ids(tok, body, chat)
            async with prefill_lock:
                cached = cache.lookup_and_fill(ids)
                await asyncio.sleep((len(ids) - cached) / block_tokens * prefill_block_s)
            queries.inc(len(ids))
            hits.inc(cached)
            return len(ids), cached
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
            return StreamingResponse(_stream(base, n, chat, body, prefill(text, body, chat), token_s),
                                     media_type="text/event-stream", headers=hdr)
        prompt, cached = await prefill(text, body, chat)
        await asyncio.sleep(token_s * n)
        out = "".join(f"tok{i} " for i in range(n))
        choice = ({"index": 0, "message": {"role": "assistant", "content": out}, "finish_reason": "length"} if chat
                  else {"index": 0, "text": out, "finish_reason": "length"})
        return JSONResponse({**base, "object": "chat.completion" if chat else "text_completion", "choices": [choice],
                             "usage": usage(prompt, cached, n)}, headers=hdr)

    async def reset(request: Request) -> Response:
        cache.lru.clear()
        if tok is not None:
            from gateway.kv_events import Batch, Cleared

            publish(Batch(time.time(), (Cleared(),), 0))
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
    p.add_argument("--api-key", help="answer only requests showing it (default: GPUFLOW_ENGINE_API_KEY, as the agent sets it)")
    p.add_argument("--name", default="standin-cache")
    p.add_argument("--block-chars", type=int, default=64)
    p.add_argument("--cache-blocks", type=int, default=256)
    p.add_argument("--prefill-block-s", type=float, default=0.004)
    p.add_argument("--token-s", type=float, default=0.01)
    p.add_argument("--tokenizer", help="a tokenizer folder: cache token blocks, as vLLM does")
    p.add_argument("--block-tokens", type=int, default=16)
    p.add_argument("--kv-events-port", type=int, help="publish KV-cache events there, as vLLM does (needs --tokenizer)")
    p.add_argument("--cache-info", choices=("yes", "no"), default="yes",
                   help="report the cache's size in /metrics (vllm:cache_config_info); no: as an engine that does not")
    a = p.parse_args()
    if a.kv_events_port and not a.tokenizer:
        p.error("--kv-events-port needs --tokenizer (events carry token ids)")
    app = make_app(a.name, a.block_chars, a.cache_blocks, a.prefill_block_s, a.token_s, a.tokenizer,
                   a.block_tokens, a.kv_events_port, a.host, a.cache_info == "yes")
    uvicorn.run(guarded(app, key_from(a.api_key)), host=a.host,  # its /metrics too (gpuflow/demo/engine_guard.py)
                port=a.port, log_level="warning", access_log=False, loop="uvloop", http="httptools",
                timeout_graceful_shutdown=2)


if __name__ == "__main__":
    main()
