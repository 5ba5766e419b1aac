"""Measured memory per replica in ``gpuflow status`` and ``explain``: read from the host workflows'
``status`` query (their latest report carries it: contracts/usage.py), so it comes through
``--address`` alone, like the rest of status. A replica across several hosts sums its hosts.

Each instance row gains ``vram``: {used, peak, claimed, rss, rss_peak, measured, over, hosts}
(bytes; ``over``: some card holds more than its claim there), or nothing when no host reports it."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from contracts.ids import host_id


def by_instance(hosts: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """instance -> its figures on each host ({host, ...ReplicaUse}), from host views as JSON."""
    out: dict[str, list[dict[str, Any]]] = {}
    for h in hosts:
        for r in (h.get("report") or {}).get("usage") or []:
            out.setdefault(r["instance"], []).append({"host": h["name"], **r})
    return out


def summed(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One replica's figures over its hosts."""
    cards = [g for p in parts for g in p.get("gpus") or []]
    kinds = {p.get("measured", "none") for p in parts}
    return {"used": sum(g["used"] for g in cards), "peak": sum(g["peak"] for g in cards),
            "claimed": sum(g["claimed"] for g in cards), "rss": sum(p.get("rss", 0) for p in parts),
            "rss_peak": sum(p.get("rss_peak", 0) for p in parts),
            "measured": kinds.pop() if len(kinds) == 1 else "mixed",
            "over": any(g["claimed"] and g["used"] > g["claimed"] for g in cards),
            "hosts": {p["host"]: {"gpus": p.get("gpus") or [], "rss": p.get("rss", 0), "at": p.get("at", 0)}
                      for p in parts}}


def attach(deployments: list[dict[str, Any]], hosts: list[dict[str, Any]]) -> None:
    """Each instance row of ``deployments`` gains ``vram`` where a host reports its memory."""
    use = by_instance(hosts)
    for d in deployments:
        for i in d.get("instances") or []:
            if i["name"] in use and i.get("state") not in ("deleted", "pending"):
                i["vram"] = summed(use[i["name"]])


def workers_of(deployments: list[dict[str, Any]]) -> list[str]:
    return sorted({w for d in deployments for i in d.get("instances") or []
                   for w in [i.get("worker"), *i.get("subordinate_workers", [])] if w})


async def with_usage(client, st: dict[str, Any], host_view: Callable[[Any, str], Awaitable[Any]]) -> dict[str, Any]:
    """``st`` (ops.status's dict) with each instance's ``vram``. Its hosts' views are there already
    for a whole-cluster status; for one deployment, the hosts its replicas run on are asked."""
    hosts = st.get("hosts")
    if not hosts:
        gate = asyncio.Semaphore(32)  # as ops.bounded: a deployment over 100 hosts asks 32 at a time

        async def one(w: str):
            async with gate:
                return await host_view(client, host_id(w))

        views = await asyncio.gather(*(one(w) for w in workers_of(st["deployments"])))
        hosts = [v.model_dump(mode="json") for v in views]
    attach(st["deployments"], hosts)
    return st
