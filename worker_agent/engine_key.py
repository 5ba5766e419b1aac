"""A replica's engine key on its agent: each server process gets its own API key, which only the
gateways and this agent's own probes hold (issue 40, "engines behind a key").

At each launch of a server (not its helpers: rpc-server, Ray and SGLang's other ranks serve no
HTTP) the agent makes a fresh **nonce**, and the key is contracts/credential.py ``engine_key(host
key, instance, part, nonce)``. Only the nonce crosses Temporal (LaunchResult.key_id); the control
plane, which shares the host key, makes the same key from it (store/records.py). The pid file keeps
the nonce, so a process adopted by a restarted agent keeps its key. The key itself is never in an
argv (``/proc/PID/cmdline`` is readable by every local user), a log line or a workflow's history:

| engine | how the key reaches it | what it guards (its source) |
| --- | --- | --- |
| vLLM | ``VLLM_API_KEY`` | paths under /v1 (vllm/envs.py, entrypoints/openai/api_server.py, 0.11.0) |
| SGLang | ``--config FILE``, FILE a 0600 YAML ``api-key: KEY`` in the agent's run folder: SGLang 0.5.3 reads no env var for it (server_args.py prepare_server_args, server_args_config_parser.py) | all but /health* and /metrics* (utils/common.py add_api_key_middleware) |
| llama-server | ``LLAMA_API_KEY`` | all but /health and /models (common/arg.cpp ``--api-key`` set_env) |
| llama-cpp-python | ``API_KEY`` (its ServerSettings has no env prefix) | every route (llama_cpp/server/app.py authenticate, 0.3.36) |
| custom | ``GPUFLOW_ENGINE_API_KEY``, and ``{api_key}`` in run_command (argv: readable by local users; the log and the recorded argv show ``{api_key}``) | what the command does with it |

A spec can set none of these (scheduler/spec_env.py OWNED, the engines' ``--api-key`` and
SGLang's ``--config`` are owned flags), so a spec can neither read nor replace the key.

An engine may print its key itself (SGLang logs its whole ServerArgs at start, api_key included; a
custom command may echo it), and an engine's log leaves the host: ``gpuflow logs`` (the agent's
read_log query) and a failed start's last lines (in the LaunchFailed error, so in the workflow's
history). So what is read of a log shows every key as ``gfe-`` and stars (``read_redacted``: same
length, so offsets hold, and a key being written at the file's end waits until it is whole)."""

from __future__ import annotations

import os
import re
import secrets
from typing import TYPE_CHECKING, BinaryIO, Protocol

if TYPE_CHECKING:  # annotations only: the CLI's `gpuflow agent` flags are built without it (issue 37)
    from contracts.agent import LaunchRequest

CUSTOM_ENV = "GPUFLOW_ENGINE_API_KEY"
ENV = {"vllm": "VLLM_API_KEY", "llama.cpp": "LLAMA_API_KEY", "llama-cpp-python": "API_KEY", "custom": CUSTOM_ENV}


class EngineKeys(Protocol):
    """What makes engine keys: the host's credential (worker_agent/credential.py HostCredential).
    ``key``: the host key, which also MACs each launch's result (contracts/launch_proof.py)."""

    key: bytes

    def engine_key(self, instance: str, part: str, nonce: str) -> str: ...


def new_nonce() -> str:
    """A launch's nonce: 18 random bytes, base64url (24 characters)."""
    return secrets.token_urlsafe(18)


def env_for(engine: str, key: str | None) -> dict[str, str]:
    """The variable that hands ``key`` to ``engine`` (a backend, or llama-cpp-python); {} for SGLang
    (a file: ``sglang_config``) and without a key."""
    name = ENV.get(engine)
    return {name: key} if key and name else {}


def key_env(req: LaunchRequest, llama_cpp_python: bool, key: str | None) -> dict[str, str]:
    """The variable that hands a server its engine key (SGLang's is a file; helpers get none);
    ``llama_cpp_python``: this agent serves llama.cpp with llama-cpp-python."""
    if req.role != "server":
        return {}
    return env_for("llama-cpp-python" if req.backend == "llama.cpp" and llama_cpp_python else req.backend, key)


def sglang_config(key: str) -> str:
    """SGLang's --config YAML holding only the key (base64url after 'gfe-': nothing to quote, but quoted)."""
    return f'api-key: "{key}"\n'


def write_secret(path: str, text: str) -> None:
    """``text`` into ``path``, readable by this user only (0600 from its creation), replacing any."""
    tmp = f"{path}.{os.getpid()}.tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def bearer(key: str | None) -> dict[str, str]:
    """The header that shows ``key`` to an engine ({} without one)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


KEY_LEN = 47  # 'gfe-' and 43 characters of base64url: contracts/credential.py engine_key
_KEY = re.compile(rb"gfe-[A-Za-z0-9_-]{43}")
_PARTIAL_AT_END = re.compile(rb"gfe-[A-Za-z0-9_-]{0,42}\Z")


def redact(data: bytes) -> bytes:
    """``data`` with every engine key's 43 characters starred (the same length)."""
    return _KEY.sub(lambda m: m.group(0)[:4] + b"*" * (len(m.group(0)) - 4), data)


def read_redacted(f: BinaryIO, start: int, end: int) -> tuple[bytes, int]:
    """Bytes ``start``..``end`` of the open file ``f``, keys starred, and where they end: ``end``,
    or earlier when a key is still being written there (the next read shows it whole, starred). A
    key across ``start`` or ``end`` is found by reading a key's length beyond each."""
    lo = max(0, start - KEY_LEN)
    f.seek(lo)
    buf = redact(f.read(end + KEY_LEN - lo))
    part = buf[:end - lo]
    if len(buf) < end + KEY_LEN - lo and (m := _PARTIAL_AT_END.search(part)) and m.start() >= start - lo:
        part = part[:m.start()]  # the file ends inside what may become a key
    return part[start - lo:], lo + len(part)
