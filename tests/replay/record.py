"""Record the replay corpus: ``.venv/bin/python -m tests.replay.record [--out DIR] [--only NAME ...]``.

Each scenario (scenarios.py) runs on a stack of its own (tests/live.py: the Temporal dev server,
a control-plane worker, agents with simulated GPUs), in a temporary folder. Once it has settled,
every workflow of that stack (deployments, instances, hosts, autoscalers, the queue sweep) has
its history fetched, open or closed, and written as ``<scenario>__<workflow id>.json``
(corpus.py). The old files are replaced only when every scenario asked for has been recorded, so
a failed run leaves the corpus as it was."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

from tests.live import Live
from tests.replay.corpus import HISTORIES, SCENARIOS, file_name
from tests.replay.scenarios import SCENARIOS as DRIVERS


async def histories_of(lv: Live) -> dict[str, str]:
    """workflow id -> its latest run's history as JSON, for every workflow the stack ran."""
    ids = sorted({w.id async for w in lv.client.list_workflows()})
    return {wid: (await lv.client.get_workflow_handle(wid).fetch_history()).to_json() for wid in ids}


async def record(name: str) -> dict[str, str]:
    """Run scenario ``name`` on a fresh stack; file name -> history JSON."""
    sc = DRIVERS[name]
    with tempfile.TemporaryDirectory(prefix=f"replay-{name}-") as tmp:
        lv = await Live(tmp).start(sc.hosts)
        try:
            await sc.drive(lv)
            got = await histories_of(lv)
        finally:
            lv.close()
    return {file_name(name, wid): text for wid, text in got.items()}


def write(out: str, files: dict[str, str], only: list[str]) -> None:
    os.makedirs(out, exist_ok=True)
    for old in os.listdir(out):  # the scenarios recorded again replace all of theirs
        if old.endswith(".json") and old.split("__", 1)[0] in only:
            os.remove(os.path.join(out, old))
    for fname, text in sorted(files.items()):
        with open(os.path.join(out, fname), "w") as f:
            f.write(text + "\n")


async def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.replay.record", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=HISTORIES, help="where the histories go (default: the committed corpus)")
    p.add_argument("--only", nargs="+", choices=SCENARIOS, default=list(SCENARIOS), help="these scenarios only")
    a = p.parse_args(argv)
    files: dict[str, str] = {}
    for name in a.only:
        t0 = time.monotonic()
        got = await record(name)
        print(f"{name}: {len(got)} histories, {sum(map(len, got.values())) // 1024} KiB, "
              f"{time.monotonic() - t0:.0f} s", flush=True)
        files.update(got)
    write(a.out, files, a.only)
    print(f"{len(files)} histories written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
