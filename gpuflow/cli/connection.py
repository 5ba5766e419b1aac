"""How each CLI command that talks to the cluster reaches it: the Temporal connection flags
(--address, --namespace, TLS, API key), the settings they make, and running a command's
coroutine. Every command module imports these from here (none from another command module)."""

from __future__ import annotations

import argparse
import asyncio

from gpuflow.settings import Settings


def settings_from(a) -> Settings:
    """The settings (the environment's), with every settings flag given on the command line set
    (gpuflow/cli/flags.py), and --data-dir/--database-url wherever a command has them."""
    from gpuflow.cli.flags import apply

    s = apply(Settings(), a)
    upd = {k: getattr(a, k) for k in ("data_dir", "database_url") if getattr(a, k, None)}
    from scheduler.engine_flags import allow_more as allow_more_flags
    from scheduler.spec_env import allow_more

    allow_more(s.allow_env)  # spec validation in this process (workflows of a server included)
    allow_more_flags(s.allow_engine_flags)
    return s.model_copy(update=upd)


TEMPORAL = ("address", "namespace", "tls_cert", "tls_key", "tls_ca", "api_key")  # TemporalSettings' fields with a flag


def temporal_flags(p: argparse.ArgumentParser) -> None:
    """--address, --namespace, --tls-cert, --tls-key, --tls-ca, --api-key: from TemporalSettings."""
    from gpuflow.cli.flags import setting

    g = p.add_argument_group("Temporal connection")
    for name in TEMPORAL:
        setting(p, f"temporal.{name}", group=g)


def run_command(coro) -> int:
    """Run a command's coroutine; its result (or 0) is the exit code."""
    return asyncio.run(coro) or 0


OFFLINE_HELP = ("offline use: work on the store directly instead of through the control plane at --address "
                "(nothing is validated or audited by Temporal); ")


def offline_flags(p: argparse.ArgumentParser) -> None:
    """--data-dir/--database-url on a command that otherwise goes through the control plane."""
    g = p.add_argument_group("offline (the store itself, without the control plane)")
    g.add_argument("--data-dir", help=OFFLINE_HELP + "the SQLite file gpuflow.db in this directory")
    g.add_argument("--database-url", help=OFFLINE_HELP + "this SQLAlchemy URL (e.g. postgresql://...)")


def offline(a) -> bool:
    """The command was given a store (--data-dir/--database-url): it works on it, offline."""
    return bool(getattr(a, "data_dir", None) or getattr(a, "database_url", None))


def open_offline_store(a):
    """The store named by --data-dir/--database-url, its tables made if missing."""
    from store import db

    s = Settings()
    s = s.model_copy(update={k: getattr(a, k) for k in ("data_dir", "database_url") if getattr(a, k, None)})
    engine = db.make_engine(s.store_url(), schema=s.database_schema)
    db.init_db(engine)
    return engine
