"""A stream's tokens when its engine sends none (issue 36). llama-cpp-python's server sends no usage
chunk even when asked (``stream_options.include_usage``: gateway/stream_usage.py asks), and a
client may say ``include_usage: false``: such a stream was counted with 0 tokens. It is counted here:

- the completion: the pieces of content the stream carried (gateway/metrics.py ``content_pieces``).
  The engines stream a token a piece (llama.cpp's servers; vLLM and SGLang unless they decode
  speculatively, when a piece may hold several);
- the prompt: with the deployment's tokenizer where this gateway has one (gateway/prompt_tokens.py:
  under a ``--tokenizer-root``, or in this machine's Hugging Face cache), rendered as the engine
  renders it; its ids, when routing already tokenized the prompt. Otherwise it is estimated, and
  marked so: ``CHARS_PER_TOKEN`` characters a token, and ``PER_MESSAGE`` tokens for each chat
  message's framing (OpenAI's rule of thumb for its own chat format), counted apart as
  ``estimated`` (store/key_usage.py; ``gpuflow keys usage`` and the console mark them with "~").
  A prompt longer than the gateway's ``max_prompt_chars`` is estimated too (tokenizing is bounded).

A stream that carried usage keeps the engine's figures; a JSON answer carries its own."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.prompt_tokens import tokenize

CHARS_PER_TOKEN = 4
PER_MESSAGE = 4  # a chat message's role and separators, in tokens (OpenAI counts 3-4)


def prompt_chars(data: Any) -> tuple[int, int]:
    """(characters of text, chat messages) of a request's prompt: its messages' text parts, or a
    completion's text prompt (a batch's first)."""
    if not isinstance(data, dict):
        return 0, 0
    msgs, p = data.get("messages"), data.get("prompt")
    if isinstance(msgs, list):
        chars = 0
        for m in msgs:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                chars += len(c)
            elif isinstance(c, list):
                chars += sum(len(x["text"]) for x in c if isinstance(x, dict) and isinstance(x.get("text"), str))
        return chars, len(msgs)
    if isinstance(p, list) and p and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        return len(p), 0
    return 0, 0


def estimate(data: Any) -> int:
    """The prompt's tokens by the rule of thumb: ceil(chars / CHARS_PER_TOKEN) + PER_MESSAGE a message."""
    chars, messages = prompt_chars(data)
    return -(-chars // CHARS_PER_TOKEN) + PER_MESSAGE * messages


def given_ids(data: Any) -> list[int] | None:
    """A completion's prompt given as token ids (the first of a batch): its tokens are known."""
    p = data.get("prompt") if isinstance(data, dict) else None
    if isinstance(p, list) and p and isinstance(p[0], list):
        p = p[0]
    if isinstance(p, list) and p and all(type(x) is int for x in p):
        return p
    return None


async def prompt_tokens(tok, data: Any, chat: bool, max_chars: int, ids: tuple[int, ...] | None) -> tuple[int, bool]:
    """(the prompt's tokens, whether estimated). ``ids``: the prompt as routing tokenized it;
    ``tok``: the deployment's tokenizer, None where this gateway has none."""
    given = given_ids(data)
    if given is not None:
        return len(given), False
    within = prompt_chars(data)[0] <= max_chars
    if ids is not None and within:
        return len(ids), False
    if tok is not None and within:
        got = await asyncio.to_thread(tokenize, tok, data, chat, max_chars)
        if got is not None:
            return len(got), False
    return estimate(data), True


async def stream_usage(tok, data: Any, chat: bool, max_chars: int, ids: tuple[int, ...] | None,
                       pieces: int) -> tuple[dict[str, int], int]:
    """(a usage object for a stream that carried none, how many of its tokens are estimated)."""
    prompt, guessed = await prompt_tokens(tok, data, chat, max_chars, ids)
    usage = {"prompt_tokens": prompt, "completion_tokens": pieces, "total_tokens": prompt + pieces}
    return usage, prompt if guessed else 0
