"""The cluster's credential and its hosts' (contracts/credential.py is the cryptography,
contracts/host_proof.py the rule). Kept in the store, so every control-plane worker and gateway
sharing the database shares them with no configuration of its own, and nothing of them crosses
Temporal (everything in a workflow's history is readable by anyone with Temporal access).

- The cluster's X25519 key pair and join secret: one row, made once (``ensure_cluster``; two
  workers racing make one: SQLite's write lock serialises them, PostgreSQL's primary key refuses
  the second, which then reads the first's).
- Each joined host: the public key it joined with, and its last accepted hello (``accept``). A
  second key for a joined name is refused until ``forget`` (``gpuflow hosts forget``)."""

from __future__ import annotations

import os

from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from contracts import credential as cr
from contracts.host_proof import ClusterKeys, Known
from store.tables import ClusterKeyRow, HostCredentialRow


def cluster_keys(engine: Engine) -> ClusterKeys | None:
    """The cluster's keys, or None when the store has none yet (no control plane has started on it)."""
    with Session(engine) as s:
        row = s.get(ClusterKeyRow, 1)
        if row is None:
            return None
        private, join = row.private, row.join_secret
    secret = cr.unb64(private, cr.KEY_BYTES, "the store's cluster private key")
    return ClusterKeys(secret=secret, public=cr.public_of(secret),
                       join_secret=cr.unb64(join, cr.SECRET_BYTES, "the store's join secret"))


def ensure_cluster(engine: Engine) -> ClusterKeys:
    """The cluster's keys, made now (32 random bytes each) when the store has none."""
    keys = cluster_keys(engine)
    if keys is not None:
        return keys
    with Session(engine) as s:
        if s.get(ClusterKeyRow, 1) is None:  # SQLite: read under the write lock, so one maker only
            s.add(ClusterKeyRow(id=1, private=cr.b64(os.urandom(cr.KEY_BYTES)),
                                join_secret=cr.b64(os.urandom(cr.SECRET_BYTES))))
            try:
                s.commit()
            except IntegrityError:  # PostgreSQL: another worker's row came first; it stands
                s.rollback()
    keys = cluster_keys(engine)
    assert keys is not None
    return keys


def join_token(engine: Engine) -> str | None:
    """What ``gpuflow hosts join-token`` prints (None: no control plane has made the keys yet)."""
    keys = cluster_keys(engine)
    return None if keys is None else cr.join_token(keys.join_secret, keys.public)


def known(engine: Engine, name: str) -> Known | None:
    """The store's record of host ``name`` (None: it has not joined, or was forgotten)."""
    with Session(engine) as s:
        row = s.get(HostCredentialRow, name)
        return None if row is None else _known(row)


def _known(row: HostCredentialRow) -> Known:
    return Known(public=row.public, hello_ms=row.hello_ms, hello_mac=row.hello_mac)


def known_many(engine: Engine, names: list[str]) -> dict[str, Known]:
    """``known`` for several hosts in one query: name -> its record, for those that joined."""
    out: dict[str, Known] = {}
    with Session(engine) as s:
        for i in range(0, len(names), 500):
            for row in s.exec(select(HostCredentialRow).where(HostCredentialRow.name.in_(names[i:i + 500]))):
                out[row.name] = _known(row)
    return out


def accept(engine: Engine, name: str, public: str, hello_ms: int = 0, hello_mac: str = "") -> bool:
    """Record host ``name`` joined with ``public`` (when it is not yet) and, given a hello's stamp,
    that hello as its last. False, writing nothing, when the name is held by another key: a second
    join that raced the first (the check in contracts/host_proof.py read the store before it)."""
    with Session(engine) as s:
        row = s.get(HostCredentialRow, name)
        if row is not None and row.public != public:
            return False
        row = row or HostCredentialRow(name=name, public=public)
        if hello_ms >= row.hello_ms and hello_ms:
            row.hello_ms, row.hello_mac = hello_ms, hello_mac
        s.add(row)
        try:
            s.commit()
        except IntegrityError:  # PostgreSQL: another join of the name came first
            s.rollback()
            now = known(engine, name)
            return now is not None and now.public == public
    return True


def forget(engine: Engine, name: str) -> bool:
    """Host ``name``'s credential removed (``gpuflow hosts forget``): its next agent joins afresh,
    with the join token. False when it had none."""
    with Session(engine) as s:
        row = s.get(HostCredentialRow, name)
        if row is None:
            return False
        s.delete(row)
        s.commit()
        return True
