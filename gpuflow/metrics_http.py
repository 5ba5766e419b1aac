"""One Prometheus endpoint per process: our prometheus-client registry, followed by the Temporal
SDK's own metrics (its exporter listens on a private port; we fetch and append its text)."""

from __future__ import annotations

import threading
import urllib.request
from typing import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from gpuflow.ports import free_port
from scheduler.errors import InvalidInput


def parse_address(addr: str) -> tuple[str, int] | None:
    """'127.0.0.1:9400' -> ('127.0.0.1', 9400); 'off' -> None."""
    if addr in ("off", "", "none"):
        return None
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidInput(f"--metrics-address {addr!r} is not HOST:PORT (or 'off')")
    return host, int(port)


def sdk_runtime() -> tuple[Runtime, str]:
    """A Temporal runtime exporting the SDK's metrics on a private localhost port."""
    addr = f"127.0.0.1:{free_port()}"
    rt = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=addr, durations_as_seconds=True)))
    return rt, addr


def serve(addr: tuple[str, int], registry: CollectorRegistry, sdk_addr: str | None,
          extra: Callable[[str], tuple[int, bytes] | None] | None = None) -> ThreadingHTTPServer:
    """Serve /metrics; ``extra`` may answer other paths (status, body), or None for 404."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path.split("?")[0] not in ("/metrics", "/"):
                got = extra(self.path.split("?")[0]) if extra else None
                if got is None:
                    self.send_error(404)
                    return
                status, body = got
                self.send_response(status)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            body = generate_latest(registry)
            if sdk_addr:
                try:
                    with urllib.request.urlopen(f"http://{sdk_addr}/metrics", timeout=2) as r:
                        body += b"\n" + r.read()
                except OSError:
                    pass  # the SDK exporter is not up yet; our own series still go out
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    try:
        httpd = ThreadingHTTPServer(addr, Handler)
    except OSError as e:
        raise InvalidInput(f"cannot serve metrics on {addr[0]}:{addr[1]}: {e.strerror}") from None
    threading.Thread(target=httpd.serve_forever, daemon=True, name="gpuflow-metrics").start()
    return httpd
