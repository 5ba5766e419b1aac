"""A booking the control plane signs for the host it books (issue 37): the launch's booking check
without a workflow task per launch, keeping its rule (no engine runs without its booking).

The place activity books a replica in the ledger (activities/place_batch.py), reads back, in the
same call, what the ledger now lets the booked host run for it (store/bookings.py, the read the
host workflow's ``booking`` update makes), and signs that Booking with the key it shares with that
host (contracts/credential.py, purpose "booking"; the key never crosses Temporal). The instance
workflow hands the proof to its first launch on that host; the agent checks it with its own key
(``problem``) and, when it holds, starts what the signed Booking allows, without asking its host
workflow. It proves what the ledger held when it was issued, so it is taken only:

- for this instance on this host, with a MAC that verifies (no one without the host's key can make
  or alter one: a proof read from a history proves only that booking);
- fresh: issued at most ``TTL_S`` before the agent checks it (and not in the future beyond the
  same skew): a booking released since is a booking an old proof still shows;
- once: the agent remembers the nonces it took (for ``TTL_S``); a second launch with the same proof
  (a retry, a replay) asks the ledger through the ``booking`` update as every launch did before.

Anything else (no proof, a host without a credential, an expired, reused or altered proof, a
placement across several hosts, a restart) falls back to that update: the proof only saves the
round trip of a replica's first launch, moments after its booking."""

from __future__ import annotations

import re
import secrets
from typing import Annotated, Any, Container

from pydantic import BaseModel, ConfigDict, Field

from contracts import credential as cr
from contracts.host import Booking
from scheduler.bounds import Name

PURPOSE = "booking"
TTL_S = 30.0  # a proof older than this (by the agent's clock) is not taken: the ledger is asked
NONCE = r"^[0-9a-f]{32}$"
MAC = r"^[0-9a-f]{64}$"
MAX_EPOCH = 1e11  # seconds since 1970: bounded (scheduler/bounds.py's rule), far beyond any clock


class BookingProof(BaseModel):
    """The ledger's Booking of ``instance`` on ``host`` as the control plane read it right after
    booking, at ``issued`` (epoch seconds), MACed with the host's key."""

    model_config = ConfigDict(extra="forbid")

    instance: Name
    host: Name
    booking: Booking
    issued: Annotated[float, Field(ge=0, le=MAX_EPOCH)]
    nonce: Annotated[str, Field(max_length=32, pattern=NONCE)]
    mac: Annotated[str, Field(max_length=64, pattern=MAC)]


def body(instance: str, host: str, booking: Booking, issued: float, nonce: str) -> dict[str, Any]:
    """What the MAC covers (both ends build it from the proof's fields)."""
    return {"instance": instance, "host": host, "booking": booking.model_dump(mode="json"), "issued": issued,
            "nonce": nonce}


def make(key: bytes, instance: str, host: str, booking: Booking, now: float) -> BookingProof:
    """The proof of ``booking`` (booked: the caller read it from the ledger) of ``instance`` on ``host``."""
    nonce = secrets.token_hex(16)
    mac = cr.sign(key, PURPOSE, host, nonce, body(instance, host, booking, now, nonce))
    return BookingProof(instance=instance, host=host, booking=booking, issued=now, nonce=nonce, mac=mac)


def problem(key: bytes, proof: BookingProof, instance: str, host: str, now: float, used: Container[str],
            ttl_s: float = TTL_S) -> str | None:
    """Why ``proof`` does not let ``host`` start ``instance`` now (None: it does). ``used``: the
    nonces this agent took already."""
    if proof.instance != instance or proof.host != host:
        return f"a booking proof for {proof.instance} on {proof.host}, not {instance} on {host}"
    if not re.fullmatch(NONCE, proof.nonce) or proof.nonce in used:
        return "a booking proof taken already"
    age = now - proof.issued
    if not -ttl_s <= age <= ttl_s:
        return f"a booking proof issued {age:.0f} s ago (taken within {ttl_s:g} s)"
    if not proof.booking.booked:
        return "a booking proof of no booking"
    if not cr.verify(key, PURPOSE, host, proof.nonce, body(instance, host, proof.booking, proof.issued, proof.nonce),
                     proof.mac):
        return f"a booking proof that does not verify with {host}'s credential"
    return None
