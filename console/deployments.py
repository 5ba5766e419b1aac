"""The Deployments pages and their actions.

- ``/deployments``: every deployment the caller may see (deployment_view.listing), filtered by
  name (``q``) and paged (``page``).
- ``/deployments/{name}``: its replicas (live), spec (env values hidden), rollout (the deployment
  workflow's ``rollout`` query, as ``gpuflow rollout status``), autoscaler (its workflow's
  ``autoscale`` query, as ``gpuflow autoscale``, drawn by charts.py; and the steps the store keeps
  for ``gpuflow explain --replay``) and serving figures (serving_stats.py).
- ``POST /deployments/{name}/scale`` ``{"replicas": N}`` and ``POST /deployments/{name}/delete``:
  through the control plane as ``gpuflow scale`` and ``gpuflow delete`` (console/plane.py), for a
  cluster-admin or a tenant-admin of the tenant that owns the deployment (rules.py).

What Temporal alone knows is asked with a deadline (``TEMPORAL_S``): a page whose control plane
is slow or absent still shows the store's view, and says what it could not ask."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from console import access, rules, serving_stats
from console.charts import replicas_chart
from console.deployment_view import detail, listing
from console.web import Page, action_body, page, page_number
from scheduler.errors import GpuflowError, InvalidInput
from scheduler.groups.spec import RoleName
from scheduler.limits import REPLICAS_CEILING
from scheduler.naming import name_problem

TEMPORAL_S = 2.0
WHOLE = re.compile(r"^[0-9]{1,7}$")


def _name(request: Request) -> str:
    name = request.path_params.get("name", "")
    problem = name_problem(name)
    if problem:
        raise InvalidInput(f"deployment name: {problem}")
    return name


async def show_list(con, request, caller) -> Page:
    q = request.query_params.get("q", "")[:100]
    ls = await asyncio.to_thread(listing, con.engine, caller, q, page_number(request))
    return Page("deployments.html", {"title": "Deployments", "ls": ls, "q": q})


async def _asked(what: str, call) -> tuple[Any, str]:
    """(its answer, '') or (None, why it has none)."""
    try:
        return await asyncio.wait_for(call(), TEMPORAL_S), ""
    except GpuflowError as e:  # refused (InvalidInput) or not answered (gpuflow.runtime.Unreachable)
        return None, str(e)
    except asyncio.TimeoutError:
        return None, f"the {what} did not answer within {TEMPORAL_S:g} s"
    except Exception as e:  # noqa: BLE001  the page shows the rest
        return None, f"the {what} could not be asked: {type(e).__name__}: {str(e)[:300]}"


async def show(con, request, caller) -> Page:
    name = _name(request)
    d = await asyncio.to_thread(detail, con.engine, caller, name)
    if d is None:
        return Page("error.html", {"title": "404", "message": f"no deployment named {name!r} that you may see"}, 404)
    jobs = [_asked("deployment workflow", lambda: con.control().rollout(name)),
            serving_stats.read(con, name, access.token_of(request))]
    if d.summary.autoscaled:  # one failed or stuck is said, never queried (as gpuflow autoscale)
        jobs.append(_asked("autoscaler workflow", lambda: con.control().autoscaler(name)))
    got = await asyncio.gather(*jobs)
    (rollout, rollout_why), serving = got[0], got[1]
    autoscaler, autoscaler_why = got[2] if len(got) > 2 else (None, "")
    history = (autoscaler or {}).get("history") or []
    return Page("deployment.html", {
        "title": name, "d": d, "rollout": rollout, "rollout_why": rollout_why, "serving": serving,
        "autoscaler": autoscaler, "autoscaler_why": autoscaler_why, "now": time.time(),
        "chart": replicas_chart(history, time.time()), "steps": [h for h in history if h.get("direction") in
                                                                    ("up", "down", "error")][-15:]})



def replicas_of(body: dict[str, Any]) -> int:
    """The ``replicas`` field: a whole number (as the form sends it, a string of digits) within the ceiling."""
    v = body.get("replicas")
    if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, str) and WHOLE.match(v.strip()))):
        raise InvalidInput(f"replicas must be a whole number >= 0, got {str(v)[:20]!r}")
    n = int(v)
    if n > REPLICAS_CEILING:
        raise InvalidInput(f"replicas {n} is more than the ceiling of {REPLICAS_CEILING}")
    return n


ROLES = tuple(r.value for r in RoleName)


async def _may(con, caller, verb: str, name: str) -> None:
    """Refused unless ``caller`` sees deployment ``name`` (InvalidInput: as if it did not exist) and
    its scope may ``verb`` it (access.Forbidden, naming what is missing: rules.deployment)."""
    d = await asyncio.to_thread(detail, con.engine, caller, name)
    if d is None:
        raise InvalidInput(f"no deployment named {name!r} that you may see")
    why = rules.deployment(caller.scope, caller.tenant, verb, name, d.summary.tenant)
    if why:
        raise access.Forbidden(why)


async def scale(con, request, caller) -> JSONResponse:
    """``{"replicas": N}``, or ``{"replicas": N, "role": ROLE}`` for one role of a prefill/decode
    group (its other members keep running), as ``gpuflow scale [--role]``."""
    name = _name(request)
    body = await action_body(request)
    n, role = replicas_of(body), body.get("role")
    if role is not None and (not isinstance(role, str) or role not in ROLES):
        raise InvalidInput(f"role must be one of {', '.join(ROLES)}, got {str(role)[:20]!r}")
    await _may(con, caller, "scale", name)
    if role:
        v = await con.control().scale_role(name, role, n)
        wanted = next((r.get("replicas", 1) for r in v.spec.get("roles") or [] if r.get("name") == role), n)
        return JSONResponse({"message": f"{name}: {role} {wanted} replica(s) wanted", "replicas": wanted})
    v = await con.control().scale(name, n)
    return JSONResponse({"message": f"{name}: {v.replicas} replica(s) wanted", "replicas": v.replicas})


async def delete(con, request, caller) -> JSONResponse:
    name = _name(request)
    await _may(con, caller, "delete", name)
    v = await con.control().delete(name)
    stopping = len(set(v.instances) | set(v.stopping))
    return JSONResponse({"message": f"deleting {name}: {stopping} replica(s) to stop"})


ROUTES = [("/deployments", page(show_list), ["GET"]),
          ("/deployments/{name}", page(show), ["GET"]),
          ("/deployments/{name}/scale", page(scale, admin=True, action=True), ["POST"]),
          ("/deployments/{name}/delete", page(delete, admin=True, action=True), ["POST"])]
