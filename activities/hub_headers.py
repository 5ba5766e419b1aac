"""Estimating a hub model without downloading it: the control plane fetches only the bytes the
estimator reads, into a header cache, and estimates from that copy as from local files.

- GGUF (a ``file`` ending in .gguf, every shard of a split model): the header, by Range
  requests of growing size (1, 4, 16 ... MiB) until the parsed header ends inside what was
  fetched.
- A repository: config.json, the safetensors index if any, and each safetensors header (8 bytes
  of length, then that many bytes of JSON).

Each copy is a sparse file of the real size (the bytes past the header are holes, which take no
disk), so size checks and tensor offsets read as they would on the real file. Copies are kept
per commit: the same revision is never fetched twice. A mirror comes from HF_ENDPOINT or
``gpuflow server --hf-endpoint``; a token from HF_TOKEN.
"""

from __future__ import annotations

import os
import struct

from hubio.listing import list_repo, where as hub_where
from scheduler.errors import GpuflowError, InvalidInput, ModelFileError
from scheduler.gguf.reader import header_extent, shard_paths
from scheduler.spec import Source

FIRST = 1 << 20


class HubUnavailable(InvalidInput):
    """The hub does not have it (or will not give it without a token): not retried."""


class HubUnreachable(GpuflowError):
    """The hub (or the mirror) did not answer: retried."""


def _head(url: str, n: int | None = None) -> bytes:
    """The first ``n`` bytes of the file at ``url`` (all of it for None), through huggingface_hub's
    own HTTP session: its headers (HF_TOKEN), and redirects to the CDN without the token."""
    from huggingface_hub.utils import build_hf_headers, get_session

    headers = build_hf_headers()
    if n is not None:
        headers["Range"] = f"bytes=0-{n - 1}"
    try:
        r = get_session().get(url, headers=headers, follow_redirects=True, timeout=60)
    except Exception as e:  # noqa: BLE001  refused, reset, timed out
        raise HubUnreachable(f"cannot read {url}: {type(e).__name__}: {e}") from None
    if r.status_code in (401, 403, 404):
        raise HubUnavailable(f"cannot read {url}: HTTP {r.status_code}")
    if r.status_code >= 400:
        raise HubUnreachable(f"cannot read {url}: HTTP {r.status_code}")
    return r.content if n is None else r.content[:n]  # a server that ignores Range: the first n bytes


def _sparse(path: str, head: bytes, size: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(head)
        f.truncate(size)
    os.replace(tmp, path)


def _gguf(url: str, size: int, dest: str) -> None:
    n = FIRST
    while True:
        n = min(n, size)
        _sparse(dest, _head(url, n), size)
        try:
            if header_extent(dest) <= n:
                return
        except ModelFileError:
            if n >= size:
                raise
        if n >= size:
            return
        n *= 4


def _safetensors(url: str, size: int, dest: str) -> None:
    (length,) = struct.unpack("<Q", _head(url, 8))
    if length > min(size, 100 * 2**20):
        raise ModelFileError(url, f"safetensors header of {length} bytes is not plausible")
    _sparse(dest, _head(url, 8 + length), size)


def header_copy(source: Source, cache_dir: str, endpoint: str | None = None) -> str:
    """A local stand-in for a hub source that the estimator can read: the GGUF file (its first
    shard for a split model) or the repository's folder."""
    import huggingface_hub as hf

    hub = source.huggingface
    if hub is None:
        raise HubUnavailable(f"{source.key}: estimation from ModelScope needs resources in the spec or a local copy")
    where = hub_where(endpoint)
    commit, tree = list_repo(hub.repo, endpoint, source.key, HubUnavailable, HubUnreachable)
    folder = os.path.join(cache_dir, "hub-headers", *hub.repo.split("/"), commit)

    def url(name: str) -> str:
        return hf.hf_hub_url(hub.repo, name, revision=commit, endpoint=endpoint)

    def done(name: str) -> bool:
        p = os.path.join(folder, name)
        return os.path.exists(p) and os.path.getsize(p) == tree[name]

    if hub.file:
        picked = hub.pick(list(tree))
        if not picked:
            raise HubUnavailable(f"{source.key}: {hub.repo} has no file {hub.file} on the hub ({where})")
        names = shard_paths(picked[0])  # every shard of a split model, by the same naming rule
        for name in names:
            if name not in tree:
                raise HubUnavailable(f"{source.key}: shard {name} is missing on the hub")
            if not done(name):
                _gguf(url(name), tree[name], os.path.join(folder, name))
        return os.path.join(folder, names[0])
    for name, size in tree.items():
        if done(name):
            continue
        if name in ("config.json", "model.safetensors.index.json"):
            _sparse(os.path.join(folder, name), _head(url(name)), size)
        elif name.endswith(".safetensors"):
            _safetensors(url(name), size, os.path.join(folder, name))
    if "config.json" not in tree:
        raise HubUnavailable(f"{source.key} has no config.json on the hub: not a Transformers model")
    return folder
