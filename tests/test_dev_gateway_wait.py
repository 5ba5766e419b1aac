"""``gpuflow dev`` waits for its own gateway, not for an open port (gpuflow/dev/serving.py): a
process that took the port between its pick and the gateway's bind (a Temporal server's gRPC
service, say) once passed for the gateway, which had exited on 'address already in use', and a
browser then read HTTP/2 frames (ERR_INVALID_HTTP_RESPONSE). Real sockets and real processes."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading

import pytest

from gpuflow.dev.serving import _is_gateway, wait_listening

H2_SETTINGS = bytes.fromhex("000000040000000000")  # an HTTP/2 server's first frame: SETTINGS, empty


def serve(answer: bytes | dict):
    """A listener on a free port answering every connection with ``answer`` (raw bytes), or an
    HTTP server answering /healthz with that JSON; its port and a stop function."""
    if isinstance(answer, dict):
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                body = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv.server_address[1], lambda: (srv.shutdown(), srv.server_close())
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            try:
                c, _ = s.accept()
            except OSError:
                return
            c.sendall(answer)
            c.close()

    threading.Thread(target=loop, daemon=True).start()
    return s.getsockname()[1], lambda: (stop.set(), s.close())


@pytest.mark.parametrize("answer, gateway", [
    ({"status": "stale", "models": 0, "gateway": "box-1-ab12cd"}, True),  # a gateway before its table's first read
    ({"status": "ok"}, False),  # some other HTTP service
    (H2_SETTINGS, False),  # a gRPC server (HTTP/2 without TLS), as a Temporal server's services are
    (b"", False),  # closes at once
])
def test_only_a_gateways_healthz_counts(answer, gateway):
    port, stop = serve(answer)
    try:
        assert _is_gateway("127.0.0.1", port) is gateway
    finally:
        stop()


def test_a_port_someone_else_holds_is_the_gateways_exit_not_its_start(tmp_path):
    port, stop = serve(H2_SETTINGS)  # the port the gateway was to take, taken
    log = tmp_path / "gateway.log"
    try:  # a 'gateway' that cannot bind and exits a moment later
        p = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(1); sys.exit(1)"])
        assert wait_listening(p, "127.0.0.1", port, str(log), timeout=30) == f"the gateway exited with code 1; see {log}"
    finally:
        stop()
