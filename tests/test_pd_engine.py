"""scheduler/groups/pd_engine.py: a decode's own witness read out of its /metrics text: the
stand-in's request counts, vLLM's prompt tokens by source, or nothing. Table; comments give sums."""

from __future__ import annotations

import pytest

from scheduler.groups.pd_engine import engine_counts
from scheduler.groups.pd_health import PDCounts

VLLM = """# HELP vllm:prompt_tokens_by_source_total Prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 1000.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 500.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 160.0
vllm:prompt_tokens_by_source_total{engine="1",model_name="m",source="external_kv_transfer"} 40.0
# TYPE vllm:nixl_num_failed_transfers_total counter
vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} 2.0
"""
STANDIN = VLLM + """# TYPE gpuflow_standin_prefills_total counter
gpuflow_standin_prefills_total{engine="0",model_name="m",source="remote"} 12.0
gpuflow_standin_prefills_total{engine="0",model_name="m",source="local"} 3.0
"""


@pytest.mark.parametrize("text, want", [
    # tokens: external 160 + 40 (two engines) = 200 remote, 1000 local; the cache hits are neither
    (VLLM, ("tokens", PDCounts(disaggregated=200, fallback=1000, transfer_failures=2))),
    # the stand-in's request counts win over its token split: 12 remote, 3 local requests
    (STANDIN, ("requests", PDCounts(disaggregated=12, fallback=3, transfer_failures=2))),
    # an engine with neither (SGLang, an older vLLM): no witness
    ("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n", None),
    # not Prometheus text: no witness, no error
    ("<html>login</html>\n{{{", None),
    # a negative, a NaN and a huge count: 0, 0 and 2**63-1
    ('gpuflow_standin_prefills_total{source="remote"} -5\ngpuflow_standin_prefills_total{source="local"} NaN\n'
     'vllm:nixl_num_failed_transfers_total 1e30\n', ("requests", PDCounts(transfer_failures=2**63 - 1))),
])
def test_engine_counts(text, want):
    assert engine_counts(text) == want
