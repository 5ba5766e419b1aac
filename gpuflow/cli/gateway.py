"""The CLI's serving commands: ``gpuflow gateway`` (the OpenAI-compatible endpoint) and
``gpuflow keys create|list|revoke|usage`` (its API keys, through the control plane at --address; offline
on the store with --data-dir/--database-url)."""

from __future__ import annotations

import argparse
import json

from contracts.scopes import SCOPES
from gpuflow.cli.connection import offline, offline_flags, run_command, settings_from, temporal_flags


def _store(a):
    from gpuflow.cli.connection import open_offline_store

    return open_offline_store(a)


def _store_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir")
    p.add_argument("--database-url", help="SQLAlchemy URL (default: SQLite file in the data dir; or GPUFLOW_DATABASE_URL)")


def _temporal(a):
    """Where to wake autoscalers from (gateway/wake.py): the Temporal flags or GPUFLOW_TEMPORAL__*."""
    from gpuflow.cli.connection import settings_from

    return settings_from(a).temporal


def cmd_gateway(a) -> int:
    from gateway import console
    from gateway.app import run
    from gateway.config import GatewaySettings, parse_listen

    host, port = parse_listen(a.listen)
    run(_store(a), GatewaySettings(
        host=host, port=port, allow_anonymous=a.allow_anonymous, queue_timeout_s=a.queue_timeout,
        max_queue=a.max_queue, max_body=a.max_body, max_concurrency=a.max_concurrency,
        connect_timeout_s=a.connect_timeout, first_byte_timeout_s=a.first_byte_timeout, idle_timeout_s=a.idle_timeout, http_client=a.http_client,
        header_timeout_s=a.header_timeout, body_timeout_s=a.body_timeout, metrics_key_required=a.metrics_key_required,
        routing=a.routing, prefix_cache_blocks=a.prefix_cache_blocks, route_slack=a.route_slack,
        kv_events=not a.no_kv_events, tokenizer_roots=tuple(a.tokenizer_root or ()),
        temporal_ui_url=a.temporal_ui_url, temporal=_temporal(a), public_names=tuple(a.public_names or ())),
        extra=(console.mount,))
    return 0


def _print_keys(rows, as_json: bool) -> None:
    if as_json:
        print(json.dumps([k.model_dump() for k in rows], indent=2))
        return
    print(f"{'ID':<14}{'TENANT':<20}{'NAME':<24}{'CREATED':<22}{'SCOPE':<15}STATE")
    for k in rows:
        print(f"{k.id:<14}{k.tenant:<20}{k.name[:23]:<24}{k.created_at[:19].replace('T', ' '):<22}"
              + f"{k.scope:<15}" + ("revoked" if k.revoked_at else "active"))


def _print_usage(rows, as_json: bool) -> None:
    """Per tenant (its keys together) then each of its keys: requests and tokens, 1 h and 24 h."""
    if as_json:
        print(json.dumps([r.model_dump() for r in rows], indent=2))
        return
    print(f"{'TENANT':<20}{'KEY':<14}{'REQ 1H':>9}{'PROMPT 1H':>12}{'COMPL 1H':>12}"
          f"{'REQ 24H':>10}{'PROMPT 24H':>13}{'COMPL 24H':>12}")
    for r in rows:
        key = "(all keys)" if r.key_id is None else (r.key_id or "(no key)")
        h, d = r.hour, r.day
        print(f"{r.tenant[:19]:<20}{key:<14}{h.requests:>9}{_prompt(h):>12}{h.completion_tokens:>12}"
              f"{d.requests:>10}{_prompt(d):>13}{d.completion_tokens:>12}")
    if any(r.day.estimated_tokens for r in rows):
        print(ESTIMATED)


ESTIMATED = ("~: holds tokens the gateway estimated (a stream whose engine sent no usage, and no tokenizer at the\n"
             "   gateway: about 4 characters a token; 'gpuflow gateway --tokenizer-root DIR' counts them exactly)")


def _prompt(c) -> str:
    """A prompt token count, marked "~" when some of the tokens counted were estimated."""
    return f"~{c.prompt_tokens}" if c.estimated_tokens else str(c.prompt_tokens)


def _keys_offline(a) -> int:
    from datetime import datetime, timezone

    from views.keys import key_usage_rows, key_view
    from store import keys

    engine = _store(a)
    if a.keys_command == "create":
        key, made = keys.new_key(a.tenant, a.name or "", _scope(a))
        _print_created(key, key_view(keys.add_known(engine, made)))
    elif a.keys_command == "list":
        _print_keys([key_view(k) for k in keys.list_keys(engine)], a.json)
    elif a.keys_command == "usage":
        _print_usage(key_usage_rows(engine, datetime.now(timezone.utc)), a.json)
    else:
        _print_revoked(key_view(keys.revoke(engine, a.key_id)))
    return 0


def _scope(a) -> str:
    """--scope, or what --admin means (contracts/scopes.py ``admin_scope``): cluster-admin for
    tenant default, tenant-admin for any other."""
    from contracts.scopes import admin_scope

    return admin_scope(a.tenant) if a.admin else a.scope


def _print_created(key: str, k) -> None:
    print(f"{k.scope} API key {k.id} for tenant {k.tenant} (shown once; only its salted hash is stored):\n{key}")


def _print_revoked(k) -> None:
    print(f"API key {k.id} (tenant {k.tenant}) revoked")


def cmd_keys(a) -> int:
    """Through the control plane (the cluster workflow's updates, gpuflow/cluster_client.py): the
    key is made here and only its salted hash travels. Offline with --data-dir/--database-url."""
    if offline(a):
        return _keys_offline(a)
    from gpuflow import cluster_client as cl
    from gpuflow.runtime import connect

    s = settings_from(a)

    async def go():
        client = await connect(s.temporal)
        if a.keys_command == "create":
            _print_created(*await cl.create_key(client, a.tenant, a.name or "", _scope(a)))
        elif a.keys_command == "list":
            _print_keys(await cl.list_keys(client), a.json)
        elif a.keys_command == "usage":
            _print_usage(await cl.key_usage(client), a.json)
        else:
            _print_revoked(await cl.revoke_key(client, a.key_id))

    return run_command(go())


def add_commands(sub) -> None:
    from gateway.config import setting_help

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
    p.add_argument("--metrics-key-required", action="store_true", help=setting_help("metrics_key_required"))
    p.add_argument("--public-name", action="append", dest="public_names", metavar="NAME[:PORT]",
                   help=setting_help("public_names"))
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
    p.add_argument("--no-kv-events", action="store_true",
                   help="do not follow the KV-cache events of engines that publish them (vLLM, SGLang started by an "
                        "agent with --kv-events): route on the text index only (docs/routing.md)")
    p.add_argument("--tokenizer-root", action="append", metavar="DIR",
                   help="a folder under which a deployment's local_path tokenizer may be loaded, to match prompts "
                        "against engines' KV events (repeatable; default none: Hugging Face cache only)")
    p.add_argument("--temporal-ui-url", default="http://127.0.0.1:8233",
                   help="the Temporal UI the web console links each replica's workflow to (default "
                        "http://127.0.0.1:8233, the dev server's; '' for no link)")
    p.set_defaults(fn=cmd_gateway)

    k = sub.add_parser("keys", help="the gateway's API keys: create, list, revoke, usage")
    ks = k.add_subparsers(dest="keys_command", required=True)
    c = ks.add_parser("create", help="a new key for a tenant, printed once")
    c.add_argument("--tenant", required=True)
    c.add_argument("--name", help="what the key is for")
    who = c.add_mutually_exclusive_group()
    who.add_argument("--scope", choices=SCOPES, default=SCOPES[0],
                     help="what the key may do: tenant (the default: use its tenant's models), tenant-admin (also "
                          "act on its tenant's deployments and keys in the console), cluster-admin (everything, "
                          "/metrics included), metrics (read /metrics only)")
    who.add_argument("--admin", action="store_true",
                     help="the form before scopes: --scope cluster-admin for tenant default, tenant-admin for "
                          "any other tenant")
    lst = ks.add_parser("list", help="every key (never the secret)")
    lst.add_argument("--json", action="store_true")
    r = ks.add_parser("revoke", help="revoke a key (its id from 'keys list', or the key itself)")
    r.add_argument("key_id")
    u = ks.add_parser("usage", help="requests and tokens per tenant and key, last hour and last day")
    u.add_argument("--json", action="store_true")
    for q in (c, lst, r, u):
        temporal_flags(q)
        offline_flags(q)
        q.set_defaults(fn=cmd_keys, temporal=True)
