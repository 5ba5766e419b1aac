"""A Hugging Face mirror on localhost, for the download tests: the hub itself cannot be reached
from these machines, and HF_ENDPOINT mirrors are how operators run without it too. It speaks the
part of the hub's HTTP protocol huggingface_hub uses to download: repository info, the tree
listing, and HEAD/GET on resolve/ with ETag, X-Repo-Commit and Range requests. It can be slowed
down (to watch progress, or to kill an agent mid-download) and broken (connections cut after
some bytes), and it logs every request."""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

COMMIT = "5f1c2e9a7b3d4c6e8f0a1b2c3d4e5f6a7b8c9d0e"
CHUNK = 64 * 1024


def _size(v: bytes | str) -> int:
    return len(v) if isinstance(v, bytes) else os.path.getsize(v)


def _slice(v: bytes | str, start: int, n: int) -> bytes:
    if isinstance(v, bytes):
        return v[start:start + n]
    with open(v, "rb") as f:
        f.seek(start)
        return f.read(n)


def _etag(v: bytes | str) -> str:
    return hashlib.sha256(v if isinstance(v, bytes) else f"{v}:{_size(v)}".encode()).hexdigest()


class HubMirror:
    """``repos``: repository -> file name -> its bytes, or the path of a local file to serve."""

    def __init__(self, repos: dict[str, dict[str, bytes | str]], rate: float | None = None, port: int = 0):
        self.repos, self.rate = repos, rate  # rate: bytes per second per response (None: as fast as it can)
        self.served = 0  # body bytes of files sent
        self.cut_after: int | None = None  # every GET of a file is cut after this many bytes of its body
        self.ignore_range = False  # answer 200 with the whole file, as some proxies do
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range)
        self.lock = threading.Lock()
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):  # noqa: N802
                mirror._serve(self, body=False)

            def do_GET(self):  # noqa: N802
                mirror._serve(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def ranges(self, path_part: str) -> list[int]:
        """The start offsets of the GETs of files whose path contains ``path_part`` (0: from the start)."""
        with self.lock:
            reqs = list(self.requests)
        return [int(re.match(r"bytes=(\d+)-", r)[1]) if r else 0 for m, p, r in reqs
                if m == "GET" and "/resolve/" in p and path_part in p]

    # --- protocol -------------------------------------------------------------------------------
    def _json(self, h, status: int, obj, error: str | None = None) -> None:
        data = json.dumps(obj).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        if error:
            h.send_header("X-Error-Code", error)
            h.send_header("X-Error-Message", obj.get("error", ""))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)

    def _serve(self, h, body: bool) -> None:
        url = urlparse(h.path)
        path = unquote(url.path)
        with self.lock:
            self.requests.append((h.command, path, h.headers.get("Range")))
        m = re.match(r"^/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?/?$", path)
        if m:
            return self._info(h, m[1])
        m = re.match(r"^/api/models/([^/]+/[^/]+)/tree/[^/]+/?(.*)$", path)
        if m:
            return self._tree(h, m[1])
        m = re.match(r"^/([^/]+/[^/]+)/resolve/[^/]+/(.+)$", path)
        if m:
            return self._file(h, m[1], m[2], body)
        self._json(h, 404, {"error": "not found"})

    def _repo(self, h, repo: str) -> dict[str, bytes] | None:
        files = self.repos.get(repo)
        if files is None:
            self._json(h, 404, {"error": f"Repository {repo} not found"}, "RepoNotFound")
        return files

    def _info(self, h, repo: str) -> None:
        files = self._repo(h, repo)
        if files is not None:
            self._json(h, 200, {"id": repo, "modelId": repo, "sha": COMMIT, "private": False,
                                "siblings": [{"rfilename": p} for p in sorted(files)]})

    def _tree(self, h, repo: str) -> None:
        files = self._repo(h, repo)
        if files is not None:
            self._json(h, 200, [{"type": "file", "path": p, "size": _size(b), "oid": _etag(b)[:40]}
                                for p, b in sorted(files.items())])

    def _file(self, h, repo: str, name: str, body: bool) -> None:
        files = self._repo(h, repo)
        if files is None:
            return
        if name not in files:
            return self._json(h, 404, {"error": f"{name} not in {repo}"}, "EntryNotFound")
        data = files[name]
        size, start, end = _size(data), 0, None
        rng = None if self.ignore_range else h.headers.get("Range")
        if rng:
            m = re.match(r"bytes=(\d+)-(\d*)", rng)
            start, end = int(m[1]), (int(m[2]) + 1 if m[2] else None)
        end = min(end or size, size)
        h.send_response(206 if rng else 200)
        h.send_header("X-Repo-Commit", COMMIT)
        h.send_header("ETag", f'"{_etag(data)}"')
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(end - start))
        if rng:
            h.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        h.end_headers()
        if not body:
            return
        sent, pos = 0, start
        while pos < end:
            if self.cut_after is not None and sent >= self.cut_after:
                h.close_connection = True
                h.connection.shutdown(2)  # the connection breaks mid-file
                return
            piece = _slice(data, pos, min(CHUNK, end - pos))
            try:
                h.wfile.write(piece)
            except OSError:
                return
            pos += len(piece)
            sent += len(piece)
            with self.lock:
                self.served += len(piece)
            if self.rate:
                time.sleep(len(piece) / self.rate)
