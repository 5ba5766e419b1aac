"""Model files from a hub into the agent's model cache: Hugging Face through ``huggingface_hub``
(a mirror through ``--hf-endpoint`` or HF_ENDPOINT; a token through HF_TOKEN), ModelScope
through its own client where it is installed.

A hub source names a repository, and optionally one file in it (a GGUF): that file is fetched
alone, otherwise every file of the repository. huggingface_hub resolves the revision to a commit,
lists the files with their sizes and builds the URLs and headers; the transfer itself is ours,
because huggingface_hub (2.x) writes each attempt to a fresh temporary file and deletes it on
failure, so a download cut short by an agent restart would start again from zero. Here each
file is written to ``<file>.partial`` and continued with a Range request, by the same attempt
while it makes progress and by the next attempt (or the next agent) after that.

Layout: ``<cache>/huggingface/<org>/<name>/<commit>/<files>``, with ``.complete`` once every file
is there, so a second instance on the host downloads nothing.
"""

from __future__ import annotations

import http.client
import os
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import urlparse

from scheduler.errors import GpuflowError, InvalidInput
from scheduler.gguf.reader import shard_paths
from scheduler.spec import HubFile, Source

CHUNK = 1 << 20
STALLS = 3  # tries in a row without a new byte before a file's download fails


@dataclass(frozen=True)
class HubConfig:
    cache_dir: str
    hf_endpoint: str | None = None  # None: huggingface_hub's own (HF_ENDPOINT, else huggingface.co)


class DownloadFailed(GpuflowError):
    """The files could not be fetched (retryable: the next attempt resumes)."""


class NotOnHub(InvalidInput):
    """The repository or file does not exist there (or needs a token this host lacks): not retried."""


@dataclass(frozen=True)
class Want:
    hub: str  # huggingface | modelscope
    repo: str
    file: str | None

    @property
    def hub_file(self) -> HubFile:
        return HubFile(repo=self.repo, file=self.file)

    @property
    def what(self) -> str:
        return f"{self.hub}:{self.repo}" + (f"/{self.file}" if self.file else "")


@dataclass
class Progress:
    """Shared with the heartbeating activity: bytes on disk of the bytes listed."""

    done: int = 0
    total: int | None = None
    cancelled: bool = False  # set by the activity when it is cancelled: the transfer stops at the next chunk
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n


def wanted(source: Source) -> Want | None:
    """What to fetch for this source; None for a local path."""
    if source.huggingface:
        return Want("huggingface", source.huggingface.repo, source.huggingface.file)
    if source.modelscope:
        return Want("modelscope", source.modelscope.repo, source.modelscope.file)
    return None


def fetch(cfg: HubConfig, want: Want, progress: Progress | None = None) -> str:
    """Download what is missing and return the local path: the file, or the repository's folder.
    Blocking; run it in a thread."""
    progress = progress or Progress()
    if want.hub == "modelscope":
        return _fetch_modelscope(cfg, want)
    commit, files = _listing(cfg, want)
    folder = _inside(cfg.cache_dir, os.path.join(cfg.cache_dir, "huggingface", *want.repo.split("/"), commit))
    for name, _ in files:  # names from the spec and from the hub: each must stay in the folder
        _inside(folder, os.path.join(folder, name))
    target = os.path.join(folder, files[0][0]) if want.file else folder  # a glob: its first match
    progress.total = sum(size for _, size in files)
    marker = os.path.join(folder, ".complete" + (f"-{_safe(want.file)}" if want.file else ""))
    if os.path.exists(marker):
        progress.add(progress.total)
        return target
    for name, size in files:
        _fetch_file(cfg, want, commit, name, size, os.path.join(folder, name), progress)
    with open(marker, "w"):
        pass
    return target


def _inside(root: str, path: str) -> str:
    """``path`` once it resolves under ``root`` (scheduler/naming.py's rule for paths from names)."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    if not real.startswith(top.rstrip(os.sep) + os.sep):
        raise NotOnHub(f"{path!r} does not resolve inside {root}; refused")
    return path


def _safe(pattern: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in pattern)


def _hf_errors():
    from huggingface_hub import errors

    return (errors.RepositoryNotFoundError, errors.EntryNotFoundError, errors.RevisionNotFoundError,
            errors.GatedRepoError)


def _listing(cfg: HubConfig, want: Want) -> tuple[str, list[tuple[str, int]]]:
    """(commit, [(file, size)]) from the hub: the file, every file a glob matches, or the whole
    repository."""
    import huggingface_hub as hf
    from huggingface_hub.hf_api import RepoFile

    where = cfg.hf_endpoint or "huggingface.co"
    wanted_file = want.hub_file
    try:
        if want.file and not wanted_file.is_glob:
            meta = hf.get_hf_file_metadata(hf.hf_hub_url(want.repo, want.file, endpoint=cfg.hf_endpoint),
                                           endpoint=cfg.hf_endpoint)
            if not meta.commit_hash or meta.size is None:
                raise DownloadFailed(f"{where} gave no commit or size for {want.what}")
            return meta.commit_hash, [(want.file, meta.size)]
        api = hf.HfApi(endpoint=cfg.hf_endpoint)
        commit = api.model_info(want.repo).sha
        sizes = {f.path: f.size for f in api.list_repo_tree(want.repo, recursive=True, revision=commit)
                 if isinstance(f, RepoFile)}
    except _hf_errors() as e:
        raise NotOnHub(f"{want.what} is not on the hub ({where}): {str(e).splitlines()[0]}") from None
    except GpuflowError:
        raise
    except Exception as e:  # noqa: BLE001  connection refused, DNS, timeouts: retried
        raise DownloadFailed(f"cannot reach the hub ({where}) for {want.what}: {type(e).__name__}: {e}") from None
    names = wanted_file.pick(list(sizes))
    if not names:
        raise NotOnHub(f"{want.what}: no file of {want.repo} on {where} matches" if want.file
                       else f"{want.what} has no files on {where}")
    if want.file:  # a glob: its first match, with every shard when that is one of a split GGUF
        names = shard_paths(names[0])
        missing = [n for n in names if n not in sizes]
        if missing:
            raise NotOnHub(f"{want.what}: shard {missing[0]} is missing on {where}")
    return commit, [(n, sizes[n]) for n in names]


class _SameHostAuth(urllib.request.HTTPRedirectHandler):
    """Follow redirects (the hub sends large files to a CDN) without taking the token along to
    another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urlparse(newurl).netloc != urlparse(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


_opener = urllib.request.build_opener(_SameHostAuth)


def _fetch_file(cfg: HubConfig, want: Want, commit: str, name: str, size: int, dest: str, progress: Progress) -> None:
    import huggingface_hub as hf
    from huggingface_hub.utils import build_hf_headers

    if os.path.exists(dest) and os.path.getsize(dest) == size:
        progress.add(size)
        return
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    partial = dest + ".partial"
    have = os.path.getsize(partial) if os.path.exists(partial) else 0
    if have > size:
        have = 0
        os.truncate(partial, 0)
    progress.add(have)
    url = hf.hf_hub_url(want.repo, name, revision=commit, endpoint=cfg.hf_endpoint)
    stalls, why = 0, ""
    while have < size:
        headers = build_hf_headers()
        if have:
            headers["Range"] = f"bytes={have}-"
        before = have
        try:
            with _opener.open(urllib.request.Request(url, headers=headers), timeout=60) as r:
                if have and r.status != 206:  # the server ignored the Range: start over
                    progress.add(-have)
                    have = 0
                with open(partial, "r+b" if have else "wb") as f:
                    f.seek(have)
                    while chunk := r.read(CHUNK):
                        if progress.cancelled:
                            raise DownloadFailed(f"download of {want.what} cancelled at {have} of {size} bytes")
                        f.write(chunk)
                        have += len(chunk)
                        progress.add(len(chunk))
        except urllib.error.HTTPError as e:
            if e.code in (401, 403, 404):
                raise NotOnHub(f"{want.what}: {name} answered HTTP {e.code}") from None
            why = f"HTTP {e.code}"
        except (OSError, ValueError, http.client.HTTPException) as e:  # a connection cut mid-file, a timeout
            why = f"{type(e).__name__}: {e}"
        if have < size:
            stalls = 0 if have > before else stalls + 1
            if stalls >= STALLS:
                raise DownloadFailed(f"download of {want.what} failed: {name} stopped at {have} of {size} bytes "
                                     f"({why or 'the connection closed early'}); the next try resumes there")
            time.sleep(0.5 * stalls)
    if have != size:
        raise DownloadFailed(f"download of {want.what} failed: {name} is {have} bytes, the hub lists {size}")
    os.replace(partial, dest)


def _fetch_modelscope(cfg: HubConfig, want: Want) -> str:
    try:
        from modelscope.hub.file_download import model_file_download
        from modelscope.hub.snapshot_download import snapshot_download
    except ImportError:
        raise NotOnHub(f"{want.what}: ModelScope's client is not installed on this host "
                       "(pip install modelscope)") from None
    where = os.path.join(cfg.cache_dir, "modelscope")
    hub_file = want.hub_file
    try:
        if want.file and not hub_file.is_glob:
            return model_file_download(want.repo, want.file, cache_dir=where)
        folder = snapshot_download(want.repo, cache_dir=where, allow_patterns=[want.file] if want.file else None)
    except Exception as e:  # noqa: BLE001
        raise DownloadFailed(f"download of {want.what} failed: {type(e).__name__}: {e}") from None
    if not want.file:
        return folder
    names = hub_file.pick([os.path.relpath(os.path.join(r, f), folder) for r, _, fs in os.walk(folder) for f in fs])
    if not names:
        raise NotOnHub(f"{want.what}: no file of {want.repo} matches")
    return os.path.join(folder, names[0])
