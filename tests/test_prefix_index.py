"""The gateway's approximate prefix index (gateway/prefix_index.py): what text a request
prefills, its chained block hashes, and each replica's bounded LRU of blocks."""

from __future__ import annotations

import pytest

from gateway.prefix_index import PrefixIndex, block_hashes, prompt_text

SYS = {"role": "system", "content": "s" * 300}


@pytest.mark.parametrize("body,text", [
    ({"messages": [{"role": "user", "content": "hi"}]}, "\x00user\x01hi"),
    # messages in order, each its role then its text; text parts joined, an image stands by its kind
    ({"messages": [{"role": "system", "content": "be brief"},
                   {"role": "user", "content": [{"type": "text", "text": "look: "}, {"type": "image_url"}]}]},
     "\x00system\x01be brief\x00user\x01look: \x02image_url\x02"),
    ({"prompt": "Once upon"}, "Once upon"),  # a completion
    ({"prompt": ["first", "second"]}, "first"),  # a batch: the first prompt's prefix
    ({"prompt": [1, 2, 3]}, ""),  # token ids: not matched
    ({"input": "embed me"}, ""),  # an embedding: no prefix cache
    ({"messages": "not a list"}, ""),
    ([1, 2], ""),
])
def test_prompt_text(body, text):
    assert prompt_text(body) == text


def test_prompt_text_is_bounded_without_building_more():
    body = {"messages": [{"role": "user", "content": "x" * 1000}] * 1000}  # 1 M characters sent
    t = prompt_text(body, limit=2500)
    # "\x00user\x01" is 6 characters, then 1000 x: 1006 a message; 2500 = 2 * 1006 + 488
    assert len(t) == 2500 and t.endswith("\x00user\x01" + "x" * 482)


def test_block_hashes_are_chained_and_only_whole_blocks():
    a = block_hashes("a" * 10 + "b" * 10 + "c" * 5, 10)  # 25 characters: 2 whole blocks, 5 left over
    assert len(a) == 2
    b = block_hashes("a" * 10 + "X" * 10, 10)
    assert a[0] == b[0] and a[1] != b[1]  # the same first block; the second differs
    c = block_hashes("Z" * 10 + "b" * 10, 10)
    assert c[1] != a[1]  # same second block's text, different prefix: a different hash
    assert block_hashes("short", 10) == ()


def test_matched_counts_leading_blocks_only():
    ix = PrefixIndex()
    h = block_hashes("".join(chr(65 + i) * 4 for i in range(6)), 4)  # 6 blocks
    ix.insert("r1", h[:4])
    assert ix.matched("r1", h) == 4 and ix.matched("r2", h) == 0
    ix.insert("r2", h[2:])  # blocks 2..5 without 0 and 1 (cannot happen for one prompt, but the
    assert ix.matched("r2", h) == 0  # chain says: no block 0, no usable prefix)


def test_lru_drops_a_prefix_from_its_tail_and_keeps_the_recent_one():
    ix = PrefixIndex(capacity=6)
    old = block_hashes("o" * 16, 4)  # 4 blocks
    new = block_hashes("n" * 16, 4)  # 4 more: 8 > 6, two must go
    ix.insert("r", old)
    ix.insert("r", new)
    assert ix.size("r") == 6 and ix.total == 6
    assert ix.matched("r", new) == 4
    assert ix.matched("r", old) == 2  # old's last two blocks went, its head is still usable
    # oldest first: new[3] new[2] new[1] new[0] old[1] old[0] after a request sharing old's 2 blocks
    ix.insert("r", old[:2])
    ix.insert("r", block_hashes("q" * 8, 4))  # 2 new blocks push out the 2 oldest: new's tail
    assert ix.matched("r", old) == 2 and ix.matched("r", new) == 2


def test_a_prompt_longer_than_the_lru_keeps_its_head():
    ix = PrefixIndex(capacity=3)
    h = block_hashes("".join(chr(65 + i) * 4 for i in range(5)), 4)  # 5 blocks, room for 3
    ix.insert("r", h)
    assert ix.matched("r", h) == 3 and ix.size("r") == 3


def test_the_whole_index_is_bounded_and_the_biggest_replica_gives_way():
    ix = PrefixIndex(capacity=100, max_total=10)
    ix.insert("a", block_hashes("a" * 32, 4))  # 8 blocks
    ix.insert("b", block_hashes("b" * 16, 4))  # 4 more: 12 > 10, a (the biggest) drops its 2 oldest
    assert (ix.size("a"), ix.size("b"), ix.total) == (6, 4, 10)


def test_forget_and_keep_only():
    ix = PrefixIndex()
    for r in ("a", "b", "c"):
        ix.insert(r, block_hashes(r * 8, 4))
    ix.forget("a")
    ix.forget("nobody")
    assert ix.size("a") == 0 and ix.total == 4
    ix.keep_only({"c"})
    assert set(ix.replicas) == {"c"} and ix.total == 2


def test_a_prefix_keeps_its_home_after_it_aged_out_of_the_lru():
    ix = PrefixIndex(capacity=4)  # homes: 8 x 4 = 32 blocks, whichever replica
    cust = block_hashes("c" * 16, 4)  # a customer's 4 blocks
    ix.insert("a", cust)
    ix.insert("a", block_hashes("x" * 16, 4))  # 4 other blocks push the customer out of a's LRU
    assert ix.matched("a", cust) == 0 and ix.home(cust) == "a"  # but a is still where it lived
    longer = cust + block_hashes("c" * 16 + "q" * 8, 4)[4:]  # the customer's prefix and a question
    assert ix.home(longer) == "a" and ix.home(block_hashes("z" * 16, 4)) is None
    ix.insert("b", cust[:2])  # its head went to b since: the deepest remembered block says a
    assert ix.home(cust) == "a" and ix.home(cust[:2]) == "b"
    ix.forget("a")  # a left: none of its homes stay
    assert ix.home(cust) == "b" and "a" not in ix.homes.values()


def test_homes_are_bounded():
    ix = PrefixIndex(capacity=2)  # homes: 16 blocks
    for i in range(10):
        ix.insert("a", block_hashes(chr(97 + i) * 8, 4))  # 2 blocks each: 20 > 16
    assert len(ix.homes) == 16 and ix.home(block_hashes("a" * 8, 4)) is None  # the oldest went
    assert ix.home(block_hashes("j" * 8, 4)) == "a"


def test_new_turn_says_who_took_a_new_prefix_longest_ago_and_forgets_a_replica():
    idx = PrefixIndex(capacity=8)
    for i in ["a", "b", "a", "c"]:  # new prefixes 1, 2, 3, 4
        idx.placed_new(i)
    assert (idx.new_turn("a"), idx.new_turn("b"), idx.new_turn("c"), idx.new_turn("d")) == (3, 2, 4, 0)
    idx.forget("a")  # left the table: were it back, it takes the next new prefix first
    assert idx.new_turn("a") == 0 and idx.new_turn("b") == 2
