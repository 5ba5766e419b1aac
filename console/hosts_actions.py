"""The overview's host action: cordon a host (no new replica is placed there; those running there
keep running) or uncordon it, through its workflow's update exactly as ``gpuflow hosts cordon``
does (the control plane's ``cordon``: console/plane.py), so the history records it. A
cluster-admin's action (rules.py); the body is one small JSON object, ``{"on": true|false}`` (the
console's form sends "true"/"false"), with an optional ``reason``."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from console import access, rules
from console.web import action_body, page
from scheduler.errors import InvalidInput
from scheduler.naming import name_problem

ON = {True: True, "true": True, False: False, "false": False}  # what "on" may be, and what it means
FIELDS = {"on", "reason"}



def cordon_ask(body: dict[str, Any]) -> tuple[bool, str]:
    """(on, reason) from the body: ``on`` true or false (a boolean or its word), ``reason`` a string;
    any other field is refused by name."""
    extra = sorted(set(body) - FIELDS)
    if extra:
        raise InvalidInput(f"cordon takes 'on' and 'reason'; it was given {str(extra[0])[:40]!r}")
    on = body.get("on")
    if isinstance(on, (bool, str)) and on in ON:
        reason = body.get("reason", "")
        if not isinstance(reason, str):
            raise InvalidInput("the cordon reason must be a string")
        return ON[on], reason.strip()
    raise InvalidInput(f"'on' must be true or false, got {str(on)[:20]!r}")


async def cordon(con, request, caller) -> JSONResponse:
    name = request.path_params["name"]
    problem = name_problem(name)
    if problem:
        raise InvalidInput(f"host name {name[:80]!r}: {problem}")
    on, reason = cordon_ask(await action_body(request))
    why = rules.host(caller.scope, caller.tenant, "cordon" if on else "uncordon", name)
    if why:
        raise access.Forbidden(why)
    return JSONResponse({"message": await con.control().cordon(name, on, reason), "cordoned": on})


ROUTES = [("/hosts/{name}/cordon", page(cordon, admin=True, action=True), ["POST"])]
