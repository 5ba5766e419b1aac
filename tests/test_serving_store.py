"""The serving path's store: the routing table's source and the gateways' in-flight counts that
a drain waits on, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

from sqlmodel import Session

from store import serving
from store.tables import InstanceRow, utcnow


def _instances(engine, rows):
    with Session(engine) as s:
        for name, state, port, address in rows:
            s.add(InstanceRow(name=name, deployment=name.rsplit("-", 1)[0], state=state, port=port, address=address))
        s.commit()


def test_routes_are_the_running_instances_with_a_port(store):
    _, _, engine = store
    _instances(engine, [("chat-0", "running", 5000, "10.0.0.7"),
                        ("chat-1", "stopping", 5001, "10.0.0.7"),  # being stopped: not routed
                        ("chat-2", "running", None, None),  # no server port (yet): not routed
                        ("embed-0", "running", 5002, None)])  # no address recorded: loopback
    assert serving.routes(engine) == [
        serving.Route(instance="chat-0", deployment="chat", address="10.0.0.7", port=5000),
        serving.Route(instance="embed-0", deployment="embed", address="127.0.0.1", port=5002)]


def test_in_flight_sums_the_live_gateways_only(store):
    _, _, engine = store
    now = utcnow()
    serving.report_load(engine, "g1", "http://a/v1", {"chat-0": 3, "chat-1": 0}, now=now)
    serving.report_load(engine, "g2", "http://b/v1", {"chat-0": 2}, now=now - timedelta(seconds=2))
    serving.report_load(engine, "g3", "http://c/v1", {"chat-0": 7}, now=now - timedelta(seconds=60))  # gone
    # live within 5 s: g1 (3) + g2 (2) = 5; g3's 7 no longer holds a drain back
    assert serving.in_flight(engine, "chat-0", now=now) == 5
    assert serving.in_flight(engine, "chat-1", now=now) == 0  # zeros are not kept
    assert [g.id for g in serving.live_gateways(engine, now=now)] == ["g1", "g2"]
    # a new report replaces the gateway's counts; a clean shutdown removes them
    serving.report_load(engine, "g1", "http://a/v1", {"chat-0": 1}, now=now)
    assert serving.in_flight(engine, "chat-0", now=now) == 3  # 1 + 2
    serving.forget_gateway(engine, "g2")
    assert serving.in_flight(engine, "chat-0", now=now) == 1


def test_in_flight_of_many_instances_in_batches_and_status_offline(store, monkeypatch):
    """The batched read (status offline, the control plane's serving view, the console) gives each
    instance what in_flight gives it alone, however the names are cut into IN (...) lists."""
    from gpuflow.serving_view import add_serving

    _, _, engine = store
    now = utcnow()
    serving.report_load(engine, "g1", "http://a/v1", {"chat-0": 3, "chat-2": 1}, now=now)
    serving.report_load(engine, "g2", "http://b/v1", {"chat-0": 2, "chat-1": 4}, now=now)
    names = ["chat-0", "chat-1", "chat-2", "chat-3"]
    monkeypatch.setattr(serving, "IN_BATCH", 3)  # chat-0..2 in one list, chat-3 in a second
    with Session(engine) as s:
        got = serving.in_flight_of(s, names, now - timedelta(seconds=serving.LIVE_S))
    assert got == {"chat-0": 5, "chat-1": 4, "chat-2": 1}  # 3 + 2; 4; 1; chat-3 none: left out
    assert got == {n: serving.in_flight(engine, n, now=now) for n in names if serving.in_flight(engine, n, now=now)}
    st = add_serving({"deployments": [{"name": "chat", "instances": [{"name": n} for n in names]}]}, engine)
    assert [i["in_flight"] for i in st["deployments"][0]["instances"]] == [5, 4, 1, 0]
    assert st["gateways"] == ["http://a/v1", "http://b/v1"]
