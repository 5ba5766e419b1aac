"""A stand-in for SGLang's prefill/decode hand-off, for the gateway's tests: both ends get the
request with ``bootstrap_host``, ``bootstrap_port`` and ``bootstrap_room`` at once. A prefill
registers the room (with its prompt) on its bootstrap server (``--bootstrap-port``: GET
/room/ROOM answers the prompt's digest, or 404); a decode asks the named bootstrap server for the
room until it is there (2 s at most, else 503 before any byte) and answers, saying whose KV it
decoded from (``gpuflow_kv``: remote and the prefill's name, or local without bootstrap fields).

    python tests/standin_sglang.py --port P --name NAME --role prefill|decode [--bootstrap-port B]"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

rooms: dict[int, str] = {}


def digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body.get("messages"), sort_keys=True).encode()).hexdigest()


def fetch(host: str, port: int, room: int) -> str | None:
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        c = http.client.HTTPConnection(host, port, timeout=2)
        c.request("GET", f"/room/{room}")
        r = c.getresponse()
        got = r.read().decode()
        if r.status == 200:
            return got
        time.sleep(0.01)
    return None


def handler(a):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def send(self, status: int, obj: dict) -> None:
            raw = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:  # noqa: N802  the bootstrap server, and /v1/models for readiness
            if self.path.startswith("/room/") and self.path[6:].isdigit() and int(self.path[6:]) in rooms:
                return self.send(200, {"digest": rooms[int(self.path[6:])]})
            self.send(404 if self.path.startswith("/room/") else 200, {"data": []})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            room, kv = body.get("bootstrap_room"), {"source": "local", "engine_id": a.name}
            if a.role == "prefill" and isinstance(room, int):
                rooms[room] = digest(body)
            elif a.role == "decode" and isinstance(room, int):
                got = fetch(body["bootstrap_host"], body["bootstrap_port"], room)
                if got is None or json.loads(got)["digest"] != digest(body):
                    return self.send(503, {"error": {"message": f"no KV in room {room}"}})
                kv = {"source": "remote", "engine_id": got and body["bootstrap_port"], "room": room}
            self.send(200, {"id": "x", "object": "chat.completion", "created": 0, "model": "pd", "gpuflow_kv": kv,
                            "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": f"from {a.name}"}}]})
    return H


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--role", choices=("prefill", "decode"), required=True)
    p.add_argument("--bootstrap-port", type=int)
    a = p.parse_args()
    if a.bootstrap_port:
        boot = ThreadingHTTPServer(("127.0.0.1", a.bootstrap_port), handler(a))
        threading.Thread(target=boot.serve_forever, daemon=True).start()
    ThreadingHTTPServer(("127.0.0.1", a.port), handler(a)).serve_forever()


if __name__ == "__main__":
    main()
