"""Topology: prefer the GPU set that is best joined (scheduler/interconnect.py), so that among
sets that fit equally well a tensor-parallel replica gets NVLink before one PCIe switch, before
one NUMA node, before a path across CPU sockets.

score = the interconnect score of the candidate's GPUs on its main worker (nvlink 100, internal
90, single switch 80, multiple switches 70, host bridge 60, NUMA node 50, across sockets or
unknown 0); one GPU has nothing to join and loses nothing (100); a placement across workers
(joined by the network) or on the CPU only scores 0. The chain runs this scorer only when some worker
reports topology, so clusters without it decide exactly as before (GPUStack has no topology).
"""

from __future__ import annotations

from scheduler import interconnect
from scheduler.cluster import ClusterSnapshot


def applies(snapshot: ClusterSnapshot) -> bool:
    return any(interconnect.reports(w) for w in snapshot.workers)


def links(snapshot: ClusterSnapshot, cands) -> list[str | None]:
    """The level joining each candidate's GPUs: ``network`` across workers, None for fewer than
    two GPUs or where the worker does not say."""
    workers = {w.name: w for w in snapshot.workers}
    out = []
    for c in cands:
        w = workers.get(c.worker)
        if c.subordinates:
            out.append("network")
        else:
            out.append(interconnect.level(w, c.gpu_indexes) if w is not None and len(c.gpu_indexes) > 1 else None)
    return out


def scores(snapshot: ClusterSnapshot, cands) -> list[float]:
    return [100.0 if len(c.gpu_indexes) == 1 and not c.subordinates else interconnect.SCORE.get(lv or "", 0.0)
            for c, lv in zip(cands, links(snapshot, cands))]
