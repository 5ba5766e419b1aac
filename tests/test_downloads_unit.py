"""The resumable transfer (worker_agent/downloads.py) against the localhost mirror, without
Temporal: what a partial file, a server that ignores Range, a cut connection, a missing file
and a missing client each lead to."""

from __future__ import annotations

import os

import pytest

from scheduler.errors import InvalidInput
from scheduler.spec import Source
from tests.hub_mirror import COMMIT, HubMirror
from worker_agent.downloads import DownloadFailed, HubConfig, NotOnHub, Progress, Want, fetch, wanted

MiB = 2**20
DATA = os.urandom(3 * MiB + 17)


@pytest.fixture
def mirror(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    import huggingface_hub.constants as k

    monkeypatch.setattr(k, "HF_HUB_OFFLINE", False)
    m = HubMirror({"org/m": {"m.gguf": DATA, "config.json": b"{}"}})
    yield m
    m.close()


def test_a_partial_file_is_continued_from_where_it_ends(tmp_path, mirror):
    cfg = HubConfig(str(tmp_path), mirror.url)
    dest = tmp_path / "huggingface" / "org" / "m" / COMMIT / "m.gguf"
    dest.parent.mkdir(parents=True)
    (tmp_path / "huggingface/org/m" / COMMIT / "m.gguf.partial").write_bytes(DATA[:MiB])  # an earlier try got 1 MiB
    p = Progress()
    assert fetch(cfg, Want("huggingface", "org/m", "m.gguf"), p) == str(dest)
    assert dest.read_bytes() == DATA
    assert mirror.ranges("m.gguf") == [MiB]  # asked for the rest only
    assert (p.done, p.total) == (len(DATA), len(DATA))
    fetch(cfg, Want("huggingface", "org/m", "m.gguf"))  # already there: no GET at all
    assert mirror.ranges("m.gguf") == [MiB]


def test_a_cut_connection_is_resumed_while_it_makes_progress(tmp_path, mirror):
    mirror.cut_after = MiB  # every response breaks after 1 MiB: 4 GETs, each from where the last stopped
    path = fetch(HubConfig(str(tmp_path), mirror.url), Want("huggingface", "org/m", "m.gguf"))
    assert open(path, "rb").read() == DATA
    assert mirror.ranges("m.gguf") == [0, MiB, 2 * MiB, 3 * MiB]


def test_no_progress_fails_and_keeps_the_partial_file(tmp_path, mirror):
    cfg, want = HubConfig(str(tmp_path), mirror.url), Want("huggingface", "org/m", "m.gguf")
    mirror.cut_after = 0  # the connection now breaks before any byte
    part = tmp_path / "huggingface/org/m" / COMMIT / "m.gguf.partial"
    part.parent.mkdir(parents=True)
    part.write_bytes(DATA[:MiB])
    with pytest.raises(DownloadFailed, match=r"m.gguf stopped at 1048576 of 3145745 bytes .*the next try resumes"):
        fetch(cfg, want)
    assert mirror.ranges("m.gguf") == [MiB] * 3  # three tries in a row without a byte
    assert part.read_bytes() == DATA[:MiB]  # kept for the next try
    mirror.cut_after = None
    assert open(fetch(cfg, want), "rb").read() == DATA
    assert mirror.ranges("m.gguf")[-1] == MiB


def test_a_whole_repository(tmp_path, mirror):
    p = Progress()
    folder = fetch(HubConfig(str(tmp_path), mirror.url), Want("huggingface", "org/m", None), p)
    assert sorted(os.listdir(folder)) == [".complete", "config.json", "m.gguf"]
    assert p.total == len(DATA) + 2


@pytest.mark.parametrize("want,problem", [
    (Want("huggingface", "org/none", "m.gguf"), "huggingface:org/none/m.gguf is not on the hub"),
    (Want("huggingface", "org/m", "other.gguf"), "huggingface:org/m/other.gguf is not on the hub"),
    (Want("huggingface", "org/none", None), "huggingface:org/none is not on the hub"),
    (Want("modelscope", "org/m", None), "ModelScope's client is not installed on this host"),
])
def test_what_is_not_there_is_named(tmp_path, mirror, want, problem):
    with pytest.raises(NotOnHub, match=problem):
        fetch(HubConfig(str(tmp_path), mirror.url), want)


def test_an_unreachable_hub_is_retryable(tmp_path, mirror):
    with pytest.raises(DownloadFailed, match="cannot reach the hub"):
        fetch(HubConfig(str(tmp_path), "http://127.0.0.1:1"), Want("huggingface", "org/m", "m.gguf"))


def test_a_server_that_ignores_range_means_starting_over(tmp_path, mirror):
    mirror.ignore_range = True
    part = tmp_path / "huggingface/org/m" / COMMIT / "m.gguf.partial"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"x" * MiB)  # whatever an earlier try left is not kept
    path = fetch(HubConfig(str(tmp_path), mirror.url), Want("huggingface", "org/m", "m.gguf"))
    assert open(path, "rb").read() == DATA and not part.exists()


def test_sources():
    assert wanted(Source(local_path="/m")) is None
    assert wanted(Source(huggingface={"repo": "a/b", "file": "x.gguf"})) == Want("huggingface", "a/b", "x.gguf")
    assert issubclass(NotOnHub, InvalidInput) and not issubclass(DownloadFailed, InvalidInput)


def test_a_cancelled_download_stops_and_keeps_its_partial_file(tmp_path, mirror):
    import threading
    import time

    mirror.rate = 4 * MiB  # slow enough to cancel midway
    p = Progress()
    errors = []

    def run():
        try:
            fetch(HubConfig(str(tmp_path), mirror.url), Want("huggingface", "org/m", "m.gguf"), p)
        except DownloadFailed as e:
            errors.append(str(e))

    t = threading.Thread(target=run)
    t.start()
    while p.done < MiB:
        time.sleep(0.02)
    p.cancelled = True
    t.join(5)
    assert not t.is_alive() and "cancelled" in errors[0]
    part = tmp_path / "huggingface/org/m" / COMMIT / "m.gguf.partial"
    assert MiB <= part.stat().st_size < len(DATA)


def test_a_glob_takes_its_first_match_with_every_shard(tmp_path, mirror):
    # "*Q4*.gguf" matches a split model (two shards) and a single file; the first match in name
    # order is the split one's first shard, so both shards come, and nothing else
    mirror.repos["org/split"] = {"m-Q4-00001-of-00002.gguf": b"a" * 10, "m-Q4-00002-of-00002.gguf": b"b" * 20,
                                 "n-Q4.gguf": b"c", "m-Q8.gguf": b"d"}
    p = Progress()
    path = fetch(HubConfig(str(tmp_path), mirror.url), Want("huggingface", "org/split", "*Q4*.gguf"), p)
    assert path.endswith("m-Q4-00001-of-00002.gguf") and p.total == 30
    assert sorted(os.listdir(os.path.dirname(path))) == [".complete-_Q4_.gguf", "m-Q4-00001-of-00002.gguf",
                                                         "m-Q4-00002-of-00002.gguf"]
    with pytest.raises(NotOnHub, match="no file of org/split on .* matches"):
        fetch(HubConfig(str(tmp_path), mirror.url), Want("huggingface", "org/split", "*Q2*.gguf"))


@pytest.mark.parametrize("file,names,picked", [
    (None, ["b", "a"], ["a", "b"]),                                    # no file: the whole repository
    ("x.gguf", ["x.gguf", "y.gguf"], ["x.gguf"]),                      # a name: itself
    ("x.gguf", ["y.gguf"], []),
    ("*Q4_K_M*.gguf", ["m-Q4_K_M.gguf", "m-Q8_0.gguf", "README.md"], ["m-Q4_K_M.gguf"]),
    ("sub/*.gguf", ["sub/a.gguf", "a.gguf"], ["sub/a.gguf"]),
])
def test_pick(file, names, picked):
    from scheduler.spec import HubFile

    assert HubFile(repo="o/r", file=file).pick(names) == picked
