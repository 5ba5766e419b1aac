"""Per-key usage through a real ``gpuflow gateway`` process in front of a stand-in engine, asked
with the official ``openai`` client: plain, streamed (the client not asking for usage: the gateway
asks, counts, and the client never sees the usage chunk), streamed asking for usage (the client
gets it), and embeddings. The counts reach the store within a flush, and ``gpuflow keys usage``
prints them."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import openai

from store import key_usage, keys
from store.key_usage import Counts
from tests import gateway_stack as gs
from tests.gateway_stack import procs, sqlite_store  # noqa: F401  (fixtures)

MSG = [{"role": "user", "content": "how many tokens is this?"}]
PROMPT = len(json.dumps(MSG)) // 4 + 1  # the stand-in's prompt tokens: len(json.dumps(messages)) // 4 + 1
GUESS = 6 + 4  # the gateway's estimate of a stream's prompt: ceil(24 characters / 4) + 4 for the message


def test_requests_and_tokens_are_counted_per_key(sqlite_store, procs, tmp_path):
    url, schema, engine = sqlite_store
    e = gs.engine("r1")
    procs.append(e)
    gs.deploy(engine, "chat", tenant="team-a", shared_with=["team-b"])
    gs.running(engine, "chat-0", "chat", e.port)
    ka, a = keys.create(engine, "team-a", "app")
    kb, b = keys.create(engine, "team-b", "batch")
    g = gs.gateway(url, schema, log=str(tmp_path / "gw.log"))
    procs.append(g)
    gs.wait_model(f"http://127.0.0.1:{g.port}", "chat", 1, headers={"Authorization": f"Bearer {ka}"}, every=0.5)
    ca, cb = (openai.OpenAI(base_url=f"http://127.0.0.1:{g.port}/v1", api_key=k, max_retries=0) for k in (ka, kb))

    plain = ca.chat.completions.create(model="chat", messages=MSG, max_tokens=3)
    assert plain.usage.prompt_tokens == PROMPT and plain.usage.completion_tokens == 3
    # a stream that did not ask for usage: every chunk the client sees has a choice, none a usage
    chunks = list(ca.chat.completions.create(model="chat", messages=MSG, max_tokens=5, stream=True))
    assert chunks and all(c.choices and c.usage is None for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "tok0 tok1 tok2 tok3 tok4 "
    # a stream that asked: its last chunk is the usage, as the engine sent it
    asked = list(cb.chat.completions.create(model="chat", messages=MSG, max_tokens=2, stream=True,
                                            stream_options={"include_usage": True}))
    assert asked[-1].choices == [] and asked[-1].usage.completion_tokens == 2
    told_no = list(cb.chat.completions.create(model="chat", messages=MSG, max_tokens=2, stream=True,
                                              stream_options={"include_usage": False}))
    assert all(c.usage is None for c in told_no)  # said no: counted by the gateway (gateway/stream_tokens.py)
    emb = cb.embeddings.create(model="chat", input=["a", "b", "c"])
    assert emb.usage.prompt_tokens == 3  # the stand-in: one per input

    # team-a's key: plain (PROMPT, 3) + stream (PROMPT, 5) = 2 requests, 2*PROMPT, 8
    # team-b's key: asked (PROMPT, 2) + told no (GUESS estimated, its 2 pieces) + embeddings (3, 0)
    #   = 3 requests, PROMPT+GUESS+3, 4, GUESS of them estimated
    want_keys = {a.id: Counts(2, 2 * PROMPT, 8), b.id: Counts(3, PROMPT + GUESS + 3, 4, GUESS)}

    def counted():
        now = time.time()
        return key_usage.totals(engine, now - 3600, now)
    got = gs.wait_for(lambda: (t := counted()).by_key == want_keys and t, 20, "the usage flushed (every 5 s)", 0.5)
    assert got.by_tenant == {"team-a": want_keys[a.id], "team-b": want_keys[b.id]}

    out = subprocess.run([sys.executable, "-m", "gpuflow", "keys", "usage", "--database-url", url, "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = {(r["tenant"], r["key_id"]): (r["hour"]["requests"], r["day"]["prompt_tokens"])
            for r in json.loads(out.stdout)}
    assert rows == {("team-a", None): (2, 2 * PROMPT), ("team-a", a.id): (2, 2 * PROMPT),
                    ("team-b", None): (3, PROMPT + GUESS + 3), ("team-b", b.id): (3, PROMPT + GUESS + 3)}
    table = subprocess.run([sys.executable, "-m", "gpuflow", "keys", "usage", "--database-url", url],
                           capture_output=True, text=True, timeout=120).stdout.splitlines()
    assert table[0].split()[:4] == ["TENANT", "KEY", "REQ", "1H"]
    assert table[2].split()[:3] == ["team-a", a.id, "2"]  # after team-a's "(all keys)" line
