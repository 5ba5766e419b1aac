"""The web console (issue 28), its own package since issue 34: server-rendered pages (Jinja2,
autoescaped) over the same views the CLI reads (views/), a little plain JavaScript for live parts,
nothing fetched from the network at run time. It is served at ``/console/`` by a gateway's
process, beside the API: ``gpuflow gateway`` builds the gateway with ``mount(plane, namespace)``
among its extra routes (gateway.app.build's ``extra``); the serving path never imports it.

It reads the store through views/ and the gateway it is served by (its keys' verdicts, routing
table and metrics), and asks the control plane only through the ``ControlPlane`` seam it is handed
(console/plane.py): it imports no Temporal client and no CLI module. Each page module lists its
routes in ``ROUTES``: (path, a function of the ``Console`` giving the handler, methods)."""

from __future__ import annotations

from typing import Callable

from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from console import deployments, keys_page, overview, signin, playground
from console import claims_page, hosts_actions, queue_page, replica, tenants_page
from console.context import Console
from console.plane import ControlPlane
from console.web import STATIC_DIR
from gateway.app import Gateway

PREFIX = "/console"
PAGES = (signin, overview, playground, keys_page, deployments,  # each has ROUTES: (path, handler, methods)
         replica, queue_page, tenants_page, claims_page, hosts_actions)


def mount(plane: ControlPlane | None = None, namespace: str = "default") -> Callable[[Gateway], Mount]:
    """The console's mount for a gateway (what ``gateway.app.build(..., extra=)`` takes): its pages
    ask ``plane`` (None: the store's view only; an action then says why it cannot be done) and link
    the Temporal UI's ``namespace``."""

    def on(gw: Gateway) -> Mount:
        con = Console(gw, plane, namespace)
        routes = [Route(path, handler(con), methods=methods) for page in PAGES for path, handler, methods in page.ROUTES]
        routes.append(Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"))
        return Mount(PREFIX, routes=routes)
    return on
