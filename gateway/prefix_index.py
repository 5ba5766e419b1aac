"""What the gateway knows of each replica's prefix cache: an approximate index of the prompt
blocks it was recently sent (pure data structure, no I/O).

A request's prompt text (``prompt_text``: chat messages rendered in order, or a completion's
prompt) is cut into blocks of ``block_chars`` characters and each block is hashed together with
the hash of the blocks before it (``block_hashes``), as vLLM and AIBrix chain theirs: a block's
hash then names the whole prefix up to its end, so two prompts share block i's hash only when
they share every character up to it. A trailing partial block is never hashed (engines cache
whole blocks only).

Each replica keeps an LRU of at most ``capacity`` hashes (or the size its engine reported, or the
size learned from its answers: ``set_capacity``, gateway/index_feedback.py), and the whole index at most
``max_total``: everything is bounded (memory, blocks per replica, characters hashed per request).
Beside it, ``homes`` remembers for longer (``HOME_FACTOR`` times a replica's capacity, in one LRU)
which replica each block was last sent to: when a prefix has aged out of every replica's LRU (its
customer was quiet for a while), it goes back where it lived rather than anywhere, so the
prefixes stay shared out as they were (SGLang's unbounded tree keeps them put the same way).
Each entry's value is the replica's *clock* when it was last sent (blocks sent to that replica so
far): ``age`` tells how many blocks were sent there since, an upper bound on how deep the block
sits in the engine's LRU (a block sent twice counts twice), which the answers' ``cached_tokens``
turn into a learned capacity. ``drop`` takes out what an answer showed the engine no longer had.
The hashes are Python's own (``hash`` of a tuple), salted per process: fast, and never shown to
anyone or kept across processes."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable

BLOCK_CHARS = 128  # AIBrix's block: ~32 tokens of English text
MAX_PROMPT_CHARS = 128 * 1024  # characters hashed per request, at most (1,024 blocks); the rest is not looked at
CAPACITY = 16384  # blocks per replica (2 MiB of text, ~0.5 M tokens) when the engine does not say
MAX_TOTAL = 500_000  # blocks in the whole index (~50 MB of entries), however many replicas
HOME_FACTOR = 8  # homes: remembered for 8 replicas' worth of blocks (one entry each, whichever replica)


def prompt_text(body: Any, limit: int = MAX_PROMPT_CHARS) -> str:
    """The text an engine prefills for ``body`` (an OpenAI request, parsed), as far as it matters
    for matching prefixes: each chat message's role and text parts in order, or the completion's
    prompt; at most ``limit`` characters, gathered without building more than that. "" when the
    body has neither (embeddings, malformed requests): such a request matches nothing."""
    if not isinstance(body, dict):
        return ""
    out: list[str] = []
    left = limit

    def add(s: str) -> bool:
        nonlocal left
        out.append(s[:left])
        left -= len(out[-1])
        return left > 0

    msgs, prompt = body.get("messages"), body.get("prompt")
    if isinstance(msgs, list):
        for m in msgs:
            if not isinstance(m, dict):
                continue
            # the role and a separator no text part can fake: "user" saying "system\n..." differs
            if not add(f"\x00{m.get('role')}\x01") or not _content(m.get("content"), add):
                break
    elif isinstance(prompt, str):
        add(prompt)
    elif isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        add(prompt[0])  # a batch of prompts: the first one's prefix (the engine caches each)
    return "".join(out)


def _content(c: Any, add) -> bool:
    """Adds a message's text (a string, or its text parts); False once the limit is reached."""
    if isinstance(c, str):
        return add(c)
    if isinstance(c, list):
        for part in c:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                if not add(part["text"]):
                    return False
            elif isinstance(part, dict):  # an image or audio part: its kind stands for it (its bytes are not hashed)
                if not add(f"\x02{part.get('type')}\x02"):
                    return False
    return True


def block_hashes(text: str, block_chars: int = BLOCK_CHARS) -> tuple[int, ...]:
    """The chained hash of each whole block of ``text``: block i's hash covers text[: (i+1) * block_chars]."""
    out, h = [], 0
    for i in range(0, len(text) - block_chars + 1, block_chars):
        h = hash((h, text[i:i + block_chars]))
        out.append(h)
    return tuple(out)


class PrefixIndex:
    """Per replica (by instance name: unique across deployments), the block hashes it was sent
    most recently, as an LRU of at most ``capacity``; at most ``max_total`` across replicas."""

    def __init__(self, capacity: int = CAPACITY, max_total: int = MAX_TOTAL, sized: bool | None = None):
        if capacity < 1 or max_total < 1:
            raise ValueError("prefix index: capacity and max_total must be >= 1")
        self.capacity, self.max_total = capacity, max_total
        self.sized = capacity != CAPACITY if sized is None else sized  # capacity is the engines' (not the guess)
        self.replicas: dict[str, OrderedDict[int, None]] = {}
        self.total = 0
        self.homes: OrderedDict[int, str] = OrderedDict()  # block hash -> the replica it was last sent to
        self.home_capacity = min(max_total, HOME_FACTOR * capacity)
        self.capacities: dict[str, int] = {}  # instance -> its engine's cache, in blocks (engine_cache.py), or learned
        self.reported: set[str] = set()  # instances whose capacity their engine reported (not learned from answers)
        self.clock: dict[str, int] = {}  # instance -> blocks sent to it so far (each entry's value: the clock then)
        self.dropped: OrderedDict[int, str] = OrderedDict()  # a dropped prefix's first hash -> the replica (bounded)
        self.new_seq = 0  # new prefixes placed so far
        self.last_new: dict[str, int] = {}  # instance -> the number of the last new prefix it took

    def set_capacity(self, instance: str, blocks: int, reported: bool = True) -> None:
        """``instance``'s engine reported a cache of ``blocks`` blocks (or, ``reported=False``, its
        answers showed it holds about that much): its LRU is that size from now on. A reported
        size is never replaced by a learned one."""
        if not reported and instance in self.reported:
            return
        if reported:
            self.reported.add(instance)
        self.capacities[instance] = cap = max(1, min(blocks, self.max_total))
        b = self.replicas.get(instance)
        while b and len(b) > cap:
            b.popitem(last=False)
            self.total -= 1

    def size_of(self, instance: str) -> tuple[str, int, int]:
        """Where ``instance``'s LRU size came from (``reported``, ``learned`` or ``default``), that
        size, and how many blocks it holds now."""
        cap = self.capacities.get(instance)
        source = "default" if cap is None else "reported" if instance in self.reported else "learned"
        return source, self.capacity if cap is None else cap, len(self.replicas.get(instance) or ())

    def matched(self, instance: str, hashes: tuple[int, ...]) -> int:
        """How many leading blocks of ``hashes`` ``instance`` holds. Chained hashes: the first
        block it lacks ends the match (a later one cannot be a cached prefix without it)."""
        blocks = self.replicas.get(instance)
        if not blocks:
            return 0
        n = 0
        for h in hashes:
            if h not in blocks:
                break
            n += 1
        return n

    def insert(self, instance: str, hashes: tuple[int, ...], home: bool = True) -> None:
        """``instance`` was sent these blocks: they become its most recent. Inserted last block
        first, so the prompt's head is the freshest and the LRU drops a prefix from its tail, as
        vLLM's free queue does: a half-evicted prefix keeps its usable head, never a useless tail.
        ``home=False`` (a one-off, such as a spill) leaves the prefix's home where it was."""
        if not hashes:
            return
        blocks = self.replicas.get(instance)
        if blocks is None:
            blocks = self.replicas[instance] = OrderedDict()
        before, cap = len(blocks), self.capacities.get(instance, self.capacity)
        head = hashes[:cap]  # a prompt longer than the LRU: its head is what repeats
        t = self.clock[instance] = self.clock.get(instance, 0) + len(head)
        for h in reversed(head):
            blocks[h] = t
            blocks.move_to_end(h)
        while len(blocks) > cap:
            blocks.popitem(last=False)
        self.total += len(blocks) - before
        if self.total > self.max_total:
            self._trim()
        if not home:
            return
        homes = self.homes
        for h in reversed(hashes[:self.capacity]):
            homes[h] = instance
            homes.move_to_end(h)
        while len(homes) > self.home_capacity:
            homes.popitem(last=False)

    def age(self, instance: str, h: int) -> int | None:
        """Blocks sent to ``instance`` since the prompt that last sent it block ``h`` (0: the latest);
        None when its LRU does not hold ``h``. That prompt's block j was j deep then, so j + age
        bounds its depth in the engine's LRU now (from above: a block sent twice since counts twice)."""
        b = self.replicas.get(instance)
        t = b.get(h) if b else None
        return None if t is None else self.clock[instance] - t

    def forgot(self, instance: str, h: int) -> bool:
        """Whether block ``h`` was last sent to ``instance`` (its home) and its LRU no longer
        holds it, and not because an answer had it dropped (``drop``): the LRU let it go."""
        b = self.replicas.get(instance)
        return (self.homes.get(h) == instance and not (b and h in b)
                and self.dropped.get(h) != instance)

    def drop(self, instance: str, hashes: tuple[int, ...]) -> int:
        """``instance``'s engine did not have these blocks (its answer said so): they leave its
        LRU (their home stays). Returns how many it held."""
        b = self.replicas.get(instance)
        n = 0
        for h in hashes if b else ():
            if b.pop(h, None) is not None:
                n += 1
        self.total -= n
        if n:
            self.dropped[hashes[0]] = instance
            self.dropped.move_to_end(hashes[0])
            while len(self.dropped) > self.home_capacity:
                self.dropped.popitem(last=False)
        return n

    def placed_new(self, instance: str) -> None:
        """A new prefix (no replica held any of it, and it had no home) went to ``instance``."""
        self.new_seq += 1
        self.last_new[instance] = self.new_seq

    def new_turn(self, instance: str) -> int:
        """When ``instance`` last took a new prefix (0: never, or not since it joined): the lower,
        the sooner it takes the next one. Once every replica's LRU is full (a busy cluster's
        steady state, or after a burst of unique prompts) the room each has is the same, and new
        prefixes then go round the replicas rather than at random: 16 prefixes at random over 4
        replicas put 6 or more on one about a third of the time, one more than its cache holds in
        the routing bench, and that replica's prefills queued. A turn, not a count of what each
        took: a count would send a run of new prefixes to whichever replica took fewest one-off
        prompts before, unevenly again."""
        return self.last_new.get(instance, 0)

    def home(self, hashes: tuple[int, ...]) -> str | None:
        """The replica the longest remembered prefix of ``hashes`` was last sent to (None: none
        is), whether or not that replica's LRU still holds it."""
        last = None
        for h in hashes:
            r = self.homes.get(h)
            if r is None:
                break
            last = r
        return last

    def _trim(self) -> None:
        """Over ``max_total``: the replica holding the most gives up its oldest blocks (one pass
        over the replicas, then a bulk pop)."""
        while self.total > self.max_total:
            name = max(self.replicas, key=lambda k: len(self.replicas[k]))
            blocks = self.replicas[name]
            drop = min(len(blocks), self.total - self.max_total)
            for _ in range(drop):
                blocks.popitem(last=False)
            self.total -= drop

    def size(self, instance: str) -> int:
        b = self.replicas.get(instance)
        return len(b) if b else 0

    def fill(self, instance: str) -> int | None:
        """The blocks ``instance``'s LRU holds less its size: minus the blocks free (0: full), the
        room left in its engine's cache as far as this gateway knows, where that size is known:
        reported, learned, or given (``--prefix-cache-blocks``). A new prefix goes where this is
        least (cache_aware.guarded). Not the blocks held alone: once sizes are learned they differ,
        and by blocks held every new prefix went to the replica with the smallest cache, full or
        not (the routing bench's no-prefix phase after the others: p90 1.3 s, 5x least outstanding).
        None under the default guess (``CAPACITY``, far above most engines' caches): there the
        count grows with every request sent, full cache or not, and tells how busy a replica was,
        not how full. A new prefix then goes by turn: by the count, in the routing replay of an
        index 128x too big, the customers who came last went to the replicas that had served least
        so far, and one replica became home to 5 customers where its cache held 4."""
        cap = self.capacities.get(instance)
        if cap is None and not self.sized:
            return None
        return self.size(instance) - (self.capacity if cap is None else cap)

    def forget(self, instance: str) -> None:
        """``instance`` left (drained, stopped, restarted elsewhere): its blocks go."""
        b = self.replicas.pop(instance, None)
        self.capacities.pop(instance, None)
        self.reported.discard(instance)
        self.clock.pop(instance, None)
        if b:
            self.total -= len(b)
        if instance in self.homes.values():  # a table change, not a request: a pass over the homes is fine
            self.homes = OrderedDict((h, i) for h, i in self.homes.items() if i != instance)
        self.last_new.pop(instance, None)

    def keep_only(self, instances: Iterable[str]) -> None:
        """Every replica not in ``instances`` leaves the index."""
        keep = set(instances)
        for name in [n for n in {*self.replicas, *self.capacities} if n not in keep]:
            self.forget(name)
