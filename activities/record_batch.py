"""Group commit for the instance rows: the record writes that arrive while one is being written
go into the store together, in one transaction, when it ends.

Every replica's workflow writes its row at each state change (a local activity: workflows/instance.py),
two of them on the way to RUNNING, and in a burst they arrive by the hundred a second. One
transaction each made them queue for the store's write turn (on SQLite one writer at a time:
store/db.py), each turn paying a BEGIN, a COMMIT and a pass through the connection pool.
Here a write waits only for the batch in progress; a write that finds none begins one at once, so a
quiet store adds no delay.

A row write sets the whole row to what its workflow holds (records.record_instances), so a batch
applies them in arrival order and a retry writes the same again. A batch that fails is written again
one record at a time, so a record that cannot be written fails its own call only."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from activities.batch import Batch
from contracts.control import InstanceRecord

MAX_BATCH = 200  # records in one transaction


class RecordBatch:
    def __init__(self, write: Callable[[list[InstanceRecord]], Awaitable[None]]):
        """``write``: writes a list of records in one transaction (in a thread: records.record_instances)."""
        self._write = write
        self._batch: Batch[InstanceRecord, None] = Batch(self._run, MAX_BATCH)

    def record(self, rec: InstanceRecord) -> asyncio.Future:
        """A future done once ``rec`` is written (or failed to be). Cancelling it before its batch
        begins drops the write."""
        return self._batch.submit(rec)

    async def _run(self, recs: list[InstanceRecord]) -> list[None | BaseException]:
        try:
            await self._write(recs)
            return [None] * len(recs)
        except Exception:  # noqa: BLE001  one by one: only the record at fault fails
            out: list[None | BaseException] = []
            for r in recs:
                try:
                    await self._write([r])
                    out.append(None)
                except Exception as e:  # noqa: BLE001
                    out.append(e)
            return out
