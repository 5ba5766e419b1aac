"""Errors in OpenAI's JSON shape: ``{"error": {"message", "type", "code"}}``."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from starlette.responses import Response


def error(status: int, message: str, type_: str, code: str | None = None,
          retry_after: float | None = None) -> Response:
    body = json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code or type_}})
    headers = {"Retry-After": str(max(1, math.ceil(retry_after)))} if retry_after is not None else None
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def bad_request(message: str, code: str = "invalid_request") -> Response:
    return error(400, message, "invalid_request_error", code)


def unauthorized(message: str) -> Response:
    r = error(401, message, "authentication_error", "invalid_api_key")
    r.headers["WWW-Authenticate"] = "Bearer"
    return r


def unknown_model(model: str, known: Sequence[str]) -> Response:
    """404 for a model that does not exist or that the caller's tenant may not use (the same
    answer: nobody learns of another tenant's models); ``known`` is what the caller may use."""
    have = ", ".join(known) if known else "none"
    model = model if len(model) <= 200 else model[:200] + "..."
    return error(404, f"The model {model!r} does not exist. Models served here: {have}.",
                 "invalid_request_error", "model_not_found")


def too_large(limit: int) -> Response:
    return error(413, f"Request body over {limit} bytes.", "invalid_request_error", "request_too_large")


def body_timeout(seconds: float) -> Response:
    """The request's body did not arrive in time (the connection is closed: the rest of it is unread)."""
    r = error(408, f"The request body did not arrive within {seconds:g} s.", "invalid_request_error", "request_timeout")
    r.headers["Connection"] = "close"
    return r


def header_timeout_bytes(seconds: float) -> bytes:
    """A whole HTTP/1.1 408 for a client whose headers did not arrive in time (gateway/protocol.py
    writes it on the connection, then closes it: there is no request to answer through the app)."""
    body = json.dumps({"error": {"message": f"The request headers did not arrive within {seconds:g} s.",
                                 "type": "invalid_request_error", "param": None, "code": "request_timeout"}}).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)


def queue_full(model: str, depth: int) -> Response:
    return error(429, f"Too many requests waiting for {model!r} ({depth} queued); try again later.",
                 "rate_limit_error", "queue_full", retry_after=1)


LIMIT_CODES = {"requests_per_s": "rate_limit_exceeded", "tokens_per_min": "tokens_limit_exceeded",
               "max_concurrent": "concurrency_limit_exceeded"}
LIMIT_HEADER = "x-gpuflow-limit"  # which limit refused a request, and its scope: "requests_per_s; scope=key"


def tenant_limit(message: str, reason: str, retry_after: float, scope: str = "tenant") -> Response:
    """A tenant or an API key over its requests_per_s, tokens_per_min or max_concurrent
    (gateway/tenant_limits.py): the body's error says which (``limit``) and whose (``scope``:
    tenant or key), beside OpenAI's fields, and so does the LIMIT_HEADER."""
    body = json.dumps({"error": {"message": message, "type": "rate_limit_error", "param": None,
                                 "code": LIMIT_CODES.get(reason, "rate_limit_exceeded"), "limit": reason,
                                 "scope": scope}})
    return Response(body, status_code=429, media_type="application/json",
                    headers={"Retry-After": str(max(1, math.ceil(retry_after))), LIMIT_HEADER: f"{reason}; scope={scope}"})


def no_replica(model: str, waited: float) -> Response:
    return error(503, f"No replica of {model!r} became free within {waited:g} s.", "service_unavailable",
                 "no_replica_available", retry_after=5)


def unreachable(model: str, why: str) -> Response:
    return error(502, f"No replica of {model!r} could be reached: {why}", "bad_gateway", "upstream_unreachable")


def timeout(model: str, why: str) -> Response:
    return error(504, f"A replica of {model!r} did not answer in time: {why}", "timeout", "upstream_timeout")
