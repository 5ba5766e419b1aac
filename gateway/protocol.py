"""uvicorn's HTTP/1.1 protocol with a header-read timeout, which uvicorn lacks: its
``timeout_keep_alive`` covers only the idle time between two requests, and it ends at a
connection's first byte. So a client that opens a connection, or starts its next request, must
finish the request line and headers within ``header_timeout_s``; if not, it gets a 408 in OpenAI's
error JSON and the connection is closed, at most ``LINGER_S`` later (nginx's
``client_header_timeout`` and lingering close). The body has its own
bound, in the app (``body_timeout_s``, gateway/app.py).

The clock starts when a connection is made, and again at the first byte that arrives while no
request is open (the previous response has ended); it stops when the server has a new request
(its ``cycle`` changed: uvicorn makes one per request, at the end of its headers). One timer
per connection, one attribute check per chunk read: nothing on the request path beyond that."""

from __future__ import annotations

import importlib.util

from gateway.errors import header_timeout_bytes

LINGER_S = 1.0  # after a 408 for slow headers, the connection is closed this long after, at the latest


def base_protocol() -> type:
    """uvicorn's httptools protocol where httptools is installed (a dependency), else h11's."""
    if importlib.util.find_spec("httptools"):
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        return HttpToolsProtocol
    from uvicorn.protocols.http.h11_impl import H11Protocol
    return H11Protocol


def with_header_timeout(seconds: float, base: type | None = None) -> type:
    """A protocol class for ``uvicorn.Config(http=...)``: ``base`` with a header-read timeout."""
    base = base or base_protocol()
    reply = header_timeout_bytes(seconds)

    class HeaderTimeoutProtocol(base):
        _header_timer = None  # the running clock (a TimerHandle), None between headers' end and the response's end
        _header_cycle = None  # the request the server had when the clock started
        _lingering = None  # after a 408: the TimerHandle that closes the connection

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._start_header_clock()

        def data_received(self, data: bytes) -> None:
            if self._lingering:
                return  # a timed-out client still sending: dropped, unparsed
            if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
                self._start_header_clock()  # the first byte of a next request
            super().data_received(data)
            if self._header_timer is not None and self.cycle is not self._header_cycle:
                self._stop_header_clock()  # its headers ended: the server made its request

        def connection_lost(self, exc) -> None:
            self._stop_header_clock()
            if self._lingering is not None:
                self._lingering.cancel()
            super().connection_lost(exc)

        def _start_header_clock(self) -> None:
            self._header_cycle = self.cycle
            self._header_timer = self.loop.call_later(seconds, self._header_timeout)

        def _stop_header_clock(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if self.cycle is not self._header_cycle or self.transport.is_closing():
                return
            if (self.cycle is None or self.cycle.response_complete) and self.transport.can_write_eof():
                # the 408, then our side's end; what the client still sends is read and dropped for
                # up to LINGER_S (its own end closes at once), so that its late bytes cannot turn our
                # close into a reset that would discard the 408 before the client reads it
                self.transport.write(reply)
                self.transport.write_eof()
                self._lingering = self.loop.call_later(LINGER_S, self.transport.close)
                return
            self.transport.close()

    HeaderTimeoutProtocol.__qualname__ = f"HeaderTimeout{base.__name__}"
    return HeaderTimeoutProtocol
