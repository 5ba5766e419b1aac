"""Host credentials: how a host proves who it is, and how a replica's engine key is derived. Pure
functions (no I/O, no clock, no randomness: callers pass keys, stamps and nonces in), shared by the
agent (worker_agent/credential.py) and the control plane (activities that read the store).

The anchor is Kubernetes' TLS bootstrapping (a join token, then a credential of the node's own)
and kubeadm's discovery hash (the join token pins the control plane's key). Here:

1. The control plane keeps a **cluster key** (an X25519 key pair) and a **join secret**, made once.
   ``gpuflow hosts join-token`` prints the join token: ``gfjoin1.<secret>.<cluster public key>``.
2. An agent that has not joined makes its own X25519 key pair, kept in its data folder, and says
   hello with its public key and a **join proof**: HMAC(join secret, host name, its public key). The
   proof shows it holds the token without the token ever crossing Temporal, and it binds the name
   and the key: replayed from a workflow's history it joins nothing else.
3. Both ends then hold the same **host key** (X25519 between the host's private key and the
   cluster's public key, or the other way round, through HKDF-SHA256), which never crosses
   Temporal. Every report the host makes is MACed with it (HMAC-SHA256 over a purpose, the host's
   name, a stamp and the report's canonical JSON); the control plane checks it in an activity that
   reads the host's public key from the store.
4. A replica's **engine key** (its engines' ``--api-key``) is HMAC(host key, instance, part,
   nonce): the agent makes it when it launches, the control plane makes the same one from the
   nonce the launch result carries, and the key itself is never in a workflow's history.

Everything that crosses Temporal here (public keys, proofs, MACs, nonces) is safe to be read by
anyone who can read a history; what is secret (the join secret, private keys, host keys, engine
keys) never does."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives import hashes, serialization

TOKEN_PREFIX = "gfjoin1"
KEY_BYTES = 32
SECRET_BYTES = 32
MAC_HEX = 64  # an HMAC-SHA256 in hex
PUBLIC_B64 = 43  # a 32-byte X25519 public key, base64url without padding
ENGINE_KEY_PREFIX = "gfe-"


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unb64(text: str, size: int, what: str) -> bytes:
    """``text`` (base64url, no padding) as exactly ``size`` bytes, or ValueError naming ``what``."""
    if not isinstance(text, str) or len(text) != -(-size * 4 // 3):
        raise ValueError(f"{what} is not {size} bytes in base64url")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError):
        raise ValueError(f"{what} is not base64url") from None
    if len(raw) != size or b64(raw) != text:
        raise ValueError(f"{what} is not {size} bytes in base64url")
    return raw


# -- key pairs (the cluster's and each host's) ------------------------------------------------------

def private_key_from(secret: bytes) -> X25519PrivateKey:
    """The X25519 private key whose raw 32 bytes are ``secret`` (the caller makes them with os.urandom)."""
    return X25519PrivateKey.from_private_bytes(secret)


def public_of(secret: bytes) -> str:
    """The public key (base64url) of the private key whose raw bytes are ``secret``."""
    pub = private_key_from(secret).public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return b64(pub)


def host_key(own_secret: bytes, peer_public: str) -> bytes:
    """The key a host and the control plane share: X25519(own private, peer public) through HKDF.
    The agent calls it with its private key and the cluster's public key; the control plane with the
    cluster's private key and the host's public key: both get the same 32 bytes."""
    peer = X25519PublicKey.from_public_bytes(unb64(peer_public, KEY_BYTES, "the peer's public key"))
    shared = private_key_from(own_secret).exchange(peer)
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=b"gpuflow-host-key/1").derive(shared)


# -- the join token ---------------------------------------------------------------------------------

def join_token(join_secret: bytes, cluster_public: str) -> str:
    return f"{TOKEN_PREFIX}.{b64(join_secret)}.{cluster_public}"


def parse_join_token(text: str) -> tuple[bytes, str]:
    """(join secret, cluster public key) of a join token, or ValueError saying what is wrong with it
    (never echoing the token: it is a secret)."""
    parts = text.strip().split(".") if isinstance(text, str) else []
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        raise ValueError(f"a join token has the form {TOKEN_PREFIX}.<secret>.<cluster key> "
                         "(print one with 'gpuflow hosts join-token' on the control plane)")
    secret = unb64(parts[1], SECRET_BYTES, "the join token's secret")
    unb64(parts[2], KEY_BYTES, "the join token's cluster key")
    return secret, parts[2]


def join_proof(join_secret: bytes, host: str, host_public: str) -> str:
    """What an agent shows to join as ``host`` with ``host_public``: HMAC(join secret, both)."""
    return _mac(join_secret, "join", host, "", host_public.encode())


# -- MACs over reports ------------------------------------------------------------------------------

def canonical(payload: Any) -> bytes:
    """The bytes a MAC covers: ``payload`` (JSON-able: a report's model_dump(mode="json")) as JSON
    with sorted keys and no spaces, so both ends agree whatever order a dict arrived in."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def _mac(key: bytes, purpose: str, host: str, stamp: str, body: bytes) -> str:
    head = "\0".join(("gpuflow/1", purpose, host, stamp)).encode()
    return hmac.new(key, head + b"\0" + hashlib.sha256(body).digest(), hashlib.sha256).hexdigest()


def sign(key: bytes, purpose: str, host: str, stamp: str, payload: Any) -> str:
    """The MAC of one report: ``purpose`` says what it is ("hello", "watch", ...), ``stamp`` makes it
    fresh (a hello's time, a watch's nonce from the workflow), ``payload`` the report itself."""
    return _mac(key, purpose, host, stamp, canonical(payload))


def verify(key: bytes, purpose: str, host: str, stamp: str, payload: Any, mac: str) -> bool:
    if not isinstance(mac, str) or len(mac) != MAC_HEX:
        return False
    try:
        want = sign(key, purpose, host, stamp, payload)
    except (TypeError, ValueError):  # not JSON-able, NaN: no report of ours
        return False
    return hmac.compare_digest(want, mac)


def verify_join(join_secret: bytes, host: str, host_public: str, proof: str) -> bool:
    if not isinstance(proof, str) or len(proof) != MAC_HEX:
        return False
    return hmac.compare_digest(join_proof(join_secret, host, host_public), proof)


# -- engine keys ------------------------------------------------------------------------------------

def engine_key(key: bytes, instance: str, part: str, nonce: str) -> str:
    """The API key of one replica's engine process (``part`` "" for the server itself): the agent
    passes it to the engine, the gateway sends it; both make it from the host key and the launch's
    nonce, which is the only part of it that crosses Temporal."""
    mac = hmac.new(key, "\0".join(("gpuflow/1", "engine", instance, part, nonce)).encode(), hashlib.sha256).digest()
    return ENGINE_KEY_PREFIX + b64(mac)
