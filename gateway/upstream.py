"""HTTP to the replicas: one pooled client per gateway, two implementations behind one small
interface (aiohttp, the default, and httpx; bench/bench_gateway.py picks between them). Bodies
go out and come back unchanged (no decompression); the named timeouts are connect, first byte
(request sent -> status line and headers) and idle (between two body chunks)."""

from __future__ import annotations

import asyncio
from typing import Protocol

HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
                 b"transfer-encoding", b"upgrade", b"host", b"content-length", b"authorization", b"server", b"date",
                 b"expect"})
KEEP_BACK = frozenset({b"content-length"})  # hop-by-hop going up, but the body comes back unchanged
# A client's headers that reach an engine: an allowlist (issue 40), what an OpenAI-compatible engine
# reads to answer, the body's type and the answer's (JSON, or an event stream). All else stays here:
# Cookie (the console's session), the client's Authorization (its gpuflow key: the engine gets its
# own, ``engine_key``), Accept-Encoding (the gateway reads answers for usage and stream timing, so
# they come back as sent), and every header a client invents: engines act on some (vLLM takes
# X-Request-Id as its own id for the request, shared by every tenant on the replica).
FORWARD = frozenset({b"content-type", b"accept"})


class UpstreamError(Exception):
    """``retry``: nothing reached the replica's application, or it failed before answering;
    ``bad``: the replica is down (connection refused / connect timeout)."""

    retry = False
    bad = False


class ConnectFailed(UpstreamError):
    retry = bad = True


class ConnectTimeout(ConnectFailed):
    pass  # a replica that neither accepts nor refuses: down, or its host unreachable


class Reset(UpstreamError):
    retry = True  # a pooled connection closed under us, or the replica died mid-request


class FirstByteTimeout(UpstreamError):
    pass


class IdleTimeout(UpstreamError):
    pass


class Broken(UpstreamError):
    pass  # the replica's answer broke off after it started


class Response(Protocol):
    status: int
    headers: list[tuple[bytes, bytes]]

    async def chunk(self) -> bytes: ...  # b"" at the end

    async def close(self) -> None: ...


class Client(Protocol):
    """The gateway's client to the replicas (one per gateway, pooled): AiohttpClient, HttpxClient."""

    async def open(self, url: str, headers: dict[str, str], body: bytes) -> Response: ...

    async def get(self, url: str) -> bytes: ...

    async def close(self) -> None: ...


def request_headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The client's headers an engine may see (``FORWARD``)."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw if k.lower() in FORWARD}


def to_engine(headers: dict[str, str], engine_key: str | None) -> dict[str, str]:
    """``headers`` with the replica's engine key (store/engine_keys.py), when it has one."""
    return {**headers, "authorization": f"Bearer {engine_key}"} if engine_key else headers


def response_headers(raw) -> list[tuple[bytes, bytes]]:
    out = []
    for k, v in raw:
        k = k.lower()
        if k not in HOP or k in KEEP_BACK:
            out.append((k, v))
    return out


class AiohttpClient:
    def __init__(self, connect_s: float, first_byte_s: float, idle_s: float):
        import aiohttp

        self.aiohttp, self.first_byte_s, self.idle_s = aiohttp, first_byte_s, idle_s
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=60), auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, connect=connect_s, sock_connect=connect_s),
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"))

    async def open(self, url: str, headers: dict[str, str], body: bytes) -> "AiohttpResponse":
        a = self.aiohttp
        try:
            async with asyncio.timeout(self.first_byte_s):
                r = await self.session.post(url, data=body, headers=headers)
        except TimeoutError as e:
            if isinstance(e, a.ServerTimeoutError):  # connect timeout
                raise ConnectTimeout(f"connect timeout ({e})") from None
            raise FirstByteTimeout(f"no answer within {self.first_byte_s:g} s") from None
        except a.ClientConnectorError as e:
            raise ConnectFailed(str(e)) from None
        except (a.ServerDisconnectedError, a.ClientOSError, a.ClientPayloadError, ConnectionError) as e:
            raise Reset(str(e) or type(e).__name__) from None
        return AiohttpResponse(r, self.idle_s, a)

    async def get(self, url: str) -> bytes:
        async with self.session.get(url) as r:
            return await r.read()

    async def close(self) -> None:
        await self.session.close()


class AiohttpResponse:
    def __init__(self, r, idle_s: float, a):
        self.r, self.idle_s, self.a = r, idle_s, a
        self.status = r.status
        self.headers = response_headers(r.raw_headers)

    async def chunk(self) -> bytes:
        try:
            async with asyncio.timeout(self.idle_s):
                return await self.r.content.readany()
        except TimeoutError:
            raise IdleTimeout(f"no bytes for {self.idle_s:g} s") from None
        except (self.a.ClientPayloadError, self.a.ClientOSError, self.a.ServerDisconnectedError, ConnectionError) as e:
            raise Broken(str(e) or type(e).__name__) from None

    async def close(self) -> None:
        self.r.release() if self.r.content.at_eof() else self.r.close()


class HttpxClient:
    def __init__(self, connect_s: float, first_byte_s: float, idle_s: float):
        try:
            import httpx2 as httpx  # httpx's maintained line (what the openai client uses)
        except ImportError:
            import httpx

        self.httpx, self.first_byte_s, self.idle_s = httpx, first_byte_s, idle_s
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(connect=connect_s, read=None, write=None, pool=None),
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=1000))

    async def open(self, url: str, headers: dict[str, str], body: bytes) -> "HttpxResponse":
        h = self.httpx
        req = self.client.build_request("POST", url, headers=headers, content=body)
        try:
            async with asyncio.timeout(self.first_byte_s):
                r = await self.client.send(req, stream=True)
        except TimeoutError:
            raise FirstByteTimeout(f"no answer within {self.first_byte_s:g} s") from None
        except h.ConnectTimeout as e:
            raise ConnectTimeout(f"connect timeout ({e})") from None
        except h.ConnectError as e:
            raise ConnectFailed(str(e) or type(e).__name__) from None
        except (h.RemoteProtocolError, h.ReadError, h.WriteError) as e:
            raise Reset(str(e) or type(e).__name__) from None
        return HttpxResponse(r, self.idle_s, h)

    async def get(self, url: str) -> bytes:
        return (await self.client.get(url)).content

    async def close(self) -> None:
        await self.client.aclose()


class HttpxResponse:
    def __init__(self, r, idle_s: float, h):
        self.r, self.idle_s, self.h = r, idle_s, h
        self.status = r.status_code
        self.headers = response_headers(r.headers.raw)
        self.it = r.aiter_raw()

    async def chunk(self) -> bytes:
        try:
            async with asyncio.timeout(self.idle_s):
                return await self.it.__anext__()
        except StopAsyncIteration:
            return b""
        except TimeoutError:
            raise IdleTimeout(f"no bytes for {self.idle_s:g} s") from None
        except (self.h.RemoteProtocolError, self.h.ReadError) as e:
            raise Broken(str(e) or type(e).__name__) from None

    async def close(self) -> None:
        await self.r.aclose()


def make_client(kind: str, connect_s: float, first_byte_s: float, idle_s: float):
    if kind == "aiohttp":
        return AiohttpClient(connect_s, first_byte_s, idle_s)
    if kind == "httpx":
        return HttpxClient(connect_s, first_byte_s, idle_s)
    raise ValueError(f"http client {kind!r}: aiohttp or httpx")
