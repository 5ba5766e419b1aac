"""An engine's KV-cache events, decoded (pure: bytes in, typed events out, no I/O).

vLLM (``--kv-events-config``, publisher ``zmq``) and SGLang (same format) publish each scheduler
step's cache changes as one msgpack payload, a ``KVEventBatch``: ``[ts, events, data_parallel_rank]``
(msgspec ``array_like``; newer vLLM builds may send it as a map, ``{"ts":..., "events":...}``, which
is read too). Each event is tagged with its class name, first in its array (or under ``"type"`` in
its map):

- ``BlockStored``: ``[tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
  ...]``: whole blocks newly cached, chained after ``parent_block_hash`` (None: from the start);
  ``token_ids`` are exactly those blocks' tokens, ``block_size`` of them per hash.
- ``BlockRemoved``: ``[tag, block_hashes, medium, ...]``: blocks evicted.
- ``AllBlocksCleared``: ``[tag]``: the cache was reset.

Fields after the ones read here (lora_name, extra_keys, group_idx...) are ignored, so later
versions still decode. The engine's hashes (an int, or bytes in newer vLLM) are only keys here:
the gateway chains its own hash over ``token_ids`` (token_index.py), as NVIDIA Dynamo does, and
never depends on the engine's hash seed.

Everything in a payload is untrusted: sizes, counts and types are bounded and checked, and a
payload that breaks any rule raises ``BadEvents`` with the first problem (the subscriber counts and
drops it). An event for a LoRA adapter or a tier other than the GPU's is read as ``Skipped``: its
blocks are not the base model's GPU prefix cache the router matches against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import msgpack

MAX_PAYLOAD = 4 << 20  # bytes in one batch; a step of vLLM's is rarely over a few hundred KiB
MAX_EVENTS = 4096  # events in one batch
MAX_BLOCKS = 8192  # block hashes in one event (a 128k-token prompt at 16 tokens a block)
MAX_BLOCK_SIZE = 1024  # tokens per block (vLLM: 1..256 in practice)
MAX_TOKEN_ID = (1 << 32) - 1
MAX_ARRAY = 1 << 18  # entries in any one array (token ids: a 256k-token step)
MAX_HASH_BYTES = 64  # an engine hash given as bytes (vLLM's sha256 hashes are 32)
GPU = "GPU"  # vLLM's MEDIUM_GPU; None also means the GPU (older builds send no medium)


class BadEvents(ValueError):
    """A payload that is not a KV-event batch this decoder accepts; the message says why."""


EngineHash = Union[int, bytes]


@dataclass(frozen=True)
class Stored:
    hashes: tuple[EngineHash, ...]
    parent: EngineHash | None
    token_ids: tuple[int, ...]
    block_size: int


@dataclass(frozen=True)
class Removed:
    hashes: tuple[EngineHash, ...]


@dataclass(frozen=True)
class Cleared:
    pass


@dataclass(frozen=True)
class Skipped:
    why: str  # "lora", "medium CPU": an event about another cache than the one routed on


Event = Union[Stored, Removed, Cleared, Skipped]


@dataclass(frozen=True)
class Batch:
    ts: float
    events: tuple[Event, ...]
    dp_rank: int | None = None


def decode(payload: bytes) -> Batch:
    """One ``KVEventBatch`` payload; BadEvents when it is not one."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise BadEvents("payload is not bytes")
    if len(payload) > MAX_PAYLOAD:
        raise BadEvents(f"payload of {len(payload)} bytes is over {MAX_PAYLOAD}")
    try:
        raw = msgpack.unpackb(bytes(payload), raw=False, strict_map_key=True, use_list=True,
                              max_str_len=1 << 16, max_bin_len=MAX_HASH_BYTES, max_array_len=MAX_ARRAY,
                              max_map_len=64, max_ext_len=0)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise BadEvents(f"not msgpack: {type(e).__name__}: {e}") from None
    if isinstance(raw, dict):
        raw = [raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")]
    if not isinstance(raw, list) or not 2 <= len(raw) <= 3:
        raise BadEvents("a batch is [ts, events, data_parallel_rank]")
    ts, events = raw[0], raw[1]
    rank = raw[2] if len(raw) == 3 else None
    if not _number(ts):
        raise BadEvents(f"ts is {type(ts).__name__}, not a number")
    if rank is not None and not _int(rank, 0, 1 << 16):
        raise BadEvents("data_parallel_rank is not a small integer")
    if not isinstance(events, list):
        raise BadEvents("events is not a list")
    if len(events) > MAX_EVENTS:
        raise BadEvents(f"{len(events)} events in one batch, over {MAX_EVENTS}")
    return Batch(float(ts), tuple(_event(e, i) for i, e in enumerate(events)), rank)


FIELDS = {  # tag -> the fields read, in array order (after the tag)
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}
REQUIRED = {"BlockStored": 4, "BlockRemoved": 1, "AllBlocksCleared": 0}  # lora_id and medium may be absent


def _event(e: Any, i: int) -> Event:
    if isinstance(e, dict):
        tag = e.get("type")
        names = FIELDS.get(tag) if isinstance(tag, str) else None
        if names is None:
            raise BadEvents(f"event {i}: unknown type {str(tag)[:40]!r}")
        missing = [n for n in names[:REQUIRED[tag]] if n not in e]
        if missing:
            raise BadEvents(f"event {i} ({tag}): missing {', '.join(missing)}")
        f = {n: e.get(n) for n in names}
        f["lora_name"] = e.get("lora_name")
    elif isinstance(e, list) and e and isinstance(e[0], str):
        tag = e[0]
        names = FIELDS.get(tag)
        if names is None:
            raise BadEvents(f"event {i}: unknown type {tag[:40]!r}")
        if len(e) - 1 < REQUIRED[tag]:
            raise BadEvents(f"event {i} ({tag}): {len(e) - 1} fields, needs {REQUIRED[tag]}")
        f = dict(zip(names, e[1:]))
        f["lora_name"] = e[7] if tag == "BlockStored" and len(e) > 7 else None
    else:
        raise BadEvents(f"event {i} is neither a tagged array nor a map")
    if tag == "AllBlocksCleared":
        return Cleared()
    hashes = _hashes(f["block_hashes"], i)
    medium = f.get("medium")
    if medium is not None and not isinstance(medium, str):
        raise BadEvents(f"event {i}: medium is not a string")
    if medium not in (None, GPU):
        return Skipped(f"medium {medium[:16]}")
    if tag == "BlockRemoved":
        return Removed(hashes)
    parent, tokens, size = f["parent_block_hash"], f["token_ids"], f["block_size"]
    if parent is not None:
        parent = _hashes([parent], i)[0]
    if not _int(size, 1, MAX_BLOCK_SIZE):
        raise BadEvents(f"event {i}: block_size is not an integer in 1..{MAX_BLOCK_SIZE}")
    if not isinstance(tokens, list) or len(tokens) != len(hashes) * size:
        raise BadEvents(f"event {i}: token_ids must hold block_size ({size}) tokens per block hash "
                        f"({len(hashes)})")
    if not all(_int(t, 0, MAX_TOKEN_ID) for t in tokens):
        raise BadEvents(f"event {i}: a token id is not an integer in 0..{MAX_TOKEN_ID}")
    if f.get("lora_id") is not None or f.get("lora_name") is not None:
        return Skipped("lora")
    return Stored(hashes, parent, tuple(tokens), size)


def _hashes(v: Any, i: int) -> tuple[EngineHash, ...]:
    if not isinstance(v, list) or len(v) > MAX_BLOCKS:
        raise BadEvents(f"event {i}: block_hashes is not a list of at most {MAX_BLOCKS}")
    for h in v:
        if isinstance(h, bool) or not isinstance(h, (int, bytes)):
            raise BadEvents(f"event {i}: a block hash is {type(h).__name__}, not an integer or bytes")
        if isinstance(h, int) and not -(1 << 63) <= h < (1 << 64):
            raise BadEvents(f"event {i}: a block hash is outside 64 bits")
    return tuple(v)


def _int(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def encode(batch: Batch) -> bytes:
    """``batch`` in vLLM's array-like wire format (the stand-in engine publishes with it; the
    tests build payloads with it)."""
    def one(e: Event) -> list:
        if isinstance(e, Stored):
            return ["BlockStored", list(e.hashes), e.parent, list(e.token_ids), e.block_size, None, GPU]
        if isinstance(e, Removed):
            return ["BlockRemoved", list(e.hashes), GPU]
        if isinstance(e, Cleared):
            return ["AllBlocksCleared"]
        raise ValueError(f"cannot encode {e!r}")
    return msgpack.packb([batch.ts, [one(e) for e in batch.events], batch.dp_rank], use_bin_type=True)
