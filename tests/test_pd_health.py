"""scheduler/groups/pd_health.py: pd_ineffective, judged from the gateways' counts over the last
30 s and from the decodes' own metrics over their last step. Tables; each row's comment is the
arithmetic."""

from __future__ import annotations

import pytest

from scheduler.groups.pd_health import PDCounts, Sample, added, engine_added, ineffective, judge, window_added

NOW = 1_000.0


def gw(at: float, dis=0, skip=0, fb=0, fail=0, source="g1", dep="pd") -> Sample:
    return Sample(source, dep, NOW + at, PDCounts(dis, skip, fb, fail))


def eng(at: float, remote=0, local=0, fail=0, source="engine:pd-1", dep="pd") -> Sample:
    return Sample(source, dep, NOW + at, PDCounts(disaggregated=remote, fallback=local, transfer_failures=fail))


@pytest.mark.parametrize("series, want", [
    # 10 -> 15 -> 18 disaggregated: +8
    ([gw(-20, dis=10), gw(-10, dis=15), gw(0, dis=18)], PDCounts(disaggregated=8)),
    # one sample: a baseline only, nothing added
    ([gw(0, dis=50)], PDCounts()),
    # the gateway restarted between -10 and 0 (15 -> 4): +5 before, then the 4 it holds since (+3 fallbacks)
    ([gw(-20, dis=10), gw(-10, dis=15), gw(0, dis=4, fb=3)], PDCounts(disaggregated=9, fallback=3)),
])
def test_what_a_series_added(series, want):
    assert added(series) == want


def test_the_window_sums_each_sources_increase():
    samples = [gw(-40, fb=100),  # before the 30 s window: not read (its +0..100 happened long ago)
               gw(-25, dis=1, fb=100), gw(-5, dis=2, fb=104),  # g1: +1 disaggregated, +4 fallbacks
               gw(-20, dis=7, source="g2"), gw(-1, dis=9, skip=5, source="g2"),  # g2: +2 disaggregated, +5 skipped
               gw(-3, fb=9, dep="other")]  # one sample: nothing added
    assert window_added(samples, NOW) == {"pd": PDCounts(3, 5, 4, 0), "other": PDCounts()}


@pytest.mark.parametrize("c, raised", [
    (PDCounts(fallback=3), True),  # 3 of 3 without remote KV
    (PDCounts(fallback=2), False),  # 2 requests: under the 3 a verdict needs
    (PDCounts(disaggregated=5, fallback=5), True),  # 5 of 10: half
    (PDCounts(disaggregated=6, fallback=5), False),  # 5 of 11: under half
    (PDCounts(skipped=100), False),  # skipped by design: never against the group
    (PDCounts(disaggregated=100, transfer_failures=40), False),  # failures a retry covered: every request remote
])
def test_ineffective(c, raised):
    assert ineffective(c) is raised


def test_a_decodes_local_prefills_count_less_the_skipped_ones():
    # pd-1 counts requests: between -30 and 0, +2 remote, +9 local; the gateway skipped 4 over that span
    # (0 -> 4): 9 - 4 = 5 local not by choice, 5 of 7 without remote KV
    samples = [eng(-60, remote=0, local=0), eng(-30, remote=10, local=1), eng(0, remote=12, local=10),
               gw(-30, skip=0), gw(0, skip=4)]
    assert engine_added(samples, NOW, 16) == {"pd": (PDCounts(disaggregated=2, fallback=5), 30.0)}
    # pd-2 counts tokens (vLLM's prompt_tokens_by_source): +160 external, +1000 local, 4 skipped of at
    # most 16 tokens each: (1000 - 64) / 16 = 58.5 -> 59 requests' worth local, 160 / 16 = 10 remote
    tok = [eng(-30, source="engine:pd-2#tokens"), eng(0, remote=160, local=1000, source="engine:pd-2#tokens"),
           gw(-30, skip=0), gw(0, skip=4)]
    assert engine_added(tok, NOW, 16) == {"pd": (PDCounts(disaggregated=10, fallback=59), 30.0)}


@pytest.mark.parametrize("samples, want", [
    # the gateway: 0 disaggregated, 6 fallbacks in the window (every prefill gone)
    ([gw(-20), gw(0, fb=6)], {"pd": "gateway: 6 of 6 requests in the last 30 s served without remote KV"}),
    # the gateway says disaggregated (+10) and 3 failures, but the decode prefilled 10 locally, 0 remote
    # (vLLM's kv_load_failure_policy=recompute: silent)
    ([gw(-20), gw(0, dis=10, fail=3), eng(-20), eng(0, local=10)],
     {"pd": "decodes: 10 of 10 requests in the last 20 s served without remote KV"}),
    # transfers resumed: the gateway +8 remote of 10, the decode's last step +8 remote, +2 local
    ([gw(-40, fb=30), gw(-20, fb=30), gw(0, dis=8, fb=32), eng(-20, local=30), eng(0, remote=8, local=32)], {}),
    # short prompts only: the decode prefilled 6 locally, the gateway skipped those 6: nothing against it
    ([gw(-20), gw(0, skip=6), eng(-20), eng(0, local=6)], {}),
])
def test_judge(samples, want):
    assert judge(samples, NOW) == want
