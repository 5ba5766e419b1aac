"""The routing bench's baseline rules, pure: ``bench_routing``'s gateways and the routing replay
(tests/test_cache_cost_sim.py) pick with the same functions."""

from __future__ import annotations

from collections.abc import Sequence


def sglang(load: Sequence[int], got: Sequence[int], blocks: int, tree: Sequence[int]) -> int:
    """SGLang router's cache-aware rule, the index of its pick: the shortest queue when the load is
    imbalanced (max - min > 32 and max > 1.0001 x min); else the best match when it covers over
    ``cache_threshold`` 0.5 of the prompt's ``blocks``; else the smallest tree (``tree``: the blocks
    each replica's tree holds; SGLang's grows with every request sent until its own eviction).
    Ties go to the first, as ``min`` and ``index`` give them."""
    if max(load) - min(load) > 32 and max(load) > 1.0001 * min(load):
        return load.index(min(load))
    if blocks and max(got) / blocks > 0.5:
        return got.index(max(got))
    return tree.index(min(tree))


def pinned(pins: dict[int, str], first_block: int, names: Sequence[str]) -> str:
    """The pinned ideal's replica for a prompt whose first block is ``first_block``: the replica it
    was dealt, round-robin over ``names`` in order of first arrival (``pins`` remembers the deal)."""
    return pins.setdefault(first_block, names[len(pins) % len(names)])
