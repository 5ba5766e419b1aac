"""A new user's commands on a real stack (Temporal dev server, control plane, two agents):
`gpuflow logs` reads through the agent's query and starts no workflow, whole lines first;
untrusted names in that query are refused by the agent; a PENDING replica's status and explain
lead with the reason that decided; `status --json | head` ends quietly."""

import os
import signal
import subprocess
import sys
import time

import pytest
from temporalio.client import WorkflowQueryFailedError

from store import records
from gpuflow import ops
from tests.live import FAST, Live, cli, spec
from worker_agent.log_reader import QUERY, workflow_id
from contracts.agent import LogChunk, LogRequest

# 2000 'boot' lines of 50 bytes (100 kB, more than one 64 KiB read) at once, then a tick every 0.1 s
TICKER = ("python3 -u -c \"import itertools,time; [print('boot', i, 'y' * 40) for i in range(2000)]; "
          "[print('tick', i, 'x' * 40) or time.sleep(0.1) for i in itertools.count()]\"")


async def _workflow_ids(lv: Live) -> list[str]:
    return sorted([w.id async for w in lv.client.list_workflows("")])


async def test_logs_status_explain(tmp_path):
    lv = await Live(str(tmp_path)).start({"g1": [24]})
    try:
        lv.add_host("cpu1", [], ["--label", "role=cpu"])
        await lv.wait(lambda: {w.name: w.state for w in records.workers(lv.engine)} == {"g1": "ready", "cpu1": "ready"},
                      30, "cpu1 READY too")
        await ops.deploy(lv.client, spec("ticker", vram_gib=1, command=TICKER), FAST)
        await lv.wait(lambda: lv.states("ticker") == {"ticker-0": "running"}, 90, "ticker RUNNING")
        await _logs(lv)
        await _untrusted_names(lv, tmp_path)
        await _pending(lv)
        await _closed_stdout(lv)
        lv.stack.kill_host("g1", processes=False)  # its agent is gone: the read says so (not invalid input)
        out = cli(lv, "logs", "ticker-0")
        assert out.returncode == 4 and "host g1 did not answer" in out.stderr, (out.returncode, out.stderr)
    finally:
        lv.close()


async def _logs(lv: Live) -> None:
    time.sleep(1.5)  # some lines (each 'tick N ' + 40 x's, 48-50 bytes)
    before = await _workflow_ids(lv)
    assert workflow_id("g1") in before and workflow_id("cpu1") in before  # one reader per host
    # 100 bytes from the end land inside a line: the output starts at the next one, whole
    out = cli(lv, "logs", "ticker-0", "--bytes", "100")
    assert out.returncode == 0, out.stderr
    assert out.stdout and all(ln.startswith("tick ") for ln in out.stdout.splitlines()), out.stdout
    whole = cli(lv, "logs", "ticker-0", "--bytes", "1000000")
    assert whole.stdout.startswith("--- gpuflow: starting python3 -u -c"), whole.stdout[:200]  # the command line
    lines = whole.stdout.splitlines()
    assert [ln.split()[1] for ln in lines if ln.startswith("boot ")] == [str(i) for i in range(2000)]  # read on
    assert lines[-1].startswith("tick ")  # past the first 64 KiB, to the end as it was
    base = [sys.executable, "-m", "gpuflow", "logs", "ticker-0", "--follow", "--address", lv.stack.temporal.address]
    follow = subprocess.Popen(base, stdout=subprocess.PIPE, text=True)
    first = follow.stdout.readline()  # it is reading (and handles Ctrl-C) once it has printed
    time.sleep(4)
    follow.send_signal(signal.SIGINT)
    later = first + follow.communicate(timeout=30)[0]
    assert follow.returncode == 0
    last = lambda text: max(int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("tick "))  # noqa: E731
    assert last(later) > last(out.stdout) + 10  # 4 s at 10 lines/s, read as it came
    after = await _workflow_ids(lv)
    assert after == before, set(after) ^ set(before)  # about 6 reads, and not one workflow started for them


async def _untrusted_names(lv: Live, tmp_path) -> None:
    """Anyone who can reach Temporal can send the query: the agent checks the name itself."""
    h = lv.client.get_workflow_handle(workflow_id("g1"))

    async def read(name: str) -> LogChunk:
        return await h.query(QUERY, LogRequest(instance=name, worker="g1", offset=0), result_type=LogChunk)

    for bad in ("../ticker-0", "ticker-0/../../../etc/passwd", "ticker-0@../../x", "/etc/passwd"):
        with pytest.raises(WorkflowQueryFailedError, match="is not an instance name"):
            await read(bad)
    secret = tmp_path / "secret.log"
    secret.write_text("not the agent's\n")
    os.symlink(secret, os.path.join(lv.stack.instance_processes("g1").log_dir, "evil.log"))
    with pytest.raises(WorkflowQueryFailedError, match="does not resolve inside the agent's log folder"):
        await read("evil")
    assert (await read("ticker-0@rpc0")).found is False  # a helper's name is a name: no such log here
    assert (await read("ticker-0")).text.startswith("--- gpuflow: starting")


async def _pending(lv: Live) -> None:
    """The label selector removes g1; the backend filter removes cpu1, the last worker: that decides."""
    big = spec("big", vram_gib=1, backend="vllm", run_command=None, worker_selector={"role": "cpu"})
    await ops.deploy(lv.client, big, FAST)
    await lv.wait(lambda: lv.states("big") == {"big-0": "pending"}, 60, "big PENDING")
    status = cli(lv, "status")
    row = next(ln for ln in status.stdout.splitlines() if ln.strip().startswith("big-0"))
    assert "backend: worker cpu1: cannot run vllm" in row, row
    assert "label" not in row, row  # it removed another worker; it did not decide
    out = cli(lv, "explain", "big-0").stdout
    assert "scheduled: False by None" not in out
    assert "request: 1.0 GiB VRAM, 1.0 GiB RAM" in out, out
    head = out.split("not placed, because (decided on 2 worker(s)):\n", 1)[1].splitlines()
    assert head[0].startswith("  - backend: worker cpu1: cannot run vllm"), out
    out = cli(lv, "explain", "ticker-0").stdout
    assert "placed on g1 GPUs 0 by strategy single_gpu, score " in out, out


async def _closed_stdout(lv: Live) -> None:
    p = subprocess.Popen([sys.executable, "-m", "gpuflow", "status", "--json", "--address", lv.stack.temporal.address],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=60) == 141 and err == "", err
