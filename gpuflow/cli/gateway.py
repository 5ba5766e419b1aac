"""The CLI's serving commands: ``gpuflow gateway`` (the OpenAI-compatible endpoint) and
``gpuflow keys create|list|revoke|usage`` (its API keys, through the control plane at --address; offline
on the store with --data-dir/--database-url)."""

from __future__ import annotations

import argparse
import json

from contracts.scopes import SCOPES
from scheduler.errors import InvalidInput
from gpuflow.cli.connection import offline, offline_flags, run_command, settings_from, temporal_flags


def _store(a):
    from gpuflow.cli.connection import open_offline_store

    return open_offline_store(a)


def _store_flags(p: argparse.ArgumentParser) -> None:
    from gpuflow.cli.flags import setting

    setting(p, "data_dir")
    setting(p, "database_url")


def _temporal(a):
    """Where to wake autoscalers from (gateway/wake.py): the Temporal flags or GPUFLOW_TEMPORAL__*."""
    from gpuflow.cli.connection import settings_from

    return settings_from(a).temporal


def cmd_gateway(a) -> int:
    """The gateway, with what it does not own handed in (gateway.app.build): the autoscaler's wake
    and the web console, each asking Temporal through one client (gpuflow/gateway_seams.py)."""
    import console
    from gateway.app import run
    from gpuflow.gateway_seams import Temporal, TemporalPlane, TemporalWake
    from gateway.config import GatewaySettings, parse_listen

    from gpuflow.cli.flags import dataclass_from

    host, port = parse_listen(a.listen)
    temporal = Temporal(_temporal(a))
    run(_store(a), dataclass_from(GatewaySettings, a, a.gateway_flags, host=host, port=port, temporal=_temporal(a)),
        extra=(console.mount(TemporalPlane(temporal), temporal.settings.namespace),), wake=TemporalWake(temporal))
    return 0


def _print_keys(rows, as_json: bool) -> None:
    if as_json:
        print(json.dumps([k.model_dump() for k in rows], indent=2))
        return
    print(f"{'ID':<14}{'TENANT':<20}{'NAME':<24}{'CREATED':<22}{'SCOPE':<15}{'STATE':<9}OWN LIMITS")
    for k in rows:
        own = _limit_text(k)
        print(f"{k.id:<14}{k.tenant:<20}{k.name[:23]:<24}{k.created_at[:19].replace('T', ' '):<22}"
              + f"{k.scope:<15}" + f"{'revoked' if k.revoked_at else 'active':<9}"
              + ("-" if own == "its tenant's only" else own))


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
        key, made = keys.new_key(a.tenant, a.name or "", _scope(a), _limits(a))
        _print_created(key, key_view(keys.add_known(engine, made)))
    elif a.keys_command == "edit":
        _print_edited(key_view(keys.set_limits(engine, _edit(a))))
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


def _limits(a):
    """A key's own limits from --requests-per-s, --tokens-per-min, --max-concurrent (None: none given)."""
    from contracts.cluster import LIMIT_FIELDS, KeyLimitFields

    got = {f: getattr(a, f) for f in LIMIT_FIELDS if getattr(a, f, None) is not None}
    return _valid(KeyLimitFields, **got) if got else None


def _valid(model, **fields):
    """``model(**fields)``, or InvalidInput naming the flag that is wrong."""
    from pydantic import ValidationError

    try:
        return model(**fields)
    except ValidationError as e:
        err = e.errors()[0]
        where = "--" + str(err["loc"][0]).replace("_", "-") if err.get("loc") else "keys edit"
        raise InvalidInput(f"{where}: {err['msg']}") from None


def _edit(a):
    """``keys edit``'s ask: the limits given set, those of --clear removed."""
    from contracts.cluster import LIMIT_FIELDS, KeyLimits
    from store.keys import key_id

    got = {f: getattr(a, f) for f in LIMIT_FIELDS if getattr(a, f, None) is not None}
    if not got and not a.clear:
        raise InvalidInput("keys edit: give a limit to set (--requests-per-s, --tokens-per-min, --max-concurrent) "
                           "or one to --clear")
    return _valid(KeyLimits, id=key_id(a.key_id), clear=sorted(set(a.clear or [])), **got)


def _limit_text(k) -> str:
    got = [f"{f}={getattr(k, f):g}" for f in ("requests_per_s", "tokens_per_min", "max_concurrent")
           if getattr(k, f, None) is not None]
    return ", ".join(got) or "its tenant's only"


def _print_edited(k) -> None:
    print(f"API key {k.id} (tenant {k.tenant}) limits: {_limit_text(k)}")


def _print_created(key: str, k) -> None:
    print(f"{k.scope} API key {k.id} for tenant {k.tenant} (shown once; only its salted hash is stored):\n{key}")
    if _limit_text(k) != "its tenant's only":
        print(f"its own limits: {_limit_text(k)}")


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
            _print_created(*await cl.create_key(client, a.tenant, a.name or "", _scope(a), _limits(a)))
        elif a.keys_command == "edit":
            _print_edited(await cl.key_limits(client, _edit(a)))
        elif a.keys_command == "list":
            _print_keys(await cl.list_keys(client), a.json)
        elif a.keys_command == "usage":
            _print_usage(await cl.key_usage(client), a.json)
        else:
            _print_revoked(await cl.revoke_key(client, a.key_id))

    return run_command(go())


def _limit_flags(p) -> None:
    """A key's own limits, beside its tenant's: every gateway of the cluster together holds them
    (docs/user-guide/gateway-limits.md)."""
    p.add_argument("--requests-per-s", dest="requests_per_s", type=float,
                   help="the key's own requests a second (all gateways together), then 429")
    p.add_argument("--tokens-per-min", dest="tokens_per_min", type=int,
                   help="the key's own tokens a minute (prompt and answer, all gateways together), then 429")
    p.add_argument("--max-concurrent", dest="max_concurrent", type=int,
                   help="the key's own requests in flight at once (all gateways together), then 429")


def add_commands(sub) -> None:
    from gateway.config import GatewaySettings
    from gpuflow.cli.flags import dataclass_flags

    p = sub.add_parser("gateway", help="the OpenAI-compatible endpoint in front of every RUNNING replica")
    temporal_flags(p)  # the gateway reads the store; Temporal only to wake autoscalers (gateway/wake.py)
    _store_flags(p)
    p.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT to serve on (default 127.0.0.1:8080)")
    p.set_defaults(gateway_flags=dataclass_flags(p, GatewaySettings))  # each from its field (gateway/config.py)
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
    ed = ks.add_parser("edit", help="a key's own limits: set (--requests-per-s ...) or --clear them")
    ed.add_argument("key_id", help="the key's id (from 'keys list'), or the key itself")
    ed.add_argument("--clear", action="append", choices=("requests_per_s", "tokens_per_min", "max_concurrent"),
                    help="remove this limit of the key's own (repeat for more); its tenant's still hold")
    for q in (c, ed):
        _limit_flags(q)
    lst = ks.add_parser("list", help="every key (never the secret)")
    lst.add_argument("--json", action="store_true")
    r = ks.add_parser("revoke", help="revoke a key (its id from 'keys list', or the key itself)")
    r.add_argument("key_id")
    u = ks.add_parser("usage", help="requests and tokens per tenant and key, last hour and last day")
    u.add_argument("--json", action="store_true")
    for q in (c, lst, r, u, ed):
        temporal_flags(q)
        offline_flags(q)
        q.set_defaults(fn=cmd_keys, temporal=True)
