"""How much memory each replica's processes hold on this host: the seam the agent's usage book
(worker_agent/usage.py) samples through, with a real and a simulated side.

- ``NvmlProbe``: GPU memory from NVML's per-process list (``nvmlDeviceGetComputeRunningProcesses``,
  and the graphics list, as inventory.py reads them) summed over the replica's process tree, and
  the tree's RSS from /proc. The tree is the leader (the process the agent started, in its own
  session) with every process in that session and every descendant by parent pid, so an engine's
  workers (vLLM's per-GPU processes, a Ray worker) count, and so does a child that left the session.
- ``ClaimShare``: a simulated host has no driver to ask; its use is the claim times a ratio
  (``gpuflow simulate --vram-use-ratio``, default 0.9), or the replica's own share (its spec's
  ``env: {GPUFLOW_SIMULATED_VRAM_USE: "0.5"}``) of what its spec states (``resources.vram``, so a
  smaller learned claim does not shrink what the replica needs), else of its claim. RSS is measured where the process is real
  (a dev agent over an inventory file), else the RAM claim times the same ratio.

A probe answers key -> ``Held`` for the keys given (process key -> leader pid, with claims); a
key whose processes are gone is left out."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Protocol

from worker_agent.nvml_procs import gpu_processes, nvml_session

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class Proc:
    """One process key the agent runs: its leader pid, and what its instance claimed here."""

    key: str
    pid: int
    vram_claim: dict[int, int] = field(default_factory=dict)
    ram_claim: int = 0
    share: float | None = None  # simulated hosts: its spec's GPUFLOW_SIMULATED_VRAM_USE (None: the host's ratio)
    stated: int = 0  # simulated hosts: the VRAM its spec states (resources.vram), the base of its use (0: the claim)


@dataclass
class Held:
    gpus: dict[int, int] | None  # GPU index -> bytes; None: this host cannot say per process
    rss: int
    measured: str  # nvml | simulated | none (contracts/usage.py Measured)


class MemoryProbe(Protocol):
    def __call__(self, procs: list[Proc]) -> dict[str, Held]: ...


@dataclass(frozen=True)
class ProcInfo:
    ppid: int
    session: int
    rss: int  # bytes


def read_procs(root: str = "/proc") -> dict[int, ProcInfo]:
    """Every process this host shows: pid -> (parent, session, RSS), from /proc/<pid>/stat (one read
    each; a process that ends meanwhile is skipped)."""
    out: dict[int, ProcInfo] = {}
    try:
        names = os.listdir(root)
    except OSError:
        return out
    for n in names:
        if not n.isdigit():
            continue
        try:
            with open(f"{root}/{n}/stat", "rb") as f:
                rest = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        try:  # after the name: state ppid pgrp session ... (rss is field 24, the 22nd after the name)
            out[int(n)] = ProcInfo(ppid=int(rest[1]), session=int(rest[3]), rss=int(rest[21]) * PAGE)
        except (IndexError, ValueError):
            continue
    return out


def trees(leaders: dict[str, int], procs: dict[int, ProcInfo]) -> dict[str, set[int]]:
    """key -> the pids of its process tree: the leader, its session, and their descendants. Keys whose
    leader is not running here are left out."""
    children: dict[int, list[int]] = {}
    sessions: dict[int, list[int]] = {}
    for pid, info in procs.items():
        children.setdefault(info.ppid, []).append(pid)
        sessions.setdefault(info.session, []).append(pid)
    out = {}
    for key, leader in leaders.items():
        if leader not in procs:
            continue
        seen, todo = set(), [leader, *sessions.get(leader, [])]
        while todo:
            p = todo.pop()
            if p not in seen:
                seen.add(p)
                todo.extend(children.get(p, []))
        out[key] = seen
    return out


class NvmlProbe:
    """Real hosts: NVML per process, over each replica's process tree; ``nvml`` is pynvml (default)
    or an in-memory fake in tests; ``proc_root`` is /proc."""

    def __init__(self, nvml=None, proc_root: str = "/proc"):
        self.nvml, self.proc_root = nvml, proc_root

    def __call__(self, procs: list[Proc]) -> dict[str, Held]:
        table = read_procs(self.proc_root)
        tree = trees({p.key: p.pid for p in procs}, table)
        per_card = self._cards()
        out = {}
        for key, pids in tree.items():
            rss = sum(table[p].rss for p in pids)
            if per_card is None:
                out[key] = Held(None, rss, "none")
                continue
            gpus = {i: sum(b or 0 for p, b in held.items() if p in pids) for i, held in per_card.items()}
            out[key] = Held({i: b for i, b in gpus.items() if b}, rss, "nvml")
        return out

    def _cards(self) -> dict[int, dict[int, int | None]] | None:
        """GPU index -> {pid: bytes} from NVML; None without NVML or when no card lists processes."""
        with nvml_session(self.nvml) as nv:
            if nv is None:
                return None
            cards = {}
            for i in range(nv.nvmlDeviceGetCount()):
                held = gpu_processes(nv, nv.nvmlDeviceGetHandleByIndex(i))
                if held is not None:
                    cards[i] = held
            return cards or None


class ClaimShare:
    """Simulated hosts: the claim times ``ratio`` on each card; RSS measured when the process is real."""

    def __init__(self, ratio: float = 0.9, proc_root: str = "/proc"):
        if not 0 <= ratio <= 4:
            raise ValueError(f"the VRAM use ratio is a share of the claim between 0 and 4, got {ratio:g}")
        self.ratio, self.proc_root = ratio, proc_root

    def __call__(self, procs: list[Proc]) -> dict[str, Held]:
        real = [p for p in procs if p.pid < 2**22]  # the simulator's pids start above any kernel's pid_max
        table = read_procs(self.proc_root) if real else {}
        tree = trees({p.key: p.pid for p in real}, table)
        out = {}
        for p in procs:
            rss = sum(table[q].rss for q in tree[p.key]) if p.key in tree else int(p.ram_claim * self.ratio)
            out[p.key] = Held(simulated_use(p, self.ratio), rss, "simulated")
        return out


def simulated_use(p: Proc, ratio: float) -> dict[int, int]:
    """GPU index -> bytes a simulated replica uses: its share (else ``ratio``) of its base, the VRAM
    its spec states spread over its GPUs as its claim is (else the claim itself)."""
    share = ratio if p.share is None else p.share
    total = sum(p.vram_claim.values())
    scale = p.stated / total if p.stated and total else 1.0
    return {i: int(b * scale * share) for i, b in p.vram_claim.items()}
