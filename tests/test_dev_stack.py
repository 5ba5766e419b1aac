"""`gpuflow dev --demo` (the README's main job) as a user runs it: it prints the placements and
the UI's address, and Ctrl-C stops every process it started."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from gpuflow.ports import server_port
from worker_agent.processes import ProcessTable, pid_alive


def test_dev_demo_then_ctrl_c_stops_everything(tmp_path):
    data = tmp_path / "dev"
    port, ui = server_port(), server_port()
    p = subprocess.Popen([sys.executable, "-m", "gpuflow", "dev", "--demo", "--data-dir", str(data),
                          "--port", str(port), "--ui-port", str(ui), "--gateway-port", str(server_port()),
                          "--agent-name", "devlocal"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _check_demo(p, data, ui)
    finally:
        if p.poll() is None:  # a failed check still stops what the demo started
            p.send_signal(signal.SIGINT)
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()


def _check_demo(p: subprocess.Popen, data, ui: int) -> None:
    lines: list[str] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "Ctrl-C stops every process" in line:
            break
    out = "".join(lines)
    assert "Ctrl-C stops every process" in out, out
    assert f"Temporal UI:  http://127.0.0.1:{ui}" in out
    assert "scaled chat-8b from 3 to 1" in out
    rows = [ln for ln in lines if re.match(r"^  (?!instances:)\S+ +RUNNING ", ln)]
    assert len(rows) == 5, out  # chat-8b x1, embed-small x2, llama-70b x1, smollm2 x1
    assert "  instances: RUNNING 2" in out, out  # embed-small's line of counts
    assert "llama-70b-0" in out and "mock-gpus" in out  # the demo's hosts: inventory GPUs, real processes
    # the real model: SmolLM2 through llama-cpp-python (found in this Python without flags) on this machine
    assert "smollm2-0            RUNNING      devlocal" in out, out
    llm = ProcessTable(str(data / "agent" / "devlocal")).find("smollm2-0")
    assert llm.argv[:3] == [sys.executable, "-m", "llama_cpp.server"]
    _check_gateway(out)
    servers = [r for h in ("gpu-a", "gpu-b", "gpu-c", "devlocal") for r in ProcessTable(str(data / "agent" / h)).records()]
    assert len(servers) == 5 and all(pid_alive(r.pid) for r in servers)

    p.send_signal(signal.SIGINT)
    assert p.wait(60) == 0
    time.sleep(0.5)
    assert not any(pid_alive(r.pid) for r in servers)
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    assert str(data) not in ps, [ln for ln in ps.splitlines() if str(data) in ln]


def test_exit_after_demo_ends_without_an_address_of_the_stack_it_stopped(tmp_path):
    """``make demo DEMO_ARGS=--exit-after-demo`` ended by printing the addresses of a stack that was
    gone (issue 36): the demo still says what it did, then that the stack stops; no address after
    the demo's own result, nothing left running."""
    data = tmp_path / "dev"
    p = subprocess.run([sys.executable, "-m", "gpuflow", "dev", "--demo", "--exit-after-demo", "--data-dir", str(data),
                        "--port", str(server_port()), "--ui-port", str(server_port()), "--gateway-port",
                        str(server_port()), "--agent-name", "devlocal"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "scaled chat-8b from 3 to 1" in p.stdout and "  A: " in p.stdout, p.stdout  # the demo ran, asked its model
    tail = p.stdout.split("HOST ", 1)[1]  # from the status's hosts table on
    assert "the stack stops now (--exit-after-demo)" in tail, tail
    assert not re.search(r"https?://|127\.0\.0\.1:|--address|curl ", tail), tail  # no address of the stopped stack
    assert "curl -s" not in p.stdout and "Prometheus metrics of" not in p.stdout
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    assert str(data) not in ps, [ln for ln in ps.splitlines() if str(data) in ln]


def _check_gateway(out: str) -> None:
    """The demo's answer came through the gateway, and its curl line, pasted, answers too. Where
    this checkout has no ``gpuflow gateway`` (the gateway lands on another branch) the demo says
    so and runs without it; anywhere else a missing gateway fails."""
    import importlib.util
    import json

    if importlib.util.find_spec("gateway") is None:
        assert "no gateway: the gateway exited" in out, out
        return
    url = next(ln.split()[2] for ln in out.splitlines() if ln.startswith("OpenAI-compatible gateway: "))
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    answer = next(ln for ln in out.splitlines() if ln.startswith("  A: "))
    assert len(answer) > len("  A: ") + 3, out  # a real model's words
    curl = next(ln.strip() for ln in out.splitlines() if ln.strip().startswith(f"curl -s {url}/chat/completions"))
    got = json.loads(subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=120).stdout)
    assert got["model"] and got["choices"][0]["message"]["content"].strip(), got
    # the stand-in deployments answer like models (issue 36: HTTP 501 before), streamed too, and are listed
    import openai

    c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
    assert {"chat-8b", "embed-small", "llama-70b", "smollm2"} <= {m.id for m in c.models.list()}
    said = c.chat.completions.create(model="chat-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=40)
    assert said.choices[0].message.content.startswith("This is gpuflow's stand-in engine"), said
    streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="llama-70b", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True) if ch.choices)
    assert streamed == "This is gpuflow's", streamed
    assert len(c.embeddings.create(model="embed-small", input=["a"]).data[0].embedding) == 8


def engine_key(data, instance: str) -> str:
    """The replica's engine key, as the store the dev stack made holds it (store/engine_keys.py)."""
    from store import db, records

    engine = db.make_engine(db.sqlite_url(str(data / "gpuflow.db")))
    try:
        return next(r.engine_key for r in records.instances_of(engine) if r.name == instance)
    finally:
        engine.dispose()


def test_dev_serves_a_real_gguf_out_of_the_box(tmp_path, smollm2):
    """Plain `gpuflow dev`, no engine flags: its agent finds llama-cpp-python in this Python, a
    deployed GGUF answers at the address:port `gpuflow status` reports, and through the gateway
    whose base URL dev printed (where this checkout has the gateway)."""
    import importlib.util
    import json
    import urllib.error
    import urllib.request

    port, data = server_port(), tmp_path / "dev"
    p = subprocess.Popen([sys.executable, "-m", "gpuflow", "dev", "--data-dir", str(data), "--port", str(port),
                          "--ui-port", str(server_port()), "--gateway-port", str(server_port()), "--agent-name", "box"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out = _read_until(p, "gpuflow dev is up", 120)
        assert "llama.cpp models run through this Python's llama-cpp-python" in out, out
        spec = tmp_path / "smol.yaml"  # today a CPU-only host still needs cpu_offloading said
        spec.write_text(json.dumps({"name": "smol", "source": {"local_path": smollm2}, "backend": "llama.cpp",
                                    "cpu_offloading": True}))
        cli = [sys.executable, "-m", "gpuflow"]
        addr = ["--address", f"127.0.0.1:{port}"]
        assert subprocess.run(cli + ["deploy", str(spec)] + addr, capture_output=True, timeout=60).returncode == 0
        line = ""
        deadline = time.monotonic() + 240
        while "RUNNING" not in line and time.monotonic() < deadline:
            time.sleep(1)
            st = subprocess.run(cli + ["status", "smol", "--data-dir", str(data)] + addr, capture_output=True,
                                text=True, timeout=60).stdout
            line = next((ln for ln in st.splitlines() if ln.strip().startswith("smol-0")), "")
        assert "RUNNING" in line and 'requests use "model": "smol"' in st, st
        where = next(w for w in line.split() if w.startswith("127.0.0.1:"))  # the replica's address:port
        body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}).encode()
        rq = urllib.request.Request(f"http://{where}/v1/chat/completions", data=body,
                                    headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError, match="401"):  # the port alone answers nobody
            urllib.request.urlopen(rq, timeout=120)
        rq.add_header("Authorization", f"Bearer {engine_key(data, 'smol-0')}")  # what the gateway sends
        with urllib.request.urlopen(rq, timeout=120) as r:
            assert json.loads(r.read())["choices"][0]["message"]["content"]
        if importlib.util.find_spec("gateway") is not None:
            from openai import OpenAI

            url = next(ln.split()[2] for ln in out.splitlines() if ln.startswith("OpenAI-compatible gateway: "))
            answer = OpenAI(base_url=url, api_key="unused", max_retries=0).chat.completions.create(
                model="smol", messages=[{"role": "user", "content": "Hi"}], max_tokens=8)
            assert answer.choices[0].message.content
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()


def _read_until(p: subprocess.Popen, marker: str, timeout: float) -> str:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        if marker in line:
            break
    return "".join(lines)
