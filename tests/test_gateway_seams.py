"""What the gateway and its console do not own comes in through seams (issue 34): the autoscaler's
wake (gateway/wake.py ``Wake``) and the console's control plane (console/plane.py
``ControlPlane``), each handed in by the wiring (gpuflow/gateway_seams.py, through Temporal).
Here each is a small fake of the one seam, on a real gateway app over a real SQLite store: the
gateway wakes through its seam at most once per model every WAKE_EVERY_S, a wake that fails is
logged and the request still waits; the console's actions reach its plane, checked first (who
may, what), and a console without a plane says why it cannot act."""

from __future__ import annotations

import asyncio

import httpx2 as httpx
import pytest

import console
from console.access import ACTION_HEADER
from contracts.control import DeploymentView
from gateway.app import build
from gateway.config import GatewaySettings
from gateway.wake import WAKE_EVERY_S, Waker
from store import db, records


class Woken:
    """A Wake: records each model it is asked to wake; ``fail`` makes it raise, as an absent autoscaler does."""

    def __init__(self, fail: bool = False):
        self.models: list[str] = []
        self.fail = fail

    async def wake(self, model: str) -> None:
        self.models.append(model)
        if self.fail:
            raise RuntimeError("workflow not found: autoscaler/chat")


async def pokes(waker: Waker, models: list[str]) -> None:
    for m in models:
        waker.poke(m)
    await asyncio.gather(*list(waker.tasks))


@pytest.mark.parametrize("models, woken", [
    (["chat"], ["chat"]),
    (["chat", "chat", "chat"], ["chat"]),  # three requests within WAKE_EVERY_S (2 s): one wake
    (["chat", "embed", "chat"], ["chat", "embed"]),  # per model
])
def test_the_gateway_wakes_through_its_seam_once_per_model(models, woken):
    seen: list[str] = []
    w = Woken()
    asyncio.run(pokes(Waker(w, before=seen.append), models))
    assert w.models == woken and seen == woken  # the queue depth is published before each wake
    assert WAKE_EVERY_S == 2.0


def test_a_failed_wake_is_logged_and_a_gateway_without_a_seam_never_wakes(caplog):
    caplog.set_level("INFO", logger="gpuflow.gateway.wake")
    w = Woken(fail=True)
    asyncio.run(pokes(Waker(w), ["chat"]))
    assert w.models == ["chat"] and "could not wake autoscaler/chat: workflow not found" in caplog.text
    never = Waker(None)
    asyncio.run(pokes(never, ["chat"]))
    assert never.tasks == set() and never.last == {}


class Plane:
    """A ControlPlane that records what it was asked (only scale, scale_role and delete are asked here)."""

    def __init__(self):
        self.asked: list[tuple] = []

    async def scale(self, deployment: str, replicas: int) -> DeploymentView:
        self.asked.append(("scale", deployment, replicas))
        return DeploymentView(name=deployment, replicas=replicas, instances=[])

    async def scale_role(self, deployment: str, role: str, replicas: int) -> DeploymentView:
        self.asked.append(("scale_role", deployment, role, replicas))
        return DeploymentView(name=deployment, replicas=1, instances=[], spec={"roles": [
            {"name": "prefill", "replicas": replicas if role == "prefill" else 1}, {"name": "decode"}]})

    async def delete(self, deployment: str) -> DeploymentView:
        self.asked.append(("delete", deployment))
        return DeploymentView(name=deployment, replicas=0, instances=["chat-0"], deleting=True)


@pytest.fixture
def engine(tmp_path):
    e = db.make_engine(f"sqlite:///{tmp_path / 'gpuflow.db'}")
    db.init_db(e)
    records.save_deployment(e, "chat", {"name": "chat", "backend": "custom", "run_command": "x"}, 1)
    yield e
    e.dispose()


async def post(app, path: str, body: dict) -> tuple[int, dict]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8080") as c:
        r = await c.post(path, json=body, headers={ACTION_HEADER: "1", "origin": "http://127.0.0.1:8080"})
        return r.status_code, r.json()


@pytest.mark.parametrize("path, body, status, asked, said", [
    ("/console/deployments/chat/scale", {"replicas": "3"}, 200, [("scale", "chat", 3)], "chat: 3 replica(s) wanted"),
    ("/console/deployments/chat/delete", {}, 200, [("delete", "chat")], "deleting chat: 1 replica(s) to stop"),
    # checked before the plane is asked: the number, and the deployment
    ("/console/deployments/chat/scale", {"replicas": "-1"}, 400, [], "replicas must be a whole number"),
    ("/console/deployments/nope/scale", {"replicas": 1}, 400, [], "no deployment named 'nope'"),
    # one role of a group, as gpuflow scale --role; a role outside the three is refused before the plane
    ("/console/deployments/chat/scale", {"replicas": "2", "role": "prefill"}, 200,
     [("scale_role", "chat", "prefill", 2)], "chat: prefill 2 replica(s) wanted"),
    ("/console/deployments/chat/scale", {"replicas": "2", "role": "encode"}, 400, [], "role must be one of"),
])
def test_the_consoles_actions_reach_its_plane(engine, path, body, status, asked, said):
    plane = Plane()
    app = build(engine, GatewaySettings(port=8080), extra=(console.mount(plane),))  # an open gateway: no key yet
    got, answer = asyncio.run(post(app, path, body))
    assert (got, plane.asked) == (status, asked), answer
    assert said in (answer.get("message") or answer.get("error")), answer


def test_a_console_without_a_plane_says_why_it_cannot_act(engine):
    app = build(engine, GatewaySettings(port=8080), extra=(console.mount(None),))
    got, answer = asyncio.run(post(app, "/console/deployments/chat/scale", {"replicas": 2}))
    assert got == 400 and "started without Temporal settings" in answer["error"], answer
