"""A prefill/decode group's routing, pure: which generation serves, which prefill and which decode
a request goes to, and whether it goes through a prefill at all. ``balance.py`` calls it with its
in-flight counts and prefix index; ``pd_route.py`` speaks the hand-off; docs/user-guide/pd-serving.md
explains it. The rule (tests/test_pd_pick.py has it as tables):

1. **Generation**: a prefill and a decode pair only within one ``group_gen``. The newest generation
   that is *ready* serves: ``any_per_role``, each of prefill and decode has a RUNNING member;
   ``all``, every member its deployment wants in that generation is RUNNING. Else a generation
   this gateway has seen ready (``started``; under ``any_per_role``, any) that still has a RUNNING
   decode serves, the newest first: a group rolled whole switches to its new generation once that
   one is ready, and a group that lost its prefills keeps serving on its decodes.
2. **Short prompt**: fewer tokens than ``skip_below`` in all: no prefill (path ``skipped``).
3. **Prefill**: cache-aware on the prompt among the generation's prefills (``cache_aware.choose``:
   the prefill holds the prefix cache). None RUNNING, or every one failed for this request or
   marked bad: the decode serves the request whole (path ``fallback``, counted: the group reports
   it). Every one busy: the request waits (the group is never silently aggregated under load).
4. **Decode**: the least loaded, preferring the prefill's host (``worker``) unless a decode
   elsewhere is more than ``slack`` requests less busy.
5. **Skip**: fewer uncached tokens than ``skip_below`` on that decode (its prefix-index match;
   the prompt's tokens, or characters / 4 when not tokenized): the decode prefills it itself
   (``skipped``); else path ``disaggregated``."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Sequence

from store.serving import Route
from gateway.cache_aware import Choice, eligible

DISAGGREGATED, SKIPPED, FALLBACK = "disaggregated", "skipped", "fallback"  # a request's path (the metric's label)
PATHS = (DISAGGREGATED, SKIPPED, FALLBACK)
KV = {DISAGGREGATED: "remote", SKIPPED: "skipped", FALLBACK: "local"}  # where the decode's KV came from (header)
PREFILL, DECODE = "prefill", "decode"
ANY_PER_ROLE, ALL = "any_per_role", "all"  # scheduler/groups/spec.py Readiness
VLLM, SGLANG = "vllm", "sglang"  # the hand-off protocols
CHARS_PER_TOKEN = 4  # a prompt not tokenized: its characters / 4, English text's usual ratio


def protocol_of(mode: str) -> str:
    """SGLang's bootstrap for ``sglang-*``; vLLM's kv_transfer_params for every other mode (vllm-nixl,
    vllm-mooncake, vllm-ascend-mooncake, custom)."""
    return SGLANG if mode.startswith("sglang-") else VLLM


@dataclass(frozen=True)
class PDGroup:
    """A group the gateway pairs itself (a group with no router): its mode, readiness, skip
    threshold, RUNNING members and, per generation, the members its deployment wants."""

    mode: str
    readiness: str = ANY_PER_ROLE
    skip_below: int = 16  # uncached tokens (scheduler/groups/spec.py Disaggregation.skip_prefill_below)
    members: tuple[Route, ...] = ()
    wanted: tuple[tuple[int, frozenset[str]], ...] = ()  # (generation, wanted names)

    def of(self, gen: int, role: str) -> list[Route]:
        return [r for r in self.members if r.group_gen == gen and r.role == role]

    def ready(self, gen: int) -> bool:
        has = {r.role for r in self.members if r.group_gen == gen}
        if self.readiness == ALL:
            want = next((ns for g, ns in self.wanted if g == gen), frozenset())
            running = {r.instance for r in self.members if r.group_gen == gen}
            return bool(want) and want <= running and {PREFILL, DECODE} <= has
        return {PREFILL, DECODE} <= has

    def serving(self, started: frozenset[int] = frozenset()) -> int | None:
        """The generation that takes requests now (rule 1); None: none can."""
        gens = sorted({r.group_gen for r in self.members}, reverse=True)
        for g in gens:
            if self.ready(g):
                return g
        for g in gens:
            if (self.readiness != ALL or g in started) and self.of(g, DECODE):
                return g
        return None


@dataclass(frozen=True)
class Pick:
    """One request's ends: the decode always, the prefill when the path is disaggregated."""

    gen: int
    path: str
    decode: Route
    prefill: Route | None = None
    choice: Choice | None = None  # the prefill's cache-aware choice (matched blocks, load)
    uncached: int = 0  # estimated tokens the decode would prefill itself
    tokens: int = 0  # estimated tokens in the prompt
    retry: bool = False  # a decode chosen again for the KV ``prefill`` already holds (its slot not held)

    def routes(self) -> tuple[Route, ...]:
        """The ends this pick holds a slot on."""
        return (self.prefill, self.decode) if self.prefill is not None and not self.retry else (self.decode,)

    def header(self) -> str:
        """``x-gpuflow-route``'s value for a group's request."""
        p = self.prefill.instance if self.prefill is not None else "none"
        m = f"; matched={self.choice.matched}/{self.choice.blocks} blocks" if self.choice is not None else ""
        return (f"prefill={p}; decode={self.decode.instance}; kv={KV[self.path]}; path={self.path}; "
                f"gen={self.gen}; uncached={self.uncached}/{self.tokens} tokens{m}")


def estimate_tokens(chars: int, tokens: int | None) -> int:
    """A prompt's tokens: counted when it was tokenized, else its characters / 4."""
    return tokens if tokens is not None else (chars + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def pick_decode(decodes: Sequence[Route], limit: int, in_flight: dict[str, int], bad_until: dict[str, float],
                now: float, exclude: frozenset[str], near: str | None, slack: int,
                rng: random.Random) -> Route | None:
    """The least loaded eligible decode; one on host ``near`` when it is at most ``slack`` busier
    than the least loaded; ties at random. None: every one is busy, failed or bad."""
    ok = eligible(decodes, limit, in_flight, bad_until, now, exclude)
    if not ok:
        return None
    low = min(in_flight.get(r.instance, 0) for r in ok)
    here = [r for r in ok if near is not None and r.worker == near and in_flight.get(r.instance, 0) <= low + slack]
    pool = here or ok
    least = min(in_flight.get(r.instance, 0) for r in pool)
    return rng.choice([r for r in pool if in_flight.get(r.instance, 0) == least])


def pick(group: PDGroup, gen: int, limit: int, in_flight: dict[str, int], bad_until: dict[str, float], now: float,
         exclude: frozenset[str], tokens: int, choose_prefill: Callable[[list[Route]], Choice | None],
         uncached_on: Callable[[Route], int], slack: int, rng: random.Random) -> Pick | None:
    """The ends for one request of ``tokens`` prompt tokens in generation ``gen`` (rules 2-5); None:
    it waits (its decodes, or its prefills, all busy). ``choose_prefill`` is the cache-aware choice
    among prefills that may be tried; ``uncached_on(decode)`` the tokens that decode would prefill."""
    decodes = group.of(gen, DECODE)
    if tokens < group.skip_below:
        d = pick_decode(decodes, limit, in_flight, bad_until, now, exclude, None, slack, rng)
        return d and Pick(gen, SKIPPED, d, uncached=tokens, tokens=tokens)
    usable = [r for r in group.of(gen, PREFILL) if r.instance not in exclude and bad_until.get(r.instance, 0.0) <= now]
    if not usable:
        d = pick_decode(decodes, limit, in_flight, bad_until, now, exclude, None, slack, rng)
        return d and Pick(gen, FALLBACK, d, uncached=tokens, tokens=tokens)
    if not eligible(decodes, limit, in_flight, bad_until, now, exclude):
        return None  # no decode to hand the KV to: wait before taking a prefill's slot
    c = choose_prefill(usable)
    if c is None:
        return None
    d = pick_decode(decodes, limit, in_flight, bad_until, now, exclude, c.route.worker, slack, rng)
    u = min(tokens, uncached_on(d))
    if u < group.skip_below:
        return Pick(gen, SKIPPED, d, uncached=u, tokens=tokens)
    return Pick(gen, DISAGGREGATED, d, c.route, c, u, tokens)
