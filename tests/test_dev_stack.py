"""`gpuflow dev --demo` (the README's main job) as a user runs it: it prints the placements and
the UI's address, and Ctrl-C stops every process it started."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from gpuflow.devserver import free_port
from worker_agent.processes import ProcessTable, pid_alive


def test_dev_demo_then_ctrl_c_stops_everything(tmp_path):
    data = tmp_path / "dev"
    port, ui = free_port(), free_port()
    p = subprocess.Popen([sys.executable, "-m", "gpuflow", "dev", "--demo", "--data-dir", str(data),
                          "--port", str(port), "--ui-port", str(ui)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _check_demo(p, data, ui)
    finally:
        if p.poll() is None:  # a failed check still stops what the demo started
            p.send_signal(signal.SIGINT)
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()


def _check_demo(p: subprocess.Popen, data, ui: int) -> None:
    lines: list[str] = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "Ctrl-C stops every process" in line:
            break
    out = "".join(lines)
    assert "Ctrl-C stops every process" in out, out
    assert f"Temporal UI:  http://127.0.0.1:{ui}" in out
    assert "scaled chat-8b from 3 to 1" in out
    assert out.count("RUNNING") == 4, out  # chat-8b x1, embed-small x2, llama-70b x1
    assert "llama-70b-0" in out and "simulated" in out
    servers = [r for h in ("gpu-a", "gpu-b", "gpu-c") for r in ProcessTable(str(data / "agent" / h)).records()]
    assert len(servers) == 4 and all(pid_alive(r.pid) for r in servers)

    p.send_signal(signal.SIGINT)
    assert p.wait(60) == 0
    time.sleep(0.5)
    assert not any(pid_alive(r.pid) for r in servers)
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    assert str(data) not in ps, [ln for ln in ps.splitlines() if str(data) in ln]
