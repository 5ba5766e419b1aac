"""This host's own credential (contracts/credential.py is the cryptography): made at its agent's
first start from the cluster's join token, kept in the agent's data folder (``credential.json``,
file mode 0600), and used to sign every report the agent makes. Later starts need no token.

While an agent runs it holds an exclusive lock (fcntl) on ``credential.lock`` beside it: a second
agent started on the same folder (the same host name and data dir) exits saying who holds it,
instead of answering the first one's tasks with the same key."""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass, field
from typing import IO, Any

from contracts import credential as cr
from contracts.host_auth import Purpose
from contracts.host_proof import sign
from scheduler.errors import InvalidInput

FILE = "credential.json"
LOCK = "credential.lock"
VERSION = 1
NO_TOKEN = ("host {name} has not joined this cluster yet: give its agent the join token ('gpuflow hosts "
            "join-token' prints it on the control plane) in GPUFLOW_AGENT__JOIN_TOKEN or --join-token-file FILE")


@dataclass
class HostCredential:
    """``name``: the host; ``public``: its X25519 public key (base64url); ``key``: the 32 bytes it
    shares with the control plane (never sent); ``proof``: its join proof, shown with every report
    so a host forgotten and back joins again; ``cluster``: the cluster's public key it joined."""

    name: str
    public: str
    key: bytes = field(repr=False)
    proof: str
    cluster: str
    lock: IO[str] | None = field(default=None, repr=False, compare=False)

    def engine_key(self, instance: str, part: str, nonce: str) -> str:
        """The API key of one engine process of a replica (contracts/credential.engine_key)."""
        return cr.engine_key(self.key, instance, part, nonce)

    def signed(self, body: dict[str, Any], purpose: Purpose, stamp: str) -> dict[str, Any]:
        """``body`` (a report's model_dump(mode="json")) with its auth: signed for ``purpose`` and ``stamp``."""
        return sign(body, self.key, purpose, self.name, stamp, self.public, self.proof)

    def close(self) -> None:
        """Let go of the folder's lock (the agent is stopping)."""
        if self.lock is not None:
            self.lock.close()
            self.lock = None


def _lock(folder: str) -> IO[str]:
    path = os.path.join(folder, LOCK)
    f = open(path, "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip()[:20]
        f.close()
        raise InvalidInput(f"another agent (pid {holder or 'unknown'}) runs on {folder} already: two agents may not "
                           "share a host's data folder (stop that one, or give this one its own --data-dir)") from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


def _read(path: str, name: str) -> dict[str, Any]:
    mode = os.stat(path).st_mode & 0o777
    if mode & 0o077:
        raise InvalidInput(f"{path} is readable by others (mode {mode:o}): it holds this host's private key; "
                           f"run 'chmod 600 {path}'")
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise InvalidInput(f"{path}: not a credential gpuflow wrote ({e})") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise InvalidInput(f"{path}: not a credential gpuflow wrote (version {VERSION})")
    if doc.get("name") != name:
        raise InvalidInput(f"{path} is host {str(doc.get('name'))[:64]!r}'s credential, not {name!r}'s: give this "
                           "agent its own --data-dir (or its old --name)")
    return doc


def _write(path: str, doc: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _joined(name: str, join_token: str) -> dict[str, Any]:
    join_secret, cluster = cr.parse_join_token(join_token)
    secret = os.urandom(cr.KEY_BYTES)
    public = cr.public_of(secret)
    return {"version": VERSION, "name": name, "private": cr.b64(secret), "cluster": cluster,
            "proof": cr.join_proof(join_secret, name, public)}


def open_credential(folder: str, name: str, join_token: str | None = None) -> HostCredential:
    """Host ``name``'s credential in ``folder``, made now from ``join_token`` when there is none, with
    the folder's lock held (``close`` lets go). InvalidInput when another agent holds the folder, the
    file is not this host's, or there is none and no token (or a token of another cluster)."""
    os.makedirs(folder, exist_ok=True)
    lock = _lock(folder)
    try:
        path = os.path.join(folder, FILE)
        if os.path.exists(path):
            doc = _read(path, name)
        elif join_token:
            try:
                doc = _joined(name, join_token)
            except ValueError as e:
                raise InvalidInput(f"the join token: {e}") from None
            _write(path, doc)
        else:
            raise InvalidInput(NO_TOKEN.format(name=name))
        if join_token and cr.parse_join_token(join_token)[1] != doc["cluster"]:
            raise InvalidInput(f"the join token is another cluster's than the one host {name} joined ({path}); "
                               f"to join that cluster, remove {path} first")
        secret = cr.unb64(doc["private"], cr.KEY_BYTES, f"{path}'s private key")
        return HostCredential(name=name, public=cr.public_of(secret), key=cr.host_key(secret, doc["cluster"]),
                              proof=doc["proof"], cluster=doc["cluster"], lock=lock)
    except (ValueError, KeyError, TypeError) as e:
        lock.close()
        raise InvalidInput(f"{os.path.join(folder, FILE)}: {e}") from None
    except BaseException:
        lock.close()
        raise


def read_token(token: str | None, path: str | None) -> str | None:
    """The join token given to an agent: ``token`` itself, else the file at ``path`` (its first
    line); None when neither is given. The token is never echoed: it is a secret."""
    if token:
        return token.strip()
    if not path:
        return None
    try:
        with open(path) as f:
            text = f.read(4096)
    except OSError as e:
        raise InvalidInput(f"join token file {path}: {e.strerror}") from None
    first = text.strip().splitlines()[0] if text.strip() else ""
    if not first:
        raise InvalidInput(f"join token file {path} is empty")
    return first.strip()
