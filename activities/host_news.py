"""Telling the instances on a host what its watch learned (workflows/supervise_steps.py): the host
was lost, its agent restarted, or one of their processes ended. The host's own liveness, one watch
per host, speaks for all of them: no activity per replica watches it (worker_agent/supervision.py)."""

from __future__ import annotations

import asyncio

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from contracts.ids import INSTANCE_HOST_NEWS, instance_id
from contracts.agent import instance_of
from contracts.control import HostNews
from contracts.process_end import ProcessEnd
from scheduler.naming import name_problem

AT_ONCE = 32  # signals in flight at a time: a host of a big cluster may hold hundreds of replicas


async def tell(client: Client, instances: list[str], news: HostNews) -> int:
    """Signal ``host_news`` to each instance's workflow; returns how many heard it. An instance
    whose workflow has ended is skipped; any other failure raises (the activity is retried, and
    a repeated piece of news changes nothing)."""
    return await tell_each(client, [(n, news) for n in instances])


async def tell_each(client: Client, news: list[tuple[str, HostNews]]) -> int:
    """Signal each (instance, its own piece of news), as ``tell``: a process's end names one instance."""
    ok = [(n, x) for n, x in news if not name_problem(n)]
    told = 0
    for i in range(0, len(ok), AT_ONCE):
        done = await asyncio.gather(*(_one(client, n, x) for n, x in ok[i:i + AT_ONCE]))
        told += sum(done)
    return told


def ends(host: str, ended: list[ProcessEnd], here: set[str]) -> list[tuple[str, HostNews]]:
    """Each process end a host's report carries, as news for its instance: only for an instance that
    holds ledger lines on that host (``here``); a host speaks for nothing placed elsewhere."""
    return [(instance_of(e.key), HostNews(host=host, kind="exited", key=e.key, pid=e.pid, returncode=e.returncode,
                                          why=e.reason[:500])) for e in ended if instance_of(e.key) in here]


async def _one(client: Client, name: str, news: HostNews) -> bool:
    try:
        await client.get_workflow_handle(instance_id(name)).signal(INSTANCE_HOST_NEWS, news)
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:  # ended, or never started here
            return False
        raise
    return True
