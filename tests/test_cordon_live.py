"""Cordoning a host end to end (issue 28's action): the real Temporal dev server, a control-plane
worker and two agents with simulated GPUs, the store on SQLite. A cordoned host takes no new
replica (placed elsewhere, or PENDING with the cordon as the reason) while the replica running
there keeps running; uncordoned, the PENDING queue's wake places the waiting replica there. The
cordon is an update in the host workflow's history, in its status query and its current details."""

from __future__ import annotations

import pytest
from temporalio.client import WorkflowUpdateFailedError

from gpuflow import ops
from scheduler.errors import InvalidInput
from store import records
from tests.live import FAST, Live, cli, spec
from tests.test_control_plane import alive
from tests.test_temporal_ui_live import describe


def cordons(history) -> list[str]:
    """The cordon and uncordon updates the history accepted, in order (the agent's booking checks aside)."""
    names = [e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
             for e in history.events if e.HasField("workflow_execution_update_accepted_event_attributes")]
    return [n for n in names if n in ("cordon", "uncordon")]


async def test_a_cordoned_host_takes_no_new_replica_until_uncordoned(tmp_path):
    lv = await Live(str(tmp_path)).start({"h1": [24], "h2": [24]})
    try:
        # binpack: a new replica prefers the fuller GPU, so only the cordon keeps it off old-0's host
        await ops.deploy(lv.client, spec("old", vram_gib=20), FAST)
        await lv.wait(lambda: lv.states("old") == {"old-0": "running"}, 60, "old-0 RUNNING")
        first = lv.instances("old")[0]
        x, y = first.worker, "h2" if first.worker == "h1" else "h1"

        out = cli(lv, "hosts", "cordon", x, "--reason", "disk swap, back at 5pm")
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == (f"host {x} cordoned: no new replicas are placed there; "
                                      "those running there keep running")
        again = cli(lv, "hosts", "cordon", x, "--reason", "disk swap, back at 5pm")
        assert again.stdout.strip() == f"host {x} was already cordoned"  # idempotent
        listing = cli(lv, "hosts")
        line = next(ln for ln in listing.stdout.splitlines() if ln.startswith(x + " "))
        assert line.endswith("CORDONED (disk swap, back at 5pm)"), listing.stdout
        assert "CORDONED" not in next(ln for ln in listing.stdout.splitlines() if ln.startswith(y + " "))
        assert {w.name: (w.cordoned, w.cordon_reason) for w in records.workers(lv.engine)}[x] == (
            True, "disk swap, back at 5pm")

        # 20 + 2 of 24 GiB on x is binpack's best fit: the cordon sends it to y
        await ops.deploy(lv.client, spec("new", vram_gib=2, placement_strategy="binpack"), FAST)
        await lv.wait(lambda: lv.states("new") == {"new-0": "running"}, 60, "new-0 RUNNING")
        assert lv.instances("new")[0].worker == y

        # both cordoned: a new replica waits, the cordon its reason
        assert await ops.cordon(lv.client, y, True) == (f"host {y} cordoned: no new replicas are placed there; "
                                                        "those running there keep running")
        await ops.deploy(lv.client, spec("waits", vram_gib=2, placement_strategy="binpack"), FAST)
        await lv.wait(lambda: lv.states("waits") == {"waits-0": "pending"}
                      and "cordoned" in lv.instances("waits")[0].reason, 60, "waits-0 PENDING for the cordon")
        assert lv.instances("waits")[0].reason.startswith(
            "unschedulable: hosts h1, h2 are cordoned; cordon: worker h1: no new replicas here until "
            "'gpuflow hosts uncordon h1'")
        views = {h.name: h for h in await ops.hosts(lv.client)}
        assert (views[x].cordoned, views[x].cordon_reason, views[x].state) == (True, "disk swap, back at 5pm", "ready")
        assert (views[y].cordoned, views[y].cordon_reason) == (True, "")
        ui = describe(lv, f"host/{x}")["current"]
        assert "**READY**" in ui and "**CORDONED** no new replicas `disk swap, back at 5pm`" in ui

        # what does not validate is refused before it enters the history (the agent's own events go on)
        h = lv.client.get_workflow_handle(f"host/{x}")
        before = cordons(await h.fetch_history())
        for bad, why in [({"reason": "<script>"}, "it holds '<', '>'"), ({"reason": "x" * 201}, "at most 200"),
                         ({"reason": "ok", "by": "me"}, "cordon takes only a reason; it was given 'by'"),
                         ("ok", "one JSON object")]:
            with pytest.raises(WorkflowUpdateFailedError) as e:
                await h.execute_update("cordon", bad)
            assert why in str(e.value.cause), (why, e.value.cause)
        assert cordons(await h.fetch_history()) == before == ["cordon", "cordon"]
        with pytest.raises(InvalidInput, match="no host named 'ghost'"):
            await ops.cordon(lv.client, "ghost", True)

        # uncordon x: the queue's wake places waits-0 there (the sweep is 120 s away)
        out = cli(lv, "hosts", "uncordon", x)
        assert out.returncode == 0 and out.stdout.strip() == f"host {x} uncordoned: new replicas may be placed there"
        await lv.wait(lambda: lv.states("waits") == {"waits-0": "running"}, 30, "waits-0 RUNNING after the uncordon")
        assert lv.instances("waits")[0].worker == x
        assert cli(lv, "hosts", "uncordon", x).stdout.strip() == f"host {x} was not cordoned"

        # old-0 ran on through it all: the same process, never restarted
        row = lv.instances("old")[0]
        assert (row.state, row.worker, row.pid, row.restarts) == ("running", x, first.pid, 0) and alive(lv, x, "old-0")
        assert cordons(await h.fetch_history()) == ["cordon", "cordon", "uncordon", "uncordon"]
        assert "CORDONED" not in describe(lv, f"host/{x}")["current"]
    finally:
        lv.close()
