"""The web console (issue 28), served by the gateway at ``/console/`` on its own address:
server-rendered pages (Jinja2, autoescaped) over the same views the CLI reads, a little plain
JavaScript for live parts, nothing fetched from the network at run time. ``mount(gw)`` gives the
Starlette Mount; each page module lists its routes in ``ROUTES``."""

from __future__ import annotations

from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from gateway.console import deployments, keys_page, overview, signin, playground
from gateway.console import hosts_actions, queue_page, replica, tenants_page
from gateway.console.web import STATIC_DIR

PREFIX = "/console"
PAGES = (signin, overview, playground, keys_page, deployments,  # each has ROUTES: (path, handler, methods)
         replica, queue_page, tenants_page, hosts_actions)


def mount(gw) -> Mount:
    from starlette.routing import Route

    routes = [Route(path, handler(gw), methods=methods) for page in PAGES for path, handler, methods in page.ROUTES]
    routes.append(Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"))
    return Mount(PREFIX, routes=routes)
