"""The capacity hook: where the autoscaler reports demand the cluster cannot place, for a
node-pool autoscaler (Cluster Autoscaler, Karpenter, a cloud script) to act on.

``gpuflow server --capacity-hook HOOK`` (or ``GPUFLOW_CAPACITY_HOOK``): an ``http://`` or
``https://`` URL gets the demand as a JSON POST; anything else is a command, split with shlex and
run without a shell, with the JSON on its standard input. The hook is the operator's, not a
deployer's: nothing in a spec can name one. A hook that fails or hangs is logged and never fails
the autoscaler; it is called again at the next blocked decision. The JSON (one object):

    {"deployment": "chat", "replicas": 2, "backend": "vllm",
     "per_replica": {"gpus": 2, "vram_bytes": ..., "vram_per_gpu_bytes": ..., "ram_bytes": ...},
     "worker_selector": {...}, "gpu_selector": {...}, "cluster": "default",
     "reasons": ["the scheduler's reasons for the first replica that did not fit"]}
"""

from __future__ import annotations

import json
import logging
import shlex
import subprocess
import urllib.request
from dataclasses import dataclass

log = logging.getLogger("gpuflow.capacity_hook")


@dataclass(frozen=True)
class HookResult:
    ok: bool
    detail: str


def call(hook: str, demand: dict, timeout_s: float = 10.0) -> HookResult:
    body = json.dumps(demand, sort_keys=True).encode()
    try:
        if hook.startswith(("http://", "https://")):
            req = urllib.request.Request(hook, data=body, method="POST", headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                return HookResult(True, f"HTTP {r.status}")
        argv = shlex.split(hook)
        p = subprocess.run(argv, input=body, capture_output=True, timeout=timeout_s, close_fds=True)
        detail = (p.stdout or p.stderr).decode(errors="replace").strip()[-500:]
        if p.returncode != 0:
            log.warning("capacity hook %s exited %d: %s", argv[0], p.returncode, detail)
        return HookResult(p.returncode == 0, f"exit {p.returncode}" + (f": {detail}" if detail else ""))
    except (OSError, ValueError, subprocess.SubprocessError) as e:  # unreachable URL, missing program, timeout
        log.warning("capacity hook %r failed: %s", hook, e)
        return HookResult(False, f"{type(e).__name__}: {e}")
