"""The ``gpuflow_group_degraded{deployment,kind}`` metric: each active group's degradations read
from the store at scrape time (store/group_health.py, activities/metrics.py), on SQLite and
PostgreSQL."""

from __future__ import annotations

import time

from sqlmodel import Session, select

from activities.metrics import StoreCollector
from contracts.host import HostReport
from store import groups, pd_counts, records
from store.pd_counts import PDCounts
from store.tables import InstanceRow
from tests.test_ledger import host


def labelled(name: str, zone: str) -> HostReport:
    return host(name).model_copy(update={"labels": {"topology.gpustack.ai/zone": zone}})


def set_rows(engine, states: dict[str, tuple[str, str | None]]) -> None:
    """Each member's (state, worker), as its workflow would have recorded it."""
    with Session(engine) as s:
        for row in s.exec(select(InstanceRow)):
            if row.name in states:
                row.state, row.worker = states[row.name]
                s.add(row)
        s.commit()


def scrape(engine) -> dict[tuple[str, str], float]:
    fam = next(f for f in StoreCollector(engine).collect() if f.name == "gpuflow_group_degraded")
    return {(x.labels["deployment"], x.labels["kind"]): x.value for x in fam.samples}


def test_a_groups_degradations_are_a_gauge_per_kind(store):
    _, _, engine = store
    for name, zone in (("a", "z1"), ("b", "z1"), ("c", "z2")):
        records.upsert_worker(engine, labelled(name, zone))
    spec = {"name": "pd", "roles": [{"name": "prefill", "replicas": 2}, {"name": "decode"}],
            "gather": {"strategy": "PreferGather", "layer": "builtin-000001"}}
    records.save_deployment(engine, "pd", spec, 1)
    records.save_deployment(engine, "plain", {"name": "plain"}, 1)  # no roles: no series
    groups.create_members(engine, "pd", "pd", {"pd-0": "prefill", "pd-1": "prefill", "pd-2": "decode"})
    # prefills on a and b (zone z1), the decode still pending: a role short, nothing loose yet
    set_rows(engine, {"pd-0": ("running", "a"), "pd-1": ("running", "b"), "pd-2": ("pending", None)})
    assert scrape(engine) == {("pd", "ratio_unmet"): 1, ("pd", "gather_unmet"): 0, ("pd", "pd_ineffective"): 0}
    # the decode runs on c, in zone z2: every role at its count, but the members share no zone
    set_rows(engine, {"pd-2": ("running", "c")})
    assert scrape(engine) == {("pd", "ratio_unmet"): 0, ("pd", "gather_unmet"): 1, ("pd", "pd_ineffective"): 0}
    # the decode on b instead: zone z1 holds them all
    set_rows(engine, {"pd-2": ("running", "b")})
    assert scrape(engine) == {("pd", "ratio_unmet"): 0, ("pd", "gather_unmet"): 0, ("pd", "pd_ineffective"): 0}
    # a gateway's counts 10 s apart, within the 30 s window: +1 disaggregated, +9 fallbacks (9 of 10
    # without remote KV, >= half): raised
    now = time.time()
    pd_counts.report(engine, "gw", {"pd": PDCounts(disaggregated=5)}, now - 25)
    pd_counts.report(engine, "gw", {"pd": PDCounts(disaggregated=6, fallback=9)}, now - 15)
    assert scrape(engine)[("pd", "pd_ineffective")] == 1
    # transfers resume: +20 disaggregated, no fallback; over the window 21 remote, 9 not (9 of 30 < half): cleared
    pd_counts.report(engine, "gw", {"pd": PDCounts(disaggregated=26, fallback=9)}, now - 1)
    assert scrape(engine)[("pd", "pd_ineffective")] == 0


def test_only_a_groups_router_takes_requests(store):
    # pd-0 prefill, pd-1 decode, pd-2 router and plain-0, all RUNNING with a port: the gateway's
    # table holds the router and the plain replica; a request straight to a prefill or a decode
    # would be served aggregated
    from store import serving

    _, _, engine = store
    with Session(engine) as s:
        for name, dep, role in (("pd-0", "pd", "prefill"), ("pd-1", "pd", "decode"), ("pd-2", "pd", "router"),
                                ("plain-0", "plain", None)):
            s.add(InstanceRow(name=name, deployment=dep, state="running", role=role, group_name=role and dep,
                              address="127.0.0.1", port=8000))
        s.commit()
    assert [r.instance for r in serving.routes(engine)] == ["pd-2", "plain-0"]
