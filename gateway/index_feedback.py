"""The engines' answers correct the prefix index (prefix_index.py), pure but for ``apply``.

The text index records what this gateway sent each replica, not what its engine kept. Every
answer that carries usage says what the engine had: ``usage.prompt_tokens_details.cached_tokens``
(a plain answer's usage, or a stream's final one; the gateway asks engines for it). That is
evidence, read once per answer, at no cost to the request:

- **A miss** (the index believed the replica held ``believed`` leading blocks of the prompt, and
  the engine had under half of them: 0 cached tokens, or only a header every prompt shares): the
  blocks it lacked leave that replica's index, unless it is the prompt's home. The prompt's home
  stays. A prefix the guard copied onto a second replica, since evicted there, stops drawing its
  customer to that replica after one such answer. At home the blocks stay: its engine has just
  prefilled them and holds them now, and the customer comes back there anyway. Dropped there,
  the index was wrong the other way, and a short match on a spill's old copy (its head, kept by
  tail-first eviction) drew the customer off home: in tests/test_index_feedback_sim.py's replay
  the corrected index then hit 0.84-0.86 where the one sized right hit 0.87-0.89.
- **A hit** confirms the index: nothing changes (the blocks were made the freshest when sent).
- **Learning the capacity** (only for a replica whose engine did not report its cache size: a
  reported size is the truth). A miss says how deep the engine's LRU reaches: the first block it
  lacked had ``age + held`` blocks sent after it (``PrefixIndex.age``: an upper bound on its
  depth), so the engine keeps no more than that; the replica's LRU shrinks to it (never under
  ``FLOOR``, never grown by a miss). The other way, an answer whose engine had clearly more than
  the index believed (over twice, and a block more), where the index's LRU had let go of the
  first block it lacked (``PrefixIndex.forgot``: sent there, not dropped by a miss), says the
  LRU is too small: it grows by a quarter, up to ``--prefix-cache-blocks``.
- A replica scored by its engine's KV events is left alone: the events are the truth there.

An answer's cached tokens become the index's blocks by the share of the prompt's tokens they
are (``held_blocks``): ``cached / prompt_tokens`` of the prompt's characters, so a tokenizer's
characters per token do not matter; at 4 characters a token when the prompt was too long to be
read whole or its token count is missing. The index's blocks and the engine's need not match:
the rule acts on a gap of twice, not a block or two."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

CHARS_PER_TOKEN = 4  # when the prompt's own ratio is unknown (engine_cache.py's figure)
FLOOR = 16  # blocks: a learned capacity is never under this (2 KiB of text)
GROW = 1.25  # a learned capacity that proved too small grows by this much
MISS, HIT, BEYOND, NONE = "miss", "hit", "beyond", "none"


def cached_tokens(usage: Any) -> tuple[int, int] | None:
    """(cached tokens, prompt tokens) from an answer's usage; prompt tokens 0 when missing; None
    when the engine did not report cached tokens (then the answer is no evidence)."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    c = details.get("cached_tokens") if isinstance(details, dict) else None
    if type(c) is not int or c < 0:
        return None
    p = usage.get("prompt_tokens")
    return c, p if type(p) is int and p > 0 else 0


def held_blocks(cached: int, prompt_tokens: int, chars: int, blocks: int, block_chars: int, whole: bool) -> int:
    """The prompt's leading blocks (of ``block_chars`` characters; it has ``blocks`` whole ones,
    from ``chars`` characters) that ``cached`` of its ``prompt_tokens`` tokens cover: their share
    of its characters when it was read ``whole`` and its tokens are known, else at
    ``CHARS_PER_TOKEN``. At most ``blocks``."""
    if cached <= 0:
        return 0
    if whole and prompt_tokens >= cached:
        k = cached * chars // (prompt_tokens * block_chars)
    else:
        k = cached * CHARS_PER_TOKEN // block_chars
    return min(k, blocks)


@dataclass(frozen=True)
class Verdict:
    kind: str  # MISS, HIT, BEYOND or NONE
    drop: int | None = None  # the prompt's blocks from this one on leave the replica's index
    capacity: int | None = None  # the replica's LRU is resized to this (learned)


def judge(believed: int, held: int, blocks: int, age: int | None, forgot: bool, capacity: int, default: int,
          learn: bool) -> Verdict:
    """What one answer does to the index, for a prompt of ``blocks`` blocks sent to a replica
    believed to hold its first ``believed``, whose engine had its first ``held``; ``age``: the
    replica's ``PrefixIndex.age`` of the prompt's first block when it was chosen (None: not
    held); ``forgot``: its LRU had let go of block ``believed``; ``capacity``: the replica's LRU
    now; ``default``: ``--prefix-cache-blocks``; ``learn``: its engine did not report its size."""
    if believed >= 1 and 2 * held < believed:
        cap = None
        if learn and age is not None:
            cap = max(min(FLOOR, default), min(capacity, age + held))
        return Verdict(MISS, held, None if cap == capacity else cap)
    if held > 2 * believed + 1 and forgot and learn and capacity < default:
        return Verdict(BEYOND, None, min(default, math.ceil(capacity * GROW)))
    return Verdict(HIT if believed >= 1 else NONE)


def apply(index, instance: str, hashes: tuple[int, ...], believed: int, held: int, age: int | None,
          forgot: bool) -> Verdict:
    """``judge`` for one answer, applied to ``index`` (a PrefixIndex)."""
    cap = index.capacities.get(instance, index.capacity)
    v = judge(believed, held, len(hashes), age, forgot, cap, index.capacity, instance not in index.reported)
    if v.drop is not None and index.home(hashes) == instance:
        v = replace(v, drop=None)  # home: its engine holds them now (it prefilled them for this answer)
    if v.drop is not None:
        index.drop(instance, hashes[v.drop:])
    if v.capacity is not None:
        index.set_capacity(instance, v.capacity, reported=False)
    return v
