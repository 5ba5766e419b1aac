"""The console's screenshots in docs/images/ (issues 28, 36), taken as a user sees the pages: the stack
``make demo`` starts (``gpuflow dev --demo``: simulated hosts, three deployments of stand-in
servers and the real SmolLM2 model on llama.cpp), one more deployment too big to place (PENDING),
then Playwright driving Debian's chromium over the console, the playground asking SmolLM2.

    .venv/bin/python docs/screenshots.py     # writes docs/images/console-*.png (a few minutes)"""

from __future__ import annotations

import pathlib
import shutil
import sys
import tempfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.console_browser import Watched, browser  # noqa: E402
from tests.dev_stack import Dev, until  # noqa: E402

HUGE = {"name": "huge", "backend": "custom", "source": {"local_path": "/models/huge"},
        "run_command": "gpuflow standin --port {port} --host {host}", "resources": {"vram": "400 GiB", "ram": "2 GiB"}}


def shoot(w: Watched, path: str, name: str) -> None:
    w.open(path).screenshot(path=str(ROOT / "docs" / "images" / f"console-{name}.png"), full_page=True)
    print(f"docs/images/console-{name}.png: {path}", flush=True)


def main() -> None:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="gpuflow-shots-"))
    dev = Dev(tmp, args=("--demo",), up_s=900)
    try:
        (tmp / "huge.yaml").write_text(yaml.safe_dump(HUGE))
        dev.run("deploy", str(tmp / "huge.yaml"))
        until("huge waits", lambda: [i["state"] for i in dev.instances("huge")] == ["pending"], timeout=60)
        base = f"http://127.0.0.1:{dev.gw_port}"
        chat = sorted(i["name"] for i in dev.instances("chat-8b") if i["state"] == "running")[0]
        with browser() as b:
            w = Watched(b, base)
            page = w.open("/console/playground?model=smollm2")
            page.fill("#message", "In one sentence: what is a GPU?")
            page.keyboard.press("Enter")
            page.locator(".turn.assistant .figures").last.wait_for(timeout=120_000)
            page.screenshot(path=str(ROOT / "docs" / "images" / "console-playground.png"), full_page=True)
            print("docs/images/console-playground.png: /console/playground?model=smollm2", flush=True)
            for name, path in [("overview", "/console/"), ("deployment", "/console/deployments/smollm2"),
                               ("decision", f"/console/replicas/{chat}"), ("pending", "/console/replicas/huge-0"),
                               ("queue", "/console/queue"), ("tenants", "/console/tenants")]:
                shoot(w, path, name)
            w.check()
    finally:
        dev.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
