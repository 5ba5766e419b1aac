"""The data converter (gpuflow/converter.py): the same payloads as the SDK's pydantic converter,
and one TypeAdapter per type for the whole process, however many converters the SDK makes (it makes
one for every workflow run)."""

from __future__ import annotations

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter

from contracts.control import InstanceInput, PlaceResult
from gpuflow import converter
from gpuflow.converter import DATA_CONVERTER

VALUE = InstanceInput(name="a-0", deployment="a", spec={"name": "a"})


@pytest.mark.parametrize("value, hint", [
    (VALUE, InstanceInput),
    ({"x": [1, 2]}, dict),
    (["a", "b"], list[str]),
    (None, None),
    ("text", None),
])
def test_payloads_are_the_sdks_pydantic_payloads_both_ways(value, hint):
    ours = DATA_CONVERTER.payload_converter.to_payloads([value])
    theirs = pydantic_data_converter.payload_converter.to_payloads([value])
    assert ours == theirs
    hints = [hint] if hint is not None else None
    assert DATA_CONVERTER.payload_converter.from_payloads(theirs, hints) == [value]
    assert pydantic_data_converter.payload_converter.from_payloads(ours, hints) == [value]


def test_every_converter_the_sdk_makes_shares_one_adapter_per_type():
    payloads = DATA_CONVERTER.payload_converter.to_payloads([VALUE])
    converter._adapter.cache_clear()
    for _ in range(20):  # as for 20 workflow runs: a converter each
        assert DATA_CONVERTER._new_payload_converter().from_payloads(payloads, [InstanceInput]) == [VALUE]
    info = converter._adapter.cache_info()
    assert (info.misses, info.hits) == (1, 19)


def test_a_payload_that_does_not_fit_its_type_is_refused():
    payloads = DATA_CONVERTER.payload_converter.to_payloads([{"decision": "not a decision"}])
    with pytest.raises(Exception, match="decision"):
        DATA_CONVERTER.payload_converter.from_payloads(payloads, [PlaceResult])


def test_every_payload_converter_shares_its_parts():
    # the SDK makes one with every data converter, thousands in a burst: the parts are made once
    a, b = converter.PayloadConverter(), converter.PayloadConverter()
    assert a is not b and a.converters == b.converters
    assert all(a.converters[k] is b.converters[k] for k in a.converters)
    assert isinstance(a.converters[b"json/plain"], converter._PydanticJSON)
    # the same encodings, in the same order, as the SDK's default converter
    from temporalio.converter import DefaultPayloadConverter
    assert list(a.converters) == [c.encoding.encode() for c in DefaultPayloadConverter.default_encoding_payload_converters]
