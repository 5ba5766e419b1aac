"""Randomized cluster snapshots (seeded) for the tests that compare two ways of computing one
thing: GPUs with and without topology, claims, subordinates, unplaced instances, model files."""

from __future__ import annotations

import random

from scheduler.units import GiB

MODELS = ["m", "other", "third"]
SOURCE = "huggingface:o/m"


def gpus(r: random.Random, n: int) -> list[dict]:
    topo = r.random() < 0.3
    out = []
    for i in range(n):
        g = {"index": i, "vram_total": r.choice([16, 24, 48, 80]) * GiB, "type": r.choice(["cuda"] * 5 + ["rocm"])}
        if r.random() < 0.3:
            g["vram_used"] = r.randint(0, 20) * GiB
        if r.random() < 0.2:
            g["vram_foreign"] = r.randint(0, 4) * GiB
        if topo:
            g["numa_node"] = i * 2 // max(n, 1)
            if r.random() < 0.5:
                g["pcie_switch"] = f"s{i // 2}"
            if r.random() < 0.4:
                g["nvlink_peers"] = [j for j in range(n) if j != i and j // 4 == i // 4]
        out.append(g)
    return out


def worker(r: random.Random, name: str) -> dict:
    n = r.choice([0, 1, 2, 4, 8, 8])
    return {"name": name, "ram_total": r.choice([32, 128, 512]) * GiB, "gpus": gpus(r, n),
            "state": r.choice(["ready"] * 8 + ["not_ready"]), "labels": {"zone": r.choice("ab")},
            "unified_memory": n == 1 and r.random() < 0.2,
            "reserved": {"ram": r.randint(0, 4) * GiB, "vram": r.randint(0, 2) * GiB}}


def part(r: random.Random, w: dict) -> dict:
    idx = [g["index"] for g in w["gpus"]]
    chosen = r.sample(idx, r.randint(0, min(3, len(idx)))) if idx else []
    return {"worker": w["name"], "gpu_indexes": chosen,
            "claim": {"ram": r.randint(0, 8) * GiB, "vram": {i: r.randint(0, 30) * GiB for i in chosen}}}


def instance(r: random.Random, name: str, workers: list[dict]) -> dict:
    d = {"name": name, "model": r.choice(MODELS), "state": r.choice(["running"] * 6 + ["starting", "error"])}
    if workers and r.random() < 0.9:  # else not placed yet: it holds nothing
        d.update(part(r, r.choice(workers)))
        if r.random() < 0.15:
            d["subordinates"] = [part(r, r.choice(workers)) for _ in range(r.randint(1, 2))]
    return d


def snapshot_dict(seed: int) -> dict:
    r = random.Random(seed)
    workers = [worker(r, f"w{k}") for k in range(r.randint(1, 12))]
    instances = [instance(r, f"i{k}", workers) for k in range(r.randint(0, 30))]
    files = [{"worker": w["name"], "source": SOURCE} for w in workers if r.random() < 0.2]
    return {"workers": workers, "instances": instances, "model_files": files}


def changed(seed: int, d: dict) -> dict:
    """``d`` after a burst of changes: instances booked, moved, released and created, a host
    replaced by a new report, one leaving and one joining."""
    r = random.Random(seed + 10_000)
    workers = [dict(w) for w in d["workers"]]
    if len(workers) > 1 and r.random() < 0.5:
        workers.pop(r.randrange(len(workers)))
    for w in workers:
        if r.random() < 0.2:
            w["gpus"] = gpus(r, len(w["gpus"]))  # the agent reports again (used memory, topology)
    if r.random() < 0.5:
        workers.append(worker(r, "joined"))
    names = {w["name"] for w in workers}
    insts = []
    for i in d["instances"]:
        if r.random() < 0.2:
            continue  # gone
        if r.random() < 0.3:
            i = instance(r, i["name"], workers)  # re-placed or re-claimed
        parts = [i.get("worker")] + [s["worker"] for s in i.get("subordinates", [])]
        if any(p is not None and p not in names for p in parts):
            i = {"name": i["name"], "model": i["model"]}  # its host left: unplaced
        insts.append(i)
    insts += [instance(r, f"new{k}", workers) for k in range(r.randint(0, 5))]
    return {"workers": workers, "instances": insts, "model_files": d["model_files"]}
