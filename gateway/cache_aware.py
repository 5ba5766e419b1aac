"""The cache-aware routing policy, pure: which replica gets a request, given how many leading
blocks of its prompt each replica is thought to hold (``prefix_index.py``) and how many requests
each has in flight. ``balance.py`` calls it; ``docs/routing.md`` explains it.

The rule, in order (tests/test_cache_aware.py has it as tables):
1. **Eligible**: below the replica limit, not marked bad, not tried already by this request:
   exactly least-outstanding's set (``balance.pick``), so no replica is ever flooded past its limit.
2. **Under one block** (a short prompt, an embedding): least outstanding, ties at random
   (``balance.pick``'s rule, the same draw). Reason ``no-prefix``.
3. **Guard** (bounded load, in the spirit of SGLang's and AIBrix's imbalance gates): a replica is
   passed over when it is more than ``slack`` requests busier than the least loaded eligible one,
   ``slack = max(slack_min, ceil(limit * slack_frac))``: half the limit by default. With that
   default, such a replica is also more than twice as busy as the least loaded (it is under its
   limit, so the least loaded is under half of it): the relative gate those routers add holds as
   well. A hot prefix whose replica runs that far ahead spills to the least loaded, which then
   caches it too, and a replica at its limit is not eligible at all: the prefix spreads over as
   many replicas as its load needs. An idle replica is never passed over for one more than
   ``slack`` busier (no starving). A brief stall (a replica a few requests behind) does not copy a
   prefix: a copy costs a full prefill and pushes another prefix out of the second replica's
   cache. With a quarter of the limit as the gap, stalls of 5 requests at a limit of 16 did, and
   cost the bench its hits.
4. **Among the candidates**: the most matched blocks (the least prefill); when none matches, the
   prefix's ``home`` (the replica it was last sent to, remembered longer than the blocks: a
   prefix that aged out of the index goes back where it lived, so prefixes stay shared out as
   they were); for a new prefix, the fewest blocks held (SGLang's "smallest tree": new prefixes
   are shared out by cache room, so no replica is handed more of them than its cache holds while
   another's is empty); then the fewest in flight; then at random. Reason ``prefix``;
   ``no-prefix`` when no replica matched; ``imbalance`` when the guard left out one that matched
   more than the chosen. With nothing matched, no home and no sizes known, this is least
   outstanding, draw for draw.

Why a guard and not a weighted cost (Dynamo's ``overlap_weight x prefill + decode``): a gap in
requests is what an operator can read off the metrics and set, and the rule's choices can be
listed in a table; the cost's weight depends on the model, the GPU and the prompt lengths.

Why no ``cache_threshold`` (SGLang counts a match only above half the prompt): SGLang's tree is
unbounded, so a partial match there is a different prompt. This index is an LRU sized to the
engine's cache that drops a prefix from its tail, as the engine does: a partial match is mostly a
prefix whose tail aged out, and its replica is still where it is best sent (elsewhere it is a
full prefill, and one more prefix crowding that cache). A short header every prompt shares ends
up on every replica, where matches tie and the least loaded wins."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable, Sequence

from store.serving import Route

CACHE_AWARE, LEAST_OUTSTANDING = "cache-aware", "least-outstanding"  # the routings (scheduler.spec.Routing)
ROUTINGS = (CACHE_AWARE, LEAST_OUTSTANDING)
PREFIX, IMBALANCE, NO_PREFIX = "prefix", "imbalance", "no-prefix"
TEXT, KV_EVENTS = "text", "kv-events"  # which index answered for the chosen replica (the header says)
REASONS = (PREFIX, IMBALANCE, NO_PREFIX, LEAST_OUTSTANDING)  # a least-outstanding deployment's choices say so


@dataclass(frozen=True)
class Knobs:
    slack_min: int = 2  # requests: the guard's gap is never under this
    slack_frac: float = 0.5  # of the replica limit: at 16 at once a replica may be 8 ahead, at 256, 128

    def __post_init__(self):
        if self.slack_min < 0 or not 0 <= self.slack_frac <= 1:
            raise ValueError("cache-aware routing: slack_min >= 0 and 0 <= slack_frac <= 1")

    def slack(self, limit: int) -> int:
        return max(self.slack_min, math.ceil(limit * self.slack_frac))


@dataclass(frozen=True)
class Choice:
    """One routing decision, as the debug header and the metrics tell it."""

    route: Route
    reason: str
    matched: int  # leading blocks of the prompt the chosen replica holds
    blocks: int  # whole blocks in the prompt
    load: int  # requests in flight on the chosen replica before this one
    limit: int
    index: str = TEXT  # kv-events: the chosen replica was scored by its engine's own events
    tokens: tuple[int, int] | None = None  # kv-events: (prompt tokens it holds, prompt tokens)

    def header(self) -> str:
        """``x-gpuflow-route``'s value."""
        exact = f"; tokens={self.tokens[0]}/{self.tokens[1]}" if self.tokens else ""
        return (f"replica={self.route.instance}; matched={self.matched}/{self.blocks} blocks; "
                f"load={self.load}/{self.limit}; reason={self.reason}; index={self.index}{exact}")


def eligible(replicas: Sequence[Route], limit: int, in_flight: dict[str, int], bad_until: dict[str, float],
             now: float, exclude: frozenset[str]) -> list[Route]:
    return [r for r in replicas if r.instance not in exclude and bad_until.get(r.instance, 0.0) <= now
            and in_flight.get(r.instance, 0) < limit]


def choose(replicas: Sequence[Route], limit: int, in_flight: dict[str, int], matched: Callable[[str], int],
           blocks: int, knobs: Knobs, rng: random.Random, bad_until: dict[str, float] | None = None,
           now: float = 0.0, exclude: frozenset[str] = frozenset(),
           held: Callable[[str], int] | None = None, home: str | None = None,
           new_turn: Callable[[str], int] | None = None) -> Choice | None:
    """The replica for a prompt of ``blocks`` whole blocks, of which replica r holds
    ``matched(r.instance)`` leading ones (and ``held(r.instance)`` blocks in all), last sent to
    ``home``; None when no replica is eligible (the request waits). A new prefix goes where there
    is most room, then to the replica that least recently took a new prefix (``new_turn``)."""
    ok = eligible(replicas, limit, in_flight, bad_until or {}, now, exclude)
    if not ok:
        return None
    load = [in_flight.get(r.instance, 0) for r in ok]
    got = [matched(r.instance) if blocks else 0 for r in ok]
    best_any = max(got)
    if blocks == 0:  # under one block: nothing to weigh but load
        low = min(load)
        i = rng.choice([i for i, n in enumerate(load) if n == low])
        return Choice(ok[i], NO_PREFIX, 0, blocks, load[i], limit)
    ceiling = min(load) + knobs.slack(limit)  # the guard: busier than this is passed over
    cands = [i for i in range(len(ok)) if load[i] <= ceiling]
    top = max(got[i] for i in cands)
    cands = [i for i in cands if got[i] == top]
    back = [i for i in cands if ok[i].instance == home] if top == 0 else []
    if back:  # aged out of the index: back where it lived, if the guard allows
        cands = back
    elif top == 0 and held is not None and len(cands) > 1:  # a new prefix: where there is most room
        room = [held(ok[i].instance) for i in cands]
        cands = [i for i, h in zip(cands, room) if h == min(room)]
        if new_turn is not None and len(cands) > 1:  # as much room (every LRU full): round the replicas
            turn = [new_turn(ok[i].instance) for i in cands]
            cands = [i for i, t in zip(cands, turn) if t == min(turn)]
    low = min(load[i] for i in cands)
    i = rng.choice([i for i in cands if load[i] == low])
    reason = NO_PREFIX if best_any == 0 else PREFIX if top == best_any else IMBALANCE
    return Choice(ok[i], reason, got[i], blocks, load[i], limit)
