"""Least outstanding requests per replica, ties at random, and a queue per model for requests
that find every replica at its limit (or none RUNNING yet). The queue is served by tenant
priority (high first), then arrival: a request's arrival is when it first asked for a replica,
so a retry (its replica failed) keeps the place it had and goes ahead of everything of its
priority that arrived after it. A waiting request keeps the priority it arrived with. A full
queue refuses a newcomer, unless the last in line has a lower priority than it: that one leaves
(QueueFull) to make room. Single event loop: no locks; the routing table is swapped whole
(``swap``), the in-flight counters and the prefix index are this gateway's only state.

Which replica, among those with a free slot: the deployment's ``routing`` (its spec), else the
gateway's (``--routing``). ``cache-aware`` (gateway/cache_aware.py) weighs the blocks of the
request's prompt each replica holds (gateway/prefix_index.py: what this gateway sent it) against
its load; ``least-outstanding`` is ``pick``. A replica whose engine publishes its KV-cache events
(gateway/token_index.py, filled by gateway/kv_subscriber.py) is scored by what its engine says it
holds instead, when the request's prompt could be tokenized. A replica that leaves the table
(drained, stopped, failed) or comes back at another address leaves the indexes: its engine's
cache is gone."""

from __future__ import annotations

import asyncio
import bisect
import itertools
import random
import time
from dataclasses import dataclass, field, replace
from typing import Iterable

from store.serving import Route
from gateway import index_feedback
from gateway.cache_aware import (AWAY, CACHE_AWARE, KV_EVENTS, LEAST_OUTSTANDING, NO_PREFIX, TEXT, Choice, Knobs,
                                 Pace, choose)
from gateway.pd_pick import DECODE, DISAGGREGATED, Pick, estimate_tokens, pick_decode
from gateway.pd_pick import pick as pick_pair
from gateway.prefix_index import BLOCK_CHARS, PrefixIndex
from gateway.table import Table
from gateway.token_index import TokenIndex, token_hashes


class UnknownModel(Exception):
    pass


class QueueFull(Exception):
    pass


class QueueTimeout(Exception):
    pass


def pick(replicas: Iterable[Route], limit: int, in_flight: dict[str, int], bad_until: dict[str, float],
         now: float, exclude: frozenset[str], rng: random.Random) -> Route | None:
    """The replica with the fewest requests in flight, below ``limit``, not marked bad and not in
    ``exclude``; ties at random; None when there is none."""
    best: list[Route] = []
    low = limit
    for r in replicas:
        if r.instance in exclude or bad_until.get(r.instance, 0.0) > now:
            continue
        n = in_flight.get(r.instance, 0)
        if n < low:
            best, low = [r], n
        elif n == low and n < limit:
            best.append(r)
    return rng.choice(best) if best else None


@dataclass(eq=False)
class Prompt:
    """What the balancer knows of a request's prompt: its chained block hashes (empty when the
    deployment is not routed by cache, or the prompt is under one block). The balancer writes
    here the choice it made (the last attempt's, after a retry)."""

    blocks: tuple[int, ...] = ()
    choice: Choice | None = None
    tokens: tuple[int, ...] | None = None  # its token ids, where a replica's KV events can be matched (None: not)
    hashed: dict[int, tuple[int, ...]] = field(default_factory=dict)  # block size -> the tokens' chained hashes
    chars: int = 0  # its text's length (a group's skip threshold estimates tokens from it when not tokenized)
    pick: Pick | None = None  # a prefill/decode group's ends, chosen (gateway/pd_pick.py)
    after: Route | None = None  # set: only a decode is wanted, for the KV this prefill holds (a decode's retry)
    age: int | None = None  # the chosen replica's PrefixIndex.age of its first block, before it was sent (None: not held)
    forgot: bool = False  # the chosen replica's LRU had let go of the first block it was not believed to hold

    def token_hashes(self, block_size: int) -> tuple[int, ...]:
        h = self.hashed.get(block_size)
        if h is None:
            h = self.hashed[block_size] = token_hashes(self.tokens or (), block_size)
        return h


@dataclass(eq=False)
class Waiter:
    fut: asyncio.Future
    exclude: frozenset[str]
    prompt: Prompt | None = None
    key: tuple = ()  # (-priority, arrival, sequence): the queue's order
    since: float = field(default_factory=time.monotonic)


class Balancer:
    def __init__(self, queue_timeout_s: float, max_queue: int, bad_s: float, rng: random.Random | None = None,
                 routing: str = CACHE_AWARE, index: PrefixIndex | None = None, knobs: Knobs | None = None,
                 block_chars: int = BLOCK_CHARS):
        self.queue_timeout_s, self.max_queue, self.bad_s = queue_timeout_s, max_queue, bad_s
        self.rng = rng or random.Random()
        self.routing = routing  # the gateway's default; a deployment's spec may say otherwise
        self.index = index or PrefixIndex()
        self.tokens = TokenIndex()  # what engines that publish KV events hold (gateway/kv_subscriber.py fills it)
        self.knobs = knobs or Knobs()
        self.where: dict[str, tuple[str, int]] = {}  # instance -> (address, port) it was indexed at
        self.table = Table({})
        self.in_flight: dict[str, int] = {}  # instance -> requests this gateway has on it
        self.bad_until: dict[str, float] = {}  # instance -> monotonic time it may be tried again
        self.queues: dict[str, list[Waiter]] = {}  # each sorted by Waiter.key
        self.seq = itertools.count()
        self.block_chars = block_chars  # of the prefix index's blocks (a group's uncached tokens are estimated with it)
        self.started: dict[str, set[int]] = {}  # a group's generations this gateway has seen ready (pd_pick.py rule 1)
        self.pace = Pace()  # what a request ahead and an uncached block cost on each replica (the relay measures)

    def swap(self, table: Table) -> None:
        """A new routing table: waiters for a deployment that is gone fail, the others get any
        replica that appeared."""
        self.table = table
        self._forget_gone(table)
        for name in list(self.queues):
            if name not in table.models:
                for w in self.queues.pop(name):
                    if not w.fut.done():
                        w.fut.set_exception(UnknownModel(name))
        self.tick()

    def _forget_gone(self, table: Table) -> None:
        """Replicas not in ``table`` (drained, stopped, failed) or now at another address (a new
        process) leave the prefix index: the cache the index stood for is gone."""
        now = {r.instance: (r.address, r.port) for m in table.models.values()
               for r in (*m.replicas, *(m.pd.members if m.pd is not None else ()))}
        for i in [i for i, at in self.where.items() if now.get(i) != at]:
            self.index.forget(i)
            self.pace.forget(i)  # a new process (or none): its pace is measured anew
            del self.where[i]
        self.index.keep_only(now)
        self.tokens.keep_only(now)

    def index_rows(self) -> list[tuple[str, str, str, int, int]]:
        """(model, replica, source, capacity, held) of the prefix index, for each replica of a
        cache-aware deployment (and each member of a group) in the table now: the metrics' view of
        what the index believes (gateway/metrics.py ``index_sizes``)."""
        rows = []
        for name, m in sorted(self.table.models.items()):
            members = (*m.replicas, *(m.pd.members if m.pd is not None else ()))
            if m.pd is None and self.routing_of(name) != CACHE_AWARE:
                continue
            rows += [(name, r.instance, *self.index.size_of(r.instance)) for r in members]
        return rows

    def routing_of(self, model: str) -> str:
        m = self.table.models.get(model)
        return (m.routing if m is not None else None) or self.routing

    def tick(self) -> None:
        """Re-dispatch every queue (a bad mark may have expired)."""
        now = time.monotonic()
        self.bad_until = {i: t for i, t in self.bad_until.items() if t > now}
        for name in list(self.queues):
            self._dispatch(name)

    def depth(self, model: str) -> int:
        q = self.queues.get(model)
        return len(q) if q else 0

    def untried(self, model: str, exclude: frozenset[str]) -> bool:
        """Whether ``model`` has a replica not in ``exclude`` (busy or not)."""
        m = self.table.models.get(model)
        return bool(m) and any(r.instance not in exclude for r in m.replicas)

    async def acquire(self, model: str, exclude: frozenset[str] = frozenset(), priority: int = 0,
                      arrival: float | None = None, prompt: Prompt | None = None) -> tuple[Route, float]:
        """A replica for one request, counted in flight, and the seconds waited for it. A request
        that waits is queued by ``priority`` (high first), then ``arrival`` (monotonic; default
        now: a retry passes its first attempt's). The choice is written to ``prompt``."""
        m = self.table.models.get(model)
        if m is None:
            raise UnknownModel(model)
        q = self.queues.get(model)
        if not q:
            r = self._choose(model, exclude, time.monotonic(), prompt)
            if r is not None:
                return r, 0.0
        q = self.queues.setdefault(model, [])
        if len(q) >= self.max_queue:
            last = q[-1]  # the lowest priority, the newest of it
            if last.key[0] <= -priority:
                raise QueueFull(model)
            q.pop()  # it makes room for a higher priority, and is told the queue is full
            if not last.fut.done():
                last.fut.set_exception(QueueFull(model))
        now = time.monotonic()
        w = Waiter(asyncio.get_running_loop().create_future(), exclude, prompt,
                   (-priority, now if arrival is None else arrival, next(self.seq)), now)
        bisect.insort(q, w, key=lambda x: x.key)  # a retry keeps its place: it already waited its turn
        self._dispatch(model)  # the ones ahead may be retries that cannot take the free replica
        ok = False
        try:
            async with asyncio.timeout(self.queue_timeout_s):
                r = await w.fut
            ok = True
            return r, time.monotonic() - w.since
        except TimeoutError:
            raise QueueTimeout(model) from None
        finally:
            if not ok:
                if w in q:
                    q.remove(w)
                if not w.fut.done():
                    w.fut.cancel()
                elif not w.fut.cancelled() and w.fut.exception() is None:
                    self.release(w.fut.result(), model)  # given a replica just as the wait ended

    def release(self, r: Route | Pick, model: str) -> None:
        for x in r.routes() if isinstance(r, Pick) else (r,):
            n = self.in_flight.get(x.instance, 0) - 1
            if n > 0:
                self.in_flight[x.instance] = n
            else:
                self.in_flight.pop(x.instance, None)
        self._dispatch(model)

    def mark_bad(self, r: Route) -> None:
        self.bad_until[r.instance] = time.monotonic() + self.bad_s

    def _choose(self, model: str, exclude: frozenset[str], now: float, prompt: Prompt | None) -> Route | None:
        """A replica of ``model`` with a free slot, by the model's routing, taken (counted in
        flight, and its prompt's blocks indexed under it); None when every one is busy."""
        m = self.table.models[model]
        if m.pd is not None:
            return self._choose_pd(model, exclude, now, prompt or Prompt())
        blocks = prompt.blocks if prompt is not None else ()
        if self.routing_of(model) == LEAST_OUTSTANDING:
            r = pick(m.replicas, m.limit, self.in_flight, self.bad_until, now, exclude, self.rng)
            c = r and Choice(r, LEAST_OUTSTANDING, 0, len(blocks), self.in_flight.get(r.instance, 0), m.limit)
            blocks = ()  # not routed by cache: nothing to remember
        else:
            exact = prompt is not None and prompt.tokens is not None and bool(blocks)
            home = self.index.home(blocks) if blocks else None
            c = choose(m.replicas, m.limit, self.in_flight,
                       (lambda i: self._matched(i, prompt)) if exact else (lambda i: self.index.matched(i, blocks)),
                       len(blocks), self.knobs, self.rng, self.bad_until, now, exclude, self.index.fill, home,
                       self.index.new_turn, self.pace.of)
            if c is not None and blocks and c.reason == NO_PREFIX and home is None:
                self.index.placed_new(c.route.instance)
            if c is not None and exact and c.route.instance in self.tokens.live:
                c = replace(c, index=KV_EVENTS, tokens=(self._exact(c.route.instance, prompt), len(prompt.tokens)))
            r = c and c.route
        if r is None:
            return None
        self.in_flight[r.instance] = self.in_flight.get(r.instance, 0) + 1
        if blocks:
            if c.index == TEXT:  # what its answer will be weighed against (index_feedback.py), before it is sent
                prompt.age = self.index.age(r.instance, blocks[0]) if c.matched else None
                prompt.forgot = c.matched < len(blocks) and self.index.forgot(r.instance, blocks[c.matched])
            self.index.insert(r.instance, blocks, home=self._moves_home(m, c, home))
            self.where[r.instance] = (r.address, r.port)
        if prompt is not None:
            prompt.choice = c
        return r

    @staticmethod
    def _moves_home(m, c: Choice, home: str | None) -> bool:
        """Whether choice ``c`` becomes its prefix's home: not a spill. A spill is a one-off: one the
        guard sent off its best match (``imbalance``), and also one sent elsewhere while its home is
        still a replica of the model, passed over for its load, as a copy a spill left matches as
        much as home does: in the routing bench's hot-prefix workload the request after a spill
        found that copy, called it a match and moved the hot prefix's home there, and the next spill
        moved it again, each move a full prefill and another prefix pushed out of a cache."""
        if c.reason in AWAY:  # a spill, or a request sent to a spill's copy while home lags
            return False
        return home is None or c.route.instance == home or all(r.instance != home for r in m.replicas)

    def answered(self, instance: str, prompt: Prompt, usage, whole: bool) -> index_feedback.Verdict | None:
        """``instance`` answered ``prompt`` with ``usage``: its cached tokens correct the prefix
        index (gateway/index_feedback.py). In a prefill/decode group, only its prefill's answer (the
        end chosen by cache; a decode's prefix cache holds what it pulled). Not for a replica scored
        by its KV events, an answer without cached tokens, or a prompt not routed by cache.
        ``whole``: the prompt was read whole (its characters and tokens compare)."""
        c, pk = prompt.choice, prompt.pick
        if pk is not None:  # a group's request: its prefill's choice, once (a decode's retry is not a new choice)
            c = pk.choice if pk.prefill is not None and pk.prefill.instance == instance and not pk.retry else None
        if (c is None or not prompt.blocks or not c.blocks or c.index != TEXT
                or c.route.instance != instance or c.reason == LEAST_OUTSTANDING):
            return None
        got = index_feedback.cached_tokens(usage)
        if got is None:
            return None
        held = index_feedback.held_blocks(got[0], got[1], prompt.chars, len(prompt.blocks), self.block_chars, whole)
        return index_feedback.apply(self.index, instance, prompt.blocks, c.matched, held, prompt.age, prompt.forgot)

    def _choose_pd(self, model: str, exclude: frozenset[str], now: float, prompt: Prompt) -> Pick | None:
        """A prefill/decode group's ends for one request (gateway/pd_pick.py), taken (each counted
        in flight; the prompt's blocks indexed under the ends that will hold its KV); None: it waits.
        ``prompt.after`` set: a decode only, of that prefill's generation, near it."""
        m = self.table.models[model]
        g, blocks, slack = m.pd, prompt.blocks, self.knobs.slack(m.limit)
        if prompt.after is not None and prompt.pick is not None:
            a = prompt.after
            d = pick_decode(g.of(a.group_gen, DECODE), m.limit, self.in_flight, self.bad_until, now, exclude,
                            a.worker, slack, self.rng)
            p = d and replace(prompt.pick, decode=d, retry=True)  # the prefill's slot is not held again
        else:
            gen = g.serving(frozenset(self.started.get(model, ())))
            if gen is None:
                return None
            if g.ready(gen):
                self.started.setdefault(model, set()).add(gen)
            tokens = estimate_tokens(prompt.chars, len(prompt.tokens) if prompt.tokens is not None else None)
            home = self.index.home(blocks) if blocks else None
            n = 0 if self.routing_of(model) == LEAST_OUTSTANDING else len(blocks)  # 0: the least loaded prefill
            p = pick_pair(g, gen, m.limit, self.in_flight, self.bad_until, now, exclude, tokens,
                          lambda ps: choose(ps, m.limit, self.in_flight, lambda i: self.index.matched(i, blocks),
                                            n, self.knobs, self.rng, self.bad_until, now, exclude,
                                            self.index.fill, home, self.index.new_turn),
                          lambda d: tokens - tokens * self.index.matched(d.instance, blocks) * self.block_chars
                          // max(prompt.chars, 1), slack, self.rng)
            if p is not None and p.path == DISAGGREGATED and p.choice.reason == NO_PREFIX and home is None and n:
                self.index.placed_new(p.prefill.instance)
        if p is None:
            return None
        if blocks and p.prefill is not None and p.choice is not None and not p.retry:  # as _choose's, for its answer
            prompt.age = self.index.age(p.prefill.instance, blocks[0]) if p.choice.matched else None
            prompt.forgot = (p.choice.matched < len(blocks)
                             and self.index.forgot(p.prefill.instance, blocks[p.choice.matched]))
        for r in p.routes():
            self.in_flight[r.instance] = self.in_flight.get(r.instance, 0) + 1
            if blocks:  # the decode holds the prompt's KV after it, whichever the path
                # the home is the prefill (the end chosen by cache), unless the guard spilled it; no prefill: the decode
                chosen = r is p.prefill and p.choice is not None and p.choice.reason not in AWAY
                self.index.insert(r.instance, blocks, home=chosen or p.prefill is None)
                self.where[r.instance] = (r.address, r.port)
        prompt.pick = p
        return p

    def _exact(self, instance: str, prompt: Prompt) -> int:
        """Leading tokens of ``prompt`` in whole blocks that ``instance``'s engine says it holds."""
        bs = self.tokens.block_size(instance)
        return self.tokens.matched(instance, prompt.token_hashes(bs)) * bs if bs else 0

    def _matched(self, instance: str, prompt: Prompt) -> int:
        """A replica whose engine publishes KV events: its exact match, in the text index's blocks
        (the prompt's share of tokens matched, of its text blocks), so that replicas scored either
        way compare; any other replica: the text index's match."""
        if instance not in self.tokens.live:
            return self.index.matched(instance, prompt.blocks)
        n, total = len(prompt.blocks), len(prompt.tokens)
        return (self._exact(instance, prompt) * n + total // 2) // total if total else 0

    def _dispatch(self, model: str) -> None:
        q, m = self.queues.get(model), self.table.models.get(model)
        if not q or m is None:
            return
        now = time.monotonic()
        for w in list(q):
            if w.fut.done():
                q.remove(w)
                continue
            r = self._choose(model, w.exclude, now, w.prompt)
            if r is None:
                if not w.exclude:
                    break  # the ones behind see the same replicas: in order, high priority first
                continue
            q.remove(w)
            w.fut.set_result(r)
