"""Per-key usage: the minute buckets a gateway counts in (gateway/usage_counter.py), their sums in
the store (store/key_usage.py: upsert-add, windows, pruning; SQLite and PostgreSQL), the rule for
a stream's tokens (gateway/stream_usage.py), and admin keys in the store."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone

import pytest

from gateway.stream_usage import HideUsage, ask_usage
from gateway.usage_counter import UsageCounter, tokens
from store import db, key_usage, keys
from store.key_usage import Counts

T0 = datetime(2026, 12, 2, 10, 0, tzinfo=timezone.utc).timestamp()  # minute M0 = T0 / 60 starts here
M0 = int(T0 // 60)


@pytest.mark.parametrize("usage, want", [
    ({"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}, (7, 3)),
    ({"prompt_tokens": 5, "total_tokens": 5}, (5, 0)),  # an embedding: no completion
    (None, (0, 0)),  # an answer without usage: the request counts, no tokens
    ({"prompt_tokens": -4, "completion_tokens": 2.5}, (0, 0)),  # not counts
    ({"prompt_tokens": True, "completion_tokens": "9"}, (0, 0)),  # a bool is no count, nor a string
    ([1, 2], (0, 0)),
    # M5: an engine's 2**70 is clipped to one answer's most, MAX_TOKENS = 2**32; 2**32 itself is kept
    ({"prompt_tokens": 2**70, "completion_tokens": 2**32}, (2**32, 2**32)),
    ({"prompt_tokens": 2**32 + 1, "completion_tokens": 10**400}, (2**32, 2**32)),
])
def test_tokens_of_a_usage(usage, want):
    assert tokens(usage) == want


BIG = key_usage.COLUMN_MAX  # 2**63 - 1, BIGINT's largest


def test_one_bad_figure_never_stops_the_others_flush(store):
    """M5: a bucket holding 2**70 (a store's column holds at most 2**63 - 1) failed the whole
    statement ("Python int too large to convert to SQLite INTEGER"), and every flush after it."""
    _, _, engine = store
    c = UsageCounter()
    c.count(T0, "good1", "a", "m", {"prompt_tokens": 5, "completion_tokens": 1})
    c.buckets[(M0, "bad", "b", "m")] = Counts(1, 2**70, 3)  # past any clip on the way in: the store clips it
    c.count(T0, "good2", "c", "m", {"prompt_tokens": 2, "completion_tokens": 2})
    asyncio.run(c.flush(engine, "gw1", T0, force=True))
    assert c.buckets == {}  # all written, none kept back for a flush that would fail again
    got = key_usage.totals(engine, T0, T0 + 59).by_key
    assert got == {"good1": Counts(1, 5, 1), "bad": Counts(1, BIG, 3), "good2": Counts(1, 2, 2)}


@pytest.mark.parametrize("first, then, want", [
    (BIG - 1, 1, BIG),  # fits exactly
    (BIG - 1, 5, BIG),  # would be 2**63 + 3: saturates
    (BIG, BIG, BIG),  # two full rows
    (-5, 2, 2),  # a negative is no count: 0, then + 2
])
def test_a_stored_count_saturates_at_its_column(store, first, then, want):
    _, _, engine = store
    _add(engine, "gw1", [(0, "k", "a", "m", (1, first, 0))])
    _add(engine, "gw1", [(0, "k", "a", "m", (1, then, 0))])  # the upsert adds to the same row
    assert key_usage.totals(engine, T0, T0 + 59).by_key["k"] == Counts(2, want, 0)


def test_saturated_rows_still_sum(store):
    """Two gateways' rows at BIG: SQLite's sum() raised 'integer overflow' on them; the window reads BIG."""
    _, _, engine = store
    _add(engine, "gw1", [(0, "k", "a", "m", (1, BIG, 7))])
    _add(engine, "gw2", [(0, "k", "a", "m", (2, BIG, 8))])
    t = key_usage.totals(engine, T0, T0 + 59)
    assert t.by_key["k"] == Counts(3, BIG, 15) and t.by_tenant["a"] == Counts(3, BIG, 15)  # 1 + 2, 7 + 8


def test_buckets_add_up_by_minute_key_and_model():
    c = UsageCounter()
    for at, key, model, usage in [
        (T0 + 0, "k1", "chat", {"prompt_tokens": 10, "completion_tokens": 4}),
        (T0 + 59.9, "k1", "chat", {"prompt_tokens": 2, "completion_tokens": 1}),  # same minute: 12, 5
        (T0 + 60, "k1", "chat", None),  # next minute: 1 request, 0 tokens
        (T0 + 61, "k1", "embed", {"prompt_tokens": 3}),
        (T0 + 5, "k2", "chat", {"prompt_tokens": 1, "completion_tokens": 1}),
    ]:
        c.count(at, key, "team-a", model, usage)
    assert c.take() == {
        (M0, "k1", "team-a", "chat"): Counts(2, 12, 5),
        (M0 + 1, "k1", "team-a", "chat"): Counts(1, 0, 0),
        (M0 + 1, "k1", "team-a", "embed"): Counts(1, 3, 0),
        (M0, "k2", "team-a", "chat"): Counts(1, 1, 1),
    }
    assert c.take() == {}


def test_a_failed_flush_puts_its_buckets_back_and_a_full_counter_drops():
    c = UsageCounter(max_buckets=2)
    c.count(T0, "k1", "a", "m", {"prompt_tokens": 1})
    taken = c.take()
    c.count(T0, "k1", "a", "m", {"prompt_tokens": 2})  # counted while the flush failed
    c.count(T0, "k2", "a", "m", None)
    c.put_back(taken)  # same bucket as one held: 1 + 1 requests, 1 + 2 tokens
    assert c.buckets[(M0, "k1", "a", "m")] == Counts(2, 3, 0)
    c.count(T0, "k3", "a", "m", None)  # a third bucket: over max_buckets=2
    assert c.dropped == 1 and len(c.buckets) == 2


def test_flush_writes_adds_and_keeps_on_failure(sqlite_engine, tmp_path):
    c = UsageCounter()
    c.count(T0, "k1", "a", "m", {"prompt_tokens": 4, "completion_tokens": 2})
    asyncio.run(c.flush(sqlite_engine, "gw1", T0))
    c.count(T0 + 1, "k1", "a", "m", {"prompt_tokens": 1, "completion_tokens": 1})
    asyncio.run(c.flush(sqlite_engine, "gw1", T0 + 1))  # within FLUSH_S (5 s): not yet
    assert c.buckets
    asyncio.run(c.flush(sqlite_engine, "gw1", T0 + 6))  # 4 + 1, 2 + 1 in the same row
    assert key_usage.totals(sqlite_engine, T0, T0 + 59).by_key == {"k1": Counts(2, 5, 3)}
    broken = db.make_engine(db.sqlite_url(str(tmp_path / "empty.db")))  # a store without its tables
    c.count(T0 + 7, "k1", "a", "m", None)
    asyncio.run(c.flush(broken, "gw1", T0 + 20))
    assert c.buckets == {(M0, "k1", "a", "m"): Counts(1, 0, 0)}  # kept for the next flush


def _add(engine, gateway, rows):
    key_usage.add(engine, gateway, {(M0 + dm, k, t, m): Counts(*c) for dm, k, t, m, c in rows})


def test_upsert_adds_and_windows_sum_by_key_and_tenant(store):
    _, _, engine = store
    # minute offsets from M0 (10:00); "now" is 11:00:30, minute M0 + 60
    _add(engine, "gw1", [
        (60, "k1", "a", "chat", (2, 20, 10)),
        (60, "k1", "a", "embed", (1, 5, 0)),
        (1, "k1", "a", "chat", (1, 1, 1)),  # 10:01: inside the last hour (starts after 10:00:30)
        (0, "k1", "a", "chat", (4, 4, 4)),  # 10:00: starts before 10:00:30, outside the hour
        (30, "k2", "a", "chat", (3, 30, 3)),
        (-60 * 23 + 1, "k3", "b", "chat", (5, 50, 5)),  # 11:01 yesterday: inside the day only
        (-60 * 23, "k3", "b", "chat", (7, 7, 7)),  # 11:00 yesterday: starts before 11:00:30 yesterday
    ])
    _add(engine, "gw1", [(60, "k1", "a", "chat", (1, 2, 3))])  # the same row again: added to it
    _add(engine, "gw2", [(60, "k1", "a", "chat", (1, 1, 1))])  # another gateway: its own row
    now = T0 + 3630
    hour = key_usage.totals(engine, now - 3600, now)
    # k1: chat at 11:00 (2+1+1 req, 20+2+1, 10+3+1) + embed (1, 5, 0) + 10:01 (1, 1, 1) = 6, 29, 15
    assert hour.by_key == {"k1": Counts(6, 29, 15), "k2": Counts(3, 30, 3)}
    assert hour.by_tenant == {"a": Counts(9, 59, 18)}  # 6+3, 29+30, 15+3
    day = key_usage.totals(engine, now - 86400, now)
    # the hour's, plus 10:00 today (4, 4, 4) for k1 and 11:01 yesterday (5, 50, 5) for k3
    assert day.by_key == {"k1": Counts(10, 33, 19), "k2": Counts(3, 30, 3), "k3": Counts(5, 50, 5)}
    assert day.by_tenant == {"a": Counts(13, 63, 22), "b": Counts(5, 50, 5)}
    assert day.key_tenant == {"k1": "a", "k2": "a", "k3": "b"}


def test_prune_keeps_eight_days(store):
    _, _, engine = store
    now = T0
    # 8 days = 11,520 minutes: minute M0 - 11520 is kept, one before it goes
    _add(engine, "gw", [(-11520, "k", "a", "m", (1, 0, 0)), (-11521, "k", "a", "m", (2, 0, 0)),
                        (0, "k", "a", "m", (4, 0, 0))])
    assert key_usage.prune(engine, now) == 1
    assert key_usage.totals(engine, now - 9 * 86400, now).by_key == {"k": Counts(5, 0, 0)}  # 1 + 4


def test_admin_keys_and_identify(store):
    _, _, engine = store
    admin, a = keys.create(engine, "ops", "console", scope="tenant-admin")
    plain, p = keys.create(engine, "team-a")
    assert (a.scope, a.admin, p.scope, p.admin) == ("tenant-admin", True, "tenant", False)
    got = keys.identify(engine, admin)
    assert (got.id, got.tenant, got.scope) == (a.id, "ops", "tenant-admin")
    assert keys.identify(engine, plain).admin is False
    assert keys.identify(engine, admin[:-1] + ("A" if admin[-1] != "A" else "B")) is None  # a wrong secret
    assert keys.identify(engine, f"gpuflow-{a.id}") is None and keys.identify(engine, "") is None
    keys.revoke(engine, a.id)
    assert keys.identify(engine, admin) is None
    assert [k.scope for k in keys.list_keys(engine)] == ["tenant-admin", "tenant"]  # ops, then team-a


def _events(*evs) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in evs) + b"data: [DONE]\n\n"


CHUNK = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"}}]}
USAGE = {"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}


@pytest.mark.parametrize("path, data, body, want_body, hide", [
    ("/v1/chat/completions", {"model": "m", "stream": True}, b'{"model":"m","stream":true}\n',
     b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}', True),
    ("/v1/completions", {"model": "m", "stream": True}, b'{"model":"m","stream":true}',
     b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}', True),
    # the client said: as it is (include_usage false: counted from the stream, gateway/stream_tokens.py)
    ("/v1/chat/completions", {"model": "m", "stream": True, "stream_options": {"include_usage": False}},
     b'{"model":"m","stream":true,"stream_options":{"include_usage":false}}', None, False),
    ("/v1/chat/completions", {"model": "m"}, b'{"model":"m"}', None, False),  # not a stream: usage in the JSON
    ("/v1/embeddings", {"model": "m", "stream": True}, b'{"model":"m","stream":true}', None, False),
    ("/v1/chat/completions", {"model": "m", "stream": True}, '{"model":"m","stream":true}'.encode("utf-16"),
     None, False),  # not ending in '}': left alone
])
def test_which_requests_ask_for_usage(path, data, body, want_body, hide):
    assert ask_usage(path, data, body) == (want_body or body, hide)


@pytest.mark.parametrize("cuts", [(), (7,), (40, 41), tuple(range(1, 400, 3))])
def test_hide_usage_takes_out_the_usage_chunk_however_the_stream_is_cut(cuts):
    stream = _events(CHUNK, CHUNK, USAGE)
    want = _events(CHUNK, CHUNK)
    h, out, at = HideUsage(), [], 0
    for cut in [*cuts, len(stream)]:
        out.append(h.feed(stream[at:cut]))
        at = cut
    out.append(h.end())
    assert b"".join(out) == want


@pytest.mark.parametrize("stream", [
    _events(CHUNK, {**CHUNK, "usage": {"prompt_tokens": 1}}),  # usage inside a content chunk: kept
    _events(CHUNK).replace(b"\n", b"\r\n") + b"data: {\"choices\": [1]",  # CRLF, and a last line without its end
    b"not an event stream, no newline at all",
])
def test_hide_usage_leaves_everything_else(stream):
    h = HideUsage()
    assert h.feed(stream) + h.end() == stream


def test_hide_usage_with_crlf_lines():
    h = HideUsage()
    crlf = _events(CHUNK, USAGE).replace(b"\n", b"\r\n")
    assert h.feed(crlf) + h.end() == _events(CHUNK).replace(b"\n", b"\r\n")
