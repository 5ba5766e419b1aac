"""Edits that keep a prefill/decode group serving (issue 35), on ONE dev stack for the file: the
Temporal dev server, a control-plane worker and two agents with simulated 24 GiB GPUs whose
members run ``gpuflow standin`` (a real process each). Rows are sampled every 0.1 s while a roll
runs, so the order of events is seen, not assumed:

- a compatible edit (decode's env) rolls decode alone, surge first (and undo the same way): the new decode RUNNING before
  the old one leaves, the prefill's process untouched, one generation throughout;
- an incompatible edit (the model) rolls the group whole: a new generation (rows' group_gen 1)
  RUNNING in full before any old member leaves; ``rollout status`` says which way and why; undo
  rolls it whole again (generation 2) back to the first spec;
- a new generation that fails is rolled back: the old one serves throughout, the new one stopped;
- both rolls under load through a real gateway (stand-in PD engines, the openai client): 0 failed;
- no room for two generations: stop-first after surge_timeout_s, recorded as the fallback;
- a control-plane worker SIGKILLed mid whole roll: it resumes from the members, nothing formed twice."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import pytest

from gpuflow import ops
from scheduler.spec import ModelSpec
from tests.live import FAST, Live, cli

pytestmark = pytest.mark.asyncio
GiB = 2**30
STANDIN = f"{sys.executable} -m gpuflow standin --port {{port}} --host {{host}}"


def group(name: str, model: str | None = None, **kw) -> dict:
    return {"name": name, "backend": "custom", "run_command": STANDIN,
            "source": {"local_path": f"/models/{model or name}"}, "resources": {"vram": 8 * GiB, "ram": GiB},
            "disaggregation": {"mode": "custom"}, "roles": [{"name": "prefill"}, {"name": "decode"}], **kw}


async def deploy(lv: Live, raw: dict) -> None:
    await ops.deploy(lv.client, ModelSpec.model_validate(raw), FAST)


def rows(lv: Live, name: str) -> dict[str, object]:
    return {i.name: i for i in lv.instances(name) if i.state != "deleted"}


class Timeline:
    """Each member's first and last moment seen RUNNING (monotonic seconds), sampled every 0.1 s."""

    def __init__(self, lv: Live, name: str):
        self.lv, self.name = lv, name
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.gen: dict[str, int | None] = {}
        self.role: dict[str, str] = {}

    def sample(self) -> None:
        now = time.monotonic()
        for n, i in rows(self.lv, self.name).items():
            self.gen[n], self.role[n] = i.group_gen, i.role
            if i.state == "running":
                self.first.setdefault(n, now)
                self.last[n] = now


async def rollout(lv: Live, name: str) -> dict:
    return await lv.client.get_workflow_handle(f"deployment/{name}").query("rollout")


async def settled(lv: Live, name: str, status: str, n: int, tl: Timeline, timeout: float = 180) -> dict:
    """Until the roll is over, says ``status`` and ``n`` members run (sampling the timeline)."""
    view: dict = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tl.sample()
        view = await rollout(lv, name)
        states = [i.state for i in rows(lv, name).values()]
        if not view["rolling"] and view["status"].startswith(status) and not view["stopping"] \
                and states == ["running"] * n:
            return view
        await asyncio.sleep(0.1)
    raise AssertionError(f"{name} not settled as {status!r}: {json.dumps(view, indent=1)}; "
                         f"{ {k: i.state for k, i in rows(lv, name).items()} }")


async def running(lv: Live, name: str, n: int, timeout: float = 90) -> dict[str, object]:
    await lv.wait(lambda: len(rows(lv, name)) == n and all(i.state == "running" for i in rows(lv, name).values()),
                  timeout, f"{n} members of {name} RUNNING")
    return rows(lv, name)


async def gone(lv: Live, name: str) -> None:
    await ops.delete(lv.client, name)
    await lv.wait(lambda: not rows(lv, name), 60, f"{name} deleted")


@pytest.fixture(scope="module")
async def stack(tmp_path_factory):
    lv = await Live(str(tmp_path_factory.mktemp("grollout"))).start({"h1": [24, 24], "h2": [24, 24]})
    yield lv
    lv.close()


async def test_a_compatible_edit_rolls_decode_alone_surge_first(stack):
    lv = stack
    raw = group("cr")
    await deploy(lv, raw)
    before = await running(lv, "cr", 2)
    prefill = next(n for n, i in before.items() if i.role == "prefill")
    decode = next(n for n in before if n != prefill)
    tl = Timeline(lv, "cr")
    await deploy(lv, {**raw, "roles": [{"name": "prefill"}, {"name": "decode", "env": {"OMP_NUM_THREADS": "2"}}]})
    v = await settled(lv, "cr", "version 1 rolled out", 2, tl)
    after = rows(lv, "cr")
    new = next(n for n in after if n != prefill)
    assert prefill in after and after[prefill].pid == before[prefill].pid  # the prefill never restarted
    assert decode not in after and after[new].role == "decode"
    # surge first: the new decode ran before the old one was last seen RUNNING (0.1 s samples)
    assert tl.first[new] < tl.last[decode], (tl.first, tl.last)
    assert {g for g in tl.gen.values()} == {0}  # one generation throughout
    assert v["way"] == "roles" and v["why"].startswith("rolls role by role (decode)") and "env" in v["why"], v
    acts = [s["action"] for s in v["steps"]]
    assert acts.index("start_new") < acts.index("stop_old") and acts[-1] == "done", v["steps"]
    out = await asyncio.to_thread(cli, lv, "rollout", "status", "cr")
    assert out.returncode == 0 and "rolls role by role (decode)" in out.stdout, (out.stdout, out.stderr)
    # undo: decode alone again, back to the first spec; the prefill still the same process
    out = await asyncio.to_thread(cli, lv, "rollout", "undo", "cr")
    assert out.returncode == 0, out.stderr
    v = await settled(lv, "cr", "version 2 rolled out", 2, tl)
    back = rows(lv, "cr")
    assert back[prefill].pid == before[prefill].pid and new not in back and v["way"] == "roles", (back, v["why"])
    status = await lv.client.get_workflow_handle("deployment/cr").query("status")
    assert [r.get("env") for r in status["spec"]["roles"]] == [None, None]  # the first spec's roles again
    assert v["history"][-1]["undo_of"] == 0
    await gone(lv, "cr")


async def test_an_incompatible_edit_rolls_the_group_whole_and_undo_rolls_it_back(stack):
    lv = stack
    raw = group("wr")
    await deploy(lv, raw)
    gen0 = set(await running(lv, "wr", 2))
    tl = Timeline(lv, "wr")
    await deploy(lv, group("wr", model="wr-14b"))  # the model changes: old and new KV cannot meet
    v = await settled(lv, "wr", "version 1 rolled out", 2, tl)
    gen1 = set(rows(lv, "wr"))
    assert not gen0 & gen1 and {tl.gen[n] for n in gen1} == {1} and {tl.gen[n] for n in gen0} == {0}
    assert sorted(tl.role[n] for n in gen1) == ["decode", "prefill"]
    # the whole new generation RUNNING before any old member left: max(first new) < min(last old)
    assert max(tl.first[n] for n in gen1) < min(tl.last[n] for n in gen0), (tl.first, tl.last)
    assert v["way"] == "whole" and v["gen"] == 1 and "the model changes" in v["why"], v
    assert "form_new" in [s["action"] for s in v["steps"]], v["steps"]
    out = await asyncio.to_thread(cli, lv, "rollout", "status", "wr")
    assert out.returncode == 0 and "group generation 1: rolls the group whole" in out.stdout, out.stdout

    tl = Timeline(lv, "wr")
    out = await asyncio.to_thread(cli, lv, "rollout", "undo", "wr")
    assert out.returncode == 0, out.stderr
    v = await settled(lv, "wr", "version 2 rolled out", 2, tl)
    gen2 = set(rows(lv, "wr"))
    assert not gen2 & gen1 and {tl.gen[n] for n in gen2} == {2}
    assert max(tl.first[n] for n in gen2) < min(tl.last[n] for n in gen1), (tl.first, tl.last)
    status = await lv.client.get_workflow_handle("deployment/wr").query("status")
    assert status["spec"]["source"] == {"local_path": "/models/wr"}  # the first spec again
    assert v["way"] == "whole" and v["history"][-1]["undo_of"] == 0, v
    await gone(lv, "wr")


async def test_a_failing_new_generation_is_rolled_back_and_the_old_serves_throughout(stack):
    lv = stack
    raw = group("fr")
    await deploy(lv, raw)
    gen0 = await running(lv, "fr", 2)
    tl = Timeline(lv, "fr")
    bad = group("fr", model="fr-bad", roles=[{"name": "prefill"},
                                             {"name": "decode", "run_command": "python3 -c 'raise SystemExit(3)'"}])
    await deploy(lv, bad)
    v = await settled(lv, "fr", "rolled back: ", 2, tl)
    now = rows(lv, "fr")
    assert {n: i.pid for n, i in now.items()} == {n: i.pid for n, i in gen0.items()}  # never stopped
    assert {tl.gen[n] for n in tl.gen if n not in gen0} == {1} and v["gen"] == 0, (tl.gen, v["gen"])
    assert v["history"][-1]["result"] == "rolled back", v["history"]
    await gone(lv, "fr")


PD = STANDIN + " --pd-role {pd_role} --kv-port {kv_port} --token-s 0.002"
PROMPT = "Tell me about the sea. " * 40  # ~230 tokens: far over the 16 a prefill is skipped below


class Load:
    """Four clients through the gateway (the official openai client, no retries), back to back;
    each answer's route (x-gpuflow-route: its generation, where its KV came from) kept, and every
    failure with its reason."""

    def __init__(self, base: str, model: str, workers: int = 4):
        import openai
        self.model, self.routes, self.failed, self.stop = model, [], [], asyncio.Event()
        self.c = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
        self.tasks = [asyncio.ensure_future(self._run(w)) for w in range(workers)]

    async def _run(self, w: int) -> None:
        i = 0
        while not self.stop.is_set():
            i += 1
            try:
                raw = await self.c.chat.completions.with_raw_response.create(
                    model=self.model, max_tokens=4, messages=[{"role": "user", "content": f"{w}.{i}: {PROMPT}"}],
                    extra_headers={"x-gpuflow-debug": "route"})
                assert raw.parse().choices[0].message.content
                self.routes.append(dict(p.split("=", 1) for p in raw.headers["x-gpuflow-route"].split("; ")))
            except Exception as e:  # noqa: BLE001  every failure is a test failure, kept with its reason
                self.failed.append(f"{type(e).__name__}: {e}")
            await asyncio.sleep(0.02)

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)
        await self.c.close()


async def first_answer(base: str, model: str, timeout: float = 60) -> None:
    """Until the gateway serves the group once (before the load: nothing counted)."""
    import openai
    c = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=30)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                await c.chat.completions.create(model=model, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
                return
            except Exception:  # noqa: BLE001
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.3)
    finally:
        await c.close()


async def test_both_rolls_under_load_through_the_gateway_fail_no_request(stack):
    # a 1P1D group of stand-in PD engines (custom mode: the agent fills {pd_role} and {kv_port}) behind
    # a real gateway, four clients sending long prompts throughout: the env changes (role by role:
    # prefill, then decode), then the model (whole: generation 1); no request fails, >= 95% decode
    # from a prefill's KV
    from gpuflow.ports import server_port
    lv = stack
    gw = lv.stack.start_gateway(server_port())
    raw = {**group("ld"), "run_command": PD}
    await deploy(lv, raw)
    await running(lv, "ld", 2)
    await first_answer(gw, "ld")
    load = Load(gw, "ld")
    try:
        await lv.wait(lambda: len(load.routes) >= 20 or load.failed, 60, "the group answers through the gateway")
        tl = Timeline(lv, "ld")
        await deploy(lv, {**raw, "env": {"OMP_NUM_THREADS": "2"}})  # both roles' env: prefill rolls, then decode
        v = await settled(lv, "ld", "version 1 rolled out", 2, tl)
        assert v["way"] == "roles" and v["why"].startswith("rolls role by role (prefill, decode)"), v
        mark = len(load.routes)
        await lv.wait(lambda: len(load.routes) >= mark + 20 or load.failed, 60, "answers after both roles rolled")
        await deploy(lv, {**raw, "env": {"OMP_NUM_THREADS": "2"}, "source": {"local_path": "/models/ld-14b"}})
        v = await settled(lv, "ld", "version 2 rolled out", 2, tl)
        assert v["way"] == "whole" and v["gen"] == 1, v
        mark = len(load.routes)
        await lv.wait(lambda: len(load.routes) >= mark + 20 or load.failed, 60, "answers from generation 1")
        await load.finish()
        routes = load.routes
        assert load.failed == [], load.failed[:5]
        assert {r["gen"] for r in routes} == {"0", "1"} and {r["gen"] for r in routes[-10:]} == {"1"}
        remote = sum(r["kv"] == "remote" for r in routes)
        assert remote >= 0.95 * len(routes), (remote, len(routes))  # decoded from a prefill's KV
        print(f"\ngroup rolls under load: {len(routes)} answered, 0 failed, {remote} with remote KV; "
              f"generation 0 -> 1 at request {next(i for i, r in enumerate(routes) if r['gen'] == '1')}")
    finally:
        if not load.stop.is_set():
            await load.finish()
    await gone(lv, "ld")


async def test_a_whole_roll_without_room_for_two_generations_goes_stop_first(stack):
    # 2P2D of 20 GiB members: the four 24 GiB GPUs hold one generation, never two. The new one waits
    # surge_timeout_s (3 s) unplaced, then the old generation is stopped (the fallback, recorded) and
    # the new one forms on its GPUs
    lv = stack
    roles = [{"name": "prefill", "replicas": 2}, {"name": "decode", "replicas": 2}]
    raw = {**group("sf", roles=roles), "resources": {"vram": 20 * GiB, "ram": GiB}, "rollout": {"surge_timeout_s": 3}}
    await deploy(lv, raw)
    gen0 = set(await running(lv, "sf", 4))
    tl = Timeline(lv, "sf")
    await deploy(lv, {**raw, "source": {"local_path": "/models/sf-14b"}})
    v = await settled(lv, "sf", "version 1 rolled out", 4, tl)
    gen1 = set(rows(lv, "sf"))
    assert not gen0 & gen1 and {tl.gen[n] for n in gen1} == {1}
    stops = [s for s in v["steps"] if s["action"] == "stop_old"]
    assert len(stops) == 1 and stops[0]["fallback"] and sorted(stops[0]["names"]) == sorted(gen0), v["steps"]
    assert min(tl.first[n] for n in gen1) > max(tl.last[n] for n in gen0)  # stop-first: never both at once
    await gone(lv, "sf")


async def test_a_control_plane_worker_killed_mid_whole_roll_resumes_from_the_members(stack):
    # the only control-plane worker is SIGKILLed right after the new generation was formed, and a fresh
    # one started: the roll carries on from the members: one new generation (no second formation),
    # each old member stopped once
    lv = stack
    raw = group("kr")
    await deploy(lv, raw)
    gen0 = set(await running(lv, "kr", 2))
    tl = Timeline(lv, "kr")
    await deploy(lv, group("kr", model="kr-14b"))

    async def formed() -> bool:
        tl.sample()
        return any(s["action"] == "form_new" and s["names"] for s in (await rollout(lv, "kr"))["steps"])
    await lv.wait_async(formed, 60, "the new generation formed", every=0.1)
    victim = next(p for p in lv.stack.servers if p.poll() is None)
    victim.send_signal(9)
    victim.wait(10)
    await asyncio.sleep(2)
    lv.stack.start_server()
    v = await settled(lv, "kr", "version 1 rolled out", 2, tl, timeout=240)
    gen1 = set(rows(lv, "kr"))
    every = {i.name for i in lv.instances("kr")}  # every row the deployment ever wrote, deleted ones too
    assert {tl.gen[n] for n in gen1} == {1} and every == gen0 | gen1, (every, tl.gen)  # no other member ever
    stops = [n for s in v["steps"] if s["action"] == "stop_old" for n in s["names"]]
    assert sorted(stops) == sorted(gen0), v["steps"]  # each old member once
    await gone(lv, "kr")
