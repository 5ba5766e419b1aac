"""What ``gpuflow status`` adds from the store about serving: each replica's requests in flight
(summed over the live gateways' reports) and the live gateways' base URLs. The rest of status
comes from Temporal; the store is read only where this machine can open it."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from sqlmodel import Session

from store import db, records, serving
from store.tables import InstanceRow, utcnow
from gpuflow.settings import Settings
from scheduler.errors import InvalidInput


def open_store(s: Settings, explicit: bool) -> Engine | None:
    """The store, when ``explicit`` (a --database-url or --data-dir was given) or its SQLite file
    exists already: status never creates an empty database where none was."""
    url = s.store_url()
    if not explicit and url.startswith("sqlite:///") and not os.path.exists(url[len("sqlite:///"):]):
        return None
    try:
        return db.make_engine(url, schema=s.database_schema)
    except (SQLAlchemyError, ValueError) as e:
        raise InvalidInput(f"the store's URL {url!r}: {e}") from None


def add_serving(st: dict[str, Any], engine: Engine | None, per_instance: bool = True) -> dict[str, Any]:
    """``st`` (ops.status's dict) with ``gateways`` (base URLs) and, with ``per_instance``,
    ``in_flight`` on each instance; unchanged when there is no store to read or it cannot be read."""
    if engine is None:
        return st
    try:
        st["gateways"] = [g.url for g in serving.live_gateways(engine)]
        insts = [i for d in st["deployments"] for i in d["instances"]] if per_instance else []
        with Session(engine) as sess:  # one query for every instance, not one each
            flying = serving.in_flight_of(sess, [i["name"] for i in insts], utcnow() - timedelta(seconds=serving.LIVE_S))
        for i in insts:
            i["in_flight"] = flying.get(i["name"], 0)
    except SQLAlchemyError as e:
        st["gateways_error"] = f"cannot read the store: {type(e).__name__}"
    return st


def add_reasons(st: dict[str, Any], engine: Engine | None) -> dict[str, Any]:
    """Each PENDING instance's reason as the store holds it: the PENDING queue keeps it current
    (activities/wake_queue.py), while the workflow's own says why its last decision did not place
    it. Unchanged when there is no store to read or it cannot be read."""
    if engine is None:
        return st
    try:
        for d in st["deployments"]:
            pending = {i["name"] for i in d.get("instances", []) if i.get("state") == "pending"}
            if pending:
                rows = {r.name: r for r in records.instances_of(engine, d["name"])}
                for i in d["instances"]:
                    row = rows.get(i["name"])
                    if i["name"] in pending and row is not None and row.state == "pending" and row.reason:
                        i["reason"] = row.reason
    except SQLAlchemyError:
        pass
    return st


def pending_reason(engine: Engine | None, name: str) -> str | None:
    """The store's reason for a PENDING instance (add_reasons), or None."""
    if engine is None:
        return None
    try:
        with Session(engine) as sess:  # the one row, not every instance's
            row = sess.get(InstanceRow, name)
    except SQLAlchemyError:
        return None
    return row.reason if row is not None and row.state == "pending" and row.reason else None


def store_states(engine: Engine):
    """deployment -> {instance: state} read from the store's rows (``gpuflow status --summary``),
    or None when the store cannot be read; ops.status uses it only where it names every instance."""
    def states(deployment: str) -> dict[str, str] | None:
        try:
            return {r.name: r.state for r in records.instances_of(engine, deployment)}
        except SQLAlchemyError:
            return None
    return states
