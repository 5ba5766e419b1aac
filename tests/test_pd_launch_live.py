"""A prefill/decode group's members launched by real agents (issue 35), on ONE dev stack for the
file: the control plane places the group, each member's workflow hands its role (and the group's
mode) to its host's agent, which picks the KV ports and starts the member. The member here is a
stand-in executable that records the argv and environment it was given, binds every port it was
told (so each was free), and answers HTTP; the instance rows are then read for ``bootstrap_port``.

- mode custom: each member's run_command gets ``{pd_role}``, ``{kv_port}`` and ``{bootstrap_port}``;
  the row records its ``{bootstrap_port}``;
- mode vllm-nixl: each member's vLLM gets ``--kv-transfer-config`` (NixlConnector) and the side
  channel on the agent's address and a port it picked; the row records that port;
- mode sglang-mooncake: the prefill's SGLang gets ``--disaggregation-mode prefill`` and a bootstrap
  port it binds, which its row records; the decode ``--disaggregation-mode decode`` and no port."""

from __future__ import annotations

import json
import stat
import sys

import pytest

from gpuflow import ops
from scheduler.spec import ModelSpec
from tests.live import FAST, Live

pytestmark = pytest.mark.asyncio
GiB = 2**30

STAND_IN = """#!{python}
import http.server, json, os, socket, sys
args = sys.argv[1:]
if "--port" not in args:  # asked whether it imports sglang (the agent's engine check): it does
    sys.exit(0)
def val(flag):
    return args[args.index(flag) + 1] if flag in args else ""
held = []
for flag in ("--kv-port", "--bootstrap-port", "--disaggregation-bootstrap-port"):
    if val(flag):  # the port it was told: bind it, as an engine would (fails if it is taken)
        s = socket.socket(); s.bind(("127.0.0.1", int(val(flag)))); s.listen(); held.append(s)
env = {{k: v for k, v in os.environ.items() if k.startswith("VLLM_")}}
with open(os.path.join({out!r}, str(os.getpid()) + ".json"), "w") as f:
    json.dump({{"argv": args, "env": env}}, f)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(val("--port"))), H).serve_forever()
"""


@pytest.fixture(scope="module")
async def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pdlaunch")
    out = tmp / "seen"
    out.mkdir()
    exe = tmp / "vllm"
    exe.write_text(STAND_IN.format(python=sys.executable, out=str(out)))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    lv = await Live(str(tmp)).start({"h1": [24, 24], "h2": [24, 24]},
                                    agent_args=["--vllm", str(exe), "--sglang-python", str(exe),  # both engines
                                                "--kv-connector", "nixl", "--kv-connector", "mooncake"])
    lv.seen, lv.exe = out, str(exe)
    yield lv
    lv.close()


def seen(lv: Live, skip: frozenset = frozenset()) -> dict[str, dict]:
    """What each stand-in started so far recorded (by file name: its pid), but ``skip``'s."""
    return {p.name: json.loads(p.read_text()) for p in lv.seen.glob("*.json") if p.name not in skip}


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


async def running(lv: Live, name: str, n: int) -> dict:
    def members() -> dict:
        return {i.name: i for i in lv.instances(name) if i.state != "deleted"}
    await lv.wait(lambda: len(members()) == n and all(i.state == "running" for i in members().values()), 90,
                  f"{n} members of {name} RUNNING")
    return members()


async def gone(lv: Live, name: str) -> None:
    await ops.delete(lv.client, name)
    await lv.wait(lambda: all(i.state == "deleted" for i in lv.instances(name)), 60, f"{name} deleted")


def group(name: str, **kw) -> ModelSpec:
    return ModelSpec.model_validate({
        "name": name, "source": {"local_path": f"/models/{name}"}, "resources": {"vram": 8 * GiB, "ram": GiB},
        "roles": [{"name": "prefill"}, {"name": "decode"}], **kw})


async def test_a_custom_member_gets_its_role_and_ports_and_the_row_records_the_bootstrap_port(stack):
    lv = stack
    cmd = f"{lv.exe} --port {{port}} --pd-role {{pd_role}} --kv-port {{kv_port}} --bootstrap-port {{bootstrap_port}}"
    await ops.deploy(lv.client, group("pdc", backend="custom", run_command=cmd, disaggregation={"mode": "custom"}), FAST)
    rows = await running(lv, "pdc", 2)
    by_port = {int(flag(s["argv"], "--port")): s["argv"] for s in seen(lv).values()}
    for r in rows.values():
        argv = by_port[r.port]
        assert flag(argv, "--pd-role") == r.role  # prefill, decode: the member's role
        kv, boot = int(flag(argv, "--kv-port")), int(flag(argv, "--bootstrap-port"))
        assert r.bootstrap_port == boot  # recorded: the port the gateway hands to the other end
        assert len({r.port, kv, boot}) == 3  # three ports, each bound by the stand-in: each was free
    await gone(lv, "pdc")


async def test_a_vllm_nixl_member_gets_the_connector_and_its_side_channel(stack):
    lv = stack
    before = frozenset(seen(lv))
    await ops.deploy(lv.client, group("pdv", backend="vllm", disaggregation={"mode": "vllm-nixl"}), FAST)
    rows = await running(lv, "pdv", 2)
    new = {int(flag(s["argv"], "--port")): s for s in seen(lv, before).values()}
    for r in rows.values():
        s = new[r.port]
        cfg = json.loads(flag(s["argv"], "--kv-transfer-config"))
        assert cfg == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        assert s["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == r.address  # reachable from the other hosts, not localhost
        assert int(s["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"]) == r.bootstrap_port != r.port
    await gone(lv, "pdv")


async def test_an_sglang_prefill_gets_its_bootstrap_port_and_the_decode_none(stack):
    lv = stack
    before = frozenset(seen(lv))
    await ops.deploy(lv.client, group("pds", backend="sglang", disaggregation={"mode": "sglang-mooncake"}), FAST)
    rows = await running(lv, "pds", 2)
    new = {int(flag(s["argv"], "--port")): s["argv"] for s in seen(lv, before).values()}
    for r in rows.values():
        argv = new[r.port]
        assert argv[:2] == ["-m", "sglang.launch_server"]
        assert flag(argv, "--disaggregation-mode") == r.role
        assert flag(argv, "--disaggregation-transfer-backend") == "mooncake"
        if r.role == "prefill":  # bound by the stand-in: it was free
            assert int(flag(argv, "--disaggregation-bootstrap-port")) == r.bootstrap_port != r.port
        else:  # each request names its prefill's bootstrap host, port and room
            assert "--disaggregation-bootstrap-port" not in argv and r.bootstrap_port is None
    await gone(lv, "pds")
