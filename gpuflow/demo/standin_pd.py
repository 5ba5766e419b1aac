"""The stand-in engine with a simulated GPU, aggregated or in a prefill/decode role (issue 35):

    gpuflow standin --port {port} --host {host} --pd-role {pd_role} --kv-port {kv_port}
    gpuflow standin --port P --sim-gpu            # aggregated, on the same simulated GPU

It speaks vLLM's disaggregated protocol (pd_kv.py): a prefill given ``kv_transfer_params:
{do_remote_decode: true}`` prefills on its GPU and answers one token, non-streamed, with the
``kv_transfer_params`` a decode needs, holding the blocks; a decode given ``do_remote_prefill``
pulls that KV from the prefill's side channel (``--kv-port``) before it answers a byte (a failed
pull answers 503, a pull of another prompt's KV 409, with the reason, so a router can retry
elsewhere) and decodes; without them it prefills locally. Any role serves a plain request whole,
as vLLM's ``kv_both`` engines do. Every request runs on the process's one simulated GPU
(pd_gpu.py), so on an aggregated replica a long prefill stalls the running decodes.

Each answer says where its KV came from: the JSON's ``gpuflow_kv`` (``{"source": "remote" |
"local", "engine_id": the prefill's}``, in every streamed chunk too) and the header ``x-kv-source``.
The request's ``ignore_eos: true`` (vLLM's) makes it generate ``max_tokens`` tokens (the canned
words repeated); else it stops where the canned answer ends. ``GET /metrics``: pd_metrics.py.
``POST /standin/faults {"fail_kv_pulls": true|false}`` (behind the engine key) makes this prefill's
side channel refuse every pull, and resume."""

from __future__ import annotations

import json
import socket
import time
import uuid

from gpuflow.demo import pd_kv
from gpuflow.demo.pd_gpu import DONE, Gpu, Seq, blocks_for
from gpuflow.demo.pd_metrics import Metrics

WILDCARD = ("", "0.0.0.0", "::")


def advertised(host: str, kv_host: str | None) -> str:
    """The side channel's host as a decode must reach it: ``--kv-host``, else ``--host`` unless it
    binds every address (then this machine's name's address)."""
    if kv_host:
        return kv_host
    if host not in WILDCARD:
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class PDEngine:
    def __init__(self, a, name: str):
        self.role = a.pd_role or "aggregated"
        self.engine_id = a.engine_id or str(uuid.uuid4())
        self.block_tokens = max(1, a.block_tokens)
        self.gpu = Gpu(max(0.0, a.prefill_token_s), max(0.0, a.token_s), a.prefill_chunk, a.max_seqs, a.kv_blocks,
                       on_token=self._on_token)
        self.held = None
        if a.kv_port:
            self.held = pd_kv.Held(self.engine_id, max(0.1, a.kv_hold_s), self.gpu.release,
                                   on_expired=lambda n: self.metrics.expired.inc(n))
            self.kv_host = advertised(a.host, a.kv_host)
            self.kv_port = a.kv_port
            self.side = pd_kv.serve_side_channel(self.held, a.host, a.kv_port, max(0.0, a.kv_token_s))
            self.held.reap()
        self.metrics = Metrics(name, self.gpu, self.held)
        self.gpu.start()

    def health(self) -> dict:
        return {"engine": "gpuflow stand-in", "runs": "no model", "pd_role": self.role, "engine_id": self.engine_id,
                **({"kv_port": self.kv_port} if self.held else {})}

    def faults(self, body: dict) -> tuple[int, dict]:
        fail = body.get("fail_kv_pulls")
        if not isinstance(fail, bool):
            return 400, {"error": {"message": "fail_kv_pulls: true or false", "code": 400}}
        if self.held is None:
            return 409, {"error": {"message": "no side channel here (no --kv-port)", "code": 409}}
        self.held.fail_pulls = fail
        return 200, {"fail_kv_pulls": fail}

    def _on_token(self, seq: Seq, t: float) -> None:
        self.metrics.generation.inc()
        last = getattr(seq, "last_t", None)
        if last is None:
            self.metrics.ttft.observe(t - seq.arrived)
        else:
            self.metrics.itl.observe(t - last)
        seq.last_t = t

    def plan(self, body: dict, prompt_tokens: int, prompt: str) -> tuple[int, dict] | tuple[Seq, dict]:
        """What a completion request runs: (Seq, how) or (status, error) before any byte.
        ``how``: {"remote_decode": bool, "source": "remote"|"local", "engine_id": the KV's}."""
        try:
            p = pd_kv.parse(body.get("kv_transfer_params"))
        except ValueError as e:
            return 400, error(400, str(e))
        n = body.get("max_tokens") or body.get("max_completion_tokens") or 16
        n = n if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 1 << 16 else 16
        if p is not None and p.do_remote_decode:
            if self.held is None:
                return 400, error(400, "kv_transfer_params.do_remote_decode: this engine has no side channel "
                                       "(--kv-port): it cannot hand its KV to a decode")
            n = 1
        blocks = blocks_for(prompt_tokens + n, self.block_tokens)
        if blocks > self.gpu.kv_blocks:
            return 400, error(400, f"the prompt and answer need {blocks} KV blocks; this engine has "
                                   f"{self.gpu.kv_blocks}")
        if p is not None and p.do_remote_prefill:
            try:
                p.pull_target()
            except ValueError as e:
                return 400, error(400, str(e))
            t0 = time.monotonic()
            try:
                got = pd_kv.pull(p, pd_kv.digest(prompt))
            except pd_kv.PullFailed as e:
                self.metrics.failure(e.reason)
                return (409 if e.reason == "mismatch" else 503), error(409 if e.reason == "mismatch" else 503, str(e))
            self.metrics.xfer.observe(time.monotonic() - t0)
            self.metrics.prefilled(got, remote=True)
            seq = Seq(prompt_tokens, n, blocks, to_prefill=0)
            return seq, {"remote_decode": False, "source": "remote", "engine_id": p.remote_engine_id}
        remote_decode = bool(p and p.do_remote_decode)
        self.metrics.prefilled(prompt_tokens, remote=False)
        seq = Seq(prompt_tokens, n, blocks, to_prefill=max(1, prompt_tokens), keep=remote_decode)
        return seq, {"remote_decode": remote_decode, "source": "local", "engine_id": self.engine_id}

    def hand_off(self, seq: Seq, prompt: str) -> dict:
        """A finished prefill's KV, held for a decode: the kv_transfer_params to answer with."""
        rid, ids = self.held.hold(seq.blocks, seq.prompt_tokens, pd_kv.digest(prompt))
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": self.engine_id,
                "remote_request_id": rid, "remote_block_ids": ids, "remote_host": self.kv_host,
                "remote_port": self.kv_port, "tp_size": 1}

    def run(self, seq: Seq):
        """Submit ``seq`` and yield each token's time; the caller cancels it if it stops early."""
        self.gpu.submit(seq)
        while True:
            t = seq.out.get()
            if t is DONE:
                break
            yield t
        if not seq.cancelled:
            self.metrics.e2e.observe(time.monotonic() - seq.arrived)
            self.metrics.finished("length" if seq.generated >= seq.max_tokens else "stop")


def error(status: int, message: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error" if status < 500 else "server_error",
                      "code": status}}


def prompt_of(body: dict) -> str:
    """What a prefill and its decode must agree on: the messages, or the prompt."""
    return json.dumps(body.get("messages") if "messages" in body else body.get("prompt"), sort_keys=True)


def serve_completion(h, engine: PDEngine, answer, body: dict, prompt_tokens: int) -> None:
    """Answer one completion on ``h`` (standin.py's handler): plan, run on the GPU, write it."""
    prompt = prompt_of(body)
    planned, how = engine.plan(body, prompt_tokens, prompt)
    if isinstance(planned, int):
        return h._send(planned, how)
    seq = planned
    answer.fit(seq.max_tokens, body.get("ignore_eos") is True and not how["remote_decode"])
    seq.max_tokens = min(seq.max_tokens, max(1, len(answer.words)))
    answer.base["gpuflow_kv"] = {"source": how["source"], "engine_id": how["engine_id"]}
    extra = {"x-kv-source": how["source"]}
    tokens = engine.run(seq)
    if body.get("stream") is True and not how["remote_decode"]:
        return stream(h, answer, tokens, seq, engine, extra)
    try:
        for _ in tokens:
            pass
    finally:
        tokens.close()
    out = answer.whole()
    if how["remote_decode"]:
        out["kv_transfer_params"] = engine.hand_off(seq, prompt)
    h._send(200, out, extra)


def stream(h, answer, tokens, seq: Seq, engine: PDEngine, extra: dict) -> None:
    events = list(answer.events())
    lead = 1 if answer.chat else 0  # the chat's role chunk goes with the first token
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream")
    h.send_header("Transfer-Encoding", "chunked")
    for k, v in extra.items():
        h.send_header(k, v)
    h.end_headers()
    i = 0
    try:
        for _ in tokens:
            take = events[i:i + 1 + lead] if i == 0 else events[i + lead:i + lead + 1]
            i = i + 1
            write(h, take)
        write(h, [*events[i + lead:], "[DONE]"])
        h.wfile.write(b"0\r\n\r\n")
    except OSError:  # the client went: free its place on the GPU
        engine.gpu.cancel(seq)
    finally:
        tokens.close()


def write(h, events: list) -> None:
    for ev in events:
        data = b"data: " + (ev.encode() if isinstance(ev, str) else json.dumps(ev).encode()) + b"\n\n"
        h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    h.wfile.flush()
