"""Visibility lists read as the CLI needs them: each workflow's id and, where asked, one keyword
search attribute, from the service's own response.

The SDK's ``Client.list_workflows`` turns every execution listed into a ``WorkflowExecution``,
decoding all of its search attributes twice (the typed and the untyped forms) and its
times: 17 ms of CPU for a deployment of 50 replicas on this machine, against 2 ms for the
response read here (issue 37: ``gpuflow deploy``'s look lists its replicas once a second, and ten
deploys sent at once share the control plane's cores). Same call, same query, same pages: only the
decoding is ours, and it reads one field."""

from __future__ import annotations

import json

from temporalio.api.workflowservice.v1 import ListWorkflowExecutionsRequest
from temporalio.common import SearchAttributeKey


def keyword(indexed_fields, key: SearchAttributeKey | None) -> str | None:
    """``key``'s value among an execution's search attributes (a keyword: a JSON string), None when
    it is not set or is not a string (a value gpuflow's workflows never set: not trusted as one)."""
    if key is None:
        return None
    p = indexed_fields.get(key.name)
    if p is None or not p.data:
        return None
    try:
        v = json.loads(p.data)
    except (ValueError, UnicodeDecodeError):
        return None
    return v if isinstance(v, str) else None


async def listed(client, query: str, key: SearchAttributeKey | None = None) -> dict[str, str | None]:
    """Workflow id -> ``key``'s value (None: not set, or no key asked), for every execution
    ``query`` lists, page after page."""
    out: dict[str, str | None] = {}
    token = b""
    while True:
        page = await client.workflow_service.list_workflow_executions(
            ListWorkflowExecutionsRequest(namespace=client.namespace, query=query, next_page_token=token))
        for e in page.executions:
            out[e.execution.workflow_id] = keyword(e.search_attributes.indexed_fields, key)
        token = page.next_page_token
        if not token:
            return out
