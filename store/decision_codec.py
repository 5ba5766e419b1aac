"""A decision's inputs kept content-addressed (scheduler/decision_inputs.py's ``DecisionInputs``),
so ``gpuflow explain --replay`` and bench/replay_all.py re-run the policy on what it saw; the rows
and blobs themselves are store/decision_log.py's.

``Encoder``: the snapshot's rows are cut into chunks at rows whose name's hash says so (so one row
added or changed changes one chunk, never shifts the others), each chunk keyed by the SHA-256 of
its rows' digests; the other parts are blobs keyed by their own SHA-256. A decision is then a small
manifest of digests, and consecutive decisions share nearly all chunks. A row's digest is
remembered by the row object itself: the snapshot cache hands the same objects to decision after
decision, so only the rows that changed are serialized again. ``decode`` reads a manifest back,
each part checked against its digest. The format is kept byte for byte (VERSION): decisions kept
by earlier builds must replay."""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from scheduler import request_codec
from scheduler.cluster import ClusterSnapshot, Instance, ModelFile, Worker
from scheduler.decision_inputs import DecisionInputs
from scheduler.errors import InvalidInput
from scheduler.group_inputs import KINDS, GroupInputs
from scheduler.groups.layers import TopologyLayer
from scheduler.groups.spec import RoleName
from scheduler.policy_config import PolicyConfig
from scheduler.spec import ModelSpec
from scheduler.tenancy.config import TenantsFile
from scheduler.tenancy.preemption import Owners

VERSION = 1
WORKERS_PER_CHUNK = 4  # on average: a worker row (its GPUs and links) is a few KB
ROWS_PER_CHUNK = 16  # instances and model files


def _canon(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _starts_chunk(name: str, every: int) -> bool:
    return zlib.crc32(name.encode()) % every == 0


@dataclass
class Encoded:
    """A decision's inputs kept: its manifest (digest and bytes), and the blobs it names that the
    encoder had not handed out before (digest -> bytes, uncompressed)."""

    digest: str
    manifest: bytes
    blobs: dict[str, bytes]


class Encoder:
    """DecisionInputs as a manifest of digests (``encode``), remembering each row's and part's
    digest by the object itself, and which blobs it handed out already (``known``; forgotten past
    ``max_known``, and then handed out again: storing one twice is harmless)."""

    def __init__(self, max_rows: int = 200_000, max_known: int = 500_000):
        self._memo: dict[int, tuple[object, bytes, bytes, bool]] = {}  # id(obj) -> (obj, sha256, json, starts a chunk)
        self._chunk_memo: dict[bytes, str] = {}  # a chunk's rows' digests -> its digest
        self.known: set[str] = set()
        self.max_rows, self.max_known = max_rows, max_known

    def _of(self, obj: object, dump: Callable[[object], bytes]) -> tuple[bytes, bytes]:
        hit = self._memo.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1], hit[2]
        data = dump(obj)
        d = hashlib.sha256(data).digest()
        if len(self._memo) >= self.max_rows:
            self._memo.clear()
        self._memo[id(obj)] = (obj, d, data, False)  # the object is held: its id is not reused meanwhile
        return d, data

    def _blob(self, obj: object, dump: Callable[[object], bytes], out: dict[str, bytes]) -> str:
        d, data = self._of(obj, dump)
        h = d.hex()
        self._hand_out(h, lambda: data, out)
        return h

    def _chunks(self, rows: Iterable, every: int, out: dict[str, bytes]) -> list[str]:
        """Rows cut where a row's name starts a chunk; each chunk's digest is the SHA-256 of its
        rows' digests, its bytes the rows' JSON one per line. A row's digest, JSON and whether it
        starts a chunk are remembered with the row (one lookup per row per decision)."""
        digests: list[str] = []
        cur: list[tuple] = []
        memo, rows_memo = self._memo, self._chunk_memo

        def close():
            key = b"".join(x[1] for x in cur)
            h = rows_memo.get(key)
            if h is None:
                h = hashlib.sha256(key).hexdigest()
                if len(rows_memo) >= self.max_rows // 8:
                    rows_memo.clear()
                rows_memo[key] = h
            if h not in self.known:
                part = list(cur)
                self._hand_out(h, lambda: b"\n".join(x[2] for x in part), out)
            digests.append(h)

        for r in rows:
            hit = memo.get(id(r))
            if hit is None or hit[0] is not r:
                data = _model_json(r)
                name = r.name if hasattr(r, "name") else f"{r.worker}\0{r.source}"
                hit = (r, hashlib.sha256(data).digest(), data, _starts_chunk(name, every))
                if len(memo) >= self.max_rows:
                    memo.clear()
                memo[id(r)] = hit  # the object is held: its id is not reused meanwhile
            if cur and hit[3]:
                close()
                cur = []
            cur.append(hit)
        if cur:
            close()
        return digests

    def _hand_out(self, h: str, data: Callable[[], bytes], out: dict[str, bytes]) -> None:
        if h in self.known:
            return
        if len(self.known) >= self.max_known:
            self.known.clear()
        self.known.add(h)
        out[h] = data()

    def _rows(self, snap, out: dict[str, bytes]) -> dict:
        """The snapshot's rows in chunks, the same for a replica's inputs and a group's (shared blobs)."""
        return {"workers": self._chunks(snap.workers, WORKERS_PER_CHUNK, out),
                "instances": self._chunks(snap.instances, ROWS_PER_CHUNK, out),
                "files": self._chunks(snap.model_files, ROWS_PER_CHUNK, out)}

    def _context(self, inp, out: dict[str, bytes]) -> dict:
        """The spec, tenants, owners, policy and generations a decision read (either kind of inputs)."""
        return {"spec": self._blob(inp.spec, _model_json, out),
                "tenants": self._blob(inp.tenants, _model_json, out),
                "owners": self._blob(inp.owners, _owners_json, out),
                "policy": self._blob(inp.policy, _model_json, out),
                "gens": self._blob(inp.gens, _canon, out)}

    def encode(self, inp: DecisionInputs) -> Encoded:
        out: dict[str, bytes] = {}
        snap = inp.snapshot
        manifest = {
            "v": VERSION, "names": list(inp.names),
            **self._rows(snap, out), **self._context(inp, out),
            "request": self._blob(inp.request, lambda r: _canon(request_codec.encode(r)), out)}
        data = _canon(manifest)
        return Encoded(hashlib.sha256(data).hexdigest(), data, out)

    def encode_group(self, inp: GroupInputs) -> Encoded:
        """A group's decision (scheduler/group_inputs.py): the snapshot's rows chunked as a
        replica's are (shared with theirs), its topology layers, the spec, each role's request and
        the members by role; the kind says how it is replayed (form or scale_out)."""
        out: dict[str, bytes] = {}
        snap = inp.snapshot
        manifest = {
            "v": VERSION, "kind": inp.kind, "group": inp.group,
            "roles": {r.value: list(ns) for r, ns in inp.names.items()},
            **self._rows(snap, out), **self._context(inp, out),
            "topology": self._blob(snap.topology, lambda t: _canon([x.model_dump(mode="json") for x in t]), out),
            "requests": self._blob(inp.requests, lambda rs: _canon({r.value: request_codec.encode(q)
                                                                     for r, q in rs.items()}), out)}
        data = _canon(manifest)
        return Encoded(hashlib.sha256(data).hexdigest(), data, out)


def _model_json(m) -> bytes:
    return m.model_dump_json().encode()


def _owners_json(o: Owners) -> bytes:
    return _canon({"tenant_of": o.tenant_of, "priority_of": o.priority_of, "started_at": o.started_at})


def _part(blob: Callable[[str], bytes], h: str, what: str = "") -> bytes:
    data = blob(h)
    if hashlib.sha256(data).hexdigest() != h:
        raise InvalidInput(f"kept blob {h[:12]}{what} does not match its digest")
    return data


def _rows(blob: Callable[[str], bytes], hs: list[str], cls) -> list:
    out = []
    for h in hs:
        lines = blob(h).split(b"\n")
        if hashlib.sha256(b"".join(hashlib.sha256(x).digest() for x in lines)).hexdigest() != h:
            raise InvalidInput(f"kept chunk {h[:12]} ({cls.__name__.lower()}s of the snapshot) does not match its digest")
        out += [cls.model_validate_json(x) for x in lines]
    return out


def _snapshot(m: dict, blob: Callable[[str], bytes], topology: list | None = None) -> ClusterSnapshot:
    return ClusterSnapshot(workers=_rows(blob, m["workers"], Worker), instances=_rows(blob, m["instances"], Instance),
                           model_files=_rows(blob, m["files"], ModelFile), topology=topology or [])


def _owners(data: bytes) -> Owners:
    o = json.loads(data)
    return Owners(dict(o["tenant_of"]), dict(o["priority_of"]), dict(o["started_at"]))


def _manifest(manifest: bytes) -> dict:
    m = json.loads(manifest)
    if m.get("v") != VERSION:
        raise InvalidInput(f"decision inputs of version {m.get('v')!r}; this gpuflow reads version {VERSION}")
    return m


def decode(manifest: bytes, blob: Callable[[str], bytes]) -> DecisionInputs:
    """The inputs a manifest names; ``blob(digest)`` gives a blob's bytes (KeyError: not kept).
    Each chunk and blob is checked against its digest; a part that does not decode raises
    InvalidInput naming it."""
    try:
        m = _manifest(manifest)

        def part(h: str) -> bytes:
            return _part(blob, h)

        return DecisionInputs(
            snapshot=_snapshot(m, blob), spec=ModelSpec.model_validate_json(part(m["spec"])),
            request=request_codec.decode(json.loads(part(m["request"]))),
            tenants=TenantsFile.model_validate_json(part(m["tenants"])), owners=_owners(part(m["owners"])),
            names=[str(n) for n in m["names"]], policy=_policy(part(m["policy"])),
            gens={str(k): int(v) for k, v in json.loads(part(m["gens"])).items()})
    except KeyError as e:
        raise InvalidInput(f"the kept decision inputs lack {e.args[0]!r} (pruned, or never written)") from None
    except ValueError as e:  # pydantic's ValidationError among them (InvalidInput is no ValueError: it passes)
        raise InvalidInput(f"the kept decision inputs do not decode: {e}") from None


def decode_group(manifest: bytes, blob: Callable[[str], bytes]) -> GroupInputs:
    """A group decision's inputs (``Encoder.encode_group``), each part checked against its digest
    and named when it is not what was kept."""
    try:
        m = _manifest(manifest)
        if m.get("kind") not in KINDS:
            raise InvalidInput(f"the kept inputs are not a group's decision (kind {m.get('kind')!r})")

        def part(key: str) -> bytes:
            return _part(blob, m[key], f" (the group's {key})")

        topology = [TopologyLayer.model_validate(x) for x in json.loads(part("topology"))]
        reqs = json.loads(part("requests"))
        return GroupInputs(
            kind=m["kind"], snapshot=_snapshot(m, blob, topology), spec=ModelSpec.model_validate_json(part("spec")),
            group=str(m["group"]), names={RoleName(r): [str(n) for n in ns] for r, ns in m["roles"].items()},
            requests={RoleName(r): request_codec.decode(q) for r, q in reqs.items()},
            tenants=TenantsFile.model_validate_json(part("tenants")), owners=_owners(part("owners")),
            policy=_policy(part("policy")),
            gens={str(k): int(v) for k, v in json.loads(part("gens")).items()})
    except KeyError as e:
        raise InvalidInput(f"the kept group decision inputs lack {e.args[0]!r} (pruned, or never written)") from None
    except ValueError as e:
        raise InvalidInput(f"the kept group decision inputs do not decode: {e}") from None


def _policy(text: str) -> PolicyConfig:
    """The policy a decision ran with. One kept before the foreign-memory margin existed ran
    without it: it replays with 0, not today's default, so its replay stays the same decision."""
    raw = json.loads(text)
    if isinstance(raw, dict):
        raw.setdefault("foreign_memory_margin", 0.0)
    return PolicyConfig.model_validate(raw)
