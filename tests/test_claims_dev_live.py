"""``gpuflow claims`` and the console's Claims page, live on a fresh ``gpuflow dev`` (issue 42): a
stand-in engine whose simulated GPU memory is half its 4 GiB claim (GPUFLOW_SIMULATED_VRAM_USE
0.5) reports its usage, the control plane learns its fingerprint's claim (the recommender told to
trust 3 samples over 4 s), ``gpuflow claims`` through the cluster's reads shows it with what it
would free under advise, and the console's page shows the same in a real browser."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

from scheduler.claims.histogram import bucket_end, bucket_of
from tests.console_browser import Watched, browser
from tests.dev_stack import Dev, until
from tests.live import FAST

ENGINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_engine.py")
GiB = 2**30
T = FAST.model_copy(update={"liveness_s": 1.0, "host_watch_s": 3.0})  # sampled every second, reported every 2.4 s
CLAIMS = {"GPUFLOW_CLAIMS__MIN_SAMPLES": "3", "GPUFLOW_CLAIMS__MIN_HISTORY_S": "4"}
# 2 GiB used: p90 is 2 GiB's bucket end, x 1.15
LEARNED = math.ceil(bucket_end(bucket_of(2 * GiB)) * 1.15)


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("claims-dev")
    d = Dev(tmp, gpus=(24,), timings=T, env=CLAIMS)
    try:
        (tmp / "half.json").write_text(json.dumps({
            "name": "half", "backend": "custom", "replicas": 1, "source": {"local_path": "/models/half"},
            "run_command": f"{sys.executable} {ENGINE} --port {{port}} --host {{host}} --name h1",
            "env": {"GPUFLOW_SIMULATED_VRAM_USE": "0.5"}, "resources": {"vram": 4 * GiB, "ram": GiB}}))
        d.run("deploy", str(tmp / "half.json"))
        yield d
    finally:
        d.stop()


def learned(dev: Dev) -> dict | None:
    rows = json.loads(dev.run("claims", "--json"))["claims"]
    row = next((r for r in rows if any(x["name"] == "half" for x in r["deployments"])), None)
    return row if row and row["confident"] and row["replicas"] == 1 else None


def test_claims_learned_from_the_replicas_use(dev):
    row = until("half's learned claim confident", lambda: learned(dev), timeout=120, every=2)
    assert row["deployments"] == [{"name": "half", "mode": "advise"}]
    assert (row["booked"], row["peak"], row["learned"]) == (4 * GiB, 2 * GiB, LEARNED)
    assert row["samples"] >= 3 and row["change"] == LEARNED - 4 * GiB and row["frees"] == 4 * GiB - LEARNED
    assert row["label"].startswith("/models/half custom [")
    text = dev.run("claims")
    assert "claims mode advise: p90 + 15%, half-life 1 day, confident from 3 samples over 4 s" in text
    assert "  deployments half (advise); 1 replica measured now" in text
    assert (f"would book {LEARNED / GiB:.1f} GiB a replica instead of 4.0 GiB ({(4 * GiB - LEARNED) / GiB:.1f} GiB less), "
            f"freeing {(4 * GiB - LEARNED) / GiB:.1f} GiB over 1 replica") in text


def test_the_console_shows_it(dev):
    until("half's learned claim confident", lambda: learned(dev), timeout=120, every=2)
    with browser() as b:
        w = Watched(b, f"http://127.0.0.1:{dev.gw_port}")
        page = w.open("/console/claims")
        row = page.locator("#claims tbody tr[data-fingerprint]")
        assert row.count() == 1
        cells = [c.strip() for c in row.locator("td").all_inner_texts()]
        assert cells[1] == "half (advise)" and cells[2] == "1" and cells[4] == "4.0 GiB" and cells[5] == "2.0 GiB"
        assert cells[6] == f"{LEARNED / GiB:.1f} GiB" and cells[7].startswith("confident")
        assert cells[8].startswith(f"would book {LEARNED / GiB:.1f} GiB a replica instead of 4.0 GiB")
        page.click("a[href='/console/claims']")  # the nav links it
        page.wait_for_load_state("networkidle")
        w.check()
        w.close()
