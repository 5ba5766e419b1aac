"""A stream's tokens, for per-key usage (gateway/usage_counter.py). An OpenAI engine reports a
stream's usage only when asked (``stream_options: {"include_usage": true}``: one last chunk with
``"choices": []`` and the ``usage``), and most clients, the official ``openai`` one included,
do not ask. So the rule:

- a streamed chat or text completion whose request has no ``stream_options`` at all is sent with
  ``"stream_options": {"include_usage": true}`` added (``ask_usage``), and that usage-only chunk is taken
  out of what the client receives (``HideUsage``): the client gets the stream it asked for, and
  its tokens are counted;
- a request that has ``stream_options`` is sent as it is: a client that asked for usage gets the
  chunk (and it is counted), one that said ``include_usage: false`` is counted from the stream;
- anything else (not a stream, embeddings) is sent unchanged; a JSON answer carries its usage.

The added field is spliced before the body's closing brace, so every other byte the client sent
goes on unchanged (a body that does not end in ``}``, e.g. UTF-16, is left alone). A stream that
carries no usage chunk all the same (llama-cpp-python's server sends none even when asked) is
counted from what it carried: gateway/stream_tokens.py."""

from __future__ import annotations

import json

ASK = b',"stream_options":{"include_usage":true}}'
PATHS = ("/chat/completions", "/completions")


def ask_usage(path: str, data: dict, body: bytes) -> tuple[bytes, bool]:
    """(the body to send, whether the usage chunk must be hidden from the client)."""
    if data.get("stream") is not True or "stream_options" in data or not path.endswith(PATHS):
        return body, False
    b = body.rstrip()
    if not b.endswith(b"}"):
        return body, False
    return b[:-1] + ASK, True


def usage_only(line: bytes) -> bool:
    """Whether an SSE line is the usage chunk asked for: ``data: {... "choices": [], "usage": {...}}``."""
    if not line.startswith(b"data:") or b'"usage"' not in line:
        return False
    try:
        ev = json.loads(line[5:])
    except ValueError:
        return False
    return isinstance(ev, dict) and ev.get("choices") == [] and isinstance(ev.get("usage"), dict)


class HideUsage:
    """A stream's bytes, less the usage-only event (its ``data:`` line and the blank line ending it).
    Whole lines go on as they arrive; a line's start waits for its end (at most ``MAX_LINE``, then
    it goes on as it is: not an event we asked for)."""

    MAX_LINE = 1 << 20

    def __init__(self):
        self.tail = b""
        self.skip_blank = False  # the dropped event's closing blank line is next

    def feed(self, data: bytes) -> bytes:
        buf = self.tail + data if self.tail else data
        cut = buf.rfind(b"\n") + 1
        whole, self.tail = buf[:cut], buf[cut:]
        if len(self.tail) > self.MAX_LINE:
            whole, self.tail = buf, b""
        if not self.skip_blank and b'"usage"' not in whole:
            return whole
        out = []
        for line in whole.split(b"\n")[:-1] if whole.endswith(b"\n") else whole.split(b"\n"):
            if self.skip_blank and line in (b"", b"\r"):
                self.skip_blank = False
                continue
            self.skip_blank = False
            if usage_only(line):
                self.skip_blank = True
                continue
            out.append(line + b"\n")
        if not whole.endswith(b"\n") and out:
            out[-1] = out[-1][:-1]  # a long line passed on whole had no end yet
        return b"".join(out)

    def end(self) -> bytes:
        """What is still held when the stream ends (a last line without its newline)."""
        t, self.tail = self.tail, b""
        return t
