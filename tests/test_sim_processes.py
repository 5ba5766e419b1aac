"""The simulated process runner (gpuflow simulate's seam) without a stack: real sockets, real
log files, nothing forked."""

from __future__ import annotations

import asyncio
import os
import random

from gpuflow.ports import free_port
from worker_agent.health import engine_answers, http_answers
from worker_agent.sim_processes import SimulatedProcessTable


async def until_ended(t, recs, within_s: float = 10.0) -> None:
    """Until every one of ``recs`` has a return code (a failed launch ends after the delay)."""
    for _ in range(int(within_s * 10)):
        if all(t.returncode(r.pid) is not None for r in recs):
            return
        await asyncio.sleep(0.1)


async def test_a_server_answers_after_the_delay_and_stops(tmp_path):
    t = SimulatedProcessTable(str(tmp_path), start_delay=0.2)
    port = free_port()
    rec = t.start("a-0", ["vllm", "serve", "--port", str(port)], {}, port)
    assert t.alive(rec.pid) and not await http_answers(port)  # 0 s: running, not listening yet
    for _ in range(100):  # 0.2 s, or longer on a loaded machine
        if await http_answers(port):
            break
        await asyncio.sleep(0.1)
    assert await engine_answers(port, "vllm") and await http_answers(port)  # /health or /v1/models: 200
    assert t.owner()(rec.pid) and not t.owner()(os.getpid())  # never a real pid
    assert await t.stop("a-0", grace_s=1) is True
    assert not await http_answers(port) and t.find("a-0") is None
    assert await t.stop("a-0", grace_s=1) is False  # idempotent
    assert "simulated: ended" in open(t.log_path("a-0")).read()


async def test_fail_rate_one_every_launch_exits_with_code_1(tmp_path):
    t = SimulatedProcessTable(str(tmp_path), start_delay=0.05, fail_rate=1.0, rng=random.Random(1))
    recs = [t.start(f"f-{k}", ["x"], {}, free_port()) for k in range(3)]
    await until_ended(t, recs)
    assert [t.returncode(r.pid) for r in recs] == [1, 1, 1]
    assert "launch failure" in t.tail("f-0")


async def test_fail_rate_share(tmp_path):
    # 200 launches at 0.25: about 50 fail (seeded: the same count every run)
    t = SimulatedProcessTable(str(tmp_path), start_delay=0.01, fail_rate=0.25, rng=random.Random(7))
    recs = [t.start(f"s-{k}", ["x"], {}, None) for k in range(200)]
    await asyncio.sleep(1.0)  # every launch has met its fate after 0.01 s (more on a loaded machine)
    failed = sum(t.returncode(r.pid) == 1 for r in recs)
    assert 30 <= failed <= 70, failed


async def test_vanish_ends_every_server(tmp_path):
    t = SimulatedProcessTable(str(tmp_path), start_delay=0.01)
    ports = [free_port() for _ in range(3)]
    recs = [t.start(f"v-{k}", ["x"], {}, p) for k, p in enumerate(ports)]
    await asyncio.sleep(0.3)
    assert all([await http_answers(p) for p in ports])
    t.vanish()
    assert not any([await http_answers(p) for p in ports]) and not any(t.alive(r.pid) for r in recs)


def test_a_port_handed_to_a_launch_is_not_handed_out_again():
    """The kernel hands out a released port again (here about one call in twelve), and a server
    binds its port only once it has started; a simulator's hosts share one process. Within
    HANDED_OUT_S no port is handed out twice; after it, the memory is let go."""
    from worker_agent import processes

    processes._handed_out.clear()
    ports = [processes.free_port(now=0.0) for _ in range(2000)]
    assert len(set(ports)) == 2000
    processes.free_port(now=processes.HANDED_OUT_S + 1)  # the window has passed: forgotten, but this one
    assert len(processes._handed_out) == 1
    processes._handed_out.clear()
