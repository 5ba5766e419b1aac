"""``gpuflow autoscale NAME``'s table (gpuflow/cli/autoscale.py render): each decision shows the
figure its rule decided on where the columns (queue, TPOT, P95) do not, so a prefill/decode
group's prefill shows its TTFT and its decode its ITL (issue 35's left-alone: autoscale's output
for groups)."""

from __future__ import annotations

import time

import pytest

from gpuflow.cli.autoscale import render, rule_signal


@pytest.mark.parametrize("rule, signals, shown", [
    ("ttft", {"ttft_p90_s": 0.8123, "queue": 2.0}, " [TTFT p90 812ms]"),  # a prefill's rule
    ("itl", {"itl_p90_s": 0.0404}, " [ITL p90 40ms]"),  # a decode's
    ("kv_usage", {"kv_usage": 0.823}, " [KV usage 0.82]"),
    ("concurrency", {"concurrency": 3.14159}, " [in flight 3.14]"),
    ("queue_time_p90", {"queue_time_p90_s": 1.5}, " [queue time p90 1500ms]"),
    ("queue_tpot", {"queue": 3.0, "tpot_s": 0.05}, ""),  # its figures have their columns
    ("ttft", {"queue": 1.0}, ""),  # not measured in that window: nothing said
    (None, {}, ""),
])
def test_each_rule_shows_its_own_figure(rule, signals, shown):
    assert rule_signal(rule, signals) == shown


def test_a_groups_table_names_each_role_and_its_figure():
    now = time.time()
    v = {"deployment": "pd", "roles": [{"role": "prefill", "desired": 3}, {"role": "decode", "desired": 2}],
         "history": [
             {"at": now - 30, "role": "prefill", "rule": "ttft", "direction": "up", "current": 1, "target": 3,
              "done": "applied", "reason": "TTFT p90 above 0.5 s", "signals": {"queue": 4.0, "ttft_p90_s": 1.25}},
             {"at": now - 10, "role": "decode", "rule": "itl", "direction": "up", "current": 1, "target": 2,
              "done": "applied", "reason": "ITL p90 above 30 ms", "signals": {"queue": 0.0, "itl_p90_s": 0.045}}]}
    text = render(v)
    assert text.splitlines()[0] == ("autoscaler pd: prefill desired 3, last up by ttft (applied); "
                                    "decode desired 2, last up by itl (applied)")
    rows = text.splitlines()[2:]
    assert "prefill:ttft" in rows[0] and "1->3" in rows[0] and rows[0].endswith("TTFT p90 above 0.5 s [TTFT p90 1250ms]")
    assert "decode:itl" in rows[1] and rows[1].endswith("ITL p90 above 30 ms [ITL p90 45ms]")
