"""A gateway's settings: where it listens, its queue and timeouts. Per-deployment settings
(the replica concurrency limit) come from the deployment's spec in the store (table.py)."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import uuid
from dataclasses import dataclass, field

from scheduler.errors import InvalidInput
from scheduler.spec import Routing

MiB = 1 << 20
CHARS_PER_TOKEN = 4  # a token of English text, as gateway/engine_cache.py converts an engine's cache
# a Host a client may send: a DNS name, an IPv4 address or a bracketed IPv6 one, with an optional port
PUBLIC_NAME = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))*"
                         r"|\[[0-9A-Fa-f:.]{2,45}\])(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}"
                         r"|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?$")


HTTP_CLIENTS = ("aiohttp", "httpx")  # gateway/upstream.py's clients to the replicas
ROUTINGS = tuple(r.value for r in Routing)  # how a request picks a replica (gateway/cache_aware.py)


def flag(name: str, help: str, **more) -> dict:
    """A setting ``gpuflow gateway`` sets with the flag ``name`` (gpuflow/cli/flags.py makes it from the field:
    its type and default are the field's, the help says the default)."""
    return {"flag": name, "help": help, **more}


@dataclass(frozen=True)
class GatewaySettings:
    host: str = "127.0.0.1"  # --listen HOST:PORT
    port: int = 8080
    allow_anonymous: bool = field(default=False, metadata=flag(
        "--allow-anonymous", "serve on a non-loopback address while no API key exists (anyone who reaches it may "
        "use it)"))
    queue_timeout_s: float = field(default=60.0, metadata=flag(
        "--queue-timeout", "seconds a request waits for a free replica before 503"))
    max_queue: int = field(default=1000, metadata=flag("--max-queue", "requests waiting per model before 429"))
    max_body: int = field(default=32 * MiB, metadata=flag("--max-body", "largest request body in bytes, then 413"))
    max_concurrency: int = field(default=4, metadata=flag(
        "--max-concurrency", "requests per replica when neither the engine's flags nor the spec's max_concurrency say"))
    connect_timeout_s: float = field(default=3.0, metadata=flag(
        "--connect-timeout", "seconds to connect to a replica before trying another (it is marked bad)"))
    first_byte_timeout_s: float = field(default=300.0, metadata=flag(
        "--first-byte-timeout", "seconds a replica may take to start answering (headers and first bytes) before 504"))
    idle_timeout_s: float = field(default=120.0, metadata=flag(
        "--idle-timeout", "seconds a replica's answer may pause between two chunks"))
    header_timeout_s: float = field(default=10.0, metadata=flag(
        "--header-timeout", "seconds a client has for a request's line and headers, from its connection or its next "
        "request's first byte; then 408 and the connection is closed"))
    body_timeout_s: float = field(default=30.0, metadata=flag(
        "--body-timeout", "seconds a request's whole body may take to arrive, then 408; it holds no tenant slot "
        "meanwhile (the body is read before the tenant's max_concurrent counts the request)"))
    metrics_key_required: bool = field(default=False, metadata=flag(
        "--metrics-key-required", "/metrics needs a cluster-admin or metrics key (its series name every tenant): 401 "
        "without a key, 403 for a key of another scope; while no key exists, nobody reads it"))
    public_names: tuple[str, ...] = field(default=(), metadata=flag(
        "--public-name", "a name (NAME or NAME:PORT) clients use to reach this gateway besides loopback, e.g. behind "
        "a proxy; the console answers only to these and 127.0.0.1, localhost, [::1] on the gateway's port, and only "
        "to loopback while no key exists (a DNS-rebinding page names its own host); repeatable",
        dest="public_names", metavar="NAME[:PORT]"))
    refresh_s: float = 0.5  # routing table re-read from the store this often
    bad_s: float = 5.0  # a replica that failed is skipped this long
    attempts: int = 3  # replicas tried per request before giving up
    key_cache_s: float = 1.0  # a key's verdict is reused this long (revocation takes effect within ~2 s)
    temporal: object = None  # gpuflow.settings.TemporalSettings: wake autoscalers (gateway/wake.py); None: never
    http_client: str = field(default="aiohttp", metadata=flag(
        "--http-client", "client to the replicas (aiohttp measured faster in bench/bench_gateway.py)",
        choices=HTTP_CLIENTS))
    routing: str = field(default="cache-aware", metadata=flag(
        "--routing", "how a request picks a replica, for deployments whose spec has no 'routing' (cache-aware: where "
        "its prompt's prefix is cached, within a load guard; docs/routing.md)", choices=ROUTINGS))
    prefix_block_chars: int = 128  # the prefix index's block, in characters of prompt text
    prefix_cache_blocks: int = field(default=16384, metadata=flag(
        "--prefix-cache-blocks", "blocks of 128 characters of prompt text (about 32 tokens each; not the engine's "
        "blocks) the gateway remembers per replica for cache-aware routing, until the replica's engine reports its "
        "cache size or its answers' cached_tokens size it (docs/routing.md); 16384 blocks are about 0.5 M tokens. "
        "An engine's cache in tokens: --prefix-cache-tokens", metavar="BLOCKS"))
    prefix_cache_tokens: int = field(default=0, metadata=flag(
        "--prefix-cache-tokens", "--prefix-cache-blocks given in tokens, as engines count their KV cache (vLLM: "
        "num_gpu_blocks x block_size): tokens x 4 / 128 blocks; set (not 0), it replaces --prefix-cache-blocks", metavar="TOKENS"))
    max_prompt_chars: int = 128 * 1024  # of a prompt, hashed for routing at most (the rest is not looked at)
    route_slack: int = field(default=2, metadata=flag(  # gateway/cache_aware.py
        "--route-slack", "cache-aware routing's guard: a replica more than max(this, limit/2) requests busier than "
        "the least loaded one is passed over for its cached prefix"))
    route_cost: bool = field(default=True, metadata=flag(  # gateway/cache_aware.py rule 3b
        "--no-route-cost", "cache-aware routing: the guard alone decides when a request leaves the replica that "
        "holds its prefix, without the measured cost of the move (by default a move happens only when the wait "
        "there costs more than the prefill it would repeat elsewhere, and a copy of a hot prefix takes requests "
        "when its home lags; docs/routing.md)", invert=True))
    kv_events: bool = field(default=True, metadata=flag(  # gateway/kv_subscriber.py
        "--no-kv-events", "do not follow the KV-cache events of engines that publish them (vLLM, SGLang started by an "
        "agent with --kv-events): route on the text index only (docs/routing.md)", invert=True))
    tokenizer_roots: tuple[str, ...] = field(default=(), metadata=flag(
        "--tokenizer-root", "a folder under which a deployment's local_path tokenizer may be loaded, to match prompts "
        "against engines' KV events (repeatable; default none: Hugging Face cache only)", metavar="DIR"))
    temporal_ui_url: str = field(default="http://127.0.0.1:8233", metadata=flag(
        "--temporal-ui-url", "the Temporal UI the web console links each replica's workflow to (the dev server's by "
        "default; '' for no link)"))
    gateway_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}")

    def __post_init__(self):
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
        if self.prefix_cache_tokens < 0:
            raise InvalidInput(f"gateway setting prefix_cache_tokens must be >= 0, got {self.prefix_cache_tokens}")
        if self.prefix_cache_tokens:  # tokens as blocks of text, at 4 characters a token (engine_cache.text_blocks)
            object.__setattr__(self, "prefix_cache_blocks",
                               max(1, self.prefix_cache_tokens * CHARS_PER_TOKEN // self.prefix_block_chars))
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
