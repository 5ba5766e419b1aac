"""Draining on the real stack (Temporal dev server, control plane, agent, real servers): a replica
being scaled away or deleted leaves the routing table (DRAINING) and is stopped only once the
gateways report nothing in flight on it. The gateway's side of the store contract
(store/serving.py: report_load every REPORT_S) is played here by the test itself, so
the control plane is checked without a gateway process; tests/test_gateway_live.py does the same
through the real gateway."""

from __future__ import annotations

import asyncio

from store import serving
from gpuflow import ops
from tests.live import FAST, Live, cli, spec
from worker_agent.processes import pid_alive

T = FAST.model_copy(update={"drain_timeout_s": 120})


class Reporter:
    """A gateway's reports: ``counts`` (instance -> requests in flight) every REPORT_S."""

    def __init__(self, engine, name: str = "gw-test"):
        self.engine, self.name, self.counts = engine, name, {}
        self.task = asyncio.ensure_future(self._run())

    async def _run(self):
        while True:
            await asyncio.to_thread(serving.report_load, self.engine, self.name, "http://127.0.0.1:1/v1",
                                    dict(self.counts))
            await asyncio.sleep(serving.REPORT_S)

    def close(self):
        self.task.cancel()
        serving.forget_gateway(self.engine, self.name)


async def test_scale_down_and_delete_drain_before_stopping(tmp_path):
    lv = await Live(str(tmp_path), t=T).start({"g1": [24, 24]})
    gw = Reporter(lv.engine)
    try:
        sp = spec("echo", replicas=2, command="python3 -m http.server {port} --bind {host}")
        await ops.deploy(lv.client, sp, T)
        await lv.wait(lambda: lv.states("echo") == {"echo-0": "running", "echo-1": "running"}, 60, "2 RUNNING")
        rows = {r.name: r for r in lv.instances("echo")}
        assert {(r.instance, r.address, r.port) for r in serving.routes(lv.engine)} == \
            {(n, "127.0.0.1", rows[n].port) for n in rows}  # the address the agent advertises (loopback here)
        gw.counts = {"echo-0": 1, "echo-1": 1}  # one request in flight on each

        await ops.scale(lv.client, "echo", 1)
        await lv.wait(lambda: "draining" in lv.states("echo").values(), 30, "one replica DRAINING")
        victim = next(n for n, s in lv.states("echo").items() if s == "draining")
        survivor = ({"echo-0", "echo-1"} - {victim}).pop()
        assert [r.instance for r in serving.routes(lv.engine)] == [survivor]  # out of the routing table
        out = await asyncio.to_thread(cli, lv, "status", "--data-dir", lv.stack.data_dir)  # the reports go on
        assert out.returncode == 0, out.stderr
        line = next(ln for ln in out.stdout.splitlines() if ln.strip().startswith(victim))
        assert "DRAINING" in line and f"127.0.0.1:{rows[victim].port}" in line.split()
        assert 'requests use "model": "echo"' in out.stdout and "gateway: http://127.0.0.1:1/v1" in out.stdout
        assert line.split()[line.split().index(f"127.0.0.1:{rows[victim].port}") + 1] == "1"  # in flight

        await asyncio.sleep(4)  # its request still runs: the process stays
        assert lv.states("echo")[victim] == "draining" and pid_alive(rows[victim].pid)
        gw.counts[victim] = 0  # the request finished
        await lv.wait(lambda: victim not in lv.states("echo"), 30, f"{victim} stopped once drained")
        assert not pid_alive(rows[victim].pid)
        assert lv.states("echo") == {survivor: "running"}

        await ops.delete(lv.client, "echo")  # delete drains too
        await lv.wait(lambda: lv.states("echo") == {survivor: "draining"}, 30, "the last replica DRAINING")
        assert serving.routes(lv.engine) == []
        gw.counts = {}
        await lv.wait(lambda: lv.states("echo") == {}, 30, "deleted once drained")
    finally:
        gw.close()
        lv.close()


async def test_the_drain_timeout_bounds_it(tmp_path):
    t = FAST.model_copy(update={"drain_timeout_s": 3})
    lv = await Live(str(tmp_path), t=t).start({"g1": [24]})
    gw = Reporter(lv.engine)
    try:
        await ops.deploy(lv.client, spec("stuck"), t)
        await lv.wait(lambda: lv.states("stuck") == {"stuck-0": "running"}, 60, "RUNNING")
        gw.counts = {"stuck-0": 1}  # a request that never ends
        await ops.scale(lv.client, "stuck", 0)
        await lv.wait(lambda: "still in flight after 3 s" in lv.instances("stuck")[0].reason
                      or lv.states("stuck") == {}, 30, "the drain gives up after 3 s")
        await lv.wait(lambda: lv.states("stuck") == {}, 30, "stopped anyway")
    finally:
        gw.close()
        lv.close()
