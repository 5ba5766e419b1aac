"""A stand-in vLLM server (a real process, for the autoscaler's closed-loop test): the OpenAI chat
API, and vLLM's metric names on ``/metrics``. It decodes at most ``--max-seqs`` sequences at once;
the rest wait (``vllm:num_requests_waiting``). One decode step gives every running sequence one
token and takes ``--base-s + --per-seq-s * batch``: time per token grows with the batch, as on a
GPU.

    python tests/standin_vllm.py --port P [--max-seqs 2] [--base-s 0.01] [--per-seq-s 0.02]"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gpuflow.demo.engine_guard import guarded, key_from

BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Engine:
    def __init__(self, max_seqs: int, base_s: float, per_seq_s: float, name: str):
        self.max_seqs, self.base_s, self.per_seq_s = max_seqs, base_s, per_seq_s
        self.waiting: list[asyncio.Queue] = []
        self.running: list[asyncio.Queue] = []
        self.wake = asyncio.Event()
        r = self.registry = CollectorRegistry()
        lab = {"model_name": name}
        self.g_wait = Gauge("vllm:num_requests_waiting", "waiting", ["model_name"], registry=r).labels(**lab)
        self.g_run = Gauge("vllm:num_requests_running", "running", ["model_name"], registry=r).labels(**lab)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "ITL", ["model_name"], buckets=BUCKETS,
                             registry=r).labels(**lab)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "e2e", ["model_name"], buckets=BUCKETS,
                             registry=r).labels(**lab)
        self.qt = Histogram("vllm:request_queue_time_seconds", "queue", ["model_name"], buckets=BUCKETS,
                            registry=r).labels(**lab)

    def submit(self, n: int) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        q.left, q.t0 = n, time.monotonic()  # type: ignore[attr-defined]
        self.waiting.append(q)
        self.wake.set()
        return q

    async def loop(self) -> None:
        while True:
            while len(self.running) < self.max_seqs and self.waiting:
                q = self.waiting.pop(0)
                self.qt.observe(time.monotonic() - q.t0)
                self.running.append(q)
            self.g_wait.set(len(self.waiting))
            self.g_run.set(len(self.running))
            if not self.running:
                self.wake.clear()
                await self.wake.wait()
                continue
            step = self.base_s + self.per_seq_s * len(self.running)
            await asyncio.sleep(step)
            for q in list(self.running):
                self.itl.observe(step)
                q.left -= 1
                q.put_nowait("tok ")
                if q.left <= 0:
                    self.running.remove(q)
                    self.e2e.observe(time.monotonic() - q.t0)
                    q.put_nowait(None)


def make_app(e: Engine, name: str) -> Starlette:
    async def chat(request: Request) -> Response:
        body = await request.json()
        n = max(1, int(body.get("max_tokens") or 8))
        q = e.submit(n)
        base = {"id": f"chatcmpl-{time.monotonic_ns()}", "created": int(time.time()), "model": body.get("model"),
                "system_fingerprint": name}
        if body.get("stream"):
            async def gen():
                yield _event({**base, "object": "chat.completion.chunk",
                              "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
                while (t := await q.get()) is not None:
                    yield _event({**base, "object": "chat.completion.chunk",
                                  "choices": [{"index": 0, "delta": {"content": t}}]})
                yield _event({**base, "object": "chat.completion.chunk",
                              "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
                yield b"data: [DONE]\n\n"
            return StreamingResponse(gen(), media_type="text/event-stream")
        text = ""
        while (t := await q.get()) is not None:
            text += t
        return JSONResponse({**base, "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}})

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(e.registry), media_type=CONTENT_TYPE_LATEST)

    async def health(request: Request) -> Response:
        return Response(b"", 200)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = asyncio.ensure_future(e.loop())
        yield
        task.cancel()

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/metrics", metrics),
                             Route("/health", health)], lifespan=lifespan)


def _event(d) -> bytes:
    return b"data: " + json.dumps(d).encode() + b"\n\n"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--api-key", help="answer only requests showing it (default: GPUFLOW_ENGINE_API_KEY, as the agent sets it)")
    p.add_argument("--name", default="standin-vllm")
    p.add_argument("--max-seqs", type=int, default=2)
    p.add_argument("--base-s", type=float, default=0.01)
    p.add_argument("--per-seq-s", type=float, default=0.02)
    a = p.parse_args()
    app = make_app(Engine(a.max_seqs, a.base_s, a.per_seq_s, a.name), a.name)
    uvicorn.run(guarded(app, key_from(a.api_key)), host=a.host, port=a.port,  # /metrics too (engine_guard.py)
                log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
