"""A stand-in inference server speaking the OpenAI API (a real process, for the gateway's tests
and bench): ``--token-s`` per generated token, ``max_tokens`` tokens (default 4), streaming or
not, with ``usage``; ``--mode error`` answers 500, ``--mode hang`` never answers, ``--mode linger``
keeps a stream open for 2 s after its ``[DONE]``, ``--mode huge-usage`` reports ``prompt_tokens: 2**70``
(issue 40's M5: more than any store's column), ``--mode llama`` streams as llama-cpp-python's server does
(its ``cache-control: no-store`` and no usage chunk even when asked), ``--mode empty`` streams an
answer with no text (finish_reason length). Every answer
names the replica (``system_fingerprint`` and the ``x-replica`` header). Behind the replica's engine
key when it has one (``--api-key``, or GPUFLOW_ENGINE_API_KEY as the agent sets it: gpuflow/demo/engine_guard.py).

    python tests/standin_engine.py --port P [--name N] [--token-s 0.01] [--mode ok|error|hang|linger|huge-usage|llama|empty]"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gpuflow.demo.engine_guard import guarded, key_from


def make_app(name: str, token_s: float, mode: str) -> Starlette:
    hdr = {"x-replica": name}

    async def gate() -> Response | None:
        if mode == "hang":
            await asyncio.sleep(3600)
        if mode == "error":
            return JSONResponse({"error": {"message": f"{name} is broken", "type": "server_error"}}, 500, hdr)
        return None

    async def generate(request: Request) -> Response:
        failed = await gate()
        if failed is not None:
            return failed
        body = await request.json()
        seen = {"x-headers-seen": ",".join(sorted(request.headers.keys()))}  # which headers reached the engine
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 4)
        chat = request.url.path.endswith("chat/completions")
        prompt = len(json.dumps(body.get("messages") or body.get("prompt") or "")) // 4 + 1
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        if mode == "huge-usage":
            usage["prompt_tokens"] = usage["total_tokens"] = 2**70
        base = {"id": f"cmpl-{name}-{time.monotonic_ns()}", "created": int(time.time()), "model": body.get("model"),
                "system_fingerprint": name}
        if body.get("stream"):
            llama = {"cache-control": "no-store", "x-accel-buffering": "no"} if mode == "llama" else {}
            return StreamingResponse(_stream(base, 0 if mode == "empty" else n, chat, token_s, usage,
                                             {**body, "stream_options": None} if mode == "llama" else body,
                                             2.0 if mode == "linger" else 0.0),
                                     media_type="text/event-stream",
                                     headers={**hdr, **seen, **llama})
        await asyncio.sleep(token_s * n)
        text = "".join(f"tok{i} " for i in range(n))
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"} if chat
                  else {"index": 0, "text": text, "finish_reason": "length"})
        return JSONResponse({**base, "object": "chat.completion" if chat else "text_completion", "choices": [choice],
                             "usage": usage}, headers={**hdr, **seen})

    async def embeddings(request: Request) -> Response:
        failed = await gate()
        if failed is not None:
            return failed
        body = await request.json()
        inputs = body.get("input")
        inputs = inputs if isinstance(inputs, list) else [inputs]
        return JSONResponse({"object": "list", "model": body.get("model"), "data": [
            {"object": "embedding", "index": i, "embedding": [0.5, -0.25, float(len(str(x)))]} for i, x in enumerate(inputs)],
            "usage": {"prompt_tokens": len(inputs), "total_tokens": len(inputs)}}, headers=hdr)

    async def health(request: Request) -> Response:
        return Response(b"", 200)

    return Starlette(routes=[Route("/v1/chat/completions", generate, methods=["POST"]),
                             Route("/v1/completions", generate, methods=["POST"]),
                             Route("/v1/embeddings", embeddings, methods=["POST"]),
                             Route("/health", health)])


async def _stream(base, n, chat, token_s, usage, body, linger_s: float):
    obj = "chat.completion.chunk" if chat else "text_completion"
    if chat:
        yield _event({**base, "object": obj, "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
    for i in range(n):
        await asyncio.sleep(token_s)
        choice = {"index": 0, "delta": {"content": f"tok{i} "}} if chat else {"index": 0, "text": f"tok{i} "}
        yield _event({**base, "object": obj, "choices": [choice]})
    yield _event({**base, "object": obj, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    if (body.get("stream_options") or {}).get("include_usage"):
        yield _event({**base, "object": obj, "choices": [], "usage": usage})
    yield b"data: [DONE]\n\n"
    if linger_s:
        await asyncio.sleep(linger_s)


def _event(d) -> bytes:
    return b"data: " + json.dumps(d).encode() + b"\n\n"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--name", default="standin")
    p.add_argument("--token-s", type=float, default=0.005)
    p.add_argument("--mode", choices=["ok", "error", "hang", "linger", "huge-usage", "llama", "empty"], default="ok")
    p.add_argument("--api-key", help="answer only requests showing it (default: GPUFLOW_ENGINE_API_KEY, as the agent sets it)")
    a = p.parse_args()
    uvicorn.run(guarded(make_app(a.name, a.token_s, a.mode), key_from(a.api_key)), host=a.host, port=a.port, log_level="warning", access_log=False,
                loop="uvloop", http="httptools", timeout_graceful_shutdown=2)  # a hung request does not hold SIGTERM


if __name__ == "__main__":
    main()
