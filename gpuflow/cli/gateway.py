"""The CLI's serving commands: ``gpuflow gateway`` (the OpenAI-compatible endpoint) and
``gpuflow keys create|list|revoke`` (its API keys)."""

from __future__ import annotations

import argparse
import json

from gpuflow.cli.connection import temporal_flags
from gpuflow.settings import Settings


def _store(a):
    from store import db

    s = Settings()
    s = s.model_copy(update={k: getattr(a, k) for k in ("data_dir", "database_url") if getattr(a, k, None)})
    engine = db.make_engine(s.store_url(), schema=s.database_schema)
    db.init_db(engine)
    return engine


def _store_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir")
    p.add_argument("--database-url", help="SQLAlchemy URL (default: SQLite file in the data dir; or GPUFLOW_DATABASE_URL)")


def _temporal(a):
    """Where to wake autoscalers from (gateway/wake.py): the Temporal flags or GPUFLOW_TEMPORAL__*."""
    from gpuflow.cli.connection import settings_from

    return settings_from(a).temporal


def cmd_gateway(a) -> int:
    from gateway.app import run
    from gateway.config import GatewaySettings, parse_listen

    host, port = parse_listen(a.listen)
    run(_store(a), GatewaySettings(
        host=host, port=port, allow_anonymous=a.allow_anonymous, queue_timeout_s=a.queue_timeout,
        max_queue=a.max_queue, max_body=a.max_body, max_concurrency=a.max_concurrency,
        connect_timeout_s=a.connect_timeout, first_byte_timeout_s=a.first_byte_timeout, idle_timeout_s=a.idle_timeout, http_client=a.http_client,
        header_timeout_s=a.header_timeout, body_timeout_s=a.body_timeout, metrics_key_required=a.metrics_key_required,
        routing=a.routing, prefix_cache_blocks=a.prefix_cache_blocks, route_slack=a.route_slack,
        temporal=_temporal(a)))
    return 0


def cmd_keys(a) -> int:
    from store import keys

    engine = _store(a)
    if a.keys_command == "create":
        key, info = keys.create(engine, a.tenant, a.name or "")
        print(f"API key {info.id} for tenant {info.tenant} (shown once; only its salted hash is stored):\n{key}")
    elif a.keys_command == "list":
        rows = keys.list_keys(engine)
        if a.json:
            print(json.dumps([{"id": k.id, "tenant": k.tenant, "name": k.name, "created_at": k.created_at.isoformat(),
                               "revoked_at": k.revoked_at.isoformat() if k.revoked_at else None} for k in rows], indent=2))
        else:
            print(f"{'ID':<14}{'TENANT':<20}{'NAME':<24}{'CREATED':<22}STATE")
            for k in rows:
                print(f"{k.id:<14}{k.tenant:<20}{k.name[:23]:<24}{k.created_at:%Y-%m-%d %H:%M:%S}   "
                      + ("revoked" if k.revoked_at else "active"))
    else:
        info = keys.revoke(engine, a.key_id)
        print(f"API key {info.id} (tenant {info.tenant}) revoked")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("gateway", help="the OpenAI-compatible endpoint in front of every RUNNING replica")
    temporal_flags(p)  # the gateway reads the store; Temporal only to wake autoscalers (gateway/wake.py)
    _store_flags(p)
    p.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT to serve on (default 127.0.0.1:8080)")
    p.add_argument("--allow-anonymous", action="store_true",
                   help="serve on a non-loopback address while no API key exists (anyone who reaches it may use it)")
    p.add_argument("--queue-timeout", type=float, default=60.0,
                   help="seconds a request waits for a free replica before 503 (default 60)")
    p.add_argument("--max-queue", type=int, default=1000, help="requests waiting per model before 429 (default 1000)")
    p.add_argument("--max-body", type=int, default=32 << 20, help="largest request body in bytes (default 32 MiB)")
    p.add_argument("--max-concurrency", type=int, default=4,
                   help="requests per replica when neither the engine's flags nor the spec's max_concurrency say (default 4)")
    p.add_argument("--connect-timeout", type=float, default=3.0,
                   help="seconds to connect to a replica before trying another (default 3)")
    p.add_argument("--first-byte-timeout", type=float, default=300.0,
                   help="seconds a replica may take to start answering before 504 (default 300)")
    p.add_argument("--idle-timeout", type=float, default=120.0,
                   help="seconds a replica's answer may pause between two chunks (default 120)")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a client has for a request's line and headers, from its connection or its next "
                        "request's first byte; then 408 and the connection is closed (default 10)")
    p.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds a request's whole body may take to arrive, then 408; it holds no tenant slot "
                        "meanwhile (default 30)")
    p.add_argument("--metrics-key-required", action="store_true",
                   help="/metrics needs a valid API key of any tenant (its labels name tenants and models); "
                        "while no key exists, nobody reads it")
    p.add_argument("--http-client", choices=["aiohttp", "httpx"], default="aiohttp",
                   help="client to the replicas (default aiohttp: faster in bench/bench_gateway.py)")
    p.add_argument("--routing", choices=["cache-aware", "least-outstanding"], default="cache-aware",
                   help="how a request picks a replica, for deployments whose spec has no 'routing' (default "
                        "cache-aware: where its prompt's prefix is cached, within a load guard; docs/routing.md)")
    p.add_argument("--prefix-cache-blocks", type=int, default=16384,
                   help="blocks of 128 characters the gateway remembers per replica for cache-aware routing "
                        "(an LRU; default 16384, about 0.5 M tokens: size it to the engines' prefix caches)")
    p.add_argument("--route-slack", type=int, default=2,
                   help="cache-aware routing's guard: a replica more than max(this, limit/2) requests busier "
                        "than the least loaded one is passed over for its cached prefix (default 2)")
    p.set_defaults(fn=cmd_gateway)

    k = sub.add_parser("keys", help="the gateway's API keys: create, list, revoke")
    ks = k.add_subparsers(dest="keys_command", required=True)
    c = ks.add_parser("create", help="a new key for a tenant, printed once")
    c.add_argument("--tenant", required=True)
    c.add_argument("--name", help="what the key is for")
    lst = ks.add_parser("list", help="every key (never the secret)")
    lst.add_argument("--json", action="store_true")
    r = ks.add_parser("revoke", help="revoke a key (its id from 'keys list', or the key itself)")
    r.add_argument("key_id")
    for q in (c, lst, r):
        _store_flags(q)
        q.set_defaults(fn=cmd_keys)
