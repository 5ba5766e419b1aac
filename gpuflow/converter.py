"""The Temporal data converter: pydantic JSON (temporalio.contrib.pydantic), with one cache of
type adapters for the whole process.

The SDK makes a new payload converter for every workflow run it holds (the workflow worker's
``payload_converter_factory``), and pydantic's converter keeps its TypeAdapter cache on the
instance: every replica's workflow built its adapters again (InstanceInput, PlaceResult,
LaunchResult, ...) on its first activation and after each eviction. In a burst at 100 simulated
hosts that was about a tenth of the control-plane worker's time (py-spy). The payloads are the
same as pydantic_data_converter's, so histories written with either replay with the other."""

from __future__ import annotations

import functools
from typing import Any

import temporalio.api.common.v1
from pydantic import TypeAdapter
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import (CompositePayloadConverter, DataConverter, DefaultPayloadConverter,
                                  JSONPlainPayloadConverter)

_adapter = functools.lru_cache(maxsize=1024)(TypeAdapter)  # per hashable type hint, shared by every run


class _PydanticJSON(PydanticJSONPlainPayloadConverter):
    def from_payload(self, payload: temporalio.api.common.v1.Payload, type_hint: type | None = None) -> Any:
        hint = Any if type_hint is None else type_hint
        try:
            hash(hint)
        except TypeError:  # an unhashable hint: an adapter of its own, as the SDK's converter does
            return TypeAdapter(hint).validate_json(payload.data)
        return _adapter(hint).validate_json(payload.data)


_JSON = _PydanticJSON()  # stateless: to_json, and the shared adapters (its own adapter cache is unused)
_PARTS = tuple(_JSON if isinstance(c, JSONPlainPayloadConverter) else c
               for c in DefaultPayloadConverter.default_encoding_payload_converters)


class PayloadConverter(CompositePayloadConverter):
    """The SDK's default encodings, with JSON done by pydantic through the shared adapters.

    Its parts are made once for the process: the SDK makes a payload converter with every data
    converter, and makes a data converter for each activation and for payloads of another
    serialization context, thousands in a burst (issue 37: 3% of the control-plane worker's Python
    time went to building pydantic's converter again each time). None of the parts keeps state or
    takes a serialization context."""

    def __init__(self) -> None:
        super().__init__(*_PARTS)


DATA_CONVERTER = DataConverter(payload_converter_class=PayloadConverter)
