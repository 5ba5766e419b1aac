"""A stream's tokens when its engine sends no usage (gateway/stream_tokens.py, issue 36): the
pieces of content it carried, the prompt with a real tokenizer where the gateway has one, else
estimated and marked; the counter and the store keep the estimated tokens apart (a store made
before the column gains it, its old rows at 0)."""

from __future__ import annotations

import asyncio
import json

import pytest
from sqlalchemy import text

from gateway.metrics import SSEWatch
from gateway.prompt_tokens import load, tokenize
from gateway.stream_tokens import estimate, prompt_tokens, stream_usage
from gateway.usage_counter import UsageCounter
from store import db, key_usage
from store.key_usage import Counts
from tests.standin_cache_engine import make_tokenizer

T0 = 1_800_000_000.0  # minute M0 starts here
M0 = int(T0 // 60)


def ev(d) -> bytes:
    return b"data: " + json.dumps(d).encode() + b"\n\n"


def delta(text: str, i: int = 0) -> dict:
    return {"index": i, "delta": {"content": text}}


@pytest.mark.parametrize("events, pieces", [
    # llama-cpp-python's stream: a role delta, a token a chunk, a finish chunk, no usage
    ([{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}, {"choices": [delta("Par")]},
      {"choices": [delta("is")]}, {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}], 2),
    ([{"choices": [{"index": 0, "text": "a"}]}, {"choices": [{"index": 0, "text": ""}]}], 1),  # a completion's text
    ([{"choices": [delta("x", 0), delta("y", 1)]}], 2),  # n=2: each choice's piece
    ([{"choices": [{"index": 0, "delta": {"tool_calls": [{"id": "c"}]}}]},
      {"choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]}], 2),
    ([{"choices": {"0": "not a list"}}, {"choices": [7, None]}, ["not", "an", "object"]], 0),
])
def test_pieces_of_content_a_stream_carried(events, pieces):
    w = SSEWatch()
    w.feed(b"".join(ev(e) for e in events) + b"data: [DONE]\n\n")
    assert (w.pieces, w.usage, w.done) == (pieces, None, True)


CHAT = {"messages": [{"role": "system", "content": "Be brief."},  # 9 characters
                     {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}]}  # 12


@pytest.mark.parametrize("data, want", [
    (CHAT, 6 + 2 * 4),  # ceil((9 + 12) / 4) = 6, and 4 for each of 2 messages' framing
    ({"messages": [{"role": "user", "content": ""}]}, 4),  # no text: its framing only
    ({"prompt": "abcdefghi"}, 3),  # ceil(9 / 4); a completion has no framing
    ({"prompt": ["abcd", "a much longer second prompt"]}, 1),  # a batch: its first prompt
    ({"prompt": [{"x": 1}]}, 0), ({"messages": "nope"}, 0), ("not a dict", 0),
])
def test_the_estimate_is_four_characters_a_token_and_four_a_message(data, want):
    assert estimate(data) == want


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = make_tokenizer(str(tmp_path_factory.mktemp("tok") / "tokenizer"))
    return load(("local", folder, None), [folder])


def test_the_prompt_with_the_deployment_s_tokenizer_is_counted_not_estimated(tok):
    exact = len(tokenize(tok, CHAT, True, 10_000))  # the chat template rendered, as the engine renders it
    assert exact != estimate(CHAT)
    run = asyncio.run
    assert run(prompt_tokens(tok, CHAT, True, 10_000, None)) == (exact, False)
    assert run(prompt_tokens(None, CHAT, True, 10_000, None)) == (estimate(CHAT), True)  # no tokenizer: marked
    assert run(prompt_tokens(None, CHAT, True, 10_000, (5, 6, 7))) == (3, False)  # routing's ids
    # longer than max_prompt_chars (20 < 21 characters): tokenizing is bounded, so estimated
    assert run(prompt_tokens(tok, CHAT, True, 20, None)) == (estimate(CHAT), True)
    assert run(prompt_tokens(None, {"prompt": [[1, 2, 3, 4]]}, False, 10, None)) == (4, False)  # ids given: known
    usage, guessed = run(stream_usage(None, CHAT, True, 10_000, None, 9))
    assert usage == {"prompt_tokens": 14, "completion_tokens": 9, "total_tokens": 23} and guessed == 14


def test_the_counter_keeps_estimated_tokens_apart_and_never_more_than_counted():
    c = UsageCounter()
    c.count(T0, "k", "a", "m", {"prompt_tokens": 14, "completion_tokens": 9}, 14)
    c.count(T0 + 1, "k", "a", "m", {"prompt_tokens": 5, "completion_tokens": 2})  # reported by the engine
    c.count(T0 + 2, "k", "a", "m", {"prompt_tokens": 1, "completion_tokens": 1}, 50)  # at most 1 + 1
    c.count(T0 + 3, "k", "a", "m", None, True)  # not a count
    # 4 requests; prompt 14 + 5 + 1 = 20, completion 9 + 2 + 1 = 12; estimated 14 + 0 + 2 + 0 = 16
    assert c.take() == {(M0, "k", "a", "m"): Counts(4, 20, 12, 16)}


def test_a_store_made_before_the_column_gains_it(tmp_path):
    engine = db.make_engine(db.sqlite_url(str(tmp_path / "old.db")))
    with engine.begin() as c:  # the table as gpuflow made it before estimated_tokens
        c.execute(text("CREATE TABLE gpuflow_key_usage (minute BIGINT NOT NULL, gateway VARCHAR NOT NULL, "
                       "key_id VARCHAR NOT NULL, tenant VARCHAR NOT NULL, model VARCHAR NOT NULL, requests BIGINT "
                       "NOT NULL, prompt_tokens BIGINT NOT NULL, completion_tokens BIGINT NOT NULL, "
                       "PRIMARY KEY (minute, gateway, key_id, tenant, model))"))
        c.execute(text(f"INSERT INTO gpuflow_key_usage VALUES ({M0}, 'gw', 'k', 'a', 'm', 2, 30, 4)"))
    db.init_db(engine)
    key_usage.add(engine, "gw", {(M0, "k", "a", "m"): Counts(1, 14, 9, 14)})
    # the old row (2, 30, 4, 0) plus the new count: 3, 44, 13, 14
    assert key_usage.totals(engine, T0, T0 + 59).by_key == {"k": Counts(3, 44, 13, 14)}
    engine.dispose()
