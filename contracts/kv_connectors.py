"""The KV connectors an agent may say its engines run (a prefill/decode group's hand-over of the KV
cache): their names, and the check of an operator's list. Apart from contracts/host.py (which
re-exports them) so that the settings (gpuflow/settings.py), read by every CLI command, do not
bring the host's report and the decision types with them (issue 37: ``gpuflow deploy``'s start).
Imports only pydantic and scheduler/groups/spec.py."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from scheduler.groups.spec import MODE_CONNECTOR

# The KV connectors a prefill/decode group's modes hand KV over (scheduler/groups/spec.py MODE_CONNECTOR):
# the names an agent's operator may state (gpuflow agent --kv-connector, the inventory's kv_connectors)
KV_CONNECTORS = tuple(sorted({c for c in MODE_CONNECTOR.values() if c}))
MAX_KV_CONNECTORS = 16
# on the wire a name is only bounded: a newer agent's connector is one this control plane never asks for
KVConnector = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[a-z0-9][a-z0-9._-]*$")]


def known_kv_connectors(names: list[str], where: str = "") -> list[str]:
    """``names`` sorted, each once; ValueError naming the first one gpuflow does not know (and ``where``
    it was given: a flag, a file), with the names it knows."""
    for n in names:
        if n not in KV_CONNECTORS:
            raise ValueError(f"{where + ': ' if where else ''}unknown KV connector {str(n)[:40]!r} "
                             f"(known: {', '.join(KV_CONNECTORS)})")
    return sorted(set(names))
