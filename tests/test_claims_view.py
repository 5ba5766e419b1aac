"""``gpuflow claims`` over real store rows (views/claims.py, views/render/claims.py): usage reports
recorded as the control plane records them (store/usage.py, then store/claims.py), the view on
SQLite and PostgreSQL, and the command itself on a data dir: the deployments (with their modes),
the estimate, what is booked, the learned claim, the peak, the confidence, and in advise mode what
it would change and free."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

from contracts.usage import GpuUse, ReplicaUse, UsageBatch
from scheduler.claims.fingerprint import fingerprint
from scheduler.claims.histogram import bucket_end, bucket_of
from scheduler.claims.settings import ClaimSettings
from scheduler.units import GiB
from store import claims, db, usage
from tests.store_fixtures import on, store, stored_spec, want  # noqa: F401  (fixture)
from views.claims import claims as claims_view
from views.render.claims import text

SRC = "huggingface:Qwen/Qwen2.5-7B-Instruct"
GPU = "NVIDIA L4"
S = ClaimSettings(min_samples=6, min_history_s=600)
EST = 14 * GiB


def rep(name: str, used: int, claimed: int = EST) -> ReplicaUse:
    return ReplicaUse(instance=name, gpus=[GpuUse(index=0, used=used, peak=used, claimed=claimed)], measured="simulated",
                      source=SRC, backend="vllm", parameters="--max-model-len 8192", gpu_model=GPU)


def fill(engine, now: float) -> None:
    """q (advise) and r (apply) run the same fingerprint; 3 replicas at 7 GiB of a 14 GiB estimate,
    reported 3 times 5 minutes apart: 9 samples over 600 s."""
    want(engine, "q-0", "q-1", spec=stored_spec(SRC, "vllm", "--max-model-len 8192", claims="advise"))
    want(engine, "r-0", spec=stored_spec(SRC, "vllm", "--max-model-len 8192", claims="apply"))
    on(engine, "g1", "q-0", "q-1", "r-0")
    for i in range(3):
        batch = UsageBatch(host="g1", replicas=[rep("q-0", 7 * GiB), rep("q-1", 7 * GiB), rep("r-0", 7 * GiB)])
        usage.record(engine, batch)
        claims.observe_batch(engine, batch, S, now - 600 + 300 * i)
    claims.note_estimate(engine, fingerprint(SRC, "vllm", "--max-model-len 8192", GPU), EST, 5 * GiB)


# p90 of 7 GiB samples: 7 GiB's bucket end (7.05 GiB); + 15% = 8.10 GiB; each replica booked 14 GiB frees 5.90
LEARNED = math.ceil(bucket_end(bucket_of(7 * GiB)) * 1.15)


def test_the_view_on_each_store(store):  # noqa: F811
    _, _, engine = store
    now = time.time()
    fill(engine, now)
    view = claims_view(engine, S, now)
    assert view["mode"] == "advise" and len(view["claims"]) == 1
    r = view["claims"][0]
    assert [d["name"] for d in r["deployments"]] == ["q", "r"] or [d["name"] for d in r["deployments"]] == ["r", "q"]
    assert {d["name"]: d["mode"] for d in r["deployments"]} == {"q": "advise", "r": "apply"}
    assert (r["replicas"], r["booked"], r["estimate"], r["weights"]) == (3, EST, EST, 5 * GiB)
    assert (r["samples"], r["confident"], r["learned"], r["peak"]) == (9, True, LEARNED, 7 * GiB)
    assert r["change"] == LEARNED - EST and r["frees"] == 3 * (EST - LEARNED)
    assert r["label"] == f"{SRC} vllm [context=8192] on {GPU}"
    words = text(view)
    assert f"freeing {3 * (EST - LEARNED) / GiB:.1f} GiB over 3 replicas" in words
    assert "books (apply) / would book (advise) 8.1 GiB a replica instead of 14.0 GiB (5.9 GiB less)" in words


def test_the_command_on_a_data_dir(tmp_path):
    engine = db.make_engine(db.sqlite_url(str(tmp_path / "gpuflow.db")))
    db.init_db(engine)
    fill(engine, time.time())
    engine.dispose()
    env = {**os.environ, "GPUFLOW_CLAIMS__MIN_SAMPLES": "6", "GPUFLOW_CLAIMS__MIN_HISTORY_S": "600"}
    run = lambda *a: subprocess.run([sys.executable, "-m", "gpuflow.cli", "claims", "--data-dir", str(tmp_path), *a],
                                    env=env, capture_output=True, text=True, timeout=120)
    out = run()
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "claims mode advise: p90 + 15%, half-life 1 day, confident from 6 samples over 10 min"
    assert lines[2] == f"{SRC} vllm [context=8192] on {GPU}"
    assert lines[3] == "  deployments q (advise), r (apply); 3 replicas measured now"
    assert lines[4] == "  estimate 14.0 GiB, booked 14.0 GiB, peak 7.0 GiB; learned 8.1 GiB (confident, confidence 0.01)"
    assert lines[5].startswith("  p90 7.0 GiB + 15% = 8.1 GiB, from 9 samples over 10 min")
    js = json.loads(run("--json").stdout)
    assert js["claims"][0]["learned"] == LEARNED and js["settings"]["min_samples"] == 6


def test_the_console_page_shows_a_tenant_its_own(store):  # noqa: F811
    from console.access import Caller
    from console.claims_page import gather

    _, _, engine = store
    now = time.time()
    fill(engine, now)  # q and r: tenant default, which every key sees
    want(engine, "s-0", spec=stored_spec(SRC, "vllm", "--max-model-len 8192", tenant="team-b"))  # the same fingerprint, team-b's
    other = ReplicaUse(**{**rep("t-0", 3 * GiB).model_dump(), "parameters": "--max-model-len 4096"})
    want(engine, "t-0", spec=stored_spec(SRC, "vllm", "--max-model-len 4096", tenant="team-b"))  # another fingerprint, team-b's only
    on(engine, "g2", "s-0", "t-0")
    batch = UsageBatch(host="g2", replicas=[rep("s-0", 7 * GiB), other])
    usage.record(engine, batch)
    claims.observe_batch(engine, batch, S, now)
    admin = gather(engine, Caller(tenant="default", keyed=False, scope="cluster-admin"), S, now)
    assert len(admin["claims"]) == 2 and admin["hidden"] == 0
    team_a = gather(engine, Caller(tenant="team-a", keyed=True, scope="tenant-admin"), S, now)
    assert [[d["name"] for d in r["deployments"]] for r in team_a["claims"]] in (
        [["q", "r"]], [["r", "q"]])
    # the shared fingerprint's figures are team-a's replicas' (q-0, q-1, r-0 at 7 GiB of 14), not s-0's too;
    # the admin's count all 4: 4 x 14 GiB booked
    mine = team_a["claims"][0]
    assert (mine["replicas"], mine["booked_total"], mine["used_total"]) == (3, 3 * EST, 3 * 7 * GiB)
    assert {x["instance"] for x in mine["live"]} == {"q-0", "q-1", "r-0"}
    assert mine["frees"] == 3 * (EST - LEARNED) and "over 3 replicas" in mine["advice"]
    shared = next(r for r in admin["claims"] if r["fingerprint"] == mine["fingerprint"])
    assert (shared["replicas"], shared["booked_total"]) == (4, 4 * EST)
    assert team_a["hidden"] == 1
