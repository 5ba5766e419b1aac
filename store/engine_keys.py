"""Replicas' engine keys on the control plane's side (worker_agent/engine_key.py is the agent's):
the store makes each RUNNING replica's key when its row is recorded, from the nonce its launch
reported (LaunchResult.key_id, carried by the instance workflow) and the host key it shares with
that replica's host (contracts/credential.py: X25519 between the cluster's private key and the
host's joined public key, store/host_credentials.py). The row keeps the key; the gateways read it
with the routing table (store/serving.py) and send it to the engine.

Why the store makes it, not each gateway: a gateway needs only the keys of the engines it routes
to, read with the rows it reads already; making them itself, its code would use the cluster's
private key, with which any host's key is made and any host's reports signed. (A gateway that
shares the database can still read that key's row today: a database role that lets gateways read
the instance rows only would close that, and this split is what makes such a role possible.) The
key is made once per recorded state, not per table refresh. Without the host's credential (not
joined, or forgotten) a replica gets no key, the gateways send none, and its engine refuses them
(401): a host the control plane cannot vouch for serves nothing.

The same host key proves where a replica listens (``check_launches``, contracts/launch_proof.py): a
record that writes a replica RUNNING with a port or an address is written only when its launch's
MAC verifies with the credential of the host the ledger books it on; otherwise nothing of it is
(UnprovenLaunch, naming why), so a workflow named for a replica (one deleted, say) cannot send the
gateways' users, and its engine key, to an address of its own."""

from __future__ import annotations

from typing import Iterable

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from contracts import credential as cr, launch_proof
from contracts.control import InstanceRecord
from scheduler.errors import GpuflowError
from store.db import reader
from store.host_credentials import cluster_keys, known_many
from store.tables import ReservationRow

SERVER_PART = ""  # the server's part: the only process of a replica that serves HTTP


class UnprovenLaunch(GpuflowError):
    """A RUNNING record whose address its host did not vouch for, or that the ledger does not book there."""


def host_keys(engine: Engine, workers: Iterable[str | None]) -> dict[str, bytes | None]:
    """worker -> the key it shares with the control plane (None: no credential in the store). Read
    through ``reader``: on SQLite beside the writers, where each of the two reads had waited for a
    write turn behind the ledger's bookings and the records (issue 37)."""
    names = sorted({w for w in workers if w})
    reads = reader(engine)
    cluster = cluster_keys(reads) if names else None
    joined = known_many(reads, names) if cluster is not None else {}
    out: dict[str, bytes | None] = {}
    for w in names:
        k = joined.get(w)
        out[w] = cr.host_key(cluster.secret, k.public) if k is not None else None
    return out


def engine_keys(engine: Engine, recs: Iterable[InstanceRecord],
                hosts: dict[str, bytes | None] | None = None) -> dict[str, str]:
    """instance -> its engine's key, for each record with a launch's nonce on a host whose
    credential the store holds (each host's key made once per call, or given in ``hosts``)."""
    wanted = [r for r in recs if r.key_id and r.worker]
    if not wanted:
        return {}
    hosts = hosts if hosts is not None else host_keys(engine, [r.worker for r in wanted])
    out = {}
    for rec in wanted:
        key = hosts.get(rec.worker)
        if key is not None:
            out[rec.name] = cr.engine_key(key, rec.name, SERVER_PART, rec.key_id)
    return out


def needs_proof(rec: InstanceRecord) -> bool:
    """A record the gateways would route: RUNNING with a port (an address alone routes nowhere yet,
    but is the host's word all the same)."""
    return rec.state == "running" and (rec.port is not None or bool(rec.address))


def launch_problem(rec: InstanceRecord, key: bytes | None, booked: bool) -> str | None:
    """Why ``rec`` may not be written RUNNING where it says (None: it may): the ledger must book the
    instance on ``rec.worker``, and its launch's MAC must verify with that host's ``key``."""
    if not rec.worker:
        return f"instance {rec.name} is recorded RUNNING at a port with no host"
    if not booked:
        return f"instance {rec.name} is not booked on host {rec.worker} in the ledger: it may not run there"
    fields = launch_proof.body(rec.name, SERVER_PART, rec.pid, rec.port, rec.address, rec.key_id, rec.kv_events_port,
                               rec.bootstrap_port)
    return launch_proof.problem(key, rec.worker, fields, rec.launch_mac)


def check_launches(s: Session, recs: list[InstanceRecord], hosts: dict[str, bytes | None]) -> None:
    """UnprovenLaunch naming the first record (``needs_proof``) that ``launch_problem`` refuses; the
    ledger is read in the caller's transaction, so a booking released meanwhile is seen."""
    proving = [r for r in recs if needs_proof(r)]
    if not proving:
        return
    t = ReservationRow.__table__
    booked = {(i, w) for i, w in s.connection().execute(select(t.c.instance, t.c.worker).where(
        t.c.instance.in_(sorted({r.name for r in proving}))))}
    for rec in proving:
        why = launch_problem(rec, hosts.get(rec.worker or ""), (rec.name, rec.worker) in booked)
        if why:
            raise UnprovenLaunch(f"refused to record {rec.name} RUNNING: {why}")
