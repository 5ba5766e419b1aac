"""The stand-in engine in a prefill/decode role (gpuflow/demo/standin_pd.py, issue 35), as real
processes asked with the official ``openai`` client: vLLM's disaggregated protocol (a prefill
answers kv_transfer_params and holds the blocks; a decode pulls them over the prefill's side
channel and counts remote and local prefills on /metrics), every way a pull fails answering before
any byte, and the simulated GPU's interference: a long prefill stalls an aggregated replica's
running decodes, never a decode-only one's."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time

import httpx2 as httpx
import openai
import pytest

from gpuflow.demo.pd_gpu import DONE, Gpu, Seq, blocks_for
from gpuflow.ports import server_port
from tests import gateway_stack as gs
from tests import pd_stack as pd
from tests.gateway_stack import metric, procs  # noqa: F401  (fixture)

KEY = "gfe-" + "p" * 43
WORDS = 800
# "word " * 800 is 4,000 characters; json.dumps of the messages adds 33: (4000 + 33) // 4 = 1008 prompt tokens
MSGS = [{"role": "user", "content": "word " * WORDS}]
PROMPT_TOKENS = 1008


def client(p, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{p.port}/v1", api_key=key, max_retries=0, timeout=30)


TOY_PROXY = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
             "remote_block_ids": None, "remote_host": None, "remote_port": None}  # what vLLM's toy proxy sends


def prefill(p, msgs=MSGS) -> dict:
    r = client(p).chat.completions.create(model="m", messages=msgs, max_tokens=1, stream=False,
                                          extra_body={"kv_transfer_params": TOY_PROXY})
    assert r.usage.completion_tokens == 1 and r.model_extra["gpuflow_kv"]["source"] == "local"
    return r.model_extra["kv_transfer_params"]


def decode(p, kv: dict | None, msgs=MSGS, n: int = 20) -> tuple[str, dict]:
    """A streamed decode: (its text, gpuflow_kv)."""
    chunks = list(client(p).chat.completions.create(model="m", messages=msgs, max_tokens=n, stream=True,
                                                    extra_body={"ignore_eos": True,
                                                                **({"kv_transfer_params": kv} if kv else {})}))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks[-1].model_extra["gpuflow_kv"]


def m(p, name: str, **labels) -> float:
    return metric(pd.metrics(p, KEY), name, **labels)


def test_a_decode_pulls_the_prefill_s_kv_and_counts_it(procs):
    P = pd.standin("prefill", key=KEY, kv_blocks=1000)
    D = pd.standin("decode", key=KEY)
    procs += [P, D]
    kv = prefill(P)
    blocks = math.ceil((PROMPT_TOKENS + 1) / 16)  # the prompt and its one token: 1009 / 16 -> 64 blocks
    assert (kv["do_remote_prefill"], kv["do_remote_decode"], kv["remote_engine_id"], kv["remote_host"],
            kv["remote_port"], len(kv["remote_block_ids"]), kv["tp_size"]) == \
        (True, False, P.engine_id, "127.0.0.1", P.kv_port, blocks, 1)
    assert m(P, "vllm:kv_cache_usage_perc") == blocks / 1000  # held for the decode: 64 of 1,000 blocks
    assert m(P, "gpuflow_standin_kv_held_requests") == 1

    text, source = decode(D, kv, n=20)
    assert len(text.split()) == 20 and source == {"source": "remote", "engine_id": P.engine_id}
    assert m(P, "vllm:kv_cache_usage_perc") == 0 and m(P, "gpuflow_standin_kv_held_requests") == 0  # freed
    assert (m(D, "gpuflow_standin_prefills_total", source="remote"), m(D, "gpuflow_standin_prefills_total",
                                                                        source="local")) == (1, 0)
    assert m(D, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == PROMPT_TOKENS
    assert m(D, "vllm:prompt_tokens_by_source_total", source="local_compute") == 0
    assert m(D, "vllm:nixl_xfer_time_seconds_count") == 1 and m(D, "vllm:generation_tokens_total") == 20

    text, source = decode(D, None, n=5)  # no params: the decode prefills it itself
    assert len(text.split()) == 5 and source == {"source": "local", "engine_id": D.engine_id}
    assert m(D, "gpuflow_standin_prefills_total", source="local") == 1
    assert m(D, "vllm:prompt_tokens_by_source_total", source="local_compute") == PROMPT_TOKENS

    done = list(client(D).completions.create(model="m", prompt="a b", max_tokens=2, stream=True))  # text, streamed
    assert "".join(x.choices[0].text for x in done if x.choices) == "This is"
    assert client(D).completions.create(model="m", prompt="a b", max_tokens=3).usage.completion_tokens == 3
    assert m(D, "gpuflow_standin_prefills_total", source="local") == 3

    with pytest.raises(openai.InternalServerError) as e:  # the same params again: the blocks are gone
        decode(D, kv)
    assert e.value.status_code == 503 and "already pulled" in e.value.message
    assert m(D, "vllm:nixl_num_failed_transfers_total") == 1
    assert m(D, "gpuflow_standin_kv_transfer_failures_total", reason="refused") == 1


def test_every_failed_pull_answers_before_any_byte_and_is_counted(procs):
    P = pd.standin("prefill", key=KEY)
    short = pd.standin("prefill", key=KEY, kv_hold_s=1.0)
    D = pd.standin("decode", key=KEY)
    procs += [P, short, D]
    other = [{"role": "user", "content": "another prompt"}]
    kv = prefill(P)
    with pytest.raises(openai.ConflictError) as e:  # the params of another prompt: the blocks stay held
        decode(D, kv, msgs=other)
    assert "another prompt's KV" in e.value.message and m(P, "gpuflow_standin_kv_held_requests") == 1
    auth = {"Authorization": f"Bearer {KEY}"}
    faults = f"http://127.0.0.1:{P.port}/standin/faults"
    assert httpx.post(faults, json={"fail_kv_pulls": True}, headers=auth).json() == {"fail_kv_pulls": True}
    with pytest.raises(openai.InternalServerError) as e:
        decode(D, kv)
    assert e.value.status_code == 503 and "failing here" in e.value.message
    httpx.post(faults, json={"fail_kv_pulls": False}, headers=auth)
    assert decode(D, kv)[1]["source"] == "remote"  # transfers resume: the same params pull the KV

    late = prefill(short)
    assert m(short, "vllm:kv_cache_usage_perc") > 0
    # held 1 s: the reaper (every 0.5 s) frees the blocks with no request asking
    gs.wait_for(lambda: m(short, "vllm:kv_cache_usage_perc") == 0, 10, "the expired hold freed")
    assert m(short, "vllm:nixl_num_kv_expired_reqs_total") == 1
    with pytest.raises(openai.InternalServerError) as e:
        decode(D, late)
    assert "expired" in e.value.message

    gone = prefill(P)
    P.kill()
    with pytest.raises(openai.InternalServerError) as e:
        decode(D, gone)
    assert e.value.status_code == 503 and f"127.0.0.1:{P.kv_port} failed" in e.value.message
    # 4 failed pulls: 1 mismatch, 1 refused (faults on), 1 expired (refused: 404 there), 1 unreachable
    got = {r: m(D, "gpuflow_standin_kv_transfer_failures_total", reason=r) for r in ("mismatch", "refused",
                                                                                    "unreachable")}
    assert got == {"mismatch": 1, "refused": 2, "unreachable": 1} and m(D, "vllm:nixl_num_failed_transfers_total") == 4
    assert m(D, "gpuflow_standin_prefills_total", source="remote") == 1  # only the pull that worked


@pytest.mark.parametrize("params, names", [
    ({"do_remote_prefill": True, "remote_port": 0}, "kv_transfer_params.remote_port"),  # ports are 1..65535
    ({"do_remote_prefill": True, "remote_host": "a/b"}, "kv_transfer_params.remote_host"),  # no path in a host
    ({"remote_block_ids": "0,1"}, "kv_transfer_params.remote_block_ids"),
    ({"remote_engine_id": "x" * 129}, "kv_transfer_params.remote_engine_id"),  # at most 128 characters
    ({"do_remote_prefill": True, "remote_port": 1}, "need remote_host, remote_engine_id, remote_request_id"),
    ("yes", "kv_transfer_params: an object"),
])
def test_kv_transfer_params_are_validated_naming_the_field(procs, params, names):
    D = pd.standin("decode")
    procs.append(D)
    r = httpx.post(f"http://127.0.0.1:{D.port}/v1/chat/completions",
                   json={"model": "m", "messages": MSGS, "kv_transfer_params": params})
    assert r.status_code == 400 and names in r.json()["error"]["message"]


def gaps(p, kv: dict | None, n: int, during) -> list[float]:
    """The gaps between a stream's tokens (seconds), with ``during`` started after its 5th token."""
    out, last, t = [], None, threading.Thread(target=during, daemon=True)
    for c in client(p, key="x").chat.completions.create(
            model="m", messages=MSGS, max_tokens=n, stream=True,
            extra_body={"ignore_eos": True, **({"kv_transfer_params": kv} if kv else {})}):
        now = time.monotonic()
        if c.choices and c.choices[0].delta.content:
            out.append(now - last) if last is not None else None
            last = now
            if len(out) == 4:
                t.start()
    t.join(30)
    return out


def test_a_long_prefill_stalls_an_aggregated_replica_s_decodes_not_a_decode_s(procs):
    slow = {"token_s": 0.01, "prefill_token_s": 0.0002}  # a chunk of 2,048 tokens: 0.41 s; a decode step 10 ms
    agg, P, D = pd.standin(None, **slow), pd.standin("prefill", **slow), pd.standin("decode", **slow)
    procs += [agg, P, D]
    long = [{"role": "user", "content": "word " * 6000}]  # (30000 + 33) // 4 = 7508 tokens: 4 chunks

    def long_prefill(on):
        return lambda: client(on, key="x").chat.completions.create(model="m", messages=long, max_tokens=2)

    aggregated = gaps(agg, None, 60, long_prefill(agg))
    kv = prefill(P)
    disaggregated = gaps(D, kv, 60, lambda: client(P, key="x").chat.completions.create(
        model="m", messages=long, max_tokens=1, extra_body={"kv_transfer_params": {"do_remote_decode": True}}))
    stalls = [sum(1 for g in x if g >= 0.35) for x in (aggregated, disaggregated)]
    # aggregated: each of the 4 chunks (0.41 s) stands between two decode steps; disaggregated: none does
    assert stalls[0] >= 3 and stalls[1] == 0, (stalls, max(aggregated), max(disaggregated))


@pytest.mark.parametrize("tokens, block, blocks", [
    (1, 16, 1), (16, 16, 1), (17, 16, 2), (1009, 16, 64), (0, 16, 1),  # ceil(tokens / block), at least 1
])
def test_blocks_for(tokens, block, blocks):
    assert blocks_for(tokens, block) == blocks


def drain(seq: Seq) -> int:
    n = 0
    while seq.out.get(timeout=10) is not DONE:
        n += 1
    return n


@pytest.mark.parametrize("prompt, chunk, to_prefill, max_tokens, prefill_steps, decode_steps", [
    (5000, 2048, 5000, 4, 3, 3),  # ceil(5000 / 2048) = 3 chunks; the last gives token 1, decode steps 2..4
    (5000, 8192, 5000, 4, 1, 3),  # one chunk holds it
    (5000, 2048, 0, 4, 0, 4),  # the KV came from a prefill: every token is a decode step's
    (100, 2048, 100, 1, 1, 0),  # a prefill for a remote decode: its one token ends it
])
def test_the_gpu_s_steps(prompt, chunk, to_prefill, max_tokens, prefill_steps, decode_steps):
    g = Gpu(0.0, 0.0, chunk, 8, 10_000)
    g.start()
    s = Seq(prompt, max_tokens, blocks_for(prompt + max_tokens, 16), to_prefill)
    g.submit(s)
    assert drain(s) == max_tokens and g.steps == {"prefill": prefill_steps, "decode": decode_steps}
    assert g.used == 0  # its blocks are back


def test_a_sequence_waits_for_kv_blocks_and_a_kept_prefill_holds_them():
    g = Gpu(0.0, 0.001, 2048, 8, 10)
    g.start()
    kept = Seq(100, 1, 8, 100, keep=True)  # a prefill for a remote decode: 8 of 10 blocks
    g.submit(kept)
    assert drain(kept) == 1 and g.used == 8  # held past its end, for the decode to pull
    waits = Seq(100, 2, 8, 100)
    g.submit(waits)
    time.sleep(0.2)
    assert not waits.admitted and g.counts() == (0, 1)  # 8 + 8 > 10: it waits
    g.release(8)  # the decode pulled the KV
    assert drain(waits) == 2 and g.used == 0


def test_the_engine_key_guards_metrics_and_faults_not_health(procs):
    P = pd.standin("prefill", key=KEY)
    procs.append(P)
    base = f"http://127.0.0.1:{P.port}"
    assert httpx.get(f"{base}/metrics").status_code == 401
    assert httpx.post(f"{base}/standin/faults", json={"fail_kv_pulls": True}).status_code == 401
    h = httpx.get(f"{base}/health").json()
    assert (h["pd_role"], h["engine_id"], h["kv_port"]) == ("prefill", P.engine_id, P.kv_port)
    plain = gs.Proc([sys.executable, "-m", "gpuflow", "standin", "--port", str(port := server_port()), "--pd-role", "",
                     "--kv-port", ""], port)  # a router's or a plain replica's {pd_role} and {kv_port}: ""
    procs.append(plain)
    assert httpx.get(f"http://127.0.0.1:{port}/health").json() == {"engine": "gpuflow stand-in", "runs": "no model"}
    bad = subprocess.run([sys.executable, "-m", "gpuflow", "standin", "--port", "1", "--pd-role", "prefill"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "--pd-role prefill needs --kv-port" in bad.stderr
