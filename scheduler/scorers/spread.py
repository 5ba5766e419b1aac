"""Spread: prefer workers and GPUs running fewer instances, this model's counting most.

Counts come from every placed instance (any state): per worker ``cur`` (this model) and ``oth``
(other models) GPU slots, per GPU likewise; an instance without GPUs counts one slot.
With inv(v, lo, hi) = 1 if hi <= lo else 1 - (v - lo)/(hi - lo) over the workers compared:
  some worker has no instance of this model:
      cur == 0: w = 0.85 + 0.15*inv(oth)      else: w = 0.45 + 0.35*inv(cur) + 0.20*inv(oth)
  otherwise:  w = 0.50 + 0.25*inv(cur) + 0.15*inv(oth)
  GPUs: g = mean_i 1/(1 + cur_i + 0.2*oth_i);  score = (0.85*w + 0.15*g)*100 (w*100 without GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.cluster import Instance


@dataclass
class Counts:
    cur: int = 0
    oth: int = 0
    gpu_cur: dict[int, int] = field(default_factory=dict)
    gpu_oth: dict[int, int] = field(default_factory=dict)


def count(instances: list[Instance], model: str) -> dict[str, Counts]:
    out: dict[str, Counts] = {}
    for inst in instances:
        mine = inst.model == model
        for worker, gpus in [(inst.worker, inst.gpu_indexes)] + [(s.worker, s.gpu_indexes) for s in inst.subordinates]:
            if worker is None:
                continue
            c = out.setdefault(worker, Counts())
            if not gpus:
                c.cur += mine
                c.oth += not mine
            for g in gpus:
                if mine:
                    c.cur += 1
                    c.gpu_cur[g] = c.gpu_cur.get(g, 0) + 1
                else:
                    c.oth += 1
                    c.gpu_oth[g] = c.gpu_oth.get(g, 0) + 1
    return out


def _inv(v: float, lo: float, hi: float) -> float:
    return 1.0 if hi <= lo else 1.0 - (v - lo) / (hi - lo)


NONE = Counts()  # a worker holding no instance (never changed)


def _worker_scores(counts: dict[str, Counts], compared: list[str]):
    """w for a worker (memoised), with stats taken over the ``compared`` workers."""
    stats = [counts.get(w, NONE) for w in dict.fromkeys(compared)]
    any_zero = any(c.cur == 0 for c in stats)
    lo_c, hi_c = min((c.cur for c in stats), default=0), max((c.cur for c in stats), default=0)
    lo_o, hi_o = min((c.oth for c in stats), default=0), max((c.oth for c in stats), default=0)
    memo: dict[str, float] = {}

    def w_of(worker: str, c: Counts) -> float:
        w = memo.get(worker)
        if w is None:
            if any_zero:
                w = 0.85 + 0.15 * _inv(c.oth, lo_o, hi_o) if c.cur == 0 else \
                    0.45 + 0.35 * _inv(c.cur, lo_c, hi_c) + 0.20 * _inv(c.oth, lo_o, hi_o)
            else:
                w = 0.50 + 0.25 * _inv(c.cur, lo_c, hi_c) + 0.15 * _inv(c.oth, lo_o, hi_o)
            memo[worker] = w
        return w

    return w_of


def _gpu(c: Counts, i: int) -> float:
    return 1 / (1 + c.gpu_cur.get(i, 0) + 0.2 * c.gpu_oth.get(i, 0))


def scores(placements: list[tuple[str, list[int]]], counts: dict[str, Counts], compared: list[str]) -> list[float]:
    """Spread score per (worker, gpu_indexes); stats are taken over the ``compared`` workers."""
    w_of = _worker_scores(counts, compared)
    out = []
    for worker, gpus in placements:
        c = counts.get(worker, NONE)
        w = w_of(worker, c)
        if gpus:
            g = sum(_gpu(c, i) for i in gpus) / len(gpus)
            out.append((0.85 * w + 0.15 * g) * 100)
        else:
            out.append(w * 100)
    return out


def one_gpu(workers: list[str], indexes: list[int], counts: dict[str, Counts]) -> list[float]:
    """``scores`` for placements of one GPU each (compared: their workers); the mean of one
    term is the term (0 + x is x, x / 1 is x)."""
    w_of = _worker_scores(counts, workers)
    per: dict[str, tuple[float, dict, dict]] = {}  # worker -> (w, its counts per GPU): one lookup each
    out = []
    for w, i in zip(workers, indexes):
        p = per.get(w)
        if p is None:
            c = counts.get(w, NONE)
            p = per[w] = (w_of(w, c), c.gpu_cur, c.gpu_oth)
        wv, cur, oth = p
        out.append((0.85 * wv + 0.15 * (1 / (1 + cur.get(i, 0) + 0.2 * oth.get(i, 0)))) * 100)  # as _gpu
    return out
