"""The engine key, as stand-in engines honour it (the demo's toy servers, tests/standin_*.py): the
key the agent hands a custom command (worker_agent/engine_key.py: ``GPUFLOW_ENGINE_API_KEY``, or
``--api-key {api_key}``), checked as the real engines check theirs, only stricter: every path but
/health answers 401 without ``Authorization: Bearer <key>`` (vLLM guards /v1 only; llama-server
also /metrics and /props, which gateways and the autoscaler read, so those need it here too)."""

from __future__ import annotations

import hmac
import os

ENV = "GPUFLOW_ENGINE_API_KEY"
OPEN = ("/health",)  # what the agent's readiness probe and the rollout's probe may ask without a key
UNAUTHORIZED = b'{"error": "Unauthorized"}'


def key_from(flag: str | None) -> str | None:
    """The key: ``--api-key`` when given, else the agent's variable; None: the engine is open."""
    return flag or os.environ.get(ENV) or None


def allowed(key: str | None, path: str, authorization: bytes | None) -> bool:
    """Whether a request for ``path`` showing ``authorization`` is answered."""
    if not key or path in OPEN:
        return True
    return hmac.compare_digest(authorization or b"", f"Bearer {key}".encode())


def guarded(app, key: str | None):
    """``app`` (ASGI) answering 401 to a request that does not show ``key`` (none: ``app`` itself)."""
    if not key:
        return app

    async def asgi(scope, receive, send):
        if scope["type"] == "http" and not allowed(key, scope["path"], dict(scope["headers"]).get(b"authorization")):
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(UNAUTHORIZED)).encode())]})
            await send({"type": "http.response.body", "body": UNAUTHORIZED})
            return
        await app(scope, receive, send)
    return asgi
