"""The console's Temporal client: its actions and the views the CLI reads through the control
plane (gpuflow/ops.py, gpuflow/cluster_client.py) go through Temporal exactly as the CLI's do,
so each is recorded in the workflows' histories. Connected once per gateway, on first use, from
the gateway's Temporal settings (``gpuflow gateway --address``, or GPUFLOW_TEMPORAL__*)."""

from __future__ import annotations

import asyncio

from scheduler.errors import InvalidInput

CONNECT_S = 5.0
_lock = asyncio.Lock()


async def client(gw):
    """The gateway's Temporal client; InvalidInput (shown on the page) when it has no Temporal
    settings or Temporal does not answer within CONNECT_S."""
    if getattr(gw, "console_client", None) is not None:
        return gw.console_client
    if gw.settings.temporal is None:
        raise InvalidInput("this gateway was started without Temporal settings (--address): the console can show "
                           "the store's view but cannot act or ask the control plane")
    async with _lock:
        if getattr(gw, "console_client", None) is None:
            from gpuflow.runtime import connect

            try:
                gw.console_client = await connect(gw.settings.temporal, wait_s=CONNECT_S)
            except Exception as e:  # noqa: BLE001  shown on the page, the rest of the console works
                raise InvalidInput(f"Temporal at {getattr(gw.settings.temporal, 'address', '?')} did not answer: {e}")
    return gw.console_client
