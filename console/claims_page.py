"""The claims page: each fingerprint's learned memory claim (issue 42), what ``gpuflow claims``
shows, read from the store as ``gpuflow claims --data-dir`` reads it (views/claims.py), judged with
this gateway's GPUFLOW_CLAIMS__* settings (set them as the control plane's). A key that is not an
admin's sees the fingerprints one of whose deployments it may see, and only those deployments."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic_settings import BaseSettings, SettingsConfigDict

from console.queue_page import specs
from console.web import Page, page
from scheduler.claims.settings import ClaimSettings
from views import claims as claims_view
from views.render.claims import advice


class _Env(BaseSettings):
    """GPUFLOW_CLAIMS__* as gpuflow/settings.py reads them (the console may not import gpuflow/)."""

    model_config = SettingsConfigDict(env_prefix="GPUFLOW_", env_nested_delimiter="__", extra="ignore")
    claims: ClaimSettings = ClaimSettings()


def gather(engine, caller, settings: ClaimSettings, now: float) -> dict[str, Any]:
    view = claims_view.claims(engine, settings, now)
    by_name = specs(engine)
    rows = []
    for r in view["claims"]:
        seen = {d["name"] for d in r["deployments"] if caller.sees(by_name.get(d["name"]) or {})}
        if caller.cluster_admin:
            pass
        elif seen:  # its own deployments' replicas only: what others book and use is not this caller's
            r = claims_view.restricted(r, seen)
        else:
            continue
        rows.append({**r, "advice": advice({**r, "deployments": r["deployments"]})})
    return {**view, "claims": rows, "hidden": len(view["claims"]) - len(rows)}


async def show(con, request, caller) -> Page:
    data = await asyncio.to_thread(gather, con.engine, caller, _Env().claims, time.time())
    return Page("claims.html", {"title": "Claims", **data})


ROUTES = [("/claims", page(show), ["GET"])]
