"""The capacity hook, called for real: the shipped example script as a command, a program that
fails, one that is missing, a URL that answers and one that does not."""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from activities.capacity_hook import call

DEMAND = {"deployment": "chat", "replicas": 2, "backend": "vllm",
          "per_replica": {"gpus": 2, "vram_bytes": 40 * 2**30, "vram_per_gpu_bytes": 20 * 2**30, "ram_bytes": 2**30},
          "worker_selector": {}, "gpu_selector": {}, "cluster": "default", "reasons": ["no room"]}
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "deploy", "hooks", "log-demand.py")


def test_the_example_script_logs_the_demand(tmp_path):
    out = tmp_path / "demand.jsonl"
    r = call(f"{sys.executable} {EXAMPLE} {out}", DEMAND)
    assert r.ok, r.detail
    assert "2 more replica(s) of 2 GPU(s), 40.0 GiB VRAM" in r.detail
    assert json.loads(out.read_text())["replicas"] == 2


def test_failures_are_reported_never_raised(tmp_path):
    assert not call(f"{sys.executable} -c 'import sys; sys.exit(3)'", DEMAND).ok
    missing = call(str(tmp_path / "no-such-hook"), DEMAND)
    assert not missing.ok and "FileNotFoundError" in missing.detail
    assert not call(f"{sys.executable} -c 'import time; time.sleep(5)'", DEMAND, timeout_s=0.5).ok
    assert not call("http://127.0.0.1:9/", DEMAND, timeout_s=1).ok  # nothing listens on port 9


def test_a_url_gets_the_json():
    got = {}

    class H(BaseHTTPRequestHandler):
        def do_POST(self):
            got["body"] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.handle_request, daemon=True).start()
    r = call(f"http://127.0.0.1:{srv.server_address[1]}/demand", DEMAND)
    srv.server_close()
    assert r.ok and got["body"] == DEMAND
