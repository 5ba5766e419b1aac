"""What the gateway sends a group's ends, and what it accepts back, per hand-off protocol (pure).

- **vLLM** (modes ``vllm-nixl``, ``vllm-mooncake``, ``vllm-ascend-mooncake``, ``custom``), as vLLM's
  own proxy (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py): the prefill gets the
  request with ``kv_transfer_params: {do_remote_decode: true, ...}``, ``max_tokens: 1`` and
  ``stream: false``; its answer's ``kv_transfer_params`` (remote_engine_id, remote_block_ids,
  remote_host, remote_port, ...) go to the decode with the original request, whose answer the
  client gets.
- **SGLang** (``sglang-*``), as SGLang's PD router: both ends get the request with
  ``bootstrap_host`` and ``bootstrap_port`` (the prefill's) and a random ``bootstrap_room``, at once.

A prefill's answer is an engine's, so untrusted: it is read up to ``MAX_ANSWER`` bytes, and its
``kv_transfer_params`` must be an object of at most ``MAX_KEYS`` keys whose known fields have their
types and bounds (``KVParams``); other keys (a connector's own) pass through to the decode as they are."""

from __future__ import annotations

import json
import random
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from store.serving import Route

MAX_ANSWER = 4 << 20  # bytes of a prefill's answer read (its one token and the KV's block ids)
MAX_KEYS = 64  # in a prefill's kv_transfer_params
MAX_BLOCKS = 1 << 20  # block ids in one hand-off (a 1 M-token prompt in blocks of 1)
Text = Annotated[str, Field(max_length=512)]


class KVParams(BaseModel):
    """The known fields of a prefill's ``kv_transfer_params`` (vLLM's NixlConnector / MooncakeConnector)."""

    model_config = ConfigDict(extra="allow", strict=True)
    do_remote_prefill: bool = False  # the decode's KV waits at the prefill (must be true: a hand-off)
    do_remote_decode: bool = False
    remote_engine_id: Text | None = None  # the prefill engine's id
    remote_block_ids: Annotated[list[Annotated[int, Field(ge=0, le=2**40)]], Field(max_length=MAX_BLOCKS)] | None = None
    remote_host: Annotated[str, Field(max_length=253)] | None = None  # the prefill's side channel
    remote_port: Annotated[int, Field(ge=1, le=65535)] | None = None


# The request fields that steer a KV hand-off: the gateway writes them, a client never does. A decode
# handed a client's ``kv_transfer_params`` would pull KV from whatever host and port they name (a
# request forgery from inside the cluster), and SGLang's bootstrap fields name the server to join.
HANDOFF_FIELDS = frozenset({"kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room"})


def without_handoff(data, body: bytes) -> tuple[object, bytes]:
    """The request without the hand-off fields a client sent (``body`` unchanged when it sent none)."""
    if not isinstance(data, dict) or HANDOFF_FIELDS.isdisjoint(data):
        return data, body
    data = {k: v for k, v in data.items() if k not in HANDOFF_FIELDS}
    return data, json.dumps(data).encode()


class BadAnswer(ValueError):
    """A prefill's answer the gateway cannot hand to a decode (the message names the field)."""


def prefill_body(data: dict) -> bytes:
    """vLLM: the request as a prefill gets it (one token, not streamed, the KV kept for a decode)."""
    out = {k: v for k, v in data.items() if k != "stream_options"}
    # vLLM's proxy also sends remote_engine_id, remote_block_ids, remote_host and remote_port as null; its
    # connectors read each with .get, so leaving them out is the same to them (and to stricter engines)
    out["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False}
    out["stream"] = False
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    return json.dumps(out).encode()


def decode_body(data: dict, params: dict) -> bytes:
    """vLLM: the original request, with the prefill's ``kv_transfer_params``."""
    return json.dumps({**data, "kv_transfer_params": params}).encode()


def bootstrap_body(data: dict, prefill: Route, rng: random.Random | None = None) -> bytes | None:
    """SGLang: the request both ends get, naming the prefill's bootstrap server and a fresh room;
    None when the prefill has no bootstrap port recorded (it cannot hand off)."""
    if prefill.bootstrap_port is None:
        return None
    room = (rng or random.SystemRandom()).getrandbits(63)
    return json.dumps({**data, "bootstrap_host": prefill.address, "bootstrap_port": prefill.bootstrap_port,
                       "bootstrap_room": room}).encode()


def kv_params(answer: bytes) -> dict[str, Any]:
    """The ``kv_transfer_params`` of a prefill's answer, checked; BadAnswer says what is wrong."""
    return prefill_answer(answer)[0]


def prefill_answer(answer: bytes) -> tuple[dict[str, Any], Any]:
    """A prefill's answer, read once: its ``kv_transfer_params``, checked (BadAnswer says what is
    wrong), and its ``usage`` (None when it has none), whose cached prompt tokens correct the
    gateway's prefix index for that prefill."""
    try:
        doc = json.loads(answer)
    except (ValueError, RecursionError) as e:
        raise BadAnswer(f"the prefill's answer is not JSON ({e})") from None
    p = doc.get("kv_transfer_params") if isinstance(doc, dict) else None
    if not isinstance(p, dict) or not p:
        raise BadAnswer("the prefill's answer has no kv_transfer_params (is its engine started with a KV "
                        "connector in the producer or both role?)")
    if len(p) > MAX_KEYS:
        raise BadAnswer(f"kv_transfer_params: {len(p)} keys, more than {MAX_KEYS}")
    try:
        k = KVParams.model_validate(p)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise BadAnswer(f"kv_transfer_params.{where}: {err['msg']}") from None
    if not k.do_remote_prefill:
        raise BadAnswer("kv_transfer_params.do_remote_prefill: not true, so no KV waits for the decode")
    return p, doc.get("usage")
