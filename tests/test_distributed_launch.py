"""Placements across several workers, launched through the whole system: real control plane, real
agents on two simulated hosts, and stand-ins in the place of llama-server, rpc-server, vllm, ray
and SGLang's Python. Each stand-in records its argv and environment, then listens where it was
told (HTTP for a server, TCP for rpc-server and the Ray head), so the RPC list, the tensor split,
TP/PP, SGLang's ranks and GPU visibility are checked against the real decision. One helper dying ends every part, and the
instance restarts; deleting it stops every part on every host."""

from __future__ import annotations

import json
import os
import stat
import sys

from gpuflow import ops
from scheduler.spec import ModelSpec
from tests.live import FAST, Live, cli
from worker_agent.processes import pid_alive

STAND_IN = """#!{python}
import http.server, json, os, socket, sys, time
args, me = sys.argv[1:], os.path.basename(sys.argv[0])
if args[:1] == ["-c"]:  # the agent asking a Python whether it has a module: this one has sglang
    sys.exit(0)
def arg(*names):
    return next(args[i + 1] for i, a in enumerate(args) if a in names)
with open({out!r} + "/calls.jsonl", "a") as f:
    f.write(json.dumps({{"prog": me, "argv": args, "pid": os.getpid(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                        "ray": os.environ.get("RAY_ADDRESS")}}) + "\\n")
if me == "rpc-server" or (me == "ray" and "--head" in args):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((arg("-H", "--node-ip-address"), int(arg("-p", "--port"))))
    s.listen()
    while True:
        s.accept()[0].close()
if me == "ray" or ("--node-rank" in args and arg("--node-rank") != "0"):  # a Ray worker, an SGLang node
    while True:
        time.sleep(1)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(arg("--port"))), H).serve_forever()
"""


def stand_ins(tmp_path, *names: str) -> list[str]:
    out = []
    for name in names:
        p = tmp_path / "bin" / name
        p.parent.mkdir(exist_ok=True)
        p.write_text(STAND_IN.format(python=sys.executable, out=str(tmp_path)))
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
        out.append(str(p))
    return out


def calls(tmp_path) -> list[dict]:
    try:
        return [json.loads(ln) for ln in (tmp_path / "calls.jsonl").read_text().splitlines()]
    except FileNotFoundError:
        return []


async def test_llama_cpp_over_rpc(tmp_path, smollm2):
    llama, rpc = stand_ins(tmp_path, "llama-server", "rpc-server")
    # SmolLM2 at ctx 2048 needs 0.82 GiB on one GPU (weights, KV cache and compute buffers). Over
    # RPC the main GPU needs 0.77 GiB and the lent one 0.58, so h1's 0.8 GiB card with h2's
    # 0.6 GiB card serves it, and neither alone can.
    lv = await Live(str(tmp_path)).start({"h1": [0.8], "h2": [0.6]},
                                         agent_args=["--llama-server", llama, "--rpc-server", rpc])
    try:
        spec = ModelSpec.model_validate({"name": "smol", "source": {"local_path": smollm2}, "backend": "llama.cpp",
                                         "distributed_inference_across_workers": True, "backend_parameters": ["-c", "2048"]})
        await ops.deploy(lv.client, spec, FAST)
        await lv.wait(lambda: lv.states() == {"smol-0": "running"}, 60, "RUNNING over RPC")
        placement = lv.instances()[0].decision["placement"]
        subs = placement["subordinates"]
        assert subs and all(s["worker"] != placement["worker"] for s in subs)

        seen = calls(tmp_path)
        servers = [c for c in seen if c["prog"] == "rpc-server"]
        main = next(c for c in seen if c["prog"] == "llama-server")
        # one rpc-server per subordinate GPU, each seeing only its GPU, bound to the advertised address
        assert sorted(c["visible"] for c in servers) == sorted(str(s["gpu_indexes"][0]) for s in subs)
        assert all(c["argv"][:2] == ["-H", "127.0.0.1"] for c in servers)
        # --rpc lists them in the decision's order, which is the tensor split's order (RPC first)
        by_gpu = {c["visible"]: c["argv"][3] for c in servers}
        want = ",".join(f"127.0.0.1:{by_gpu[str(s['gpu_indexes'][0])]}" for s in subs)
        argv = main["argv"]
        assert argv[argv.index("--rpc") + 1] == want
        assert argv[argv.index("--tensor-split") + 1] == ",".join(map(str, placement["claim"]["tensor_split"]))
        assert len(placement["claim"]["tensor_split"]) == len(subs) + len(placement["gpu_indexes"])
        assert main["visible"] == ",".join(map(str, placement["gpu_indexes"]))

        # an rpc-server dies: every part is stopped, the instance restarts, all parts start afresh
        first = {c["pid"] for c in seen}
        os.kill(servers[0]["pid"], 9)
        await lv.wait(lambda: any("rpc-server rpc" in i.reason and "exited" in i.reason for i in lv.instances()),
                      30, "ERROR naming the rpc-server", every=0.1)
        await lv.wait(lambda: lv.states() == {"smol-0": "running"} and lv.instances()[0].restarts == 1, 60,
                      "RUNNING again")
        assert not any(pid_alive(p) for p in first)
        again = [c for c in calls(tmp_path) if c["pid"] not in first]
        assert sorted(c["prog"] for c in again) == sorted(["llama-server"] + ["rpc-server"] * len(subs))

        await ops.delete(lv.client, "smol", wait=True)
        assert not any(pid_alive(c["pid"]) for c in calls(tmp_path))
    finally:
        lv.close()


async def test_vllm_over_ray(tmp_path):
    vllm, ray = stand_ins(tmp_path, "vllm", "ray")
    lv = await Live(str(tmp_path)).start({"a": [24, 24], "b": [24, 24]}, agent_args=["--vllm", vllm, "--ray", ray])
    try:
        # 80 GiB: more than one worker's 2 x 24 GiB, so it spans both
        spec = ModelSpec.model_validate({"name": "big", "source": {"local_path": "/models/big"}, "backend": "vllm",
                                         "distributed_inference_across_workers": True, "resources": {"vram": "80 GiB"}})
        await ops.deploy(lv.client, spec, FAST)
        await lv.wait(lambda: lv.states() == {"big-0": "running"}, 60, "RUNNING over Ray")
        row = lv.instances()[0]
        sub = row.decision["placement"]["subordinates"][0]
        assert sub["worker"] != row.worker

        seen = calls(tmp_path)
        head = next(c for c in seen if c["prog"] == "ray" and "--head" in c["argv"])
        worker = next(c for c in seen if c["prog"] == "ray" and "--head" not in c["argv"])
        server = next(c for c in seen if c["prog"] == "vllm")
        address = f"127.0.0.1:{head['argv'][head['argv'].index('--port') + 1]}"
        assert head["visible"] == ",".join(map(str, row.gpu_indexes))
        assert worker["argv"][worker["argv"].index("--address") + 1] == address
        assert worker["visible"] == ",".join(map(str, sub["gpu_indexes"]))
        a = server["argv"]
        assert server["ray"] == address
        assert a[a.index("--tensor-parallel-size") + 1] == str(len(row.gpu_indexes))
        assert a[a.index("--pipeline-parallel-size") + 1] == "2"
        assert a[a.index("--distributed-executor-backend") + 1] == "ray"

        view = await ops.instance(lv.client, "big-0")
        assert view.subordinate_workers == [sub["worker"]]
        assert view.parts == {"big-0@ray-head": row.worker, "big-0@ray0": sub["worker"]}
        # a helper's log is read on the host that runs it
        out = cli(lv, "logs", "big-0@ray0")
        assert out.returncode == 0 and "--- gpuflow: starting" in out.stdout and "--address" in out.stdout, out.stderr
        bad = cli(lv, "logs", "big-0@rpc7")
        assert bad.returncode == 2 and "big-0 has no part big-0@rpc7 (its parts: big-0@ray-head, big-0@ray0)" in bad.stderr
        await ops.delete(lv.client, "big", wait=True)
        assert not any(pid_alive(c["pid"]) for c in calls(tmp_path))  # the Ray worker on the other host too
    finally:
        lv.close()


async def test_sglang_nodes(tmp_path):
    (sglang,) = stand_ins(tmp_path, "sglang-python")
    lv = await Live(str(tmp_path)).start({"a": [24], "b": [24]}, agent_args=["--sglang-python", sglang])
    try:
        # 40 GiB: more than either worker's one 24 GiB card, so one SGLang node on each
        spec = ModelSpec.model_validate({"name": "sg", "source": {"local_path": "/models/sg"}, "backend": "sglang",
                                         "resources": {"vram": "40 GiB"}})
        await ops.deploy(lv.client, spec, FAST)
        await lv.wait(lambda: lv.states() == {"sg-0": "running"}, 60, "RUNNING across two nodes")
        row = lv.instances()[0]
        assert row.reason == ""  # rank 0 was started by this launch, not adopted from an earlier one
        sub = row.decision["placement"]["subordinates"][0]
        seen = calls(tmp_path)
        rank0 = next(c for c in seen if c["argv"][c["argv"].index("--node-rank") + 1] == "0")
        rank1 = next(c for c in seen if c["argv"][c["argv"].index("--node-rank") + 1] == "1")
        a0, a1 = rank0["argv"], rank1["argv"]
        dist = a0[a0.index("--dist-init-addr") + 1]
        assert dist.startswith("127.0.0.1:") and a1[a1.index("--dist-init-addr") + 1] == dist
        assert a0[a0.index("--tp") + 1] == a1[a1.index("--tp") + 1] == "2"  # TP spans both nodes' GPUs
        assert a0[a0.index("--nnodes") + 1] == "2" and "--port" in a0 and "--port" not in a1
        assert rank1["visible"] == ",".join(map(str, sub["gpu_indexes"]))
        view = await ops.instance(lv.client, "sg-0")
        assert view.parts == {"sg-0@node1": sub["worker"]}
        await ops.delete(lv.client, "sg", wait=True)
        assert not any(pid_alive(c["pid"]) for c in calls(tmp_path))
    finally:
        lv.close()
