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
(401): a host the control plane cannot vouch for serves nothing."""

from __future__ import annotations

from typing import Iterable

from sqlalchemy.engine import Engine

from contracts import credential as cr
from contracts.control import InstanceRecord
from store.host_credentials import cluster_keys, known

SERVER_PART = ""  # the server's part: the only process of a replica that serves HTTP


def engine_keys(engine: Engine, recs: Iterable[InstanceRecord]) -> dict[str, str]:
    """instance -> its engine's key, for each record with a launch's nonce on a host whose
    credential the store holds (each host's key made once per call)."""
    wanted = [r for r in recs if r.key_id and r.worker]
    if not wanted:
        return {}
    cluster = cluster_keys(engine)
    if cluster is None:
        return {}
    hosts: dict[str, bytes | None] = {}
    out = {}
    for rec in wanted:
        if rec.worker not in hosts:
            k = known(engine, rec.worker)
            hosts[rec.worker] = cr.host_key(cluster.secret, k.public) if k is not None else None
        key = hosts[rec.worker]
        if key is not None:
            out[rec.name] = cr.engine_key(key, rec.name, SERVER_PART, rec.key_id)
    return out
