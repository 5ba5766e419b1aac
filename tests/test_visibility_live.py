"""gpuflow/visibility.py: the CLI's visibility lists read from the service's response (issue 37), on a
real dev server. They list what the SDK's ``list_workflows`` lists, and read the keyword as it does."""

from __future__ import annotations

import asyncio
import time

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from contracts.ids import INSTANCE_WORKFLOW, instance_id
from contracts.search import SA_DEPLOYMENT, SA_STATE
from gpuflow import deploy_look
from gpuflow.dev.temporal import DevServer
from gpuflow.ports import server_port
from gpuflow.runtime import connect
from gpuflow.settings import TemporalSettings
from gpuflow.visibility import keyword, listed


@pytest.mark.parametrize("data, want", [
    (b'"RUNNING"', "RUNNING"),  # a keyword: a JSON string
    (b"", None),  # empty: not set
    (b"42", None),  # JSON, not a string: not trusted as a state
    (b'["RUNNING"]', None),  # a keyword list
    (b"RUNNING", None),  # not JSON
    (b'"\xff"', None),  # not UTF-8
])
def test_a_keyword_is_read_only_as_a_json_string(data, want):
    assert keyword({SA_STATE.name: Payload(data=data)}, SA_STATE) == want


def test_a_keyword_not_set_or_not_asked_is_none():
    assert keyword({}, SA_STATE) is None
    assert keyword({SA_STATE.name: Payload(data=b'"RUNNING"')}, None) is None


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One dev server for the file, gpuflow's search attributes registered."""
    s = DevServer(str(tmp_path_factory.mktemp("temporal")), port=server_port(), ui_port=None).start()
    yield s
    s.stop()


async def listed_by_sdk(client, query: str) -> dict[str, str | None]:
    return {w.id: w.typed_search_attributes.get(SA_STATE) async for w in client.list_workflows(query)}


@pytest.mark.asyncio
async def test_the_lists_match_the_sdk_s_on_a_real_server(server):
    client = await connect(TemporalSettings(address=server.address), wait_s=20)
    # real workflows of the replicas' type, that no worker runs: three of deployment "web" (two with
    # a state, one not yet), one of "api"
    for name, dep, state in [("web-0", "web", "RUNNING"), ("web-1", "web", "STARTING"), ("web-2", "web", None),
                             ("api-0", "api", "PENDING")]:
        attrs = [SearchAttributePair(SA_DEPLOYMENT, dep)] + ([SearchAttributePair(SA_STATE, state)] if state else [])
        await client.start_workflow(INSTANCE_WORKFLOW, {"name": name}, id=instance_id(name), task_queue="nobody-polls",
                                    search_attributes=TypedSearchAttributes(attrs))
    # this test's workflows only: the next test's (no deployment) share the file's server
    q = f"WorkflowType = '{INSTANCE_WORKFLOW}' AND ExecutionStatus = 'Running' AND {SA_DEPLOYMENT.name} IN ('web', 'api')"
    deadline = time.monotonic() + 30
    while len(await listed(client, q)) < 4:  # visibility follows the starts within moments
        assert time.monotonic() < deadline, await listed(client, q)
        await asyncio.sleep(0.2)
    assert await listed(client, q, SA_STATE) == await listed_by_sdk(client, q) == {
        "instance/web-0": "RUNNING", "instance/web-1": "STARTING", "instance/web-2": None, "instance/api-0": "PENDING"}
    assert await listed(client, q) == dict.fromkeys(await listed_by_sdk(client, q))  # ids only: no key asked
    # the deploy's look: one deployment's replicas, a replica without a state yet counted PENDING
    assert await deploy_look.states(client, "web") == {"web-0": "running", "web-1": "starting", "web-2": "pending"}
    assert await listed(client, f"{q} AND {SA_DEPLOYMENT.name} = 'none'") == {}


@pytest.mark.asyncio
async def test_a_list_longer_than_a_page_is_read_page_after_page(server, monkeypatch):
    client = await connect(TemporalSettings(address=server.address), wait_s=20)
    for k in range(5):
        await client.start_workflow(INSTANCE_WORKFLOW, {"name": f"p-{k}"}, id=instance_id(f"p-{k}"),
                                    task_queue="nobody-polls")
    q = f"WorkflowType = '{INSTANCE_WORKFLOW}' AND WorkflowId STARTS_WITH 'instance/p-'"
    deadline = time.monotonic() + 30
    while len(await listed(client, q)) < 5:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    pages = []
    real = client.workflow_service.list_workflow_executions

    async def two_a_page(req, *a, **kw):  # the real call, asked for pages of two
        req.page_size = 2
        got = await real(req, *a, **kw)
        pages.append(len(got.executions))
        return got
    monkeypatch.setattr(client.workflow_service, "list_workflow_executions", two_a_page)
    assert sorted(await listed(client, q)) == [instance_id(f"p-{k}") for k in range(5)]
    assert pages[:3] == [2, 2, 1], pages
