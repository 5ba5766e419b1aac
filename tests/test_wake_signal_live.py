"""A wake's signal (activities/wake_queue.py ``Waker._signal``) against a real Temporal dev server:
a replica whose workflow is gone is nobody's (no retry, no warning); a server that does not answer
is asked SIGNAL_TRIES times before the wake gives up, saying so, since the replica's reason
already says it was woken and nothing else wakes it before the next wake or the sweep. (A burst
on a loaded machine left one woken replica PENDING for 240 s: its one signal had failed.)"""

from __future__ import annotations

import logging
import time

from activities.wake_queue import SIGNAL_TRIES, Waker
from gpuflow.runtime import connect
from gpuflow.settings import TemporalSettings
from tests.live import Live


async def test_a_wake_s_signal_is_sent_again_unless_its_workflow_is_gone(tmp_path, caplog):
    lv = await Live(str(tmp_path)).start({}, servers=0)
    try:
        client = await connect(TemporalSettings(address=lv.stack.temporal.address), wait_s=20)
        waker = Waker(lv.engine, client, None, None, None, run=None)
        caplog.set_level(logging.WARNING, logger="gpuflow.control")
        await waker._signal("nobody-0")  # no such workflow: NOT_FOUND, nothing to retry
        assert not [r for r in caplog.records if "could not wake" in r.getMessage()]
        lv.stack.temporal.stop()
        began = time.monotonic()
        await waker._signal("nobody-0")  # the server is gone: asked again, 0.5 + 1 + 2 s apart
        assert time.monotonic() - began >= 3.5
        said = [r.getMessage() for r in caplog.records if "could not wake" in r.getMessage()]
        assert len(said) == 1 and f"after {SIGNAL_TRIES} tries" in said[0], said
    finally:
        lv.close()
