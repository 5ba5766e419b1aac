"""What each replica's engine says it holds in its prefix cache, from its KV-cache events
(kv_events.py): an exact index, per replica, of the token blocks it has cached (pure data
structure, no I/O).

Hashes are the gateway's own, chained over token ids (``token_hashes``): block i's hash covers
the block's tokens and, through its parent's hash, every token before it, as the engines' own
block hashes do. A ``BlockStored`` event gives its blocks' tokens and its parent's engine hash;
the gateway looks the parent up (engine hash -> ours), chains on, and keeps engine hash -> ours so
that a later ``BlockRemoved``, which names engine hashes only, can be applied. This is NVIDIA
Dynamo's way: the router never depends on the engine's hash function or seed (vLLM's is salted per
process unless PYTHONHASHSEED is set). A stored event whose parent the index does not know (its
parent's event came before the gateway subscribed, or was dropped) cannot be chained, and is
counted as an orphan and ignored: that prefix is under-counted, never over-counted.

A prompt's match on a replica is the number of its leading blocks, at that replica's block size,
the replica holds; the first block it lacks ends the match (the engine cannot use a block whose
prefix is gone).

Bounded: per replica at most its engine's reported capacity (``set_capacity``, in tokens; a
default number of blocks otherwise), and at most ``max_total`` blocks over all replicas; over either, the blocks
stored first go first (an engine that keeps its promise never gets there). Several engine hashes
may name the same prefix (vLLM keeps a duplicate block when a cache salt differs): a block of ours
is held while any of them is."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from gateway.kv_events import Batch, Cleared, EngineHash, Removed, Skipped, Stored

CAPACITY = 1 << 17  # blocks per replica when the engine did not report its cache (2 M tokens at 16)
MAX_TOTAL = 1_000_000  # blocks over every replica: ~350 MiB of the gateway's RSS at the cap (bench/bench_token_index.py)


def token_hashes(token_ids: Sequence[int], block_size: int, parent: int = 0) -> tuple[int, ...]:
    """The chained hash of each whole block of ``token_ids``, after ``parent`` (0: from the start)."""
    out, h = [], parent
    for i in range(0, len(token_ids) - block_size + 1, block_size):
        h = hash((h, tuple(token_ids[i:i + block_size])))
        out.append(h)
    return tuple(out)


@dataclass
class Applied:
    """What one batch did to one replica's index (the subscriber counts these in metrics)."""

    stored: int = 0
    removed: int = 0
    cleared: int = 0
    orphans: int = 0  # blocks whose parent was unknown: not indexed
    skipped: int = 0  # events about a LoRA adapter, another tier, or another block size


@dataclass
class Replica:
    default: int  # blocks, while the engine's cache size is unknown
    capacity_tokens: int | None = None  # what the engine reported (engine_cache.py)
    block_size: int | None = None  # from its first stored event
    ours: dict[EngineHash, int] = field(default_factory=dict)  # engine hash -> our hash (stored first, first)
    held: dict[int, int] = field(default_factory=dict)  # our hash -> how many engine hashes name it
    # engine hashes in the order stored, some since removed (skipped when met): the oldest is found in
    # O(1) amortized. Iterating a dict from its front after many deletions there scans every deleted
    # slot first: at the cap each eviction did, 1 M stores took 100 s of the gateway's CPU
    order: deque = field(default_factory=deque)
    stale: dict[EngineHash, int] = field(default_factory=dict)  # engine hash -> its entries in ``order`` dropped since
    peak: int = 0  # the most entries ``ours`` held since it was last rebuilt (a dict never shrinks)

    def limit(self) -> int:
        if self.capacity_tokens and self.block_size:
            return max(1, self.capacity_tokens // self.block_size)
        return self.default

    def oldest(self) -> EngineHash:
        """The engine hash stored longest ago and still held. An engine hash's entries in ``order`` come
        in the order stored, and each drop makes its earliest one stale: one removed and stored again
        is as young as its last store."""
        while True:
            eh = self.order[0]
            n = self.stale.get(eh, 0)
            if not n:
                return eh
            self.order.popleft()
            if n == 1:
                del self.stale[eh]
            else:
                self.stale[eh] = n - 1

    def compact(self) -> None:
        """Give back what removals left behind: the order once it is mostly stale, the dicts once they
        hold under a quarter of their peak (a dict keeps its table at its largest size)."""
        n = len(self.ours)
        if len(self.order) > 2 * n + 1024:
            self.order, self.stale = deque(self.ours), {}
        if self.peak > 4 * n + 4096:
            self.ours, self.held, self.peak = dict(self.ours), dict(self.held), n


class TokenIndex:
    def __init__(self, capacity: int = CAPACITY, max_total: int = MAX_TOTAL):
        if capacity < 1 or max_total < 1:
            raise ValueError("token index: capacity and max_total must be >= 1")
        self.capacity, self.max_total = capacity, max_total
        self.replicas: dict[str, Replica] = {}
        self.total = 0  # engine-hash entries over every replica
        self.live: set[str] = set()  # replicas whose events arrive (kv_subscriber.py): scored by their exact match

    def _replica(self, instance: str) -> Replica:
        r = self.replicas.get(instance)
        if r is None:
            r = self.replicas[instance] = Replica(self.capacity)
        return r

    def set_capacity(self, instance: str, tokens: int) -> None:
        """The engine reported room for ``tokens`` tokens: more blocks than that are not believed."""
        r = self._replica(instance)
        r.capacity_tokens = max(1, tokens)
        self._bound(r)

    def apply(self, instance: str, batch: Batch) -> Applied:
        r, done = self._replica(instance), Applied()
        for e in batch.events:
            if isinstance(e, Stored):
                self._store(r, e, done)
            elif isinstance(e, Removed):
                for h in e.hashes:
                    done.removed += self._drop(r, h)
            elif isinstance(e, Cleared):
                self._clear(r)
                done.cleared += 1
            elif isinstance(e, Skipped):
                done.skipped += 1
        self._bound(r)
        return done

    def _store(self, r: Replica, e: Stored, done: Applied) -> None:
        if r.block_size is None:
            r.block_size = e.block_size
        if e.block_size != r.block_size:  # another KV-cache group (a hybrid model): not the prefix routed on
            done.skipped += 1
            return
        parent = 0
        if e.parent is not None:
            p = r.ours.get(e.parent)
            if p is None:
                done.orphans += len(e.hashes)
                return
            parent = p
        for eh, h in zip(e.hashes, token_hashes(e.token_ids, e.block_size, parent)):
            if eh in r.ours:  # stored again under the same engine hash: already counted
                continue
            r.ours[eh] = h
            r.order.append(eh)
            r.held[h] = r.held.get(h, 0) + 1
            self.total += 1
            done.stored += 1
        r.peak = max(r.peak, len(r.ours))

    def _drop(self, r: Replica, eh: EngineHash) -> int:
        h = r.ours.pop(eh, None)
        if h is None:
            return 0
        r.stale[eh] = r.stale.get(eh, 0) + 1
        self.total -= 1
        n = r.held[h] - 1
        if n:
            r.held[h] = n
        else:
            del r.held[h]
        return 1

    def _clear(self, r: Replica) -> None:
        self.total -= len(r.ours)
        r.ours, r.held, r.order, r.stale, r.peak = {}, {}, deque(), {}, 0  # new ones: clear() keeps the tables' size

    def _bound(self, r: Replica) -> None:
        """Over the replica's capacity, or over ``max_total``: the blocks stored first go."""
        cap = min(r.limit(), self.max_total)
        while len(r.ours) > cap:
            self._drop(r, r.oldest())
        while self.total > self.max_total:  # from the largest, down to the next largest at most, then again
            big, *rest = sorted(self.replicas.values(), key=lambda x: len(x.ours), reverse=True)
            runner = max((len(x.ours) for x in rest), default=0)
            for _ in range(min(self.total - self.max_total, max(1, len(big.ours) - runner))):
                self._drop(big, big.oldest())
            big.compact()
        r.compact()

    def block_size(self, instance: str) -> int | None:
        r = self.replicas.get(instance)
        return r.block_size if r else None

    def matched(self, instance: str, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` (at the replica's block size) ``instance`` holds."""
        r = self.replicas.get(instance)
        if r is None or not r.held:
            return 0
        n = 0
        for h in hashes:
            if h not in r.held:
                break
            n += 1
        return n

    def size(self, instance: str) -> int:
        r = self.replicas.get(instance)
        return len(r.held) if r else 0

    def clear(self, instance: str) -> None:
        """What the index held for ``instance`` can no longer be trusted (events were lost)."""
        r = self.replicas.get(instance)
        if r is not None:
            self._clear(r)

    def forget(self, instance: str) -> None:
        r = self.replicas.pop(instance, None)
        if r is not None:
            self.total -= len(r.ours)
        self.live.discard(instance)

    def keep_only(self, instances: Iterable[str]) -> None:
        keep = set(instances)
        for name in [n for n in self.replicas if n not in keep]:
            self.forget(name)
