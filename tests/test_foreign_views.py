"""Where foreign memory and its degradation show: the host's report (judged by the agent against
its bookings), ``gpuflow hosts``, ``explain``, the console's overview and the control plane's
metrics. The words: '3.2 GiB used by other processes'."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from activities.metrics import add_foreign, foreign_families
from console.cluster_view import _host
from contracts.host import HostReport
from scheduler.cluster import GPU
from scheduler.units import GiB
from store.tables import WorkerRow
from views.render.cluster import hosts
from views.render.explain import explain
from worker_agent.inventory import booked_here, judged


def _report(foreign: float | None) -> HostReport:
    return HostReport(name="g1", ram_total=64 * GiB, gpus=[
        GPU(index=0, vram_total=24 * GiB, vram_foreign=None if foreign is None else int(foreign * GiB)),
        GPU(index=1, vram_total=24 * GiB)])


def test_the_agent_judges_its_report_against_its_bookings():
    """12 GiB booked on GPU 0 leaves 12 GiB: 10 GiB foreign is fine, 14 GiB is degraded, and back
    to 10 clears it (None: the fingerprint as before the field)."""
    booked = booked_here([type("R", (), {"vram_claim": {0: 8 * GiB}})(), type("R", (), {"vram_claim": {0: 4 * GiB}})(),
                          type("R", (), {"vram_claim": {}})()])
    assert booked == {0: 12 * GiB}
    fine = judged(_report(10), booked)
    assert fine.foreign_degraded is None and fine.fingerprint() == _report(10).fingerprint()
    bad = judged(_report(14), booked)
    assert [(d.index, d.foreign, d.booked, d.room) for d in bad.foreign_degraded] == [(0, 14 * GiB, 12 * GiB, 12 * GiB)]
    assert bad.fingerprint() != _report(14).fingerprint()  # news: the watch returns with it
    assert judged(bad.model_copy(update={"gpus": _report(10).gpus}), booked).foreign_degraded is None


def test_gpuflow_hosts_shows_foreign_use_and_the_degradation():
    r = judged(_report(14), {0: 12 * GiB})
    text = hosts([{"name": "g1", "state": "ready", "report": r.model_dump(mode="json")}])
    assert "0:24.0GiB (14.0 GiB used by other processes), 1:24.0GiB" in text, text
    assert ("DEGRADED: GPU 0: 14.0 GiB used by other processes, past the 12.0 GiB gpuflow's bookings leave free "
            "(12.0 GiB booked); its replicas may run out of memory; nothing is evicted") in text
    calm = hosts([{"name": "g1", "state": "ready", "report": _report(3.2).model_dump(mode="json")}])
    assert "3.2 GiB used by other processes" in calm and "DEGRADED" not in calm


def _row(foreign: float | None) -> WorkerRow:
    return WorkerRow(name="g1", state="ready", ram_total=64 * GiB, reserved_vram=0,
                     gpus=[g.model_dump(mode="json") for g in _report(foreign).gpus])


def test_the_console_overview_shows_it():
    h = _host(_row(14), {("g1", 0): 12 * GiB}, {})
    assert h.gpus[0].foreign_text == "14.0 GiB used by other processes" and h.gpus[1].foreign_text == ""
    assert len(h.degraded) == 1 and h.degraded[0].startswith("GPU 0: 14.0 GiB used by other processes, past the 12.0")
    assert _host(_row(10), {("g1", 0): 12 * GiB}, {}).degraded == []


def test_the_metrics_carry_foreign_bytes_and_the_degraded_flag():
    in_bytes, flag = foreign_families()
    add_foreign(in_bytes, flag, _row(14), {0: 12 * GiB})
    assert [(s.labels["gpu"], s.value) for s in in_bytes.samples] == [("0", 14 * GiB)]  # GPU 1: unknown, absent
    assert [(s.labels["gpu"], s.value) for s in flag.samples] == [("0", 1)]
    in_bytes, flag = foreign_families()
    add_foreign(in_bytes, flag, _row(10), {0: 12 * GiB})
    assert [s.value for s in flag.samples] == [0]
    assert isinstance(in_bytes, GaugeMetricFamily)


def test_explain_shows_the_foreign_use_where_a_replica_was_placed():
    note = ("foreign memory: worker g1: GPU 0: 3.2 GiB used by other processes (3.5 GiB kept off the books "
            "with the 10% margin)")
    d = {"instance": "m-0", "state": "running", "scheduled": True, "worker": "g1", "gpu_indexes": [0],
         "strategy": "single_gpu", "reasons": ["Matched 1 worker by cluster selector.", note],
         "decision": {"placement": {"worker": "g1", "gpu_indexes": [0]}, "candidates": []}}
    assert f"  {note}" in explain(d).splitlines()


def test_the_overview_page_renders_the_foreign_use_and_the_alert():
    from console.cluster_view import Overview
    from console.web import render
    from contracts.host import HOST_KINDS

    h = _host(_row(13), {("g1", 0): 12 * GiB}, {})
    ov = Overview(hosts=[h], matched=1, total=1, page=1, pages=1, host_states={"ready": 1}, gpu_models={}, gpus=2,
                  vram_total=48 * GiB, vram_claimed=12 * GiB, deployments={}, replicas={})
    html = render("overview.html", title="Overview", ov=ov, q="", state="", kinds=HOST_KINDS, caller=None,
                  data_ms=None).body.decode()
    assert '<span class="foreign">13.0 GiB used by other processes</span>' in html
    assert "degraded: GPU 0: 13.0 GiB used by other processes, past the 12.0 GiB gpuflow&#39;s bookings" in html


def test_the_temporal_ui_shows_it_on_the_host_workflow():
    from contracts.ui_text import host_details

    text = host_details(judged(_report(13), {0: 12 * GiB}))
    assert "GPU 0: `cuda` 24.0 GiB, 13.0 GiB used by other processes\nGPU 1: `cuda` 24.0 GiB\n" in text, text
    assert "**DEGRADED** GPU 0: 13.0 GiB used by other processes, past the 12.0 GiB" in text, text
    assert "DEGRADED" not in host_details(_report(10))


def test_the_signed_report_covers_the_foreign_figure_and_the_degradation(tmp_path):
    """The MAC covers both (contracts/host_proof.py): a watch answer whose foreign use was hidden,
    or whose degradation was dropped, after signing is refused; the whole one passes."""
    from tests.test_host_report_check import World, check

    w = World(tmp_path)
    try:
        sent = judged(_report(13).model_copy(update={"name": "h1"}), {0: 12 * GiB}).model_dump(mode="json",
                                                                                                 exclude={"auth"})
        signed = w.h1.signed(sent, "watch", "n-1")
        assert w.acts.check(check(signed, "watch", nonce="n-1")).ok
        hidden = {**signed, "gpus": [{**signed["gpus"][0], "vram_foreign": None}, signed["gpus"][1]]}
        assert w.acts.check(check(hidden, "watch", nonce="n-1")).kind == "mac"
        assert w.acts.check(check({**signed, "foreign_degraded": None}, "watch", nonce="n-1")).kind == "mac"
    finally:
        w.close()
