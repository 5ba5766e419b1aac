"""Requests and tokens per API key, tenant and model, counted by the gateway in minute buckets
and added to the store (store/key_usage.py) by the refresh loop every ``FLUSH_S``, off the event
loop. A request counts once an engine answered it (a relayed answer, whatever its status); its
tokens are the answer's ``usage`` (a JSON answer's, or a stream's usage chunk: see
gateway/stream_usage.py); a stream without one is counted from what it carried, its prompt's
tokens estimated where this gateway has no tokenizer (gateway/stream_tokens.py: ``estimated``,
kept apart), and a JSON answer without one counts the request with 0 tokens.

Counting is a dict update on the request's path; a flush swaps the dict for an empty one. A
flush that fails puts its buckets back (they add up again), so a store outage loses nothing
until ``MAX_BUCKETS`` are held; past that, new buckets are dropped and counted in ``dropped``.
No figure can fail a flush: an answer's tokens are clipped here (``tokens``) and every column
where it is stored (store/key_usage.py ``add``), so one engine's bad report never stops the
others' counts."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable

from sqlalchemy.engine import Engine

from store import key_usage
from store.key_usage import Bucket, Counts

log = logging.getLogger("gpuflow.gateway")
FLUSH_S = 5.0  # buckets go to the store this often
PRUNE_S = 3600.0  # and rows older than key_usage.KEEP_DAYS are dropped this often
MAX_BUCKETS = 100_000  # held in memory at most (a store outage of hours, with many keys and models)


MAX_TOKENS = key_usage.MAX_ANSWER_TOKENS  # one answer's count, at most (a larger one is clipped to it)


def tokens(usage) -> tuple[int, int]:
    """(prompt, completion) tokens of an OpenAI ``usage`` object; 0 for anything missing or not a
    count (a negative, a float, a bool, a string), and at most MAX_TOKENS: an engine is a process
    that runs a spec's code, and its ``prompt_tokens: 2**70`` once stopped every key's accounting
    (the store refused the whole flush, every 5 s)."""
    if not isinstance(usage, dict):
        return 0, 0
    got = [usage.get(k) for k in ("prompt_tokens", "completion_tokens")]
    return tuple(min(n, MAX_TOKENS) if type(n) is int and n > 0 else 0 for n in got)  # type: ignore[return-value]


class UsageCounter:
    def __init__(self, max_buckets: int = MAX_BUCKETS):
        self.buckets: dict[Bucket, Counts] = {}
        self.max_buckets = max_buckets
        self.dropped = 0  # requests not counted: the buckets were full
        self.flushed_at: float | None = None
        self.pruned_at: float | None = None
        self.pending: set[asyncio.Task] = set()  # counts being made (``later``)

    def count(self, now_s: float, key_id: str, tenant: str, model: str, usage, estimated: int = 0) -> None:
        """One answered request at ``now_s`` (seconds since the epoch); ``estimated``: how many of
        its ``usage``'s tokens the gateway estimated (gateway/stream_tokens.py), at most their sum."""
        b = (key_usage.minute_of(now_s), key_id, tenant, model)
        have = self.buckets.get(b)
        if have is None and len(self.buckets) >= self.max_buckets:
            self.dropped += 1
            return
        p, c = tokens(usage)
        e = min(estimated, p + c) if type(estimated) is int and estimated > 0 else 0
        self.buckets[b] = (have or Counts()) + Counts(1, p, c, e)

    def later(self, counting: Awaitable[None]) -> None:
        """Count when ``counting`` is done (a stream's prompt tokenized off the event loop)."""
        t = asyncio.get_running_loop().create_task(counting)
        self.pending.add(t)
        t.add_done_callback(self._done)

    def _done(self, t: asyncio.Task) -> None:
        self.pending.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.warning("gateway: a stream's tokens could not be counted: %s", t.exception())

    async def settle(self, timeout_s: float = 5.0) -> None:
        """Wait (at most ``timeout_s``) for the counts still being made, before the last flush."""
        if self.pending:
            await asyncio.wait(set(self.pending), timeout=timeout_s)

    def take(self) -> dict[Bucket, Counts]:
        taken, self.buckets = self.buckets, {}
        return taken

    def put_back(self, taken: dict[Bucket, Counts]) -> None:
        """Buckets a flush could not write, added to those counted since."""
        for b, c in taken.items():
            have = self.buckets.get(b)
            if have is None and len(self.buckets) >= self.max_buckets:
                self.dropped += c.requests
                continue
            self.buckets[b] = c if have is None else have + c

    async def flush(self, engine: Engine, gateway: str, now_s: float, force: bool = False) -> None:
        """Write the buckets when ``FLUSH_S`` has passed since the last flush (or ``force``), and
        prune old rows every ``PRUNE_S``; a failure is logged and the buckets kept for the next."""
        if not force and self.flushed_at is not None and now_s - self.flushed_at < FLUSH_S:
            return
        self.flushed_at = now_s
        taken = self.take()
        try:
            await asyncio.to_thread(key_usage.add, engine, gateway, taken)
        except Exception as e:  # noqa: BLE001  the counts wait for the next flush
            self.put_back(taken)
            log.warning("gateway: cannot write per-key usage (%s); keeping %d buckets", e, len(self.buckets))
            return
        if self.pruned_at is None or now_s - self.pruned_at >= PRUNE_S:
            self.pruned_at = now_s
            try:
                await asyncio.to_thread(key_usage.prune, engine, now_s)
            except Exception as e:  # noqa: BLE001  the next prune catches up
                log.warning("gateway: cannot prune per-key usage (%s)", e)
