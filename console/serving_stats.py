"""A deployment's serving figures on its page, read from the gateways' own counters: this
gateway's registry (its ``Gateway.metrics``) and every other live gateway's ``/metrics`` (store/serving.py
``live_gateways`` gives their URLs), parsed as the autoscaler parses them
(scheduler/autoscale/scrape.py ``parse``, for one ``model``).

- Requests: the count of the gateway's request-duration histogram (a request answered, in full).
- Requests/s: that count's rise since the previous reading this gateway's console kept, over the
  seconds between (a rate since the gateway started would hide what happens now; the page's live
  section reads again every few seconds, so the window is short). None on the first reading.
- TTFT and latency percentiles: Prometheus' ``histogram_quantile`` over the buckets since each
  gateway started (scheduler/autoscale/histogram.py ``quantile``); all gateways together merge
  their buckets first (``merge``), never their percentiles.

A gateway that does not answer within ``READ_S`` is listed as such, with why."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx2 as httpx
from prometheus_client import generate_latest

from store.serving import metrics_url
from scheduler.autoscale.scrape import Scrape, parse
from scheduler.autoscale.histogram import EMPTY, Histogram, merge, quantile
from store import serving

READ_S = 0.25  # another gateway on the cluster's network answers in a few ms; the page's budget is 300 ms
QUANTILES = (0.5, 0.95, 0.99)
MAX_WINDOW_S = 300.0  # an older previous reading gives no rate (the page was not open meanwhile)


@dataclass
class Figures:
    """One gateway's (or all gateways') figures for one deployment."""

    gateway: str  # its id, or "all"
    url: str
    requests: int = 0
    rate: float | None = None  # requests/s since the previous reading
    ttft: dict[float, float | None] = field(default_factory=dict)  # quantile -> seconds
    latency: dict[float, float | None] = field(default_factory=dict)
    error: str = ""  # why it has no figures (did not answer, refused)


def percentiles(h: Histogram | None, qs: tuple[float, ...] = QUANTILES) -> dict[float, float | None]:
    """q -> the q-quantile of what ``h`` observed (None: nothing observed)."""
    return {q: (quantile(h, q) if h is not None else None) for q in qs}


def rate(prev: tuple[float, float] | None, now: float, count: float) -> float | None:
    """Requests/s between ``prev`` (time, count) and (``now``, ``count``); None without a usable
    previous reading (none, too old, same instant) or after a reset (the count went down)."""
    if prev is None:
        return None
    at, before = prev
    dt = now - at
    if dt <= 0 or dt > MAX_WINDOW_S or count < before:
        return None
    return (count - before) / dt


def figures(gateway: str, url: str, s: Scrape, prev: tuple[float, float] | None, now: float) -> Figures:
    lat = s.histograms.get("latency")
    n = lat.count if lat is not None else 0.0
    return Figures(gateway=gateway, url=url, requests=int(n), rate=rate(prev, now, n),
                   ttft=percentiles(s.histograms.get("ttft")), latency=percentiles(lat))


def total(parts: list[Figures], scrapes: list[Scrape]) -> Figures:
    """Every gateway that answered, together: counts and rates added, buckets merged."""
    rates = [f.rate for f in parts if not f.error]
    return Figures(gateway="all", url="", requests=sum(f.requests for f in parts if not f.error),
                   rate=sum(r for r in rates if r is not None) if any(r is not None for r in rates) else None,
                   ttft=percentiles(merge([s.histograms.get("ttft") or EMPTY for s in scrapes])),
                   latency=percentiles(merge([s.histograms.get("latency") or EMPTY for s in scrapes])))


async def _other(http: httpx.AsyncClient, url: str, model: str, token: str) -> Scrape | str:
    """The gateway's scrape for ``model``, or why there is none."""
    try:
        r = await http.get(metrics_url(url), headers={"authorization": f"Bearer {token}"} if token else {})
    except httpx.TimeoutException:
        return f"did not answer within {READ_S:g} s"
    except httpx.HTTPError as e:
        return f"did not answer: {type(e).__name__}"
    if r.status_code != 200:
        return f"answered HTTP {r.status_code}" + (" (its /metrics needs a key)" if r.status_code == 401 else "")
    try:
        return parse(r.text, model)
    except ValueError as e:
        return f"its /metrics did not parse: {e}"


async def read(con, model: str, token: str = "") -> list[Figures]:
    """Each live gateway's figures for ``model``, this one first, then all of them together
    (last, when more than one answered). ``token``: the caller's key, for gateways whose
    /metrics needs one."""
    me = con.settings.gateway_id
    others = [g for g in await asyncio.to_thread(serving.live_gateways, con.engine) if g.id != me]
    kept = con.serving_prev
    async with httpx.AsyncClient(timeout=READ_S) as http:
        got = await asyncio.gather(*(_other(http, g.url, model, token) for g in others))
    now = time.monotonic()
    rows = [(me, con.settings.url or "this gateway", parse(generate_latest(con.gw.metrics.registry).decode(), model))]
    rows += [(g.id, g.url, s) for g, s in zip(others, got)]
    out, scrapes = [], []
    for gid, url, s in rows:
        if isinstance(s, str):
            out.append(Figures(gateway=gid, url=url, error=s))
            continue
        f = figures(gid, url, s, kept.get((gid, model)), now)
        if len(kept) > 10_000:
            kept.clear()
        kept[gid, model] = (now, float(f.requests))
        out.append(f)
        scrapes.append(s)
    if len(scrapes) > 1:
        out.append(total(out, scrapes))
    return out
