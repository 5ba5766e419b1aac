"""One booking, one set of processes (issue 40, H2): the parts a placement books on each host
(contracts/booked_parts.py), the same parts the instance workflow launches (contracts/launch_parts.py),
and the ledger's read of them (store/bookings.py) on a real SQLite file and PostgreSQL schema."""

from __future__ import annotations

import pytest

from contracts import launch_parts as topology
from contracts.agent import LaunchRequest
from contracts.booked_parts import booked_parts
from contracts.control import HostReport, PlacementPlan
from scheduler.cluster import GPU, Claim, Subordinate
from scheduler.units import GiB
from store import bookings, ledger, records
from tests.store_fixtures import want

ONE = PlacementPlan(worker="h1", gpu_indexes=[0, 1], claim=Claim(vram={0: 10 * GiB, 1: 10 * GiB}, ram=GiB))
# llama.cpp over RPC: one subordinate entry per lent GPU (h2 lends two, h3 one), the server on h1's GPU 0
RPC = PlacementPlan(worker="h1", gpu_indexes=[0], claim=Claim(vram={0: 6 * GiB}, ram=GiB),
                    subordinates=[Subordinate(worker="h2", gpu_indexes=[0], claim=Claim(vram={0: 5 * GiB})),
                                  Subordinate(worker="h2", gpu_indexes=[1], claim=Claim(vram={1: 5 * GiB})),
                                  Subordinate(worker="h3", gpu_indexes=[0], claim=Claim(vram={0: 4 * GiB}))])
# vLLM over Ray, SGLang nodes: one subordinate entry per worker, its GPUs together
MULTI = PlacementPlan(worker="a", gpu_indexes=[0, 1], claim=Claim(vram={0: 20 * GiB, 1: 20 * GiB}, ram=GiB),
                      subordinates=[Subordinate(worker="b", gpu_indexes=[0, 1],
                                                claim=Claim(vram={0: 20 * GiB, 1: 20 * GiB}, ram=GiB))])


def shown(parts) -> list[tuple[str, str, list[int]]]:
    return [(p.part, p.role, p.gpu_indexes) for p in parts]


@pytest.mark.parametrize("backend, plan, worker, parts", [
    ("vllm", ONE, "h1", [("", "server", [0, 1])]),  # one worker: the server, nothing else
    ("custom", ONE, "h1", [("", "server", [0, 1])]),
    ("vllm", ONE, "h2", []),  # a host the placement does not name runs nothing of it
    ("llama.cpp", RPC, "h1", [("", "server", [0])]),  # the server; it reaches its rpc-servers over the network
    ("llama.cpp", RPC, "h2", [("rpc0", "rpc-server", [0]), ("rpc1", "rpc-server", [1])]),  # one per lent GPU
    ("llama.cpp", RPC, "h3", [("rpc2", "rpc-server", [0])]),  # numbered in tensor-split order across hosts
    ("vllm", MULTI, "a", [("ray-head", "ray-head", [0, 1]), ("", "server", [0, 1])]),
    ("vllm", MULTI, "b", [("ray0", "ray-worker", [0, 1])]),
    ("sglang", MULTI, "a", [("", "server", [0, 1])]),  # rank 0 is the server itself
    ("sglang", MULTI, "b", [("node1", "sglang-node", [0, 1])]),
    ("custom", MULTI, "b", []),  # custom commands are never launched across hosts
    (None, MULTI, "b", [("rpc0", "rpc-server", [0, 1]), ("ray0", "ray-worker", [0, 1]),  # booked before the
                        ("node1", "sglang-node", [0, 1])]),  # backend was stored: any backend's helper
    (None, ONE, "h1", [("", "server", [0, 1])]),  # ... but on one worker still the server alone
])
def test_a_booking_names_the_parts_its_placement_needs(backend, plan, worker, parts):
    assert shown(booked_parts(backend, plan, worker)) == parts


def launched(backend: str, plan: PlacementPlan) -> set[tuple[str, str, str, tuple[int, ...]]]:
    """(worker, part, role, GPUs) of every process the instance workflow launches (host_steps.py)."""
    req = LaunchRequest(instance="m-0", model="m", backend=backend, gpu_indexes=plan.gpu_indexes)
    subs = plan.subordinates
    if backend == "llama.cpp":
        helpers = topology.rpc_servers(req, subs)
    elif backend == "vllm":
        helpers = [(plan.worker, topology.ray_head(req))] + topology.ray_workers(req, subs, "a:1")
    else:
        helpers = topology.sglang_nodes(topology.sglang_head(req, subs), subs, "a:2")
    return {(w, r.part, r.role, tuple(r.gpu_indexes)) for w, r in [(plan.worker, req)] + helpers}


@pytest.mark.parametrize("backend, plan", [("llama.cpp", RPC), ("vllm", MULTI), ("sglang", MULTI)])
def test_the_booked_parts_are_exactly_what_the_workflow_launches(backend, plan):
    """launch_parts names each process; booked_parts must name the same ones, or the agent would
    refuse a legitimate helper (or allow a part nobody launches)."""
    hosts = {plan.worker} | {s.worker for s in plan.subordinates}
    booked = {(w, p.part, p.role, tuple(p.gpu_indexes)) for w in hosts for p in booked_parts(backend, plan, w)}
    assert booked == launched(backend, plan)


def host(name: str) -> HostReport:
    return HostReport(name=name, ram_total=64 * GiB, gpus=[GPU(index=i, vram_total=24 * GiB) for i in range(2)])


def test_the_ledgers_read_names_parts_and_claim_per_host(store):
    """What the agent is told (contracts/host.py Booking): booked or not with the reason, the GPUs
    of its lines there, its parts there, and its server's claim there (the main worker's lines)."""
    _, _, engine = store
    for h in ("h1", "h2", "h3"):
        records.upsert_worker(engine, host(h))
    want(engine, "r-0", "u-0")
    ledger.reserve(engine, "r-0", RPC, backend="llama.cpp")
    on = {h: bookings.booking_on(engine, "r-0", h) for h in ("h1", "h2", "h3")}
    assert (on["h1"].booked, on["h1"].gpu_indexes, shown(on["h1"].parts)) == (True, [0], [("", "server", [0])])
    assert (on["h1"].vram_claim, on["h1"].ram_claim) == ({0: 6 * GiB}, GiB)  # the server's claim, from h1's lines
    assert shown(on["h2"].parts) == [("rpc0", "rpc-server", [0]), ("rpc1", "rpc-server", [1])]
    assert (on["h2"].gpu_indexes, on["h2"].vram_claim) == ([0, 1], {})  # subordinate lines: no server claim here
    assert shown(on["h3"].parts) == [("rpc2", "rpc-server", [0])]
    assert bookings.booking_on(engine, "u-0", "h1").reason == "no booking in the ledger for instance u-0 on host h1"
    # the orphan check's read: several instances at once, the ones booked here and the others not
    assert sorted(n for n, b in bookings.bookings_on(engine, ["r-0", "u-0", "ghost-0"], "h2").items() if b.booked) == ["r-0"]
    # a replica deleted while its lines are still held (its teardown is under way) runs nothing more
    from contracts.control import InstanceRecord

    records.record_instance(engine, InstanceRecord(name="r-0", deployment="r", model="r", state="deleted"))
    gone = bookings.booking_on(engine, "r-0", "h2")
    assert not gone.booked and gone.reason == "instance r-0 of deployment r was deleted"


def test_a_carried_placement_is_trusted_only_when_the_ledger_holds_it(store):
    """The instance workflow's check of a placement in its input (M3): held exactly, for a wanted
    replica, or why not."""
    _, _, engine = store
    records.upsert_worker(engine, host("h1"))
    want(engine, "m-0")
    assert bookings.holds_problem(engine, "m-0", ONE) == "the ledger holds no booking for instance m-0"
    ledger.reserve(engine, "m-0", ONE, backend="vllm")
    assert bookings.holds_problem(engine, "m-0", ONE) is None
    other = ONE.model_copy(update={"gpu_indexes": [1], "claim": Claim(vram={1: 10 * GiB}, ram=GiB)})
    assert "another booking" in bookings.holds_problem(engine, "m-0", other)
    assert "was not started by a deployment" in bookings.holds_problem(engine, "evil-0", ONE)
