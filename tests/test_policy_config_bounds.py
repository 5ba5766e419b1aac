"""The scheduler's settings are bounded (scheduler/policy_config.py): they come from the operator's
environment and, through ``gpuflow audit --with-settings``, from a caller of the control plane, and
the worker that decides with them serves every deployment."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from scheduler.policy_config import MAX_RPC_COMBINATIONS, PolicyConfig, rpc_combinations


@pytest.mark.parametrize("servers, gpus, want", [
    (8, 16, 39_202),  # the defaults: C(16,1) + ... + C(16,8) = 16 + 120 + 560 + 1820 + 4368 + 8008 + 11440 + 12870
    (16, 16, 65_535),  # every non-empty subset of 16: 2^16 - 1
    (1, 1000, 1000),  # one server of 1,000 GPUs: C(1000, 1)
    (64, 3, 7),  # more servers than GPUs: 2^3 - 1
])
def test_the_rpc_search_s_size(servers, gpus, want):
    assert rpc_combinations(servers, gpus) == want


@pytest.mark.parametrize("given, error", [
    ({"placement": float("inf")}, "placement"),  # an infinite weight made every score inf or NaN
    ({"locality": float("nan")}, "locality"),
    ({"fragmentation": 10_001}, "fragmentation"),  # above MAX_WEIGHT (10,000)
    ({"max_rpc_gpus": 20}, "263,949 combinations"),  # 8 of 20: sum C(20, k<=8) = 263,949 > 100,000
    ({"max_rpc_servers": 65}, "max_rpc_servers"),
    ({"max_rpc_gpus": 1025, "max_rpc_servers": 1}, "max_rpc_gpus"),
])
def test_settings_outside_their_bounds_are_refused_by_name(given, error):
    with pytest.raises(ValidationError, match=error):
        PolicyConfig(**given)


@pytest.mark.parametrize("given", [
    {},
    {"placement": 10_000, "fragmentation": 0},
    {"max_rpc_servers": 16, "max_rpc_gpus": 16},  # 65,535 <= 100,000
    {"max_rpc_servers": 1, "max_rpc_gpus": 1000},
])
def test_settings_inside_them_are_kept(given):
    got = PolicyConfig(**given)
    assert rpc_combinations(got.max_rpc_servers, got.max_rpc_gpus) <= MAX_RPC_COMBINATIONS
    assert all(getattr(got, k) == v for k, v in given.items())
