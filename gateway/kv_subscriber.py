"""The gateway's side of the engines' KV-cache events: one ZMQ SUB socket per replica whose
routing-table row names an events port (the agent started its engine with one), read on the
gateway's event loop (``zmq.asyncio``), each batch decoded (kv_events.py) and applied to the
token index (token_index.py).

The wire, as vLLM's ``ZmqEventPublisher`` sends it: a multipart message ``[topic, seq, payload]``,
``seq`` an 8-byte big-endian counter. A message of any other shape, a payload that does not
decode, or a frame over ``kv_events.MAX_PAYLOAD`` (refused by ZMQ itself: ``MAXMSGSIZE``) is
counted and dropped. A gap in ``seq`` (the publisher dropped messages at its high-water mark, or
the engine restarted) means removals may have been missed: the replica's index is cleared and
refills from the next events (under-counting is safe; over-counting is what sends a prompt where
its prefix is not). vLLM's replay socket is not used: a cleared index costs a few misses.

A replica counts as *live* (scored by its exact match) once a batch has been applied; it stays
so until it leaves the table. Bounded: at most ``MAX_SUBSCRIBERS`` sockets, at most ``RCVHWM``
messages queued per socket (ZMQ drops beyond it, which shows up as a gap)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Callable

from gateway import kv_events
from gateway.token_index import TokenIndex

log = logging.getLogger("gpuflow.gateway")

MAX_SUBSCRIBERS = 4096
RCVHWM = 32  # messages queued per socket (x MAX_PAYLOAD: the memory one replica can hold up)
THREAD_OVER = 64 << 10  # payloads bigger than this are decoded in a thread, off the event loop
OK, MALFORMED, GAP = "ok", "malformed", "gap"


def seq_of(frame: bytes) -> int | None:
    return int.from_bytes(frame, "big") if len(frame) == 8 else None


class Subscribers:
    """Which replicas are followed (instance -> endpoint) and their tasks; ``count(result)`` is
    called once per message (ok, malformed, gap)."""

    def __init__(self, index: TokenIndex, count: Callable[[str], None] = lambda r: None):
        self.index, self.count = index, count
        self.ctx = None
        self.tasks: dict[str, tuple[str, asyncio.Task]] = {}

    def sync(self, wanted: dict[str, str]) -> None:
        """Follow exactly ``wanted`` (instance -> tcp://host:port); a replica whose endpoint
        changed (a new process) starts over with an empty index."""
        for inst, (ep, task) in list(self.tasks.items()):
            if wanted.get(inst) != ep:
                task.cancel()
                del self.tasks[inst]
                self.index.forget(inst)
        for inst, ep in wanted.items():
            if inst not in self.tasks and len(self.tasks) < MAX_SUBSCRIBERS:
                self.tasks[inst] = (ep, asyncio.get_running_loop().create_task(self._follow(inst, ep)))

    def live(self, instance: str) -> bool:
        return instance in self.index.live

    async def _follow(self, instance: str, endpoint: str) -> None:
        import zmq
        import zmq.asyncio

        if self.ctx is None:
            self.ctx = zmq.asyncio.Context()
        sock = self.ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.MAXMSGSIZE, kv_events.MAX_PAYLOAD)
        sock.setsockopt(zmq.RCVHWM, RCVHWM)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")  # every topic: the socket is this replica's alone
        last: int | None = None
        try:
            sock.connect(endpoint)
            while True:
                frames = [await sock.recv()]
                while sock.getsockopt(zmq.RCVMORE):
                    f = await sock.recv()
                    if len(frames) < 4:
                        frames.append(f)
                last = await self._one(instance, frames, last)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001  a broken socket: this replica is scored on text from now on
            log.warning("gateway: KV events of %s from %s stopped: %s", instance, endpoint, e)
            self.index.live.discard(instance)
        finally:
            sock.close(linger=0)

    async def _one(self, instance: str, frames: list[bytes], last: int | None) -> int | None:
        """Apply one message; the sequence number to expect the next from."""
        seq = seq_of(frames[1]) if len(frames) == 3 else None
        if seq is None:
            self.count(MALFORMED)
            return last
        payload = frames[2]
        try:
            batch = (await asyncio.to_thread(kv_events.decode, payload) if len(payload) > THREAD_OVER
                     else kv_events.decode(payload))
        except kv_events.BadEvents as e:
            self.count(MALFORMED)
            log.debug("gateway: KV events of %s: dropped a batch: %s", instance, e)
            return last
        if last is not None and seq != last + 1:
            self.index.clear(instance)
            self.count(GAP)
        self.index.apply(instance, batch)
        self.index.live.add(instance)
        self.count(OK)
        return seq

    async def close(self) -> None:
        for _, task in self.tasks.values():
            task.cancel()
        for _, task in self.tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tasks.clear()
        if self.ctx is not None:
            self.ctx.term()
            self.ctx = None
