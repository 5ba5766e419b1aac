"""gpuflow's stand-in engine: a small OpenAI-compatible server that runs no model (issue 36). The
demo's deployments (chat-8b, llama-70b, embed-small) and any spec that wants a replica which
answers like a model without a GPU or a model file run it:

    run_command: "gpuflow standin --port {port} --host {host}"
    (or: python -m gpuflow.demo.standin --port {port} --host {host})

It answers ``GET /v1/models``, ``POST /v1/chat/completions`` and ``/v1/completions`` (plain, and
streamed as server-sent events with a word a chunk and, when asked, the usage chunk), and
``POST /v1/embeddings`` (a small vector made from each input's SHA-256: the same input, the same
vector). Its text is canned and echoes the last message, cut to ``max_tokens`` words; its usage
counts a word a token and 4 characters a prompt token. Behind the replica's engine key as every
engine is (engine_guard.py: only /health answers without it); ``GET /`` and ``/health`` say what it
is. It serves no file. Standard library only (http.server, a thread a connection): it starts in a
fraction of a second and holds little memory, so a laptop runs many.

With ``--sim-gpu``, or in a prefill/decode role (``--pd-role prefill|decode --kv-port {kv_port}``,
issue 35), its completions run on one simulated GPU and speak vLLM's disaggregated protocol, and it
answers ``GET /metrics``: standin_pd.py."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpuflow.demo.engine_guard import UNAUTHORIZED, allowed, key_from

MAX_BODY = 1 << 20  # a request's body, at most
DIMS = 8  # of an embedding
CANNED = "This is gpuflow's stand-in engine: no model runs here, so it answers with this text. You said:"


def words(body: dict, chat: bool) -> list[str]:
    """The answer, a word a token: the canned text and the last message (or prompt), cut to
    ``max_tokens`` (default 16)."""
    said = ""
    if chat and isinstance(body.get("messages"), list) and body["messages"]:
        last = body["messages"][-1]
        said = last.get("content") if isinstance(last, dict) else ""
    elif not chat:
        said = body.get("prompt")
        said = said[0] if isinstance(said, list) and said and isinstance(said[0], str) else said
    said = said if isinstance(said, str) else json.dumps(said)[:200]
    n = body.get("max_tokens") or body.get("max_completion_tokens") or 16
    n = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 16
    return (CANNED.split() + said[:400].split())[:n]


def usage(body: dict, completion: int) -> dict:
    prompt = max(1, len(json.dumps(body.get("messages") or body.get("prompt") or body.get("input") or "")) // 4)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def embedding(value) -> list[float]:
    digest = hashlib.sha256(json.dumps(value).encode()).digest()
    return [round(b / 255 * 2 - 1, 4) for b in digest[:DIMS]]


class Answer:
    """One answer's JSON objects (not I/O): a whole answer, or a stream's events."""

    def __init__(self, name: str, body: dict, chat: bool):
        self.body, self.chat, self.name = body, chat, name
        self.words = words(body, chat)
        self.base = {"id": f"standin-{time.monotonic_ns()}", "created": int(time.time()),
                     "model": body.get("model") or name, "system_fingerprint": "gpuflow-standin"}

    def fit(self, n: int, repeat: bool) -> None:
        """At most ``n`` words; with ``repeat`` (vLLM's ``ignore_eos``), exactly ``n``, the answer again."""
        self.words = [self.words[i % len(self.words)] for i in range(n)] if repeat and self.words else self.words[:n]

    def whole(self) -> dict:
        text = " ".join(self.words)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"} if self.chat
                  else {"index": 0, "text": text, "finish_reason": "stop"})
        return {**self.base, "object": "chat.completion" if self.chat else "text_completion", "choices": [choice],
                "usage": usage(self.body, len(self.words))}

    def events(self):
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        if self.chat:
            yield {**self.base, "object": obj, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
        for i, w in enumerate(self.words):
            piece = w if i == 0 else " " + w
            yield {**self.base, "object": obj, "choices": [{"index": 0, "delta": {"content": piece}} if self.chat
                                                           else {"index": 0, "text": piece}]}
        yield {**self.base, "object": obj, "choices": [{"index": 0, "finish_reason": "stop",
                                                        **({"delta": {}} if self.chat else {"text": ""})}]}
        opts = self.body.get("stream_options")
        if isinstance(opts, dict) and opts.get("include_usage") is True:
            yield {**self.base, "object": obj, "choices": [], "usage": usage(self.body, len(self.words))}


def stream(h: BaseHTTPRequestHandler, answer: Answer, token_s: float) -> None:
    """``answer`` as server-sent events, ``token_s`` between words."""
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream")
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    for ev in [*answer.events(), "[DONE]"]:
        data = b"data: " + (ev.encode() if isinstance(ev, str) else json.dumps(ev).encode()) + b"\n\n"
        h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        h.wfile.flush()
        time.sleep(token_s)
    h.wfile.write(b"0\r\n\r\n")


def handler(key: str | None, name: str, token_s: float, engine=None) -> type[BaseHTTPRequestHandler]:
    """The request handler; ``engine`` (standin_pd.PDEngine): completions run on its simulated GPU."""
    class StandIn(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the gateway pools its connections

        def _send(self, status: int, obj: dict | bytes, headers: dict | None = None,
                  kind: str = "application/json") -> None:
            out = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def _error(self, status: int, message: str) -> None:
            self._send(status, {"error": {"message": message, "type": "invalid_request_error", "code": status}})

        def _guarded(self) -> bool:
            auth = self.headers.get("Authorization")
            if allowed(key, self.path.split("?", 1)[0], auth.encode() if auth is not None else None):
                return True
            self._send(401, UNAUTHORIZED)
            return False

        def do_GET(self) -> None:  # noqa: N802  (http.server's name)
            if not self._guarded():
                return
            path = self.path.split("?", 1)[0]
            if path in ("/", "/health"):
                self._send(200, engine.health() if engine else {"engine": "gpuflow stand-in", "runs": "no model"})
            elif path == "/metrics" and engine:
                self._send(200, engine.metrics.text(), kind="text/plain; version=0.0.4; charset=utf-8")
            elif path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                                             "owned_by": "gpuflow-standin"}]})
            else:
                self._error(404, f"no {path[:100]} here: the stand-in engine serves /v1 only")

        def do_POST(self) -> None:  # noqa: N802
            if not self._guarded():
                return
            path = self.path.split("?", 1)[0]
            n = self.headers.get("Content-Length", "")
            if not n.isdigit() or int(n) > MAX_BODY:
                self._error(413 if n.isdigit() else 411, f"a body of at most {MAX_BODY} bytes, with its length")
                return
            try:
                body = json.loads(self.rfile.read(int(n)) or b"{}")
            except ValueError:
                self._error(400, "the body is not JSON")
                return
            if not isinstance(body, dict):
                self._error(400, "the body is not a JSON object")
            elif path == "/v1/embeddings":
                inputs = body.get("input") if isinstance(body.get("input"), list) else [body.get("input")]
                self._send(200, {"object": "list", "model": body.get("model") or name, "usage": usage(body, 0),
                                 "data": [{"object": "embedding", "index": i, "embedding": embedding(x)}
                                          for i, x in enumerate(inputs)]})
            elif path == "/standin/faults" and engine:
                self._send(*engine.faults(body))
            elif path in ("/v1/chat/completions", "/v1/completions"):
                answer = Answer(name, body, path.endswith("chat/completions"))
                if engine:
                    from gpuflow.demo.standin_pd import serve_completion
                    serve_completion(self, engine, answer, body, usage(body, 0)["prompt_tokens"])
                elif body.get("stream") is True:
                    stream(self, answer, token_s)
                else:
                    self._send(200, answer.whole())
            else:
                self._error(404, f"no {path[:100]} here: the stand-in engine serves /v1 only")

        def log_message(self, *args) -> None:  # quiet: the agent keeps the engine's log
            pass
    return StandIn


def port_or_none(v: str) -> int | None:
    """A port, or none: the agent renders ``{kv_port}`` as "" for a member it picked no port for."""
    if v == "":
        return None
    n = int(v)
    if not 0 < n < 65536:
        raise ValueError(v)
    return n


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model-name", default="standin", help="the id /v1/models lists (default standin)")
    p.add_argument("--token-s", type=float, default=0.02,
                   help="a streamed word's pause, in seconds; on the simulated GPU, a decode step's (default 0.02)")
    p.add_argument("--api-key", help="answer only requests showing it (default: GPUFLOW_ENGINE_API_KEY, which the "
                                     "agent sets)")
    p.add_argument("--exit-after-s", type=float, default=None,
                   help="exit with code 1 this many seconds after start, a crash to test with (a version that "
                        "dies after its rollout ends: the rollout's bake rolls it back); default: never")
    g = p.add_argument_group("simulated GPU and prefill/decode roles (standin_pd.py)")
    g.add_argument("--pd-role", choices=("prefill", "decode", "none", ""), default=None,
                   help="a prefill/decode group member's role (implies --sim-gpu); none or '' (the agent's "
                        "{pd_role} for a router or a plain replica): the plain stand-in")
    g.add_argument("--kv-port", type=port_or_none, help="the KV side channel's port: a decode pulls a prefill's KV from it "
                                               "(needed to answer do_remote_decode)")
    g.add_argument("--kv-host", help="the side channel's host as decodes reach it (default: --host, or this "
                                     "machine's address when --host binds every address)")
    g.add_argument("--sim-gpu", action="store_true", help="run completions on one simulated GPU (continuous "
                                                          "batching; /metrics) without a prefill/decode role")
    g.add_argument("--engine-id", help="the engine's id in kv_transfer_params (default: a random UUID)")
    g.add_argument("--prefill-token-s", type=float, default=0.0001,
                   help="a prefilled prompt token's GPU time, in seconds (default 0.0001: 2,048 tokens in 205 ms)")
    g.add_argument("--prefill-chunk", type=int, default=2048,
                   help="the most prompt tokens one step prefills (default 2048, vLLM's chunked-prefill budget)")
    g.add_argument("--max-seqs", type=int, default=256, help="sequences in the running batch, at most (default 256)")
    g.add_argument("--kv-blocks", type=int, default=8192, help="the GPU's KV blocks (default 8192)")
    g.add_argument("--block-tokens", type=int, default=16, help="tokens a KV block (default 16, vLLM's)")
    g.add_argument("--kv-hold-s", type=float, default=30.0,
                   help="how long a prefill holds KV no decode pulled, in seconds (default 30)")
    g.add_argument("--kv-token-s", type=float, default=0.0,
                   help="a pulled token's transfer time on the side channel, in seconds (default 0)")


def crash_after(seconds: float) -> None:
    """Exit the process with code 1 after ``seconds`` (a daemon timer: --exit-after-s)."""
    def crash() -> None:
        print(f"gpuflow standin: exiting with code 1 after {seconds:g} s (--exit-after-s)", flush=True)
        os._exit(1)
    t = threading.Timer(seconds, crash)
    t.daemon = True
    t.start()


def serve(a) -> int:
    engine = None
    a.pd_role = a.pd_role or None if a.pd_role != "none" else None
    if a.pd_role == "prefill" and not a.kv_port:
        raise SystemExit("gpuflow standin: --pd-role prefill needs --kv-port (where decodes pull its KV)")
    if a.pd_role or a.sim_gpu:
        from gpuflow.demo.standin_pd import PDEngine
        engine = PDEngine(a, a.model_name)
    server = ThreadingHTTPServer((a.host, a.port),
                                 handler(key_from(a.api_key), a.model_name, max(0.0, a.token_s), engine))
    server.daemon_threads = True
    if a.exit_after_s is not None and a.exit_after_s >= 0:
        crash_after(a.exit_after_s)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m gpuflow.demo.standin", description="gpuflow's stand-in engine")
    add_arguments(p)
    raise SystemExit(serve(p.parse_args()))


if __name__ == "__main__":
    main()
