"""The issue's failure, replayed in one process, and the correction's effect on it: the gateway's
balancer (gateway/balance.py, the real choice, index and correction) before 4 of the stand-in
engines' caches (tests/standin_cache_engine.py ``Cache``: an LRU of 256 blocks of 64 characters,
freed tail first, 128 of the index's blocks), requests one at a time. 16 customers, each a
3,072-character system prompt and a unique 256-character question (26 of the index's blocks, 24 of
them the prefix: 4 customers fill 96 of a replica's 128). In 5% of the requests the replica the
rule would pick (the most matched; home on a tie) is 9 requests ahead (the guard's slack at a
limit of 16 is 8): the guard spills it, as under load. The first third warms up; the rest is
counted. (Until issue 39's third round the spill loaded the first replica of the most matched,
not home on a tie: with copies in the index, many "spills" then loaded a copy and went home.)

- sized to the engines (128 blocks, as when they report it): the reference;
- 16,384 blocks (the default, when an engine does not report), no correction: the issue's case.
  Copies made by spills stay in the index for good, and a request the index routes as held is
  answered with nothing cached. Such a copy once drew its customer off home, and each visit was a
  full prefill that pushed another prefix out; now a copy moves no home and ties with it lose;
- 16,384 blocks, corrected by the answers' cached_tokens: the gateway as it is."""

from __future__ import annotations

import random
from collections import Counter

from store.serving import Route
from gateway.balance import Balancer, Prompt
from gateway.prefix_index import PrefixIndex, block_hashes, prompt_text
from gateway.table import build
from tests.standin_cache_engine import Cache, prompt_of

ENGINE = 128  # each engine's cache in the index's blocks: 256 x 64 / 128


def run(index_blocks: int, correct: bool, n: int = 4500, spill: float = 0.05, seed: int = 1):
    """(hit rate, requests believed held that the engine answered with 0 cached tokens, learned
    capacities, the customers each replica is home to at the end) over the last two thirds of
    ``n`` requests."""
    rng = random.Random(seed)
    routes = [Route(f"r{i}", "m", "127.0.0.1", i + 1) for i in range(4)]
    b = Balancer(1, 10, 5, rng=random.Random(seed), index=PrefixIndex(index_blocks))
    b.swap(build(routes, {"m": {"max_concurrency": 16}}, 4))
    engines = {r.instance: Cache(256, 64) for r in routes}
    system = [(f"customer {c} system prompt. " * 200)[:3072] for c in range(16)]
    hits = wrong = counted = 0
    for k in range(n):
        body = {"messages": [{"role": "system", "content": system[rng.randrange(16)]},
                             {"role": "user", "content": f"{k:08d}" * 32}]}
        text = prompt_text(body)
        p = Prompt(block_hashes(text, 128), chars=len(text))
        b.in_flight = {}
        if rng.random() < spill:  # the replica the rule would pick is 9 ahead: passed over
            got = {r.instance: b.index.matched(r.instance, p.blocks) for r in routes}
            top = max(got.values())
            best = [i for i, m in got.items() if m == top]
            home = b.index.home(p.blocks)  # a tie goes home, as the rule's does
            at = home if home in best or top == 0 else best[0]
            b.in_flight = {at: 9} if at else {}
        r = b._choose("m", frozenset(), 0.0, p)
        engine_text = prompt_of(body)
        cached = engines[r.instance].lookup_and_fill(engine_text) // 4  # tokens, as the stand-in answers
        if k >= n // 3:
            counted += 1
            hits += cached >= 3000 // 4
            wrong += p.choice.matched > 0 and cached == 0
        if correct:
            usage = {"prompt_tokens": len(engine_text) // 4 + 1, "prompt_tokens_details": {"cached_tokens": cached}}
            b.answered(r.instance, p, usage, True)
    homes = Counter(b.index.home(block_hashes(prompt_text({"messages": [{"role": "system", "content": t}]}), 128))
                    for t in system)
    return hits / counted, wrong, sorted(b.index.capacities.values()), sorted(homes.values())


def test_answers_correct_an_index_128_times_too_big_and_its_homes_stay_put():
    sized, sized_wrong, _, _ = run(ENGINE, False)
    big, big_wrong, _, big_homes = run(16384, False)
    fixed, fixed_wrong, learned, fixed_homes = run(16384, True)
    # deterministic (seeded): sized 0.874; too big 0.881 with 213 wrong of 3,000 counted; corrected 0.878, 35 wrong.
    # Before homes stayed put (a spill's copy moved no home, a miss at home dropped nothing, room by turn where
    # the engines' sizes are unknown): sized 0.830; too big 0.814, 287 wrong; corrected 0.837, 86 wrong
    assert sized_wrong == 0  # sized right, the index follows the engine's LRU exactly
    assert big_wrong >= 150, big_wrong  # the symptom: routed as held where the engine had nothing
    assert big >= sized - 0.02, (big, sized)  # ... but the customers stay home: no hits lost to it
    assert fixed >= sized - 0.02 and fixed_wrong <= big_wrong / 4, (fixed, fixed_wrong)
    # 16 customers over 4 replicas, 4 each (a cache holds 4 prefixes): by turn, as no engine's size is known
    assert big_homes == fixed_homes == [4, 4, 4, 4], (big_homes, fixed_homes)
    # learned from the misses' ages (upper bounds): 130, 130, 494 (one replica never missed); never under 128
    assert learned and all(ENGINE <= c <= 5 * ENGINE for c in learned), learned


def test_the_correction_costs_nothing_where_the_index_was_sized_right():
    sized, _, _, _ = run(ENGINE, False, n=3000, seed=2)
    corrected, wrong, _, _ = run(ENGINE, True, n=3000, seed=2)
    assert wrong == 0 and abs(corrected - sized) <= 0.01, (sized, corrected)
