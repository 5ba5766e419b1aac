"""What each worker can still give: total minus claims, system reserve and foreign use.

GPUStack counts claims only. We also honour what the host observes: ``vram_foreign``, memory
held by processes gpuflow did not start (NVML lists each process), is never offered, and
``vram_used`` (everything in use) covers gpuflow processes that grew past their claims
(GPUStack #6044). Per GPU:
allocatable = max(total - reserve - max(claimed + foreign x (1 + margin), used), 0), where the
margin (``PolicyConfig.foreign_memory_margin``, scheduler/foreign.py) allows for foreign growth.
Subordinate claims count on their own workers, RAM included (GPUStack forgets subordinate RAM).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.cluster import ClusterSnapshot, Instance, Worker
from scheduler.foreign import with_margin


@dataclass
class Allocated:
    ram: int = 0
    vram: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Allocatable:
    ram: int
    vram: dict[int, int]  # GPU index -> bytes

    @property
    def vram_total(self) -> int:
        return sum(self.vram.values())


def allocated_by_worker(instances: list[Instance]) -> dict[str, Allocated]:
    out: dict[str, Allocated] = {}
    for inst in instances:
        parts = [(inst.worker, inst.claim)] + [(s.worker, s.claim) for s in inst.subordinates]
        for worker, claim in parts:
            if worker is None:
                continue
            a = out.setdefault(worker, Allocated())
            a.ram += claim.ram
            for idx, b in claim.vram.items():
                a.vram[idx] = a.vram.get(idx, 0) + b
    return out


def allocatable(worker: Worker, allocated: Allocated | None, margin: float = 0.0) -> Allocatable:
    a = allocated or Allocated()
    vram = {}
    for g in worker.gpus:
        claimed = a.vram.get(g.index, 0)
        used = max(claimed + with_margin(g.vram_foreign, margin), g.vram_used or 0)
        vram[g.index] = max(g.vram_total - worker.reserved.vram - used, 0)
    ram = max(worker.ram_total - a.ram - worker.reserved.ram, 0)
    if worker.unified_memory:
        ram = max(ram - worker.reserved.vram - sum(a.vram.values()), 0)
        if vram:
            first = min(vram)
            vram[first] = min(ram, vram[first])
    return Allocatable(ram=ram, vram=vram)


def allocatable_map(snapshot: ClusterSnapshot, exclude: str | None = None) -> dict[str, Allocatable]:
    """Allocatable for every worker; ``exclude`` drops one instance's own claim (re-placement)."""
    insts = [i for i in snapshot.instances if i.name != exclude]
    by = allocated_by_worker(insts)
    return {w.name: allocatable(w, by.get(w.name)) for w in snapshot.workers}
