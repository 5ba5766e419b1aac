"""What a replica holds and what each tenant uses: GPUs (each GPU a replica holds, on any of its
workers, counts 1), VRAM and RAM bytes claimed."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.cluster import Instance
from scheduler.decision import Candidate


@dataclass(frozen=True)
class Usage:
    gpus: int = 0
    vram: int = 0
    ram: int = 0

    def __add__(self, o: "Usage") -> "Usage":
        return Usage(self.gpus + o.gpus, self.vram + o.vram, self.ram + o.ram)

    def __sub__(self, o: "Usage") -> "Usage":
        return Usage(self.gpus - o.gpus, self.vram - o.vram, self.ram - o.ram)


def of_instance(i: Instance) -> Usage:
    parts = [(i.gpu_indexes, i.claim)] + [(s.gpu_indexes, s.claim) for s in i.subordinates]
    return Usage(gpus=sum(len(g) for g, _ in parts), vram=sum(c.vram_total for _, c in parts),
                 ram=sum(c.ram for _, c in parts))


def of_candidate(c: Candidate) -> Usage:
    parts = [(c.gpu_indexes, c.claim)] + [(s.gpu_indexes, s.claim) for s in c.subordinates]
    return Usage(gpus=sum(len(g) for g, _ in parts), vram=sum(sum(cl.vram.values()) for _, cl in parts),
                 ram=sum(cl.ram for _, cl in parts))


def by_tenant(instances: list[Instance], tenant_of: dict[str, str]) -> dict[str, Usage]:
    """``tenant_of``: deployment (the instance's model) -> tenant; unknown ones are ``default``."""
    out: dict[str, Usage] = {}
    for i in instances:
        if i.worker is None:
            continue
        t = tenant_of.get(i.model, "default")
        out[t] = out.get(t, Usage()) + of_instance(i)
    return out
