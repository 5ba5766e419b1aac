"""One-GPU candidates kept as columns: the single-GPU strategies offer one candidate per GPU that
fits (8,000 on 1,000 workers of 8 GPUs), and building a Candidate with its claim for each, then
scoring each object, was most of a decision's time. ``GpuRows`` holds the columns (worker, GPU
index, bytes booked, RAM, GPU type), the scorers read the columns (decide.py), and a Candidate is
built only when someone asks for it: the pick, the top few the decide activity records, or every
one when a whole decision is printed. A built candidate is the one the list would have held:
same claim, same per-scorer contributions and total, and asked again it is the same object.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from scheduler.decision import Candidate, claim


class GpuRows(Sequence):
    """Candidates of one GPU each, no subordinates. ``layers``: the GGUF claims' offload and
    total layers (all of them, on one GPU), None elsewhere."""

    def __init__(self, layers: int | None = None) -> None:
        self.layers = layers
        self.workers: list[str] = []
        self.indexes: list[int] = []
        self.books: list[int] = []  # bytes booked on the GPU
        self.rams: list[int] = []
        self.types: list[str] = []
        self.extra: list[tuple[float | None, bool]] = []  # (vram_utilization, is_unified_memory)
        self.names: list[str] = []  # the scorers that ran, in order
        self.columns: list[list[float]] = []  # each one's weighted contribution per row
        self.totals: list[float] | None = None
        self._made: dict[int, Candidate] = {}

    def add(self, worker: str, index: int, book: int, ram: int, gpu_type: str | None,
            utilization: float | None = None, unified: bool = False) -> None:
        self.workers.append(worker)
        self.indexes.append(index)
        self.books.append(book)
        self.rams.append(ram)
        self.types.append(gpu_type)
        self.extra.append((utilization, unified))

    def extend(self, workers: list[str], indexes: list[int], books: list[int], gpu_types: list[str | None],
               ram: int) -> None:
        """Rows of one RAM claim and no utilization, given as columns: ``add`` for each, without a
        call per row (the single-GPU scan offers one row per GPU of the cluster)."""
        n = len(workers)
        self.workers.extend(workers)
        self.indexes.extend(indexes)
        self.books.extend(books)
        self.types.extend(gpu_types)
        self.rams.extend([ram] * n)
        self.extra.extend([(None, False)] * n)

    def __len__(self) -> int:
        return len(self.workers)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        n = len(self.workers)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError(k)
        c = self._made.get(k)
        if c is None:
            i, (util, uma) = self.indexes[k], self.extra[k]
            c = Candidate(self.workers[k], [i], claim(self.rams[k], {i: self.books[k]}, self.layers, self.layers,
                                                      None, uma, util), gpu_type=self.types[k])
            if self.totals is not None:
                self._score(c, k)
            self._made[k] = c
        return c

    def __iter__(self):
        for k in range(len(self.workers)):
            yield self[k]

    def _score(self, c: Candidate, k: int) -> None:
        c.scores = dict(zip(self.names, [col[k] for col in self.columns]))
        c.score = self.totals[k]

    def set_scores(self, names: list[str], columns: list[list[float]], totals: list[float]) -> None:
        self.names, self.columns, self.totals = names, columns, totals
        for k, c in self._made.items():
            self._score(c, k)

    def best(self) -> int | None:
        """The row with the highest total, the first of equals (as scorers.pick)."""
        t = self.totals
        if not t:
            return None
        top = max(t)
        return t.index(top)

    def top(self, n: int) -> list[Candidate]:
        """The n best by total rounded to 4 places, equals in row order (as sorted()[:n])."""
        keys = [-round(x, 4) for x in self.totals] if self.totals else [0.0] * len(self)
        ks = heapq.nsmallest(n, range(len(keys)), key=keys.__getitem__)  # the keys made once, not a lambda a row
        return [self[k] for k in ks]
