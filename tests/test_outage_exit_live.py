"""A control plane that does not answer is an outage, not the user's mistake (issue 40, low): with the
Temporal dev server up and no control-plane worker polling, a deploy's update and a status query give up
with ``Unreachable`` (the CLI's exit 4, "did not answer"), never ``InvalidInput`` (exit 2, which tells
the user to fix their input)."""

from __future__ import annotations

import pytest

from gpuflow import broken, ops
from gpuflow.dev.temporal import DevServer
from gpuflow.ports import server_port
from gpuflow.runtime import Unreachable, connect
from gpuflow.settings import TemporalSettings
from tests.live import spec

pytestmark = pytest.mark.asyncio


async def test_a_control_plane_that_does_not_answer_is_unreachable_not_invalid(tmp_path, monkeypatch):
    server = DevServer(str(tmp_path), port=server_port(), ui_port=None).start()
    try:
        client = await connect(TemporalSettings(address=server.address), wait_s=20)
        monkeypatch.setattr(ops, "UPDATE_TIMEOUT_S", 2.0)  # the CLI waits 60 s
        monkeypatch.setattr(broken, "QUERY_TIMEOUT_S", 2.0)  # and 10 s
        with pytest.raises(Unreachable, match="did not answer within 2 s"):
            await ops.deploy(client, spec("web"))
        with pytest.raises(Unreachable, match="did not answer a query within 2 s"):
            await ops.current(client, "web")
    finally:
        server.stop()
