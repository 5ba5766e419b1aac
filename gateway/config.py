"""A gateway's settings: where it listens, its queue and timeouts. Per-deployment settings
(the replica concurrency limit) come from the deployment's spec in the store (table.py)."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import uuid
from dataclasses import MISSING, dataclass, field

from scheduler.errors import InvalidInput

MiB = 1 << 20
# a Host a client may send: a DNS name, an IPv4 address or a bracketed IPv6 one, with an optional port
PUBLIC_NAME = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))*"
                         r"|\[[0-9A-Fa-f:.]{2,45}\])(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}"
                         r"|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?$")


@dataclass(frozen=True)
class GatewaySettings:
    host: str = "127.0.0.1"
    port: int = 8080
    allow_anonymous: bool = False  # start on a non-loopback address while no key exists
    queue_timeout_s: float = 60.0  # a request waits this long for a free replica, then 503
    max_queue: int = 1000  # requests waiting per model; one more gets 429
    max_body: int = 32 * MiB  # request bodies over this get 413
    max_concurrency: int = 4  # per replica, when neither the engine's flags nor the spec say
    connect_timeout_s: float = 3.0  # TCP connect to a replica (then it is marked bad, retried elsewhere)
    first_byte_timeout_s: float = 300.0  # request sent -> response headers and first body bytes
    idle_timeout_s: float = 120.0  # between two body chunks of a response
    header_timeout_s: float = 10.0  # a client's request line and headers, from its connection (or its first byte
    #                                 after the last response) to their end; then 408 and the connection is closed
    body_timeout_s: float = 30.0  # a request's whole body, once its headers arrived; then 408. No tenant slot is held
    #                               meanwhile: the body is read before the tenant's max_concurrent counts the request
    metrics_key_required: bool = field(default=False, metadata={"help": (
        "/metrics needs a cluster-admin or metrics key (its series name every tenant): 401 without a key, 403 for a "
        "key of another scope; while no key exists, nobody reads it")})
    public_names: tuple[str, ...] = field(default=(), metadata={"help": (
        "a name (NAME or NAME:PORT) clients use to reach this gateway besides loopback, e.g. behind a proxy; the "
        "console answers only to these and 127.0.0.1, localhost, [::1] on the gateway's port, and only to "
        "loopback while no key exists (a DNS-rebinding page names its own host); repeatable")})
    refresh_s: float = 0.5  # routing table re-read from the store this often
    bad_s: float = 5.0  # a replica that failed is skipped this long
    attempts: int = 3  # replicas tried per request before giving up
    key_cache_s: float = 1.0  # a key's verdict is reused this long (revocation takes effect within ~2 s)
    temporal: object = None  # gpuflow.settings.TemporalSettings: wake autoscalers (gateway/wake.py); None: never
    http_client: str = "aiohttp"  # or "httpx" (bench/bench_gateway.py measured aiohttp faster)
    routing: str = "cache-aware"  # or "least-outstanding": for deployments whose spec does not say (docs/routing.md)
    prefix_block_chars: int = 128  # the prefix index's block, in characters of prompt text
    prefix_cache_blocks: int = 16384  # blocks remembered per replica (LRU) until its engine reports its cache
    max_prompt_chars: int = 128 * 1024  # of a prompt, hashed for routing at most (the rest is not looked at)
    route_slack: int = 2  # the guard: a replica more than max(this, limit / 2) requests busier than the least
    #                       loaded one gets no request for its cached prefix (gateway/cache_aware.py)
    kv_events: bool = True  # follow the KV-cache events of engines that publish them (gateway/kv_subscriber.py)
    tokenizer_roots: tuple[str, ...] = ()  # a spec's local_path tokenizer is loaded only under one of these
    temporal_ui_url: str = "http://127.0.0.1:8233"  # the console links each replica's workflow there ("": no link)
    gateway_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}")

    def __post_init__(self):
        from gateway.cache_aware import ROUTINGS  # here: the CLI reads this module's flags' help at parse time

        for k in ("queue_timeout_s", "connect_timeout_s", "first_byte_timeout_s", "idle_timeout_s", "refresh_s",
                  "header_timeout_s", "body_timeout_s"):
            if not getattr(self, k) > 0:
                raise InvalidInput(f"gateway setting {k} must be > 0, got {getattr(self, k)}")
        if self.routing not in ROUTINGS:
            raise InvalidInput(f"gateway setting routing must be one of {', '.join(ROUTINGS)}, got {self.routing!r}")
        if self.temporal_ui_url and not re.match(r"^https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/\-]*)?$",
                                                 self.temporal_ui_url):
            raise InvalidInput("gateway setting temporal_ui_url must be an http(s) URL, "
                               f"got {self.temporal_ui_url[:100]!r}")
        if self.route_slack < 0:
            raise InvalidInput(f"gateway setting route_slack must be >= 0, got {self.route_slack}")
        for k in ("max_queue", "max_body", "max_concurrency", "attempts", "prefix_block_chars", "prefix_cache_blocks",
                  "max_prompt_chars"):
            if getattr(self, k) < 1:
                raise InvalidInput(f"gateway setting {k} must be >= 1, got {getattr(self, k)}")
        for n in self.public_names:
            if not PUBLIC_NAME.match(n):
                raise InvalidInput(f"gateway setting public_names: {n[:100]!r} is not NAME or NAME:PORT (a DNS name, "
                                   "an IPv4 address or a bracketed IPv6 one; a port 1-65535)")

    @property
    def url(self) -> str:
        """The base URL clients use (listening on every address: this machine's name)."""
        host = socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/v1"


def parse_listen(v: str) -> tuple[str, int]:
    host, sep, port = v.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInput(f"--listen takes HOST:PORT (e.g. 127.0.0.1:8080), got {v!r}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def setting_help(name: str) -> str:
    """The help a setting's flag shows: its field's own (``metadata={"help": ...}``), with its default."""
    f = GatewaySettings.__dataclass_fields__[name]
    default = f.default if f.default is not MISSING else None
    shown = "none" if default in ((), None) else ("off" if default is False else default)
    return f"{f.metadata['help']} (default {shown})"
