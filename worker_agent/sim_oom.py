"""Simulated out-of-memory: on a host of simulated GPUs (an inventory file, as ``gpuflow dev`` and
``gpuflow simulate`` run agents), a replica whose simulated use (memory_probe.py ClaimShare: its
claim times GPUFLOW_SIMULATED_VRAM_USE or --vram-use-ratio) passes what its GPU has free dies as an
engine's CUDA OOM would: the agent writes the engine's error to its log and kills it, so its
supervision reports the exit with that line (worker_agent/supervision.py), and the instance workflow
places it again (workflows/instance_machine.py).

The judge (``victims``) is pure. Per GPU, what gpuflow's replicas may hold is the card's total less
what other processes hold (worker_agent/inventory.py ``free_for_gpuflow``: the inventory's
``vram_used_by_others``). The replicas take their use in the order they started (the one that
allocated first holds its memory); the first whose use no longer fits dies, and its use is not
counted against the ones after it. A replica across several GPUs dies when any of them is full."""

from __future__ import annotations

import signal
from dataclasses import dataclass

from scheduler.claim_apply import is_oom  # noqa: F401  (where the workflow reads it)
from scheduler.units import gib

OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory (simulated)"  # what is_oom reads, as an engine writes it


@dataclass(frozen=True)
class Use:
    key: str  # the process key
    gpus: dict[int, int]  # GPU index -> simulated bytes in use


def victims(free: dict[int, int], uses: list[Use], foreign: dict[int, int] | None = None) -> dict[str, str]:
    """key -> the OOM message, for each replica of ``uses`` (in start order) whose use passes what its
    GPU has free (``free``: bytes gpuflow's processes may hold per GPU; a GPU not named is not judged)."""
    held: dict[int, int] = {}
    out: dict[str, str] = {}
    for u in uses:
        bad = next((i for i, b in sorted(u.gpus.items()) if i in free and held.get(i, 0) + b > free[i]), None)
        if bad is None:
            for i, b in u.gpus.items():
                held[i] = held.get(i, 0) + b
            continue
        left = max(free[bad] - held.get(bad, 0), 0)
        others = (foreign or {}).get(bad, 0)
        out[u.key] = (f"{OOM_LINE}: tried to hold {gib(u.gpus[bad])} GiB on GPU {bad} with {gib(left)} GiB free"
                      + (f" ({gib(others)} GiB used by other processes)" if others else ""))
    return out


def kill(table, key: str, pid: int, message: str) -> None:
    """End ``key``'s process as an OOM would: the message in its log, then SIGKILL."""
    with open(table.log_path(key), "a") as f:
        f.write(message + "\n")
    table.signal_group(pid, signal.SIGKILL)
