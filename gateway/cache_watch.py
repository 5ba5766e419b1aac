"""Off the request path, what the gateway learns from the engines themselves, kept in step with
the routing table (``on_table``, after each swap):

- each replica's cache size, asked once per replica address in the background
  (engine_cache.py), sizes that replica's LRU in the prefix index and its token index; until it
  answers, or when it says nothing, ``--prefix-cache-blocks`` holds;
- each replica whose row names a KV-events port is followed (kv_subscriber.py);
- for each deployment with such a replica, its tokenizer is loaded (prompt_tokens.py), so that
  its prompts can be matched against the exact index.

Nothing here ever blocks a request: probes and loads are tasks, their results land in the indexes
when they come."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from gateway import engine_cache
from gateway.kv_subscriber import Subscribers
from gateway.prompt_tokens import Tokenizers
from gateway.table import Table

log = logging.getLogger("gpuflow.gateway")

MAX_PROBES = 16  # cache-size probes at once
MAX_KNOWN = 65536  # replica addresses whose cache size is remembered


def endpoint(address: str, port: int) -> str:
    return f"tcp://[{address}]:{port}" if ":" in address else f"tcp://{address}:{port}"


class CacheWatch:
    def __init__(self, balancer, block_chars: int, tokenizer_roots=(), kv_events: bool = True, count=None):
        self.balancer, self.block_chars, self.kv_events = balancer, block_chars, kv_events
        self.subscribers = Subscribers(balancer.tokens, count or (lambda r: None))
        self.tokenizers = Tokenizers(tokenizer_roots)
        self.sizes: dict[tuple[str, str, int], tuple[int, int | None] | None] = {}  # (instance, address, port) ->
        #                                                       (tokens, block size) as reported; None: it said nothing
        self.probing: set[asyncio.Task] = set()
        self.gate = asyncio.Semaphore(MAX_PROBES)
        self.session = None

    def on_table(self, table: Table) -> None:
        # a group's members too: the index sizes a prefill's cache as a replica's (gateway/pd_pick.py chooses on it)
        here = {(r.instance, r.address, r.port): r for m in table.models.values()
                for r in (*m.replicas, *(m.pd.members if m.pd is not None else ()))}
        for key in [k for k in self.sizes if k not in here]:
            del self.sizes[key]
        for key in here:
            if key in self.sizes:
                self._apply(key)
            elif len(self.sizes) < MAX_KNOWN:
                self.sizes[key] = None  # asked once, whatever it answers
                t = asyncio.get_running_loop().create_task(self._probe(key, here[key].engine_key))
                self.probing.add(t)
                t.add_done_callback(self.probing.discard)
        if not self.kv_events:
            return
        self.subscribers.sync({r.instance: endpoint(r.address, r.kv_events_port)  # a group's choice reads text only
                               for m in table.models.values() for r in m.replicas if r.kv_events_port})
        for m in table.models.values():
            if any(r.kv_events_port for r in m.replicas):
                self.tokenizers.want(m.tokenizer)

    async def _probe(self, key: tuple[str, str, int], engine_key: str | None = None) -> None:
        import aiohttp

        inst, address, port = key
        host = f"[{address}]" if ":" in address else address
        async with self.gate:
            if self.session is None:
                self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=engine_cache.PROBE_TIMEOUT_S))
            got = await engine_cache.probe(f"http://{host}:{port}",
                                           engine_cache.aiohttp_fetch(self.session, engine_key=engine_key))
        if key in self.sizes:  # still in the table at that address
            self.sizes[key] = got
            self._apply(key)
            if got:
                log.info("gateway: %s reports a cache of %d tokens", inst, got[0])

    def _apply(self, key: tuple[str, str, int]) -> None:
        got = self.sizes.get(key)
        if not got:
            return
        inst, tokens = key[0], got[0]
        self.balancer.index.set_capacity(inst, engine_cache.text_blocks(tokens, self.block_chars))
        self.balancer.tokens.set_capacity(inst, tokens)

    async def close(self) -> None:
        for t in list(self.probing):
            t.cancel()
        for t in list(self.probing):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.subscribers.close()
        await self.tokenizers.close()
        if self.session is not None:
            await self.session.close()
