"""How formation hands a role's members to the workers of a domain, and how it ranks the domains
of one layer that hold the group (GPUStack 2.3.0: group_solver.py _share_out, _pick;
group_capacity.py _one_gpu_size_only; group_placement_scorer.py).

- ``share_out``: the roomiest worker first, one member at a time round the ranked workers (not
  "fill the first"), so the roles mix: ranked by room (most slots), then fewest of this group's
  members already there, then a worker holding the model's files, then the worker's place in the
  snapshot (GPUStack's worker id, its creation order).
- ``one_size``: a role's members sit on GPUs of one size (a member books a fraction of its card, so
  a smaller card holds a smaller KV cache the router cannot tell apart): workers are banded by their
  largest GPU (a band's smallest at least 0.9 of its largest), the band holding the most members
  wins (then the bigger card, then the earlier worker), every other band's workers get 0 slots.
- ``rank``: among one layer's fitting placements, those splitting no member over workers first,
  then the highest ``PAIR_WEIGHT * pair + FILE_WEIGHT * file``, ties to the earlier (smaller)
  domain. pair = sum_j p_j * d_j / (x * y), the share of prefill/decode pairs on one host (a member
  spanning hosts: |its hosts & the decode's| / |its hosts|); file = the members' mean share of hosts
  holding the model's files (0 when no host holds them: the term is off).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.groups.spec import RoleName

PAIR_WEIGHT = 1.0  # GPUStack's SCHEDULER_GROUP_PAIR_LOCALITY_WEIGHT
FILE_WEIGHT = 0.3  # GPUStack's SCHEDULER_GROUP_FILE_LOCALITY_WEIGHT
SIZE_TOLERANCE = 0.9  # two cards are one size when the smaller is at least this share of the larger


def share_out(slots: dict[str, int], replicas: int, load: dict[str, int], warm: set[str],
              order: dict[str, int]) -> list[tuple[str, int]] | None:
    """(worker, members) for ``replicas`` members, in the ranked order; None when the slots fall short."""
    if replicas <= 0:
        return []
    if sum(slots.values()) < replicas:
        return None
    miss = len(warm) + 1
    ranked = sorted(slots, key=lambda w: (-slots[w], load.get(w, 0), 0 if w in warm else miss, order[w]))
    taken: dict[str, int] = {}
    left = replicas
    while left:
        for w in ranked:
            if left and taken.get(w, 0) < slots[w]:
                taken[w] = taken.get(w, 0) + 1
                left -= 1
    return [(w, taken[w]) for w in ranked if w in taken]


def bands(sizes: dict[str, int], order: dict[str, int]) -> list[list[str]]:
    """Workers by the size of their largest GPU, smallest band first; workers without one left out."""
    out: list[list[str]] = []
    smallest = 0
    for w in sorted(sizes, key=lambda x: (sizes[x], order[x])):
        if not out or smallest < sizes[w] * SIZE_TOLERANCE:
            out.append([])
            smallest = sizes[w]
        out[-1].append(w)
    return out


def one_size(slots: dict[str, int], sizes: dict[str, int], order: dict[str, int]) -> tuple[dict[str, int], int | None]:
    """``slots`` with every band but the winner's zeroed, and the members the winner holds (None:
    one band or none, nothing narrowed). ``sizes``: the eligible workers' largest GPU."""
    bs = bands({w: s for w, s in sizes.items() if w in slots}, order)
    if len(bs) < 2:
        return slots, None
    best = min(bs, key=lambda b: (-sum(slots[w] for w in b), -max(sizes[w] for w in b), min(order[w] for w in b)))
    keep = set(best)
    return {w: (n if w in keep or w not in sizes else 0) for w, n in slots.items()}, sum(slots[w] for w in best)


@dataclass
class Placed:
    """One way the whole group fits in one domain: each gang member's role and workers (main first)."""

    spans: list[tuple[RoleName, list[str]]] = field(default_factory=list)

    def splits_a_member(self) -> bool:
        return any(len(ws) > 1 for _, ws in self.spans)


def pair_locality(p: Placed) -> float:
    pre = [set(ws) for r, ws in p.spans if r == RoleName.PREFILL]
    dec = [set(ws) for r, ws in p.spans if r == RoleName.DECODE]
    if not pre or not dec:
        return 0.0
    return sum(len(a & b) / len(a) for a in pre for b in dec) / (len(pre) * len(dec))


def file_locality(p: Placed, warm: set[str]) -> float:
    if not warm or not p.spans:
        return 0.0
    return sum(len([w for w in ws if w in warm]) / len(ws) for _, ws in p.spans) / len(p.spans)


def terms(p: Placed, warm: set[str]) -> dict[str, float]:
    out = {"pair": pair_locality(p)} if PAIR_WEIGHT > 0 else {}
    if FILE_WEIGHT > 0 and warm:
        out["file"] = file_locality(p, warm)
    return out


def total(t: dict[str, float]) -> float:
    return PAIR_WEIGHT * t.get("pair", 0.0) + FILE_WEIGHT * t.get("file", 0.0)


def rank(fits: list, placed_of, warm: set[str]) -> tuple[int, dict[str, float]]:
    """The index of the best of ``fits`` (``placed_of(fit)`` -> Placed) and its terms."""
    field_ = [k for k, f in enumerate(fits) if not placed_of(f).splits_a_member()] or list(range(len(fits)))
    best, best_t = field_[0], terms(placed_of(fits[field_[0]]), warm)
    for k in field_[1:]:
        t = terms(placed_of(fits[k]), warm)
        if total(t) > total(best_t):
            best, best_t = k, t
    return best, best_t
