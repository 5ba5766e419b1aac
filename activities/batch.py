"""Calls that arrive while one batch is being run go together into the next batch, when it ends.

A call that finds no batch running starts one at once, so a quiet control plane adds no delay; in a
burst (hundreds of replicas a second) each batch pays once what every call paid before: a
transaction's BEGIN and COMMIT and its turn at the store's write lock, a refresh of the snapshot.
Used by the instance rows' group commit (record_batch.py) and by placing replicas (place_batch.py)."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Batch(Generic[T, R]):
    def __init__(self, run: Callable[[list[T]], Awaitable[list[R | BaseException]]], max_batch: int):
        """``run``: the items of one batch -> one outcome each, in order (a result, or the exception
        that call fails with). Should ``run`` itself raise, every call of that batch fails with it."""
        self._run, self.max_batch = run, max_batch
        self._waiting: list[tuple[T, asyncio.Future]] = []
        self._busy = False
        self._task: asyncio.Future | None = None

    def submit(self, item: T) -> asyncio.Future:
        """A future done with ``item``'s outcome. Cancelling it before its batch begins drops the item."""
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append((item, fut))
        if not self._busy:
            self._busy = True
            self._task = asyncio.ensure_future(self._drain())  # held: the loop keeps only a weak reference
        return fut

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting[:self.max_batch], self._waiting[self.max_batch:]
                live = [(x, f) for x, f in batch if not f.done()]  # a cancelled caller's item is dropped
                if not live:
                    continue
                try:
                    outs = await self._run([x for x, _ in live])
                except Exception as e:  # noqa: BLE001  every call of the batch hears it
                    outs = [e] * len(live)
                for (_, f), out in zip(live, outs):
                    if f.done():
                        continue
                    if isinstance(out, BaseException):
                        f.set_exception(out)
                    else:
                        f.set_result(out)
        finally:
            self._busy = False
