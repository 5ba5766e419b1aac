"""store/pd_counts.py: each gateway's prefill/decode counts per deployment, one sample per
gateway, deployment and 5 s slot; ``totals`` sums the newest of every live gateway, ``samples``
gives the series the pd_ineffective judgement reads. On SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timezone

from store import pd_counts
from store.pd_counts import PDCounts

T0 = 1_800_000_000.0  # seconds since the epoch: a slot boundary (T0 % 5 == 0)


def test_totals_sum_the_newest_sample_of_each_live_gateway(store):
    _, _, engine = store
    # gateway g1 at T0: pd 10 disaggregated, 1 fallback; at T0+1 (same slot, replaced): 12 and 1
    pd_counts.report(engine, "g1", {"pd": PDCounts(disaggregated=10, fallback=1)}, T0)
    pd_counts.report(engine, "g1", {"pd": PDCounts(disaggregated=12, fallback=1)}, T0 + 1)
    # gateway g2 at T0+2: pd 5 disaggregated, 3 skipped, 2 transfer failures; other 4 fallbacks
    pd_counts.report(engine, "g2", {"pd": PDCounts(disaggregated=5, skipped=3, transfer_failures=2),
                                    "other": PDCounts(fallback=4)}, T0 + 2)
    # at T0+3 both are live (LIVE_S = 5): pd = 12+5 disaggregated, 3 skipped, 1 fallback, 2 failures
    assert pd_counts.totals(engine, T0 + 3) == {"pd": PDCounts(17, 3, 1, 2), "other": PDCounts(fallback=4)}
    # at T0+6.5, g1 (last at T0+1) is 5.5 s silent: gone; g2 (T0+2, 4.5 s) still counts
    assert pd_counts.totals(engine, T0 + 6.5) == {"pd": PDCounts(5, 3, 0, 2), "other": PDCounts(fallback=4)}
    # a datetime is read as the same instant
    assert pd_counts.totals(engine, datetime.fromtimestamp(T0 + 6.5, timezone.utc)) == \
        pd_counts.totals(engine, T0 + 6.5)


def test_one_sample_per_slot_kept_and_old_ones_pruned(store):
    _, _, engine = store
    # g reports every second for 12 s: slots T0/5 .. (T0+11)/5, i.e. 3 slots, each holding its last report
    for i in range(12):
        pd_counts.report(engine, "g", {"pd": PDCounts(disaggregated=i)}, T0 + i)
    got = pd_counts.samples(engine, T0 - 1, T0 + 20)
    # slot T0: reports 0..4 (last: 4); slot T0+5: 5..9 (9); slot T0+10: 10, 11 (11)
    assert [(s.at_s - T0, s.counts.disaggregated) for s in got] == [(4, 4), (9, 9), (11, 11)]
    # a report KEEP_S (600 s) after T0+4 prunes every sample older than T0+5
    pd_counts.report(engine, "g", {"pd": PDCounts(disaggregated=99)}, T0 + 605)
    assert [s.at_s - T0 for s in pd_counts.samples(engine, 0, T0 + 605)] == [9, 11, 605]


def test_bad_counts_are_stored_clipped(store):
    _, _, engine = store
    # a negative, a float and a count past BIGINT are stored as 0, 0 and 2**63-1
    pd_counts.report(engine, "g", {"pd": PDCounts(disaggregated=-3, skipped=1.5, fallback=2**70)}, T0)  # type: ignore[arg-type]
    assert pd_counts.totals(engine, T0) == {"pd": PDCounts(0, 0, 2**63 - 1, 0)}
    # an engine-side witness is kept apart from the gateways' totals
    pd_counts.report(engine, "engine:pd-1", {"pd": PDCounts(fallback=7)}, T0)
    assert pd_counts.totals(engine, T0)["pd"].fallback == 2**63 - 1
    assert pd_counts.totals(engine, T0, gateways_only=False)["pd"].fallback == 2**63 - 1 + 7
