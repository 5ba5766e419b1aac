"""A booking the control plane signs for its host (contracts/booking_proof.py, issue 37): the
agent takes it in place of the ``booking`` update only for this instance on this host, with a MAC
that verifies, fresh, and once; anything else asks the ledger, whose answer decides. The real
activity, a real process table and real processes; the control plane's side on a real store."""

from __future__ import annotations

import os

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from contracts import agent as p
from contracts import booking_proof as bp
from contracts.control import PlacementPlan
from contracts.host import BookedPart, Booking
from scheduler.cluster import Claim
from scheduler.units import GiB
from store import bookings, ledger, records
from tests.store_fixtures import want
from tests.test_booked_parts import ONE, RPC, host
from worker_agent.activities import HostActivities
from worker_agent.bookings import HeldBookings, TakenProofs
from worker_agent.engines import EngineConfig
from worker_agent.processes import ProcessTable, pid_alive

KEY, OTHER_KEY = os.urandom(32), os.urandom(32)
T0 = 1_800_000_000.0
B = Booking(booked=True, gpu_indexes=[0], parts=[BookedPart(part="", role="server", gpu_indexes=[0])],
            vram_claim={0: 10 * GiB}, ram_claim=GiB)
SLEEP = "python3 -c 'import time; time.sleep(30)'"


def proof(**kw) -> bp.BookingProof:
    return bp.make(kw.pop("key", KEY), kw.pop("instance", "m-0"), kw.pop("host", "h1"), kw.pop("booking", B),
                   kw.pop("now", T0))


def altered(pr: bp.BookingProof, **kw) -> bp.BookingProof:
    return pr.model_copy(update=kw)


@pytest.mark.parametrize("pr, now, used, named", [
    (proof(), T0 + 5, set(), None),                          # this booking, 5 s old, first use: taken
    (proof(), T0 + bp.TTL_S, set(), None),                   # at the limit of its life (30 s)
    (proof(), T0 + bp.TTL_S + 1, set(), "issued 31 s ago"),  # older: the ledger is asked
    (proof(), T0 - bp.TTL_S - 1, set(), "issued -31 s ago"),  # from beyond the clocks' skew
    (proof(instance="m-1"), T0, set(), "for m-1 on h1, not m-0 on h1"),  # another instance's
    (proof(host="h2"), T0, set(), "for m-0 on h2, not m-0 on h1"),  # another host's
    (proof(key=OTHER_KEY), T0, set(), "does not verify with h1's credential"),  # signed with another key
    (altered(proof(), booking=B.model_copy(update={"gpu_indexes": [0, 1]})), T0, set(), "does not verify"),  # GPUs added
    (altered(proof(), issued=T0 + 60), T0 + 60, set(), "does not verify"),  # made younger
    (proof(booking=Booking(reason="none")), T0, set(), "a booking proof of no booking"),
])
def test_a_proof_holds_only_for_its_booking_fresh_and_unaltered(pr, now, used, named):
    why = bp.problem(KEY, pr, "m-0", "h1", now, used)
    assert why is None if named is None else named in why, why


def test_a_proof_is_taken_once():
    taken = TakenProofs(clock=lambda: T0 + 1)
    pr = proof()
    assert taken.booking(KEY, pr, "m-0", "h1") == (B, "")
    assert taken.booking(KEY, pr, "m-0", "h1") == (None, "a booking proof taken already")  # a retry, a replay


class Key:
    key = KEY

    def engine_key(self, instance: str, part: str, nonce: str) -> str:
        return "k"


def agent(tmp_path, held: dict) -> HostActivities:
    return HostActivities("h1", ProcessTable(str(tmp_path)), lambda: None, bookings=HeldBookings(held),
                          engines=EngineConfig(allow_custom=True), credential=Key())


def launch(pr: bp.BookingProof | None, gpus=(0,)) -> p.LaunchRequest:
    return p.LaunchRequest(instance="m-0", model="m", backend="custom", run_command=SLEEP, gpu_indexes=list(gpus),
                           settle_s=0.2, booking_proof=pr)


async def test_the_agent_starts_on_a_fresh_proof_and_asks_the_ledger_otherwise(tmp_path):
    pr = bp.make(KEY, "m-0", "h1", B, __import__("time").time())
    acts = agent(tmp_path, {})  # the ledger holds nothing: only the proof can start it
    res = await ActivityEnvironment().run(acts.launch_instance, launch(pr))
    assert pid_alive(res.pid)
    await ActivityEnvironment().run(acts.stop_instance, "m-0")
    # the same proof again (a replay once the process stopped): the ledger is asked, and says no
    with pytest.raises(ApplicationError) as e:
        await ActivityEnvironment().run(acts.launch_instance, launch(pr))
    assert e.value.type == "NotBooked" and "no booking in the ledger for instance m-0" in str(e.value)
    # a proof of GPU 0 does not start it on GPU 1: the signed booking is checked as the ledger's is
    with pytest.raises(ApplicationError) as e:
        await ActivityEnvironment().run(acts.launch_instance, launch(bp.make(KEY, "m-0", "h1", B, __import__("time").time()),
                                                                     gpus=(1,)))
    assert e.value.type == "NotBooked" and "asks for GPU(s) 1" in str(e.value)
    # an altered one: the ledger is asked (here it books the instance: it starts, by the ledger's word)
    acts = agent(tmp_path / "b", {"m-0": [0]})
    res = await ActivityEnvironment().run(acts.launch_instance, launch(altered(proof(), nonce="0" * 32)))
    assert pid_alive(res.pid)
    await ActivityEnvironment().run(acts.stop_instance, "m-0")


@pytest.mark.parametrize("backend, plan, worker", [("vllm", ONE, "h1"), ("llama.cpp", RPC, "h1"),
                                                   ("llama.cpp", RPC, "h2")])
def test_the_signed_booking_is_what_the_ledger_reads_back(store, backend, plan, worker):
    """booked_by (what the place activity signs) equals bookings_on (what the update reads)."""
    _, _, engine = store
    for h in ("h1", "h2", "h3"):
        records.upsert_worker(engine, host(h))
    want(engine, "r-0")
    booked, _ = ledger.reserve(engine, "r-0", plan, backend=backend)
    assert bookings.booked_by("r-0", worker, booked, backend) == bookings.booking_on(engine, "r-0", worker)


def test_only_a_placement_on_one_joined_host_is_signed(store):
    from store.booking_proofs import BookingSigner

    _, _, engine = store
    records.upsert_worker(engine, host("h1"))
    signer = BookingSigner(clock=lambda: T0)
    signer.keys = {"h1": (T0, KEY), "h2": (T0, None)}  # h2 has no credential in the store
    other = PlacementPlan(worker="h2", gpu_indexes=[0], claim=Claim(vram={0: GiB}))
    got = signer.sign(engine, [("a-0", ONE, "vllm"), ("b-0", RPC, "llama.cpp"), ("c-0", other, "vllm")])
    assert sorted(got) == ["a-0"]
    assert bp.problem(KEY, got["a-0"], "a-0", "h1", T0, set()) is None
    assert got["a-0"].booking == bookings.booked_by("a-0", "h1", ONE, "vllm")
