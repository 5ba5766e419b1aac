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
3b. **Cost** (when the guard would move the request off the replica that matches most, and
   ``Pace`` has measured every eligible one): each replica costs ``cost_s``, the seconds its
   requests in flight add to a new one's first token plus the seconds of prefill for the blocks it
   lacks, both measured on that replica. The request moves only when the wait where it is held
   costs more than the prefill it would repeat elsewhere: the least cost wins; a tie goes to the
   prefix's home (as in rule 4), then the most matched, then the fewest in flight. The cost only
   ever vetoes a move: as the only rule (Dynamo's, every request to the least cost) it moved
   requests the guard kept, and a move also pushes another prefix out of the target's cache,
   which the cost does not see: in a replay (24 customers filling the caches) it lost hits and
   p90 against the guard, where the veto gained both.
4. **Among the candidates**: the most matched blocks (the least prefill); then the prefix's
   ``home`` (the replica it was last sent to, remembered longer than the blocks, and not moved by
   a spill: a prefix that aged out of the index goes back where it lived, so prefixes stay shared
   out as they were, and a spill's copy elsewhere ties with home and loses, unless every eligible
   replica holds as much: a shared header, or a hot prefix spread over all); for a new prefix, the
   fewest blocks held less the cache's size (the most free), read to the new prompt's own size
   (SGLang's "smallest tree": new prefixes are shared out by cache room, so no replica is handed
   more of them than its cache holds while another's is empty; a replica within the prompt's size
   of the least counts as the least, and the turn decides between them; where a replica's cache
   size is not known, blocks held tell how busy it was, not how full, and the turn alone
   decides); then the fewest in flight; then at random. Reason ``prefix``; ``no-prefix`` when no replica matched;
   ``imbalance`` when the guard left out one that matched more than the chosen. With nothing
   matched, no home and no sizes known, this is least outstanding, draw for draw.
5. **A copy shares a hot prefix's load** (measured, as 3b): where another eligible replica holds
   as much as the pick (a spill's copy), it takes the request when the pick's ``cost_s`` exceeds
   its own by more than ``copy_margin`` of the prefill the copy spares (``shared``). Without it,
   a copy tied with home and lost, so a customer busier than one replica queued at home while its
   copy idled. Reason ``copy``; the home does not move (``Balancer._moves_home``).

Ties go to the prefix's home, not to the API key or ``user`` that sent it: the home is known
per prefix at no cost, and one key often sends many customers' prefixes (an agent platform).

Why the cost needs measuring (Dynamo's ``overlap_weight x prefill_blocks + decode_blocks`` sets
the weight): it depends on the model, the GPU and the prompt lengths; a request ahead on a replica
whose prompts mostly hit costs milliseconds, a full prefill elsewhere far more. Until every
eligible replica is measured (``Pace``: 16 first tokens, with some variation in both load and
prefill) the request-gap guard stands: a gap an operator can read off the metrics.

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
PREFIX, IMBALANCE, NO_PREFIX, COPY = "prefix", "imbalance", "no-prefix", "copy"
TEXT, KV_EVENTS = "text", "kv-events"  # which index answered for the chosen replica (the header says)
REASONS = (PREFIX, IMBALANCE, NO_PREFIX, COPY, LEAST_OUTSTANDING)  # a least-outstanding deployment's choices say so
AWAY = (IMBALANCE, COPY)  # sent off its home for load (a spill, or to a spill's copy): the home stays


@dataclass(frozen=True)
class Knobs:
    slack_min: int = 2  # requests: the guard's gap is never under this
    slack_frac: float = 0.5  # of the replica limit: at 16 at once a replica may be 8 ahead, at 256, 128
    cost: bool = True  # rule 3b: a measured cost may veto the guard's move (gpuflow gateway --no-route-cost: off)
    copy_margin: float = 0.1  # rule 5: a copy takes a request when home waits this share of its prefill longer

    def __post_init__(self):
        if self.slack_min < 0 or not 0 <= self.slack_frac <= 1 or self.copy_margin < 0:
            raise ValueError("cache-aware routing: slack_min >= 0, 0 <= slack_frac <= 1 and copy_margin >= 0")

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


class Pace:
    """What a request ahead and an uncached block cost on each replica, measured: per replica, a
    least-squares fit of its requests' first-token times on (1, requests in flight before each,
    its uncached blocks), every sample's weight halved after ``half_life`` more samples (recent
    requests count most). Pure: the relay feeds it (``observe``), the rule reads it (``of``).
    O(1) per call: 9 decayed sums per replica, the fit solved when a sample arrives."""

    def __init__(self, half_life: float = 64, min_samples: int = 16):
        if half_life <= 0 or min_samples < 3:
            raise ValueError("pace: half_life > 0 and min_samples >= 3")
        self.decay, self.min_samples = 0.5 ** (1 / half_life), min_samples
        self.sums: dict[str, list[float]] = {}  # instance -> [n, x, u, xx, xu, uu, y, xy, uy], decayed
        self.fits: dict[str, tuple[float, float]] = {}  # instance -> (seconds a request ahead, seconds a block)
        self.seen: dict[str, int] = {}

    def observe(self, instance: str, ahead: int, uncached: int, ttft_s: float) -> None:
        """A request sent to ``instance`` with ``ahead`` in flight there and ``uncached`` blocks not
        thought held got its first token after ``ttft_s`` seconds."""
        s = self.sums.setdefault(instance, [0.0] * 9)
        x, u, y, d = float(ahead), float(uncached), float(ttft_s), self.decay
        for k, v in enumerate((1.0, x, u, x * x, x * u, u * u, y, x * y, u * y)):
            s[k] = s[k] * d + v
        self.seen[instance] = n = self.seen.get(instance, 0) + 1
        fit = solve3(((s[0], s[1], s[2]), (s[1], s[3], s[4]), (s[2], s[4], s[5])), (s[6], s[7], s[8]))
        if n >= self.min_samples and fit is not None and fit[2] > 0:
            self.fits[instance] = (max(fit[1], 0.0), fit[2])
        else:
            self.fits.pop(instance, None)  # no variation to tell the two apart, or prefill free: unmeasured

    def of(self, instance: str) -> tuple[float, float] | None:
        """(seconds one request in flight adds to a new one's first token, seconds one uncached
        block adds) on ``instance``; None until measured."""
        return self.fits.get(instance)

    def forget(self, instance: str) -> None:
        for d in (self.sums, self.fits, self.seen):
            d.pop(instance, None)


def solve3(a: tuple[tuple[float, ...], ...], b: tuple[float, ...]) -> tuple[float, float, float] | None:
    """``a x = b`` for a symmetric 3x3 ``a`` (Cramer's rule); None when ``a`` is near singular
    (a regressor that did not vary, or two that moved together)."""
    def det(m):
        return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
                + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))
    d = det(a)
    if abs(d) <= 1e-9 * a[0][0] * a[1][1] * a[2][2] or d == 0:
        return None
    out = []
    for c in range(3):
        m = tuple(tuple(b[r] if k == c else a[r][k] for k in range(3)) for r in range(3))
        out.append(det(m) / d)
    return out[0], out[1], out[2]


def cost_s(load: int, matched: int, blocks: int, pace: tuple[float, float]) -> float:
    """The expected seconds to a first token on a replica, but for what every replica shares:
    ``load`` requests ahead at ``pace[0]`` each, and the blocks it lacks at ``pace[1]`` each.
    Dynamo's ``overlap_weight x prefill_blocks + decode_blocks``, in seconds, with both weights
    measured rather than set."""
    return load * pace[0] + (blocks - matched) * pace[1]


def choose(replicas: Sequence[Route], limit: int, in_flight: dict[str, int], matched: Callable[[str], int],
           blocks: int, knobs: Knobs, rng: random.Random, bad_until: dict[str, float] | None = None,
           now: float = 0.0, exclude: frozenset[str] = frozenset(),
           held: Callable[[str], int | None] | None = None, home: str | None = None,
           new_turn: Callable[[str], int] | None = None,
           pace: Callable[[str], tuple[float, float] | None] | None = None) -> Choice | None:
    """The replica for a prompt of ``blocks`` whole blocks, of which replica r holds
    ``matched(r.instance)`` leading ones (and ``held(r.instance)`` blocks in all, or that less its
    cache's size: prefix_index.fill; None where the size is not known), last sent to
    ``home``; None when no replica is eligible (the request waits). A new prefix goes where there
    is most room, then to the replica that least recently took a new prefix (``new_turn``). When
    some replica matches and ``pace`` has measured every eligible one, the cost decides (rule 3b),
    and a replica holding as much as the pick may take the request from it (rule 5)."""
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
    paces = [pace(r.instance) for r in ok] if pace is not None and best_any and knobs.cost else []
    measured = bool(paces) and all(p is not None for p in paces)  # rules 3b and 5 need every eligible one
    cands = guarded(ok, load, got, limit, knobs, held, home, new_turn, blocks)
    if measured and max(got[i] for i in cands) < best_any:
        cands = cheapest(ok, load, got, blocks, paces, home)  # a spill, weighed: it stays if moving costs more
    low = min(load[i] for i in cands)
    i = rng.choice([i for i in cands if load[i] == low])
    if measured and got[i] == best_any:
        j = shared(i, load, got, blocks, paces, knobs.copy_margin)
        if j != i:
            return Choice(ok[j], COPY, got[j], blocks, load[j], limit)
    reason = NO_PREFIX if best_any == 0 else PREFIX if got[i] == best_any else IMBALANCE
    return Choice(ok[i], reason, got[i], blocks, load[i], limit)


def cheapest(ok: Sequence[Route], load: list[int], got: list[int], blocks: int,
             paces: list, home: str | None) -> list[int]:
    """Rule 3b: the replicas of least ``cost_s`` (within a microsecond); a tie goes home, then to
    the most matched."""
    cost = [cost_s(load[i], got[i], blocks, paces[i]) for i in range(len(ok))]
    least = min(cost)
    cands = [i for i in range(len(ok)) if cost[i] <= least + 1e-6]
    back = [i for i in cands if ok[i].instance == home and not everywhere(got, got[i])]
    if back:
        return back
    top = max(got[i] for i in cands)
    return [i for i in cands if got[i] == top]


def shared(i: int, load: list[int], got: list[int], blocks: int, paces: list, margin: float) -> int:
    """Rule 5: a hot prefix's copy shares its load. Chosen ``i`` holds the most; another eligible
    replica ``j`` that holds as much (a spill's copy) takes the request instead when ``i``'s
    ``cost_s`` exceeds ``j``'s by more than ``margin`` of the prefill the copy spares
    (``got[j]`` blocks at ``j``'s pace). The copy costs no prefill now; the margin is what keeping
    it warm may cost later (in a full cache, the blocks of another prefix it keeps out), and keeps
    a request home through a swing of a request or so. At the default tenth, a 48-block prefix at
    3 ms a block and 12 ms a request ahead moves when home is two requests ahead of the copy."""
    alts = [j for j in range(len(got)) if j != i and got[j] >= got[i]]
    if not alts:
        return i
    cost = {j: cost_s(load[j], got[j], blocks, paces[j]) for j in (i, *alts)}
    j = min(alts, key=lambda j: (cost[j], load[j]))
    return j if cost[i] - cost[j] > margin * got[j] * paces[j][1] + 1e-6 else i  # more, by over a microsecond


def everywhere(got: list[int], n: int) -> bool:
    """Whether every eligible replica holds ``n`` > 0 leading blocks: a header every prompt shares,
    or a hot prefix spread over all of them, where no replica is its home and load decides."""
    return n > 0 and min(got) >= n


def guarded(ok: Sequence[Route], load: list[int], got: list[int], limit: int, knobs: Knobs,
            held: Callable[[str], int | None] | None, home: str | None,
            new_turn: Callable[[str], int] | None, blocks: int = 1) -> list[int]:
    """Rules 3 and 4: the candidates within the guard's slack, the most matched, then home, room, turn.
    Room is read to the new prompt's own size: a replica that holds less than the least plus
    ``blocks`` counts as the least (the new prefix would not leave it holding more than the others).
    ``held`` None for a replica (its size not known: prefix_index.fill): the turn alone."""
    ceiling = min(load) + knobs.slack(limit)  # the guard: busier than this is passed over
    cands = [i for i in range(len(ok)) if load[i] <= ceiling]
    top = max(got[i] for i in cands)
    cands = [i for i in cands if got[i] == top]
    back = [i for i in cands if ok[i].instance == home and not everywhere(got, top)]
    if back:  # its home: aged out of the index, or a match as long elsewhere (a spill's copy)
        return back
    if top == 0 and held is not None and len(cands) > 1:  # a new prefix: where there is most room
        room = [held(ok[i].instance) for i in cands]
        if None not in room:  # every size known (prefix_index.fill): else by turn alone
            cands = [i for i, h in zip(cands, room) if h < min(room) + max(blocks, 1)]
        if new_turn is not None and len(cands) > 1:  # as much room (every LRU full): round the replicas
            turn = [new_turn(ok[i].instance) for i in cands]
            cands = [i for i, t in zip(cands, turn) if t == min(turn)]
    return cands
