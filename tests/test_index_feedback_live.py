"""The engines' answers correct the gateway's prefix index, live: a real ``gpuflow gateway``
process with its default index (16,384 blocks a replica) in front of a stand-in engine with a
prefix cache that does not report its size (tests/standin_cache_engine.py ``--cache-info no``),
driven by the official ``openai`` client. The index starts far too big; the issue's measure of a
wrong index is a request routed as "prefix held" (``x-gpuflow-route: matched=M/N``, M > 0) that
the engine answers with ``cached_tokens = 0``.

The engine caches 64 blocks of 64 characters: 4,096 characters, 4 of the prompts below. Each
prompt is, in the gateway's text, "\\x00system\\x01" + 1,016 characters (8 blocks of 128) + a
question under one block; in the engine's, "system: " + the same + "\\n" (16 blocks of 64)."""

from __future__ import annotations

import re

import openai
import pytest

from store import db
from tests import gateway_stack as gs

DEBUG = {"x-gpuflow-debug": "route"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("feedback")
    url = db.sqlite_url(str(tmp / "gpuflow.db"))
    store = db.make_engine(url)
    db.init_db(store)
    procs: list[gs.Proc] = []
    try:
        e = gs.cache_engine("fa", cache_blocks=64, prefill_block_s=0.001, token_s=0.001, cache_info="no")
        procs.append(e)
        gs.deploy(store, "chat", max_concurrency=8)
        gs.running(store, "chat-0", "chat", e.port)
        g = gs.gateway(url, None, log=str(tmp / "gw.log"))
        procs.append(g)
        gs.wait_model(f"http://127.0.0.1:{g.port}", "chat", 1)
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{g.port}/v1", api_key="none", max_retries=0, timeout=30)
    finally:
        for p in reversed(procs):
            p.stop()
        store.dispose()


def ask(c, who: str, question: str, stream: bool = False) -> tuple[int, int]:
    """(blocks the gateway believed the replica held, tokens the engine had cached) for one chat."""
    messages = [{"role": "system", "content": (f"You serve {who}. " * 100)[:1016]},
                {"role": "user", "content": question}]
    raw = c.chat.completions.with_raw_response.create(
        model="chat", messages=messages, max_tokens=2, extra_headers=DEBUG, stream=stream,
        **({"stream_options": {"include_usage": True}} if stream else {}))
    believed = int(re.search(r"matched=(\d+)/8 blocks", raw.headers["x-gpuflow-route"]).group(1))
    if stream:
        usage = [ch.usage for ch in raw.parse() if ch.usage is not None][-1]
    else:
        usage = raw.parse().usage
    return believed, usage.prompt_tokens_details.cached_tokens


def wrong(answers: list[tuple[int, int]]) -> int:
    """Requests routed as "prefix held" that the engine answered with 0 cached tokens."""
    return sum(1 for believed, cached in answers if believed > 0 and cached == 0)


def test_an_index_too_big_recovers_after_one_answer_and_learns_the_engines_size(stack):
    c = stack
    six = [f"customer{i}" for i in range(6)]  # 6 prompts cycling through a cache that holds 4: every one misses
    first = [ask(c, w, "r0") for w in six]
    assert first == [(0, 0)] * 6  # new prefixes: nothing believed, nothing cached
    second = [ask(c, w, "r1") for w in six]
    # the index (16,384 blocks) still believes all 6 held; the engine (LRU of 4 prompts) kept none. The
    # first answer sizes the LRU: that miss was 5 prompts x 8 blocks = 40 blocks deep (index_feedback.judge:
    # age 40 + 0 held), so it keeps at most 40. Its prefix stays (this replica is its home, and its engine has
    # just prefilled it), and the oldest, customer1's, leaves: each of the next is believed 0, rightly.
    # Wrong once, where a drop of each missed prefix left the LRU at 40 blocks of stale prompts: wrong 6 times
    assert second == [(8, 0)] + [(0, 0)] * 5
    later = [ask(c, w, f"r{r}") for r in (2, 3, 4) for w in six]
    # recovered: never wrong again. The drop alone would not do it: a prefix sent again after its drop is
    # believed again, and was wrong every other round when this test ran without the learned size (6 of
    # these 18); the LRU of 40 blocks lets each go before it comes back 6 prompts (48 blocks) later
    assert wrong(later) == 0 and all(believed == 0 for believed, _ in later)

    # 7 new prompts, streamed (the final usage event is the evidence), never dropped: the learned LRU of
    # 40 blocks (5 prompts) has let each go by the time it comes back. With the 16,384 blocks it had,
    # their second round would be wrong 7 times, as the six's was
    seven = [f"newcomer{i}" for i in range(7)]
    assert [ask(c, w, "r0", stream=True) for w in seven] == [(0, 0)] * 7
    again = [ask(c, w, f"r{r}", stream=True) for r in (1, 2) for w in seven]
    assert wrong(again) == 0, again

    # a prefix that fits is believed again, and rightly: 3 prompts (48 of the engine's 64 blocks)
    three = [ask(c, w, f"r{r}") for r in (5, 6, 7) for w in six[:3]]
    assert wrong(three) == 0
    assert all(believed == 8 and cached >= 1016 // 4 for believed, cached in three[3:]), three
