"""The demo's toy engine (``gpuflow dev --demo``'s three deployments): an HTTP server that answers
``GET /`` and ``/health`` and nothing else, behind the replica's engine key (engine_guard.py). It
replaces ``python3 -m http.server``, which served the agent's working folder to anyone on the port.

    python -m gpuflow.demo.toy_server --port P [--host H] [--api-key KEY]"""

from __future__ import annotations

import argparse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpuflow.demo.engine_guard import UNAUTHORIZED, allowed, key_from


def handler(key: str | None) -> type[BaseHTTPRequestHandler]:
    class Toy(BaseHTTPRequestHandler):
        def _answer(self, body: bool) -> None:
            auth = self.headers.get("Authorization")
            if not allowed(key, self.path, auth.encode() if auth is not None else None):
                status, out = 401, UNAUTHORIZED
            elif self.path in ("/", "/health"):
                status, out = 200, b'{"engine": "gpuflow demo toy"}'
            else:
                status, out = 404, b'{"error": "not found"}'
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            if body:
                self.wfile.write(out)

        def do_GET(self) -> None:  # noqa: N802  (http.server's name)
            self._answer(True)

        def do_HEAD(self) -> None:  # noqa: N802
            self._answer(False)

        def log_message(self, *args) -> None:  # quiet: the agent keeps the engine's log
            pass
    return Toy


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--api-key", help="default: GPUFLOW_ENGINE_API_KEY (the agent sets it)")
    a = p.parse_args()
    ThreadingHTTPServer((a.host, a.port), handler(key_from(a.api_key))).serve_forever()


if __name__ == "__main__":
    main()
