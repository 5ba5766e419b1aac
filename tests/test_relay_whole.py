"""The request path is handed a small typed context, and the Relay is whole when made (issue 34):
``forward`` takes the parts of the gateway it works with (relay.Serving) and the admitted request
(relay.Ask), not the Gateway; the Relay it returns computes everything it carries from them, and
nothing of it is set afterwards (gateway/app.py set five of its fields once it was returned)."""

from __future__ import annotations

import ast
import pathlib

import pytest

from gateway.balance import Balancer, Prompt
from gateway.cache_aware import Choice
from gateway.metrics import Metrics
from gateway.prompt_tokens import Tokenizers
from gateway.relay import ROUTE, Ask, Disconnect, Relay, Serving
from gateway.tenant_limits import Limits
from gateway.usage_counter import UsageCounter
from store.serving import Route

ROOT = pathlib.Path(__file__).resolve().parent.parent
R = Route(instance="chat-0", deployment="chat", address="127.0.0.1", port=1)


class Answer:
    """A replica's answer as gateway/upstream.py's Response seam gives it."""

    def __init__(self, status: int, ctype: bytes = b"application/json"):
        self.status, self.headers = status, [(b"content-type", ctype)]

    async def chunk(self) -> bytes:
        return b""

    async def close(self) -> None:
        pass


def serving() -> Serving:
    return Serving(Balancer(60.0, 1000, 5.0), None, Limits(), UsageCounter(), Metrics(), Tokenizers(), 3, 60.0, 1024)


def prompt(chosen: bool) -> Prompt:
    return Prompt(choice=Choice(R, "prefix", 3, 4, 1, 4) if chosen else None)


@pytest.mark.parametrize("status, hide_usage, show_route, chosen, hidden, header", [
    (200, True, False, False, True, None),   # the gateway asked the stream for its usage: hidden from the client
    (500, True, False, False, False, None),  # an error carries no usage to hide
    (200, False, False, False, False, None),
    (200, False, True, True, False, b"replica=chat-0; matched=3/4 blocks; load=1/4; reason=prefix; index=text"),
    (200, False, True, False, False, None),  # asked, but no cache-aware choice was made
    (200, False, False, True, False, None),  # a choice, not asked for
])
async def test_a_relay_is_whole_when_made(status, hide_usage, show_route, chosen, hidden, header):
    ask = Ask("chat", "team-a", True, "k1", 0.0, True, prompt(chosen), cold=True, show_route=show_route,
              hide_usage=hide_usage, asked=({}, True, None))
    async def receive():
        return {"type": "http.disconnect"}
    watch = Disconnect(receive)
    r = Relay(serving(), ask, R, Answer(status, b"text/event-stream"), b"", watch)
    watch.stop()
    assert (r.hide is not None, r.status_code, r.ask is ask) == (hidden, status, True)
    assert r.extra_headers == ([(ROUTE, header)] if header else [])


def set_after(source: str) -> list[str]:
    """Attribute assignments, in ``source``, on a name bound to what forward() (or a function
    handing its answer on: _forward, _route) returned."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        bound = set()
        for n in ast.walk(fn):
            if isinstance(n, ast.Assign) and any(f in ast.unparse(n.value) for f in ("forward(", "_route(")):
                for t in n.targets:
                    first = t.elts[0] if isinstance(t, ast.Tuple) else t
                    bound |= {first.id} if isinstance(first, ast.Name) else set()
        found += [f"{fn.name}:{n.lineno}: {ast.unparse(t)}" for n in ast.walk(fn) if isinstance(n, ast.Assign)
                  for t in n.targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                  and t.value.id in bound]
    return found


def test_nothing_of_a_relay_is_set_after_it_is_made():
    assert [(p.name, f) for p in sorted((ROOT / "gateway").rglob("*.py")) for f in set_after(p.read_text())] == []


def test_the_check_finds_a_relay_filled_in_afterwards():
    # gateway/app.py before issue 34: the Relay's fields were set once forward() had returned it
    before = ("async def _route(self):\n    r = await self._forward(request)\n    r.cold = cold\n"
              "async def relay(self):\n    r, model = await self._route(request)\n    r.key_id = key_id\n")
    assert set_after(before) == ["_route:3: r.cold", "relay:6: r.key_id"]
