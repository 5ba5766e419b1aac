"""gpuflow's stand-in engine (gpuflow/demo/standin.py, issue 36): the demo's deployments answered
a chat with HTTP 501 (an HTML page relayed through the gateway); the stand-in answers the OpenAI
API, asked here with the official ``openai`` client: /v1/models, chat and text completions plain
and streamed, embeddings; only with its engine key. And the spec's ``api``: a deployment whose
engine serves no OpenAI API (``api: none``) is left out of /v1/models and the playground, and a
request naming it is refused, naming why."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx2 as httpx
import openai
import pytest
from pydantic import ValidationError

from contracts.control import InstanceRecord
from gpuflow.ports import server_port
from scheduler.spec import Api, ModelSpec
from store import keys, records
from tests import gateway_stack as gs
from tests.gateway_stack import procs, sqlite_store  # noqa: F401  (fixtures)

KEY = "gfe-" + "k" * 43


def standin(procs, key: str | None = None, name: str = "standin") -> gs.Proc:
    port = server_port()
    env = {k: v for k, v in os.environ.items() if k != "GPUFLOW_ENGINE_API_KEY"}
    p = gs.Proc([sys.executable, "-m", "gpuflow", "standin", "--port", str(port), "--model-name", name,
                 "--token-s", "0"], port, env={**env, **({"GPUFLOW_ENGINE_API_KEY": key} if key else {})})
    procs.append(p)
    return p


def test_the_stand_in_answers_the_openai_api_with_its_key_only(procs, tmp_path):
    e = standin(procs, KEY)
    base = f"http://127.0.0.1:{e.port}"
    c = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0, timeout=30)
    assert [m.id for m in c.models.list()] == ["standin"]
    msg = [{"role": "user", "content": "hello there"}]
    plain = c.chat.completions.create(model="chat", messages=msg, max_tokens=40)
    text = plain.choices[0].message.content
    assert text.startswith("This is gpuflow's stand-in engine") and text.endswith("You said: hello there")
    # a word a token: the canned text's 17 words and the 2 said; the prompt: 44 characters of JSON // 4
    assert (plain.usage.completion_tokens, plain.usage.prompt_tokens) == (19, 11)
    chunks = list(c.chat.completions.create(model="chat", messages=msg, max_tokens=3, stream=True))
    assert "".join(x.choices[0].delta.content or "" for x in chunks if x.choices) == "This is gpuflow's"
    assert all(x.usage is None for x in chunks)  # not asked for usage: none sent
    asked = list(c.chat.completions.create(model="chat", messages=msg, max_tokens=3, stream=True,
                                           stream_options={"include_usage": True}))
    assert asked[-1].choices == [] and asked[-1].usage.completion_tokens == 3
    done = c.completions.create(model="chat", prompt="a b", max_tokens=2)
    assert done.choices[0].text == "This is" and done.usage.completion_tokens == 2
    streamed = list(c.completions.create(model="chat", prompt="a b", max_tokens=2, stream=True))
    assert "".join(x.choices[0].text for x in streamed if x.choices) == "This is"
    emb = c.embeddings.create(model="e", input=["a", "b", "a"])
    v = [d.embedding for d in emb.data]
    assert len(v) == 3 and len(v[0]) == 8 and v[0] == v[2] != v[1]  # the same input, the same vector

    assert httpx.get(f"{base}/health").status_code == 200  # the agent's probes ask without the key
    refused = openai.OpenAI(base_url=f"{base}/v1", api_key="gfe-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        refused.models.list()
    ok = {"Authorization": f"Bearer {KEY}"}
    bad = httpx.post(f"{base}/v1/chat/completions", content=b"{not json", headers=ok)
    assert bad.status_code == 400 and bad.json()["error"]["message"] == "the body is not JSON"
    assert httpx.get(f"{base}/../../etc/passwd", headers=ok).status_code == 404  # it serves no file


def test_a_deployment_that_serves_no_openai_api_is_not_listed_and_is_refused(sqlite_store, procs, tmp_path):
    url, schema, engine = sqlite_store
    for name, extra in (("chat", {}), ("grpc-thing", {"api": "none"})):
        e = standin(procs, name=name)
        records.save_deployment(engine, name, {"name": name, "backend": "custom", "run_command": "x", **extra}, 1)
        records.record_instance(engine, InstanceRecord(name=f"{name}-0", deployment=name, model=name, state="running",
                                                       worker="w1", port=e.port, address="127.0.0.1"),
                                check_launch=False)  # no agent launched it: this test did
    admin, _ = keys.create(engine, "default", "ops", "cluster-admin")
    g = gs.gateway(url, schema, log=str(tmp_path / "gw.log"))
    procs.append(g)
    base, auth = f"http://127.0.0.1:{g.port}", {"Authorization": f"Bearer {admin}"}
    gs.wait_model(base, "chat", 1, headers=auth, every=0.3, timeout=30)
    c = openai.OpenAI(base_url=f"{base}/v1", api_key=admin, max_retries=0, timeout=30)
    assert [m.id for m in c.models.list()] == ["chat"]  # grpc-thing serves no OpenAI API
    assert c.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}]).choices
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="grpc-thing", messages=[{"role": "user", "content": "hi"}])
    assert e.value.code == "not_an_openai_model" and "api: none" in e.value.message
    page = httpx.get(f"{base}/console/playground", headers=auth, timeout=30).text
    assert 'value="chat"' in page and "grpc-thing" not in page


@pytest.mark.parametrize("spec, serves", [
    ({"backend": "vllm", "source": {"huggingface": {"repo": "Qwen/Qwen2.5-7B"}}}, Api.OPENAI),
    ({"backend": "custom", "run_command": "x"}, Api.OPENAI),  # specs written before api: still listed
    ({"backend": "custom", "run_command": "x", "api": "none"}, Api.NONE),
    ({"backend": "vllm", "source": {"huggingface": {"repo": "Qwen/Qwen2.5-7B"}}, "api": "none"}, Api.NONE),
])
def test_the_api_a_spec_serves_is_its_own_else_its_backend_s(spec, serves):
    full = {"name": "m", "source": {"local_path": "/m"}, **spec}
    assert ModelSpec.model_validate(full).serves == serves


def test_an_api_gpuflow_does_not_know_is_refused_naming_it():
    with pytest.raises(ValidationError) as e:
        ModelSpec.model_validate({"name": "m", "source": {"local_path": "/m"}, "backend": "custom",
                                  "run_command": "x", "api": "grpc"})
    assert "api" in str(e.value) and "'openai' or 'none'" in str(e.value)


def test_the_dry_run_keeps_its_old_name_as_an_alias_that_names_the_new_one(tmp_path):
    run = [sys.executable, "-m", "gpuflow"]
    old = subprocess.run([*run, "demo", "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert old.returncode == 0 and "'gpuflow demo' is now 'gpuflow dry-run'" in old.stderr
    new = subprocess.run([*run, "dry-run", "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert new.returncode == 0 and new.stderr == "" and new.stdout == old.stdout
    v = subprocess.run([*run, "--version"], capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and v.stdout.startswith("gpuflow 0.")
