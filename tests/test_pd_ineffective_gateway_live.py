"""``pd_ineffective`` from the gateway's own view (issue 35): a 2P2D group of real stand-in PD
engines behind a real ``gpuflow gateway`` (its router), over a real store, driven by the official
``openai`` client (tests/test_pd_gateway_live.py's stack: no Temporal, the store is all a gateway
and the ``gpuflow_group_degraded`` metric read). Every prefill gone: the gateway serves each
request on a decode whole (a fallback: 0 failed) and reports it; pd_ineffective is raised from
those counts. A prefill back: requests decode from its KV again and it clears."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
from sqlmodel import Session

from activities.metrics import StoreCollector
from store import group_health
from store.tables import DeploymentRow
from tests import gateway_stack as gs
from tests.gateway_stack import procs, sqlite_store  # noqa: F401  (fixtures)
from tests.test_pd_gateway_live import ask, fields, group, member, row


def gauge(engine) -> float | None:
    fam = next(f for f in StoreCollector(engine).collect() if f.name == "gpuflow_group_degraded")
    return next((x.value for x in fam.samples if x.labels == {"deployment": "pd", "kind": "pd_ineffective"}), None)


def why(engine) -> str:
    with Session(engine) as s:
        return group_health.standing(s, s.get(DeploymentRow, "pd")).why.get("pd_ineffective", "")


def test_pd_ineffective_from_the_gateways_counts_raised_and_cleared(sqlite_store, procs, tmp_path):
    _, _, engine = sqlite_store
    members, g = group(sqlite_store, procs, tmp_path)
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{g.port}/v1", api_key="none", max_retries=0)
    stop, done, failed = threading.Event(), [], []

    def load(k: int) -> None:
        i = 0
        while not stop.is_set():
            try:
                done.append(fields(ask(c, k * 10_000 + i, False)[0]))
            except Exception as e:  # noqa: BLE001  a failed request is what this test counts
                failed.append(repr(e))
            i += 1
            time.sleep(0.05)

    with ThreadPoolExecutor(4) as pool:
        for k in range(4):
            pool.submit(load, k)
        # healthy: 8 s of requests, all disaggregated: nothing raised
        time.sleep(8)
        assert done and {r["path"] for r in done} == {"disaggregated"} and gauge(engine) == 0
        # every prefill gone (killed, and the control plane marks them failed): each request a fallback
        for name, worker in (("pd-p0", "w1"), ("pd-p1", "w2")):
            members[name].kill()
            row(engine, name, "prefill", members[name].port, worker, state="failed")
        t0 = time.monotonic()
        gs.wait_for(lambda: gauge(engine) == 1, 45, "pd_ineffective raised")
        raised_s = time.monotonic() - t0
        assert why(engine).startswith("gateway: ") and "served without remote KV" in why(engine), why(engine)
        assert done[-1]["path"] == "fallback" and failed == []
        # a prefill back (a new member, RUNNING): requests decode from its KV again, and it clears
        p2 = member("pd-p2", "prefill", "w1", str(tmp_path / "pd-p2.log"))
        procs.append(p2)
        row(engine, "pd-p2", "prefill", p2.port, "w1")
        t1 = time.monotonic()
        gs.wait_for(lambda: gauge(engine) == 0, 60, "pd_ineffective cleared")
        cleared_s = time.monotonic() - t1
        assert done[-1]["path"] == "disaggregated" and why(engine) == ""
        stop.set()
    assert failed == []
    paths = [r["path"] for r in done]
    print(f"gateway witness: raised {raised_s:.1f} s after the prefills went, cleared {cleared_s:.1f} s after one "
          f"came back; {len(done)} requests: {paths.count('disaggregated')} disaggregated, "
          f"{paths.count('fallback')} fallback, 0 failed")
