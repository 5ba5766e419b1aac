"""``gpuflow dev`` for a test, started and driven as a user does: a fresh data dir, a simulated
inventory, the shortened timings an operator would set through the environment, and every other
command run as ``gpuflow ARGS --address ADDRESS`` (one address, issue 26). Shared by the live
tests that need the whole stack on one machine (tests/test_one_address_live.py,
tests/test_routing_dev_live.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from contracts.control import Timings
from gpuflow.ports import server_port
from tests.gateway_stack import wait_for
from tests.live import FAST, timings_env, write_inventory


class Dev:
    """``gpuflow dev`` as a user starts it, and ``gpuflow ARGS --address ADDRESS`` as they run it.
    ``args`` are more ``gpuflow dev`` flags; ``env`` is laid over this process's environment and
    ``timings``' variables."""

    def __init__(self, tmp, gpus: tuple[float, ...] = (24, 24), args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, timings: Timings = FAST, up_s: float = 180):
        self.tmp, self.port, self.gw_port = tmp, server_port(), server_port()
        self.address = f"127.0.0.1:{self.port}"
        inv = write_inventory(str(tmp / "inv.yaml"), list(gpus))
        self.p = subprocess.Popen(
            [sys.executable, "-m", "gpuflow", "dev", "--data-dir", str(tmp / "dev"), "--port", str(self.port),
             "--ui-port", str(server_port()), "--gateway-port", str(self.gw_port), "--agent-name", "box",
             "--inventory", inv, *args], env={**os.environ, **timings_env(timings), **(env or {})},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.out = ""
        deadline = time.monotonic() + up_s
        while "gpuflow dev is up" not in self.out and time.monotonic() < deadline:
            line = self.p.stdout.readline()
            if not line:
                break
            self.out += line
        if "gpuflow dev is up" not in self.out:
            self.stop()
            raise AssertionError(f"gpuflow dev did not come up:\n{self.out}")
        # keep reading what it prints (its pipe would fill and block it otherwise)
        threading.Thread(target=self._drain, daemon=True).start()
        self.gateway = f"http://127.0.0.1:{self.gw_port}/v1"

    def join_env(self) -> dict[str, str]:
        """The environment another agent started beside this stack joins it with: the join token,
        read as an operator reads it (``gpuflow hosts join-token --data-dir``)."""
        p = subprocess.run([sys.executable, "-m", "gpuflow", "hosts", "join-token", "--data-dir",
                            str(self.tmp / "dev")], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return {"GPUFLOW_AGENT__JOIN_TOKEN": p.stdout.strip()}

    def _drain(self) -> None:
        for line in self.p.stdout:
            self.out += line

    def run(self, *args: str, code: int = 0, timeout: float = 120) -> str:
        """``gpuflow ARGS --address ADDRESS``'s stdout (and stderr when ``code`` is not 0); its
        exit code must be ``code``."""
        p = subprocess.run([sys.executable, "-m", "gpuflow", *args, "--address", self.address],
                           capture_output=True, text=True, timeout=timeout)
        assert p.returncode == code, (args, p.stdout, p.stderr)
        return p.stdout + (p.stderr if code else "")

    def status(self, name: str | None = None) -> dict:
        """``gpuflow status [NAME] --json``, read."""
        return json.loads(self.run("status", *([name] if name else []), "--json"))

    def instances(self, name: str) -> list[dict]:
        """The rows of deployment ``name``'s replicas in ``status NAME --json``."""
        return [i for d in self.status(name)["deployments"] if d["name"] == name for i in d["instances"]]

    def log(self, name: str) -> str:
        """One of the stack's own logs (``gateway-0``, ``server-0``, ``agent-box``), for a failure's message."""
        try:
            with open(os.path.join(str(self.tmp / "dev"), "logs", f"{name}.log"), errors="replace") as f:
                return f.read()
        except OSError as e:
            return str(e)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                self.p.kill()


def until(what: str, check, timeout: float = 60.0, every: float = 0.5):
    """``check()``'s first truthy value, asked every ``every`` s (each ask may run a CLI command)."""
    return wait_for(check, timeout, what, every)
