"""A request's prompt as its engine tokenizes it, for matching against the engines' KV-cache events
(token_index.py): the deployment's own tokenizer (``transformers.AutoTokenizer``), loaded off the
event loop once per tokenizer source and kept, and only from where this gateway's operator allows.

Where a tokenizer comes from (``source_of``, from the deployment's spec; the spec is a deployer's,
so nothing in it is trusted):
- ``source.local_path``: loaded only when the path resolves under one of the gateway's
  ``--tokenizer-root`` folders (none by default): a deployer cannot make the gateway read files
  its operator did not name. A ``.gguf`` file's tokenizer is read from the GGUF (``gguf_file``).
- ``source.huggingface``: the repository from this machine's Hugging Face cache, never downloaded
  (``local_files_only``).
- Never ``trust_remote_code``: a tokenizer that needs the model's own code is not loaded.

A chat request is rendered with the tokenizer's chat template (``add_generation_prompt``), as
vLLM and SGLang render it; a completion's prompt is tokenized with the special tokens the engine
adds; a prompt given as token ids is used as is. Anything that fails (no tokenizer here, no chat
template, a message the template refuses) gives None, and the request is routed on the text index
as before."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Sequence

log = logging.getLogger("gpuflow.gateway")

MAX_TOKENS = 1 << 17  # of a prompt, tokenized at most (the rest matters little for a prefix)
MAX_LOADED = 32  # tokenizers kept (one per distinct source); beyond that the oldest goes


def source_of(spec: dict[str, Any]) -> tuple[str, str, str | None] | None:
    """("local", path, gguf file or None) or ("hub", repo, gguf file or None) from a spec's
    ``source``; None when it names neither."""
    src = spec.get("source")
    if not isinstance(src, dict):
        return None
    lp, hf = src.get("local_path"), src.get("huggingface")
    if isinstance(lp, str) and lp and "\x00" not in lp:
        if lp.endswith(".gguf"):
            return "local", os.path.dirname(lp) or ".", os.path.basename(lp)
        return "local", lp, None
    if isinstance(hf, dict) and isinstance(hf.get("repo"), str) and hf["repo"]:
        f = hf.get("file")
        gguf = f if isinstance(f, str) and f.endswith(".gguf") and not any(c in f for c in "*?[") else None
        return "hub", hf["repo"], gguf
    return None


def allowed(path: str, roots: Sequence[str]) -> bool:
    """Whether ``path`` resolves (symlinks followed) to a folder under one of ``roots``."""
    real = os.path.realpath(path)
    for r in roots:
        root = os.path.realpath(r)
        if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
            return True
    return False


def load(source: tuple[str, str, str | None], roots: Sequence[str]):
    """The tokenizer (blocking: run it in a thread); None when it cannot or may not be loaded."""
    kind, where, gguf = source
    if kind == "local" and not allowed(where, roots):
        log.info("gateway: tokenizer at %s not loaded: not under a --tokenizer-root", where)
        return None
    try:
        from transformers import AutoTokenizer

        kw = {"gguf_file": gguf} if gguf else {}
        return AutoTokenizer.from_pretrained(where, local_files_only=True, trust_remote_code=False, **kw)
    except Exception as e:  # noqa: BLE001  any failure to load means: route on text
        log.info("gateway: no tokenizer for %s %s (%s: %s); routing on the text index", kind, where,
                 type(e).__name__, str(e)[:200])
        return None


def tokenize(tok, body: Any, chat: bool, max_chars: int) -> tuple[int, ...] | None:
    """The token ids ``tok`` gives the request's prompt (blocking); None when it cannot say."""
    if not isinstance(body, dict):
        return None
    try:
        if chat:
            msgs = _messages(body.get("messages"), max_chars)
            if not msgs:
                return None
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):  # newer transformers may give a BatchEncoding
                ids = ids["input_ids"]
        else:
            p = body.get("prompt")
            if isinstance(p, list) and p and isinstance(p[0], (str, list)):
                p = p[0]  # a batch: its first prompt
            if isinstance(p, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in p):
                ids = p
            elif isinstance(p, str) and p:
                ids = tok(p[:max_chars], add_special_tokens=True)["input_ids"]
            else:
                return None
    except Exception:  # noqa: BLE001  a template that refuses these messages: route on text
        return None
    if not isinstance(ids, list) or not all(isinstance(x, int) for x in ids[:MAX_TOKENS]):
        return None
    return tuple(ids[:MAX_TOKENS])


def _messages(msgs: Any, max_chars: int) -> list[dict[str, str]]:
    """The messages as a chat template takes them: role and text only, at most ``max_chars`` of
    text in all (later messages are left out: the prefix is what matters)."""
    out: list[dict[str, str]] = []
    if not isinstance(msgs, list):
        return out
    left = max_chars
    for m in msgs:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or left <= 0:
            break
        c = m.get("content")
        if isinstance(c, list):
            c = "".join(p["text"] for p in c if isinstance(p, dict) and isinstance(p.get("text"), str))
        if not isinstance(c, str):
            c = ""
        out.append({"role": m["role"][:64], "content": c[:left]})
        left -= len(c)
    return out


class Tokenizers:
    """Tokenizers by source, loaded in the background on first ``want``; ``get`` never waits."""

    def __init__(self, roots: Sequence[str] = ()):
        self.roots = tuple(roots)
        self.loaded: dict[tuple, Any] = {}  # source -> tokenizer, or None when it cannot be had
        self.loading: dict[tuple, asyncio.Task] = {}

    def want(self, source: tuple | None) -> None:
        """Start loading ``source``'s tokenizer (once)."""
        if source is None or source in self.loaded or source in self.loading:
            return
        self.loading[source] = asyncio.get_running_loop().create_task(self._load(source))

    async def _load(self, source: tuple) -> None:
        try:
            tok = await asyncio.to_thread(load, source, self.roots)
        finally:
            self.loading.pop(source, None)
        while len(self.loaded) >= MAX_LOADED:
            self.loaded.pop(next(iter(self.loaded)))
        self.loaded[source] = tok

    def get(self, source: tuple | None):
        return self.loaded.get(source) if source is not None else None

    async def close(self) -> None:
        for t in list(self.loading.values()):
            t.cancel()
