"""Every decision is replayable (issue 30), on a real installation: replicas placed, refused,
scaled and moved off a lost host; then ``gpuflow explain --replay`` re-runs each kept decision
with this build's policy and says "same decision" (exit 0), ``--history`` lists them with their
inputs, ``--snapshot`` writes a cluster file ``gpuflow schedule`` reads, and a replay under other
scorer weights (the caller's, offline and through the control plane) reports the decisions it
would change (exit 1); ``--history`` given a replica's name refuses it, naming the deployment."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gpuflow import ops
from store import decision_log
from tests.live import FAST, Live, cli, spec


def explain(lv: Live, *args: str, env: dict[str, str] | None = None, offline: bool = False) -> subprocess.CompletedProcess:
    """``gpuflow explain ARGS --address A``: through the control plane; ``offline``: on the store
    itself (--data-dir), replayed by this process."""
    store = ["--data-dir", lv.stack.data_dir] if offline else []
    return subprocess.run([sys.executable, "-m", "gpuflow", "explain", *args, "--address", lv.stack.temporal.address,
                           *store], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


async def test_every_kept_decision_replays_to_the_same_decision(tmp_path):
    # h1: 2 x 24 GiB, h2: 1 x 24 GiB, h3: 1 x 24 GiB. "web" (10 GiB) x 3, then "big" (40 GiB) which
    # fits no GPU (refused), then web scaled to 4, then h3 lost: its replica moves.
    lv = await Live(str(tmp_path)).start({"h1": [24, 24], "h2": [24], "h3": [24]})
    try:
        await ops.deploy(lv.client, spec("web", replicas=3, vram_gib=10), FAST)
        await lv.wait(lambda: sorted(lv.states("web").values()) == ["running"] * 3, 60, "3 web RUNNING")
        await ops.deploy(lv.client, spec("big", vram_gib=40), FAST)
        await lv.wait(lambda: any(r.outcome == "refused" for r in decision_log.history(lv.engine, "big")), 30,
                      "big refused")
        await ops.scale(lv.client, "web", 4)
        await lv.wait(lambda: sorted(lv.states("web").values()) == ["running"] * 4, 60, "4 web RUNNING")
        on_h3 = [i.name for i in lv.instances("web") if i.worker == "h3"]
        if on_h3:
            lv.stack.kill_host("h3")
            await lv.wait(lambda: all(i.worker != "h3" and i.state == "running" for i in lv.instances("web")), 60,
                          "web off h3")
        rows = list(decision_log.every(lv.engine))
        assert {r.outcome for r in rows} >= {"placed", "refused"}
        assert len({r.instance for r in rows if r.instance.startswith("web")}) == 4
        # the record in each workflow's history names the kept inputs
        for name in {r.instance for r in rows if r.instance.startswith("web")}:
            rec = (await ops.instance(lv.client, name)).decision
            assert rec.inputs == decision_log.latest(lv.engine, name).digest

        # every kept decision, the refused one too, replays to the same decision: through the
        # control plane (--address alone), and on the store itself
        for r in rows:
            for offline in (False, True):
                out = explain(lv, r.instance, "--replay", "--decision", r.digest[:16], offline=offline)
                assert out.returncode == 0 and "same decision" in out.stdout, (r.instance, out.stdout, out.stderr)
        # the latest of an instance (no --decision): offline, against its workflow's own record
        out = explain(lv, "web-0", "--replay", "--json", offline=True)
        assert out.returncode == 0 and json.loads(out.stdout)["same"] is True

        for offline in (False, True):
            hist = explain(lv, "web", "--history", "--json", offline=offline)
            listed = json.loads(hist.stdout)
            assert hist.returncode == 0 and [x["inputs"] for x in listed] == [r.digest for r in rows
                                                                              if r.deployment == "web"]
        text = explain(lv, "web", "--history").stdout
        assert "placed" in text and "--replay --decision" in text
        assert "--data-dir" in explain(lv, "web-0", "--snapshot", str(tmp_path / "x.json")).stderr  # needs the store

        # the cluster the decision saw, as a file the dry run reads
        snap = str(tmp_path / "seen.json")
        out = explain(lv, "web-0", "--snapshot", snap, offline=True)
        assert out.returncode == 0 and os.path.exists(snap), out.stderr
        dry = subprocess.run([sys.executable, "-m", "gpuflow", "schedule", "--cluster", snap, "--model",
                              str(tmp_path / "seen.spec.json"), "--json"], capture_output=True, text=True, timeout=60)
        assert dry.returncode in (0, 3) and "candidates" in json.loads(dry.stdout), dry.stderr

        # other weights (this process's settings, --with-settings) decide differently: exit 1, named
        placed = next(r for r in rows if r.outcome == "placed")
        out = explain(lv, placed.instance, "--replay", "--decision", placed.digest[:16], "--with-settings",
                      env={"GPUFLOW_SCHEDULER__PLACEMENT": "0"}, offline=True)
        assert out.returncode == 1 and "different decision" in out.stdout and "score" in out.stdout, out.stdout
        # bench/replay_all.py: every decision of the store the same under this build; a changed
        # scorer weight reports each placing decision it would change (the refusal stays the same)
        bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "replay_all.py")
        # the store as the bench reads it: the refused "big" is decided again (and kept) when the
        # lost host's release wakes the queue, which may land after ``rows`` was read
        rows = list(decision_log.every(lv.engine))
        every = subprocess.run([sys.executable, bench, "--data-dir", lv.stack.data_dir], capture_output=True,
                               text=True, timeout=120)
        assert every.returncode == 0 and f"{len(rows)} decisions replayed" in every.stdout, every.stdout + every.stderr
        assert f"{len(rows)} the same, 0 different" in every.stdout
        changed = subprocess.run([sys.executable, bench, "--data-dir", lv.stack.data_dir, "--set", "placement=0",
                                  "--json"], capture_output=True, text=True, timeout=120)
        report = json.loads(changed.stdout)
        placing = [r for r in rows if r.outcome == "placed"]
        assert changed.returncode == 1 and report["different"] == len(placing) and report["failed"] == 0
        assert {d["instance"] for d in report["decisions"]} == {r.instance for r in placing}
        assert all(any(x.startswith("score:") for x in d["differences"]) for d in report["decisions"])

        # nothing is lost for a name with no kept decision: it is named
        for offline in (False, True):
            out = explain(lv, "nope-0", "--replay", offline=offline)
            assert out.returncode == 2 and "nope-0" in out.stderr, out.stderr
        # through the control plane too (issue 38): the caller's settings travel with the ask; the
        # worker's own (placement 100) answered "same decision" before
        out = explain(lv, placed.instance, "--replay", "--decision", placed.digest[:16], "--with-settings",
                      env={"GPUFLOW_SCHEDULER__PLACEMENT": "0"})
        assert out.returncode == 1 and "different decision" in out.stdout and "score" in out.stdout, out.stdout
        out = explain(lv, placed.instance, "--replay", "--decision", placed.digest[:16], "--with-settings")
        assert out.returncode == 0 and "same decision" in out.stdout, out.stdout + out.stderr
        # a history is a deployment's: a replica's name is refused, naming its deployment
        for offline in (False, True):
            out = explain(lv, "web-0", "--history", offline=offline)
            assert out.returncode == 2 and "web-0 is a replica of deployment web" in out.stderr, out.stderr
            assert "gpuflow explain web --history" in out.stderr
        assert cli(lv, "status").returncode == 0
    finally:
        lv.close()
