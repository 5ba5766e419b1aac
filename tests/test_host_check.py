"""Which Host a request may name (gateway/host_check.py; issue 40, M1: DNS rebinding), and which
Origin an action may come from (console/access.py). The gateway listens on
127.0.0.1:8080 with ``--public-name gpu.example.com`` unless a row says otherwise."""

from __future__ import annotations

import pytest

from gateway import host_check as hc
from gateway.config import GatewaySettings
from console.access import origin_problem
from scheduler.errors import InvalidInput

PUBLIC = ("gpu.example.com", "Proxy.Example:443")


def ok(path: str, host: str | None, keyed: bool, allow_anonymous: bool = False, port: int = 8080,
       listen: str = "127.0.0.1") -> bool:
    kind = hc.guarded(path, keyed, allow_anonymous)
    return kind is None or hc.host_ok(host, hc.allowed(kind, keyed, port, PUBLIC, listen))


@pytest.mark.parametrize("path, host, keyed, allowed", [
    # the probe: the open console (no key), a rebinding page's own name on the gateway's port
    ("/console/keys/create", "evil.example:8080", False, False),
    ("/console/", "evil.example:8080", False, False),
    ("/console", "evil.example:8080", False, False),
    ("/console/static/console.js", "evil.example:8080", False, False),
    ("/console/", "127.0.0.1:8080", False, True),
    ("/console/", "localhost:8080", False, True),
    ("/console/", "LOCALHOST:8080", False, True),  # DNS names are case-insensitive
    ("/console/", "[::1]:8080", False, True),
    ("/console/", "127.0.0.1:9999", False, False),  # another port: another server's name
    ("/console/", "127.0.0.1", False, False),  # no port is port 80
    ("/console/", "gpu.example.com:8080", False, False),  # open: loopback only, public names not yet
    ("/console/", None, False, False),  # no Host at all (HTTP/1.0)
    ("/console/", "", False, False),
    # once a key exists: loopback and the public names
    ("/console/", "gpu.example.com", True, True),  # a bare public name: as itself (a proxy on 80/443) ...
    ("/console/", "gpu.example.com:8080", True, True),  # ... and on the gateway's port
    ("/console/", "gpu.example.com:9000", True, False),
    ("/console/", "proxy.example:443", True, True),  # NAME:PORT as given (lower-cased)
    ("/console/", "proxy.example", True, False),
    ("/console/", "evil.example:8080", True, False),
    ("/console/", "127.0.0.1:8080", True, True),
    # the API and /metrics: checked only while open (an open gateway trusts whoever reaches loopback)
    ("/v1/chat/completions", "evil.example:8080", False, False),
    ("/v1/models", "127.0.0.1:8080", False, True),
    ("/v1/models", "gpu.example.com", False, True),  # public names serve the open API (a proxy in front)
    ("/metrics", "evil.example:8080", False, False),
    ("/v1/chat/completions", "evil.example:8080", True, True),  # a key exists: bearer keys are not ambient
    ("/metrics", "anything:1", True, True),
    ("/healthz", "evil.example:8080", False, True),  # probed by address
])
def test_the_host_rule(path, host, keyed, allowed):
    assert ok(path, host, keyed) is allowed


@pytest.mark.parametrize("path, host, allowed", [
    ("/v1/models", "evil.example:8080", True),  # --allow-anonymous: the operator opened the API to everyone
    ("/console/", "evil.example:8080", False),  # but never the console
])
def test_allow_anonymous_opens_the_api_only(path, host, allowed):
    assert ok(path, host, False, allow_anonymous=True) is allowed


@pytest.mark.parametrize("port, listen, host, allowed", [
    (80, "127.0.0.1", "localhost", True),  # port 80: the bare loopback names
    (80, "127.0.0.1", "localhost:80", True),
    (8080, "127.0.0.2", "127.0.0.2:8080", True),  # the address it listens on
    (8080, "::1", "[::1]:8080", True),
    (8080, "0.0.0.0", "0.0.0.0:8080", False),  # every address: not a name
])
def test_loopback_names(port, listen, host, allowed):
    assert ok("/console/", host, False, port=port, listen=listen) is allowed


@pytest.mark.parametrize("origin, keyed, why", [
    (None, False, None),  # no Origin sent (the action header is then what holds)
    ("http://127.0.0.1:8080", False, None),
    ("https://localhost:8080", False, None),
    ("http://evil.example:8080", False, "another origin (http://evil.example:8080)"),  # the probe's Origin
    ("http://gpu.example.com:8080", False, "another origin"),  # open: loopback only
    ("https://gpu.example.com", True, None),
    ("null", True, "another origin (null)"),  # a sandboxed frame
    ("file://127.0.0.1:8080", True, "another origin"),
    ("http://127.0.0.1:9999", True, "another origin"),
])
def test_an_action_origin_is_one_of_the_gateways_names_never_the_requests_own_host(origin, keyed, why):
    got = origin_problem(origin, hc.allowed("console", keyed, 8080, PUBLIC))
    assert got == why if why is None else why in got, got


def test_a_refusal_names_what_is_answered():
    msg = hc.refusal("evil.example:8080", hc.loopback(8080), False)
    assert "does not answer to Host 'evil.example:8080'" in msg and "127.0.0.1:8080, [::1]:8080, localhost:8080" in msg
    assert "the console answers to loopback names only" in msg
    assert "--public-name NAME[:PORT]" in hc.refusal("x", hc.loopback(8080), True)
    assert "--public-name NAME[:PORT]" in hc.refusal("x", hc.loopback(8080), False, "api")  # the open API: it may


@pytest.mark.parametrize("name", ["evil example", "a:0", "a:65536", "-a.example", "a.:1", "http://a", "a/b"])
def test_a_public_name_is_checked(name):
    with pytest.raises(InvalidInput, match="public_names"):
        GatewaySettings(public_names=(name,))


def test_good_public_names():
    assert GatewaySettings(public_names=("gpu.example.com", "gpu:443", "10.0.0.5:8080", "[fd00::1]:8080")).public_names
