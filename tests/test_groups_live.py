"""Prefill/decode groups admitted whole (issue 41), on ONE dev stack for the file: the Temporal dev
server, a control-plane worker and two agents with simulated GPUs whose members run ``gpuflow
standin`` (a real process each). Each test deploys its own group, looks, and deletes it:

- a 1P1D group, and a 2P1D group with a router, placed whole and their processes running;
- a group whose decode cannot fit starts nothing, holds no ledger line, and says why naming decode;
- ``scale_role`` adds a prefill beside the group and keeps every other member's pid; scaling it back
  stops the member the retention scorer names (scale_in on the store's snapshot);
- a tenant at its limit gets no partial group: nothing booked, its reason the quota;
- a control-plane worker SIGKILLed while groups form leaves no partial booking;
- a group switched off (``replicas: 0``: deploy, ``scale NAME 0``) stops and unbooks every member and
  keeps its deployment; switched on (``scale NAME 1``, ``deploy --replicas 1``) it forms whole again;
  a new group deployed off starts nothing;
- a group whose model cannot be read: its members ERROR naming why, the deployment listed and deletable."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import pytest

from contracts.group import DEPLOYMENT_SCALE_ROLE, RoleScaleAsk
from contracts.ids import deployment_id
from gpuflow import ops
from scheduler.groups.scale_in import scale_in
from scheduler.groups.spec import RoleName
from scheduler.spec import ModelSpec
from scheduler.tenancy.config import TenantsFile
from store import ledger, tenants
from store.snapshot import load_snapshot
from tests.live import FAST, Live, cli, spec
from worker_agent.processes import pid_alive

pytestmark = pytest.mark.asyncio
GiB = 2**30
STANDIN = f"{sys.executable} -m gpuflow standin --port {{port}} --host {{host}}"


def group(name: str, roles: list[dict], vram_gib: float = 8, **kw) -> dict:
    return {"name": name, "backend": "custom", "run_command": STANDIN, "source": {"local_path": f"/models/{name}"},
            "resources": {"vram": int(vram_gib * GiB), "ram": GiB}, "disaggregation": {"mode": "custom"},
            "roles": roles, **kw}


async def deploy(lv: Live, raw: dict) -> None:
    """``gpuflow deploy``'s call: start the deployment (or update it), as users run it."""
    await ops.deploy(lv.client, ModelSpec.model_validate(raw), FAST)


def members(lv: Live, name: str) -> dict[str, object]:
    return {i.name: i for i in lv.instances(name) if i.state != "deleted"}


def booked(lv: Live, name: str) -> list[str]:
    return sorted({i for i in _ledger_instances(lv) if i.startswith(f"{name}-")})


def _ledger_instances(lv: Live) -> list[str]:
    from sqlmodel import Session, select

    from store.tables import ReservationRow
    with Session(lv.engine) as s:
        return list(s.exec(select(ReservationRow.instance)))


async def running(lv: Live, name: str, n: int, timeout: float = 90) -> dict[str, object]:
    await lv.wait(lambda: len(members(lv, name)) == n and all(i.state == "running" for i in members(lv, name).values()),
                  timeout, f"{n} members of {name} RUNNING")
    return members(lv, name)


async def gone(lv: Live, name: str) -> None:
    await ops.delete(lv.client, name)
    await lv.wait(lambda: not members(lv, name) and not booked(lv, name), 60, f"{name} deleted, nothing booked")
    await lv.wait_async(lambda: _ended(lv, name), 30, f"{name}'s workflow ended (its row deleted)")


async def _ended(lv: Live, name: str) -> bool:
    return await ops.current(lv.client, name) is None


@pytest.fixture(scope="module")
async def stack(tmp_path_factory):
    lv = await Live(str(tmp_path_factory.mktemp("groups"))).start({"h1": [24, 24], "h2": [24, 24]})
    yield lv
    lv.close()


async def test_a_1p1d_group_is_placed_whole_and_its_processes_run(stack):
    lv = stack
    await deploy(lv, group("pd", [{"name": "prefill"}, {"name": "decode"}]))
    ms = await running(lv, "pd", 2)
    assert sorted(i.role for i in ms.values()) == ["decode", "prefill"]
    assert {i.group_name for i in ms.values()} == {"pd"}
    assert all(i.pid and pid_alive(i.pid) for i in ms.values())  # real processes
    assert booked(lv, "pd") == sorted(ms)  # each member holds its ledger lines
    view = await ops.current(lv.client, "pd")
    assert view.members == {n: i.role for n, i in ms.items()} and view.waiting == "" and view.forming == []
    await gone(lv, "pd")


async def test_a_2p1d_group_with_a_router_is_placed_whole(stack):
    lv = stack
    await deploy(lv, group("pdr", [{"name": "prefill", "replicas": 2}, {"name": "decode"}, {"name": "router"}]))
    ms = await running(lv, "pdr", 4)
    assert sorted(i.role for i in ms.values()) == ["decode", "prefill", "prefill", "router"]
    router = next(i for i in ms.values() if i.role == "router")
    assert router.gpu_indexes == [] and pid_alive(router.pid)  # RAM only, no GPU; a process all the same
    assert all(pid_alive(i.pid) for i in ms.values())
    await gone(lv, "pdr")


async def test_a_group_whose_decode_cannot_fit_starts_nothing_and_holds_nothing(stack, tmp_path):
    lv = stack
    path = tmp_path / "nofit.json"
    path.write_text(json.dumps(group("nofit", [{"name": "prefill"}, {"name": "decode", "worker_selector": {"tier": "h200"}}])))
    out = cli(lv, "deploy", str(path), "--wait", "--timeout", "40")  # as users run it
    assert out.returncode == 3 and "decode" in out.stdout + out.stderr, (out.returncode, out.stdout, out.stderr)
    await lv.wait_async(lambda: _waiting(lv, "nofit"), 30, "nofit says why it waits")
    view = await ops.current(lv.client, "nofit")
    assert view.waiting.startswith("unschedulable: ") and "decode" in view.waiting, view.waiting
    assert view.instances == [] and len(view.forming) == 2  # no member's workflow started
    rows = members(lv, "nofit")
    assert {i.state for i in rows.values()} == {"pending"} and all("decode" in i.reason for i in rows.values())
    assert all(i.pid is None for i in rows.values())
    assert booked(lv, "nofit") == []  # no ledger line: prefill would fit alone, and holds nothing
    await asyncio.sleep(5)  # it tries again (its retry timer): still nothing held
    assert booked(lv, "nofit") == [] and (await ops.current(lv.client, "nofit")).instances == []
    await gone(lv, "nofit")


async def _waiting(lv: Live, name: str) -> bool:
    view = await ops.current(lv.client, name)
    return view is not None and bool(view.waiting)


async def test_scale_role_keeps_the_other_members_and_scale_in_removes_the_retention_victim(stack):
    lv = stack
    raw = group("sc", [{"name": "prefill"}, {"name": "decode"}])
    await deploy(lv, raw)
    before = {n: i.pid for n, i in (await running(lv, "sc", 2)).items()}
    h = lv.client.get_workflow_handle(deployment_id("sc"))
    await h.execute_update(DEPLOYMENT_SCALE_ROLE, RoleScaleAsk(role=RoleName.PREFILL, replicas=2))
    after = await running(lv, "sc", 3)
    assert {n: after[n].pid for n in before} == before  # no member restarted
    assert sorted(i.role for i in after.values()) == ["decode", "prefill", "prefill"]
    spec = ModelSpec.model_validate({**raw, "roles": [{"name": "prefill", "replicas": 2}, {"name": "decode"}]})
    victim = scale_in(load_snapshot(lv.engine), spec, RoleName.PREFILL, "sc").victim
    assert victim is not None and after[victim].role == "prefill"
    await h.execute_update(DEPLOYMENT_SCALE_ROLE, RoleScaleAsk(role=RoleName.PREFILL, replicas=1))
    await lv.wait(lambda: set(members(lv, "sc")) == set(after) - {victim}, 60, f"{victim} stopped")
    left = await running(lv, "sc", 2)
    assert {n: left[n].pid for n in left} == {n: after[n].pid for n in left}
    await gone(lv, "sc")


async def test_a_tenant_at_its_limit_gets_no_partial_group(stack):
    lv = stack
    tenants.apply(lv.engine, TenantsFile.model_validate({"tenants": [{"name": "lab", "limit": {"gpus": 1}}]}))
    try:  # 2 members, one GPU each: the whole group is 2 GPUs, over the limit of 1; prefill alone would fit
        await deploy(lv, group("lim", [{"name": "prefill"}, {"name": "decode"}], tenant="lab"))
        await lv.wait_async(lambda: _waiting(lv, "lim"), 30, "lim says why it waits")
        view = await ops.current(lv.client, "lim")
        assert view.waiting.startswith("quota: tenant lab") and "group of 2" in view.waiting, view.waiting
        assert booked(lv, "lim") == [] and view.instances == []
    finally:
        if await ops.current(lv.client, "lim") is not None:
            await gone(lv, "lim")
        tenants.apply(lv.engine, TenantsFile.model_validate({"tenants": []}))


async def test_a_control_plane_worker_killed_while_groups_form_leaves_no_partial_booking(stack):
    lv = stack
    lv.stack.start_server()  # a second worker carries on
    names = [f"k{n}" for n in range(3)]
    await asyncio.gather(*(deploy(lv, group(n, [{"name": "prefill"}, {"name": "decode"}], vram_gib=4)) for n in names))
    first = lv.stack.servers[0]
    os.kill(first.pid, signal.SIGKILL)  # in the middle of the formations
    for _ in range(40):  # every moment: a group holds all its members' bookings or none
        for n in names:
            held, ms = booked(lv, n), members(lv, n)
            assert held in ([], sorted(ms)), (n, held, sorted(ms))
        await asyncio.sleep(0.25)
    for n in names:
        await running(lv, n, 2, timeout=120)
    assert not ledger.overbooked(lv.engine)
    for n in names:
        await gone(lv, n)


async def test_preemption_admits_a_guaranteed_group_whole(stack):
    # 4 GPUs of 24 GiB, each held by one 20 GiB replica of poc (no guarantee: it borrows them all);
    # lab (guarantee 2 GPUs) deploys a 1P1D group of 20 GiB members: two poc replicas give way, in
    # one transaction with the group's booking, and both members start once those stopped
    lv = stack
    tenants.apply(lv.engine, TenantsFile.model_validate(
        {"tenants": [{"name": "lab", "guarantee": {"gpus": 2}}, {"name": "poc"}]}))
    try:
        await ops.deploy(lv.client, spec("fill", vram_gib=20, replicas=4, tenant="poc"), FAST)
        await running(lv, "fill", 4)
        await deploy(lv, group("gpd", [{"name": "prefill"}, {"name": "decode"}], vram_gib=20, tenant="lab"))
        for _ in range(60):  # every moment: the group holds all its members' bookings or none
            held, ms = booked(lv, "gpd"), members(lv, "gpd")
            assert held in ([], sorted(ms)), (held, sorted(ms))
            if all(i.state == "running" for i in ms.values()) and len(ms) == 2:
                break
            await asyncio.sleep(0.5)
        await running(lv, "gpd", 2)
        states = sorted(i.state for i in members(lv, "fill").values())
        assert states == ["pending", "pending", "running", "running"], states
        assert all("preempted by lab/gpd" in i.reason for i in members(lv, "fill").values() if i.state == "pending")
        assert not ledger.overbooked(lv.engine)
    finally:
        for n in ("gpd", "fill"):
            if await ops.current(lv.client, n) is not None:
                await gone(lv, n)
        tenants.apply(lv.engine, TenantsFile.model_validate({"tenants": []}))


async def test_a_redeploy_changing_a_roles_replicas_restarts_nothing_and_a_command_change_rolls_the_group_whole(stack):
    lv = stack
    raw = group("re", [{"name": "prefill"}, {"name": "decode"}])
    await deploy(lv, raw)
    before = {n: i.pid for n, i in (await running(lv, "re", 2)).items()}
    await deploy(lv, {**raw, "roles": [{"name": "prefill"}, {"name": "decode", "replicas": 2}]})  # update_spec
    after = await running(lv, "re", 3)
    assert {n: after[n].pid for n in before} == before and sorted(i.role for i in after.values()) == [
        "decode", "decode", "prefill"]
    await deploy(lv, {**raw, "roles": [{"name": "prefill"}, {"name": "decode", "replicas": 2}],
                      "run_command": STANDIN + " --token-s 0.01"})
    await lv.wait(lambda: not set(members(lv, "re")) & set(after), 60, "every old member stopped")
    again = await running(lv, "re", 3)  # rolled whole: a new generation under new names, the old one stopped
    assert not set(again) & set(after) and sorted(i.role for i in again.values()) == ["decode", "decode", "prefill"]
    await gone(lv, "re")


async def test_a_member_whose_workflow_ends_is_replaced_alone(stack):
    # its workflow terminated from the UI: the deployment finds it closed, stops its process and places one
    # more member of that role alone beside the group (place_member); the other member keeps its pid
    lv = stack
    await deploy(lv, group("rep", [{"name": "prefill"}, {"name": "decode"}]))
    before = await running(lv, "rep", 2)
    decode = next(n for n, i in before.items() if i.role == "decode")
    prefill = next(n for n in before if n != decode)
    await lv.client.get_workflow_handle(f"instance/{decode}").terminate("test: gone")
    await lv.wait(lambda: decode not in members(lv, "rep") and len(members(lv, "rep")) == 2, 60, "decode replaced")
    after = await running(lv, "rep", 2)
    assert sorted(i.role for i in after.values()) == ["decode", "prefill"] and after[prefill].pid == before[prefill].pid
    assert not pid_alive(before[decode].pid)
    await gone(lv, "rep")


def _file(tmp_path, raw: dict) -> str:
    path = tmp_path / f"{raw['name']}-{raw.get('replicas', 1)}.json"
    path.write_text(json.dumps(raw))
    return str(path)


async def _all_off(lv: Live, name: str, pids: list[int]) -> None:
    """No member row left wanted (every row deleted), nothing booked, every process gone."""
    await lv.wait(lambda: not members(lv, name) and not booked(lv, name), 60, f"{name} off, nothing booked")
    assert not any(i.wanted for i in lv.instances(name)) and not any(pid_alive(p) for p in pids)
    view = await ops.current(lv.client, name)
    assert view is not None and view.instances == [] and view.forming == [] and view.replicas == 0  # kept, off


async def test_a_group_switched_off_stops_everything_and_switched_on_forms_whole_again(stack, tmp_path):
    lv = stack
    raw = group("sw", [{"name": "prefill"}, {"name": "decode"}])
    await deploy(lv, raw)
    first = await running(lv, "sw", 2)
    out = cli(lv, "deploy", _file(tmp_path, {**raw, "replicas": 0}), "--wait", "--timeout", "40")  # the trial's run
    assert out.returncode == 0 and "switched off" in out.stdout and "the group is off" in out.stdout, (out.stdout, out.stderr)
    await _all_off(lv, "sw", [i.pid for i in first.values()])
    kept = (await ops.current(lv.client, "sw")).spec["roles"]
    assert [(r["name"], r["replicas"]) for r in kept] == [("prefill", 1), ("decode", 1)]  # its roles' replicas kept
    st = cli(lv, "status", "sw")
    assert st.returncode == 0 and "off" in st.stdout, st.stdout
    out = cli(lv, "scale", "sw", "1")  # on: formed whole again, new members
    assert out.returncode == 0 and "the group is on: 2 member(s)" in out.stdout, (out.stdout, out.stderr)
    again = await running(lv, "sw", 2)
    assert sorted(i.role for i in again.values()) == ["decode", "prefill"] and not set(again) & set(first)
    assert booked(lv, "sw") == sorted(again)
    out = cli(lv, "scale", "sw", "0")
    assert out.returncode == 0 and "the group is off" in out.stdout, (out.stdout, out.stderr)
    await _all_off(lv, "sw", [i.pid for i in again.values()])
    out = cli(lv, "deploy", _file(tmp_path, raw), "--replicas", "1", "--wait", "--timeout", "60")
    assert out.returncode == 0 and "switched on" in out.stdout, (out.stdout, out.stderr)
    await running(lv, "sw", 2)
    out = cli(lv, "scale", "sw", "2")  # a group's own replicas is 0 or 1: its size is its roles'
    assert out.returncode == 2 and "--role ROLE" in out.stderr, out.stderr
    await gone(lv, "sw")


async def test_a_group_switched_off_mid_roll_stops_both_generations_and_forms_the_new_spec_when_on(stack, tmp_path):
    # a model change rolls the group whole (old and new KV cannot meet): a new generation beside the old one, whose
    # members here take 8 s to start serving (a shell sleeps first), so the roll is under way when it is switched off
    lv = stack
    raw = group("mr", [{"name": "prefill"}, {"name": "decode"}])
    await deploy(lv, raw)
    first = await running(lv, "mr", 2)
    slow = {**raw, "source": {"local_path": "/models/mr-14b"}, "run_command": f"sh -c 'sleep 8; exec {STANDIN}'"}
    await deploy(lv, slow)
    await lv.wait(lambda: any(i.group_gen == 1 for i in members(lv, "mr").values()), 60, "mr's new generation formed")
    roll = await lv.client.get_workflow_handle("deployment/mr").query("rollout")
    assert roll["rolling"] and roll["way"] == "whole", roll
    out = cli(lv, "deploy", _file(tmp_path, {**slow, "replicas": 0}), "--wait", "--timeout", "60")
    assert out.returncode == 0 and "switched off (replicas 0): its 4 member(s) stop" in out.stdout, out.stdout
    await _all_off(lv, "mr", [i.pid for i in first.values()])  # both generations: no member, nothing booked
    roll = await lv.client.get_workflow_handle("deployment/mr").query("rollout")
    # the roll ends with the group off (it had said 'rolling from version 0 to 1' until switched on)
    assert not roll["rolling"] and roll["status"] == "version 1 rolled out", roll
    assert roll["steps"][-1]["reason"].startswith("the group is off: no member runs version 0"), roll["steps"]
    out = cli(lv, "rollout", "status", "mr")
    assert out.returncode == 0 and "rolling" not in out.stdout.splitlines()[0], out.stdout
    out = cli(lv, "scale", "mr", "1")  # on: formed whole, with the spec it was switched off with
    assert out.returncode == 0 and "the group is on: 2 member(s)" in out.stdout, (out.stdout, out.stderr)
    again = await running(lv, "mr", 2, timeout=120)
    assert not set(again) & set(first) and sorted(i.role for i in again.values()) == ["decode", "prefill"]
    assert (await ops.current(lv.client, "mr")).spec["run_command"] == slow["run_command"]
    assert booked(lv, "mr") == sorted(again)
    roll = await lv.client.get_workflow_handle("deployment/mr").query("rollout")
    assert not roll["rolling"] and roll["status"] == "version 1 rolled out", roll  # switched on: no roll again
    await gone(lv, "mr")


async def test_a_new_group_deployed_with_replicas_0_starts_nothing(stack, tmp_path):
    lv = stack
    out = cli(lv, "deploy", _file(tmp_path, group("z", [{"name": "prefill"}, {"name": "decode"}], replicas=0)), "--wait")
    assert out.returncode == 0 and "the group is off" in out.stdout, (out.stdout, out.stderr)
    await asyncio.sleep(3)  # a formation would have named and booked its members by now
    view = await ops.current(lv.client, "z")
    assert view.instances == [] and view.forming == [] and view.replicas == 0
    assert members(lv, "z") == {} and booked(lv, "z") == []
    await gone(lv, "z")


async def test_a_group_whose_model_cannot_be_read_says_why_and_stays_listed_and_deletable(stack, tmp_path):
    # the trial's spec: a local path with no config.json, no resources (so the model is read to size
    # it). A plain replica gives up ERROR with the reason; so do the group's members, and the deployment's
    # workflow keeps running (before, form_group's error failed it: "Activity task failed", gone from status)
    lv = stack
    (tmp_path / "model").mkdir()
    raw = {**group("bad", [{"name": "prefill"}, {"name": "decode"}]), "source": {"local_path": str(tmp_path / "model")}}
    raw.pop("resources")
    out = cli(lv, "deploy", _file(tmp_path, raw), "--wait", "--timeout", "60")
    both = out.stdout + out.stderr
    assert out.returncode == 1 and "config.json" in both and "Activity task failed" not in both, both
    st = cli(lv, "status")
    assert st.returncode == 0 and "deployment bad" in st.stdout and "config.json" in st.stdout, st.stdout
    assert {i.state for i in members(lv, "bad").values()} == {"error"} and booked(lv, "bad") == []
    plain = {k: v for k, v in raw.items() if k not in ("roles", "disaggregation")} | {"name": "badp"}
    p = cli(lv, "deploy", _file(tmp_path, plain), "--wait", "--timeout", "60")  # the plain path, the same source
    assert p.returncode == out.returncode and "config.json" in p.stderr, (p.stdout, p.stderr)
    print(both, p.stdout + p.stderr, st.stdout, sep="\n---\n")  # what users read (pytest -s)
    for name in ("bad", "badp"):
        out = cli(lv, "delete", name)
        assert out.returncode == 0, out.stderr
        await lv.wait(lambda: not members(lv, name), 60, f"{name}'s members deleted")
        await lv.wait_async(lambda: _ended(lv, name), 30, f"{name}'s workflow ended")
