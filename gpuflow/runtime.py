"""Connecting to Temporal (address, namespace, mTLS, API key) with the pydantic converter (converter.py), and
registering gpuflow's search attributes."""

from __future__ import annotations

import asyncio

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.service import RPCError, TLSConfig

from gpuflow.converter import DATA_CONVERTER
from gpuflow.settings import TemporalSettings
from scheduler.errors import GpuflowError, InvalidInput
from contracts.search import SEARCH_ATTRIBUTES


class Unreachable(GpuflowError):
    """Temporal, or a host through it, did not answer: nothing was wrong with the input (exit 4)."""


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise InvalidInput(f"{path}: {e.strerror}") from None


def tls_config(t: TemporalSettings) -> TLSConfig | bool:
    if t.tls_cert or t.tls_key or t.tls_ca:
        if bool(t.tls_cert) != bool(t.tls_key):
            raise InvalidInput("mTLS needs both --tls-cert and --tls-key")
        return TLSConfig(server_root_ca_cert=_read(t.tls_ca), client_cert=_read(t.tls_cert),
                         client_private_key=_read(t.tls_key))
    return bool(t.tls or t.api_key)


async def connect(t: TemporalSettings, wait_s: float = 0.0, runtime=None) -> Client:
    """Connect; with ``wait_s``, keep trying that long (a server that is still starting)."""
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        try:
            return await Client.connect(t.address, namespace=t.namespace, data_converter=DATA_CONVERTER,
                                        tls=tls_config(t), api_key=t.api_key, runtime=runtime)
        except RuntimeError as e:
            if asyncio.get_running_loop().time() >= deadline:
                raise Unreachable(f"cannot reach Temporal at {t.address}: {e}\n"
                                  "Start one on this machine with 'gpuflow dev' (Temporal, a control plane and an agent), "
                                  "or point at yours with --address or GPUFLOW_TEMPORAL__ADDRESS.") from None
            await asyncio.sleep(0.5)


async def ensure_search_attributes(client: Client) -> None:
    """Register GpuflowModel/Deployment/Worker/State (Keyword) in the namespace if missing."""
    have = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace))
    missing = {k.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for k in SEARCH_ATTRIBUTES
               if k.name not in have.custom_attributes}
    if missing:
        try:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing))
        except RPCError as e:
            if "already exists" not in str(e):
                raise
