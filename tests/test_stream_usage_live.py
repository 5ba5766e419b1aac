"""Streamed tokens counted when the engine sends no usage (issue 36): the real SmolLM2 on
llama-cpp-python's server, which sends no usage chunk even when asked, behind a real ``gpuflow
gateway``, asked with the official ``openai`` client with ``stream=True``. The stream's completion
is its pieces of content (a token each: the same request not streamed reports as many), its prompt
is estimated (this gateway has no tokenizer for a GGUF) and marked so; ``gpuflow keys usage`` and
the console's keys page show the counts, the prompt's with "~". Before this, the stream counted 0."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx2 as httpx
import openai

from contracts.control import InstanceRecord
from gateway.stream_tokens import estimate
from gpuflow.ports import server_port
from store import key_usage, keys, records
from store.key_usage import Counts
from tests import gateway_stack as gs
from tests.gateway_stack import procs, sqlite_store  # noqa: F401  (fixtures)

ASK = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 12, "temperature": 0,
       "seed": 1}


def test_a_stream_without_usage_is_counted_from_what_it_carried(sqlite_store, procs, smollm2, tmp_path):
    url, schema, engine = sqlite_store
    port = server_port()
    procs.append(gs.Proc([sys.executable, "-m", "llama_cpp.server", "--model", smollm2, "--host", "127.0.0.1",
                          "--port", str(port), "--n_ctx", "512", "--model_alias", "smollm2"], port,
                         str(tmp_path / "llama.log")))
    records.save_deployment(engine, "smollm2", {"name": "smollm2", "backend": "llama.cpp",
                                                "source": {"local_path": smollm2}}, 1)
    records.record_instance(engine, InstanceRecord(name="smollm2-0", deployment="smollm2", model="smollm2",
                                                   state="running", worker="w1", port=port, address="127.0.0.1"),
                            check_launch=False)  # no agent launched it: this test did
    admin, a = keys.create(engine, "default", "ops", "cluster-admin")
    g = gs.gateway(url, schema, log=str(tmp_path / "gw.log"))
    procs.append(g)
    base = f"http://127.0.0.1:{g.port}"
    gs.wait_model(base, "smollm2", 1, headers={"Authorization": f"Bearer {admin}"}, timeout=30, every=0.3)
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=admin, max_retries=0, timeout=120)

    chunks = list(client.chat.completions.create(model="smollm2", stream=True, **ASK))
    pieces = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
    assert all(c.usage is None for c in chunks) and pieces > 0  # the engine sent no usage
    plain = client.chat.completions.create(model="smollm2", **ASK)  # the same, not streamed: the engine counts
    assert plain.usage.completion_tokens == pieces  # a token a piece
    guess = estimate(ASK)  # ceil(20 / 4) + 4 = 9: no tokenizer for a GGUF here, so estimated
    assert guess == 9

    # 2 requests; prompt: 9 (estimated) + the engine's; completion: pieces twice; estimated: 9
    want = Counts(2, guess + plain.usage.prompt_tokens, 2 * pieces, guess)
    gs.wait_for(lambda: key_usage.totals(engine, 0, 4e9).by_key.get(a.id) == want, 30, "the usage flushed", 0.5)

    out = subprocess.run([sys.executable, "-m", "gpuflow", "keys", "usage", "--database-url", url, "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    mine = next(r for r in json.loads(out.stdout) if r["key_id"] == a.id)
    assert mine["hour"] == {"requests": 2, "prompt_tokens": want.prompt_tokens, "completion_tokens": 2 * pieces,
                            "estimated_tokens": guess}
    table = subprocess.run([sys.executable, "-m", "gpuflow", "keys", "usage", "--database-url", url],
                           capture_output=True, text=True, timeout=120).stdout
    line = next(x for x in table.splitlines() if a.id in x).split()
    assert line[2:5] == ["2", f"~{want.prompt_tokens}", str(2 * pieces)]  # REQ 1H, PROMPT 1H marked, COMPL 1H
    assert "~: holds tokens the gateway estimated" in table

    page = httpx.get(f"{base}/console/keys", headers={"Authorization": f"Bearer {admin}"}, timeout=30).text
    row = re.search(rf"<tr data-key=\"{a.id}\">(.*?)</tr>", page, re.S).group(1)
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
    assert cells[6:8] == ["2", f"~{want.prompt_tokens} / {2 * pieces}"]  # the last hour: requests, tokens
