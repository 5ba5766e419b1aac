"""The stand-in engine's KV hand-off (issue 35), in vLLM's protocol (NixlConnector, as
tests/v1/kv_connector/nixl_integration/toy_proxy_server.py drives it):

- a prefill asked with ``kv_transfer_params: {do_remote_decode: true}`` prefills, answers with
  ``kv_transfer_params: {do_remote_prefill: true, do_remote_decode: false, remote_engine_id,
  remote_request_id, remote_block_ids, remote_host, remote_port, tp_size}`` (vLLM's fields) and
  holds those blocks (``Held``) until a decode pulls them, or ``hold_s`` passes (vLLM's
  ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``; an expiry counts as ``vllm:nixl_num_kv_expired_reqs``);
- a decode given those params pulls the KV from ``remote_host:remote_port``, the prefill's side
  channel (``serve_side_channel``: HTTP, ``POST /kv/pull``), a real TCP fetch that checks the
  engine id, the blocks and the prompt's digest, and frees the blocks on the prefill.

The side channel answers no one who has not seen the prefill's answer: ``remote_request_id`` is a
random 128-bit name, the only handle on the held blocks. Everything a request carries in
``kv_transfer_params`` is validated (``KVParams``) before the engine acts on it."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

HOST = re.compile(r"^[A-Za-z0-9.\-:\[\]]{1,253}$")  # a name, IPv4 or IPv6: nothing else in a URL's host
NAME = r"^[A-Za-z0-9._:\-]{1,128}$"
MAX_BLOCKS = 1 << 16  # of one request's KV (1M tokens at 16 a block)
PULL_TIMEOUT_S = 10.0


class KVParams(BaseModel):
    """A request's ``kv_transfer_params`` (vLLM's fields; unknown ones ignored, as vLLM does)."""
    model_config = ConfigDict(extra="ignore")
    do_remote_decode: bool = False  # ask a prefill to keep the KV for a decode elsewhere
    do_remote_prefill: bool = False  # tell a decode its KV waits at remote_host:remote_port
    remote_engine_id: Annotated[str, Field(pattern=NAME)] | None = None  # the prefill engine's id
    remote_request_id: Annotated[str, Field(pattern=NAME)] | None = None  # the held blocks' name there
    remote_block_ids: Annotated[list[Annotated[int, Field(ge=0, le=2**31)]], Field(max_length=MAX_BLOCKS)] = []
    remote_host: str | None = None  # the prefill's side channel: host
    remote_port: Annotated[int, Field(ge=1, le=65535)] | None = None  # and port
    tp_size: Annotated[int, Field(ge=1, le=1024)] = 1  # the prefill's tensor parallelism (vLLM's field)

    @field_validator("remote_block_ids", mode="before")
    @classmethod
    def _none_is_empty(cls, v):
        return [] if v is None else v  # vLLM's toy proxy sends null fields with do_remote_decode

    @field_validator("remote_host")
    @classmethod
    def _host(cls, v: str | None) -> str | None:
        if v is not None and not HOST.match(v):
            raise ValueError("a host name or IP address (letters, digits, '.', '-', ':', '[]')")
        return v

    def pull_target(self) -> tuple[str, int, str, str]:
        """(host, port, engine id, request id) of a remote prefill's KV; ValueError names what is missing."""
        missing = [f for f in ("remote_host", "remote_port", "remote_engine_id", "remote_request_id")
                   if getattr(self, f) is None]
        if missing:
            raise ValueError(f"kv_transfer_params with do_remote_prefill need {', '.join(missing)}")
        return self.remote_host, self.remote_port, self.remote_engine_id, self.remote_request_id


def parse(raw) -> KVParams | None:
    """``kv_transfer_params`` as sent (None: absent); ValueError names the bad field."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError("kv_transfer_params: an object")
    try:
        return KVParams.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ValueError(f"kv_transfer_params.{where}: {err['msg']}") from None


def digest(prompt: str) -> str:
    """What a decode and its prefill compare: the same prompt, or the KV is someone else's."""
    return hashlib.sha256(prompt.encode()).hexdigest()[:32]


@dataclass
class Hold:
    blocks: list[int]
    tokens: int
    digest: str
    until: float


class Held:
    """A prefill's KV kept for decodes to pull: ``release(n)`` gives freed blocks back to the GPU."""

    def __init__(self, engine_id: str, hold_s: float, release, on_expired=None):
        self.engine_id, self.hold_s, self.release = engine_id, hold_s, release
        self.on_expired = on_expired or (lambda n: None)
        self.lock = threading.Lock()
        self.held: dict[str, Hold] = {}
        self.next_block = 0
        self.fail_pulls = False  # a fault a test turns on: every pull answers 503

    def reap(self) -> threading.Thread:
        """Expire holds in the background too (a quiet engine frees them without a next request)."""
        def loop() -> None:
            while True:
                time.sleep(min(1.0, self.hold_s / 2))
                self.expire()
        t = threading.Thread(target=loop, name="standin-kv-reaper", daemon=True)
        t.start()
        return t

    def hold(self, blocks: int, tokens: int, prompt_digest: str) -> tuple[str, list[int]]:
        """Keep ``blocks`` blocks of a finished prefill: (request id, block ids)."""
        self.expire()
        rid = secrets.token_hex(16)
        with self.lock:
            ids = [(self.next_block + i) % 2**31 for i in range(blocks)]
            self.next_block = (self.next_block + blocks) % 2**31
            self.held[rid] = Hold(ids, tokens, prompt_digest, time.monotonic() + self.hold_s)
        return rid, ids

    def expire(self) -> int:
        now = time.monotonic()
        with self.lock:
            gone = [k for k, h in self.held.items() if h.until <= now]
            freed = sum(len(self.held.pop(k).blocks) for k in gone)
        if gone:
            self.release(freed)
            self.on_expired(len(gone))
        return len(gone)

    def take(self, ask: dict) -> tuple[int, dict]:
        """A pull: (status, answer). 200 frees the blocks; any other leaves them held."""
        self.expire()
        if self.fail_pulls:
            return 503, {"error": "KV transfers are failing here (a fault the test set)"}
        rid, eng = ask.get("request_id"), ask.get("engine_id")
        if not isinstance(rid, str) or not isinstance(eng, str) or not hmac.compare_digest(eng, self.engine_id):
            return 404, {"error": "no such engine or request"}
        with self.lock:
            h = self.held.get(rid)
            if h is None:
                return 404, {"error": f"no KV held as {rid[:40]}: never, already pulled, or expired"}
            if ask.get("block_ids") != h.blocks or ask.get("digest") != h.digest:
                return 409, {"error": "these blocks hold another prompt's KV"}
            del self.held[rid]
        self.release(len(h.blocks))
        return 200, {"tokens": h.tokens, "blocks": len(h.blocks)}

    def count(self) -> int:
        with self.lock:
            return len(self.held)


def serve_side_channel(held: Held, host: str, port: int, token_s: float) -> ThreadingHTTPServer:
    """The prefill's side channel on ``host:port``, in a thread; a pull takes ``token_s`` a token."""
    class SideChannel(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            n = self.headers.get("Content-Length", "")
            if self.path != "/kv/pull" or not n.isdigit() or int(n) > 4 * MAX_BLOCKS * 12:
                return self._send(404, {"error": "POST /kv/pull only, with a body of its length"})
            try:
                ask = json.loads(self.rfile.read(int(n)))
            except ValueError:
                return self._send(400, {"error": "not JSON"})
            status, out = held.take(ask if isinstance(ask, dict) else {})
            if status == 200:
                time.sleep(out["tokens"] * token_s)  # the bytes on the wire
            self._send(status, out)

        def _send(self, status: int, obj: dict) -> None:
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer((host, port), SideChannel)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="standin-kv", daemon=True).start()
    return server


class PullFailed(Exception):
    """A pull that failed: ``reason`` is unreachable|refused|mismatch (a metric's label)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def pull(p: KVParams, prompt_digest: str) -> int:
    """Fetch the KV ``p`` names from its prefill: the tokens it holds; PullFailed says why not."""
    host, port, engine_id, rid = p.pull_target()
    body = json.dumps({"engine_id": engine_id, "request_id": rid, "block_ids": p.remote_block_ids,
                       "digest": prompt_digest}).encode()
    conn = http.client.HTTPConnection(host, port, timeout=PULL_TIMEOUT_S)
    try:
        conn.request("POST", "/kv/pull", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read(1 << 16)
    except (OSError, http.client.HTTPException) as e:
        raise PullFailed("unreachable", f"KV transfer from {host}:{port} failed: {type(e).__name__}: {e}") from None
    finally:
        conn.close()
    try:
        out = json.loads(raw)
    except ValueError:
        out = {}
    if r.status == 200 and isinstance(out.get("tokens"), int):
        return out["tokens"]
    why = str(out.get("error", raw[:200]))[:200] if isinstance(out, dict) else ""
    reason = "mismatch" if r.status == 409 else "refused"
    raise PullFailed(reason, f"KV transfer from {host}:{port} failed: HTTP {r.status}: {why}")
