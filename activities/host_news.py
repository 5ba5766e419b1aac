"""Telling the instances on a host what its watch learned (workflows/supervise_steps.py): the host
was lost, or its agent restarted. Their supervisors heartbeat too rarely to notice either soon
(generation 2), so the host's own liveness, one watch per host, speaks for all of them."""

from __future__ import annotations

import asyncio

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from contracts.ids import INSTANCE_HOST_NEWS, instance_id
from contracts.control import HostNews
from scheduler.naming import name_problem

AT_ONCE = 32  # signals in flight at a time: a host of a big cluster may hold hundreds of replicas


async def tell(client: Client, instances: list[str], news: HostNews) -> int:
    """Signal ``host_news`` to each instance's workflow; returns how many heard it. An instance
    whose workflow has ended is skipped; any other failure raises (the activity is retried, and
    a repeated piece of news changes nothing)."""
    names = [n for n in instances if not name_problem(n)]
    told = 0
    for i in range(0, len(names), AT_ONCE):
        done = await asyncio.gather(*(_one(client, n, news) for n in names[i:i + AT_ONCE]))
        told += sum(done)
    return told


async def _one(client: Client, name: str, news: HostNews) -> bool:
    try:
        await client.get_workflow_handle(instance_id(name)).signal(INSTANCE_HOST_NEWS, news)
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:  # ended, or never started here
            return False
        raise
    return True
