"""GPU types as flavors (Kueue's ResourceFlavors): a tenant's guarantee and limit per GPU model.

A tenant that lists ``flavors`` uses only GPUs whose model matches one of them; ``"*"`` matches
every model no other key of the tenant matches. A key matches a GPU's reported name as a word,
case-insensitive: ``H100`` matches ``NVIDIA H100 80GB HBM3`` but not ``H1000``; the first key
listed that matches wins, ``"*"`` last. A tenant without ``flavors`` uses any model, and its
quota counts every GPU alike (the file's meaning before flavors).

What a replica holds on a flavor: each GPU of that flavor it holds counts 1 GPU and the VRAM
claimed there; its RAM counts on the flavor of its first GPU. Example, a tenant with
``{H100: {limit: {gpus: 4}}, "*": {}}`` and a replica on GPUs 0-1 (H100) of one worker and GPU 0
(A100) of another: H100 2 GPUs, ``*`` 1 GPU.

``restrict`` hides the GPUs a tenant may not use from the decision (the filters and selectors
then never see them); ``only`` keeps just some models (a borrower trying its cohort's first)."""

from __future__ import annotations

import re
from functools import lru_cache

from scheduler.cluster import ClusterSnapshot, Instance
from scheduler.decision import Candidate
from scheduler.tenancy.config import Tenant
from scheduler.tenancy.usage import Usage

ANY = "*"


@lru_cache(maxsize=4096)
def _word(key: str) -> re.Pattern:
    return re.compile(r"(?<![A-Za-z0-9])" + re.escape(key) + r"(?![A-Za-z0-9])", re.IGNORECASE)


def flavor_of(t: Tenant, gpu_name: str) -> str | None:
    """``t``'s flavor key for a GPU called ``gpu_name``; None when ``t`` may not use it. A tenant
    without flavors: ``"*"`` for every GPU."""
    if not t.flavors:
        return ANY
    for k in t.flavors:
        if k != ANY and _word(k).search(gpu_name):
            return k
    return ANY if ANY in t.flavors else None


def gpu_names(snap: ClusterSnapshot) -> dict[tuple[str, int], str]:
    """(worker, GPU index) -> the GPU's reported model name."""
    return {(w.name, g.index): g.name for w in snap.workers for g in w.gpus}


def restrict(snap: ClusterSnapshot, t: Tenant) -> ClusterSnapshot:
    """``snap`` with only the GPUs ``t`` may use (itself when ``t`` lists no flavors)."""
    if not t.flavors or ANY in t.flavors:  # every model allowed
        return snap
    return keep_gpus(snap, lambda w, g: flavor_of(t, g.name) is not None)


def only(snap: ClusterSnapshot, t: Tenant, keys: set[str]) -> ClusterSnapshot:
    """``snap`` with only the GPUs of ``t``'s flavors ``keys``."""
    return keep_gpus(snap, lambda w, g: flavor_of(t, g.name) in keys)


def keep_gpus(snap: ClusterSnapshot, keep) -> ClusterSnapshot:
    """``snap`` whose workers list only the GPUs ``keep(worker name, gpu)`` accepts; the instances
    stay (their claims on hidden GPUs count nowhere the decision looks)."""
    workers, changed = [], False
    for w in snap.workers:
        gpus = [g for g in w.gpus if keep(w.name, g)]
        if len(gpus) != len(w.gpus):
            changed = True
            w = w.model_copy(update={"gpus": gpus})
        workers.append(w)
    return snap.model_copy(update={"workers": workers}) if changed else snap


def _parts(x):
    yield x.worker, x.gpu_indexes, x.claim
    for s in x.subordinates:
        yield s.worker, s.gpu_indexes, s.claim


def held(t: Tenant, x: Instance | Candidate, names: dict[tuple[str, int], str]) -> dict[str, Usage]:
    """What ``x`` holds on each of ``t``'s flavors (module docstring); {} for a tenant without flavors."""
    if not t.flavors:
        return {}
    out: dict[str, Usage] = {}
    ram_on: str | None = None
    for w, gpus, claim in _parts(x):
        for i in gpus:
            k = flavor_of(t, names.get((w, i), "")) or ANY
            ram_on = ram_on or k
            out[k] = out.get(k, Usage()) + Usage(gpus=1, vram=claim.vram.get(i, 0))
    if ram_on is not None:
        ram = sum(c.ram for _, _, c in _parts(x))
        out[ram_on] = out[ram_on] + Usage(ram=ram)
    return out


def add(a: dict[str, Usage], b: dict[str, Usage]) -> dict[str, Usage]:
    out = dict(a)
    for k, u in b.items():
        out[k] = out.get(k, Usage()) + u
    return out


def used_by(t: Tenant, instances: list[Instance], names: dict[tuple[str, int], str]) -> dict[str, Usage]:
    """What ``instances`` (the tenant's own) hold on each of ``t``'s flavors."""
    out: dict[str, Usage] = {}
    for i in instances:
        if i.worker is not None:
            out = add(out, held(t, i, names))
    return out
