"""Hub models are estimated from their headers alone (activities/hub_headers.py): the control
plane fetches the GGUF header or config.json and the safetensors headers from a Hugging Face
mirror on localhost, and the estimate is the same as from the whole local file."""

from __future__ import annotations

import os

import pytest

from scheduler.estimate import estimate_request
from scheduler.spec import ModelSpec, Source
from scheduler.summary import request_summary
from tests.hub_mirror import HubMirror
from activities.hub_headers import HubUnavailable, HubUnreachable, header_copy

MiB = 2**20


@pytest.fixture
def offline_off(monkeypatch):
    import huggingface_hub.constants as k

    monkeypatch.setattr(k, "HF_HUB_OFFLINE", False)


def test_gguf_from_its_header(tmp_path, smollm2, offline_off):
    m = HubMirror({"org/smol": {"SmolLM2.gguf": smollm2}})
    try:
        src = Source(huggingface={"repo": "org/smol", "file": "SmolLM2.gguf"})
        copy = header_copy(src, str(tmp_path), m.url)
        # 98 MB model: its header (vocabulary included) lies in the first 4 MiB fetched
        assert m.served <= 5 * MiB < os.path.getsize(smollm2) == os.path.getsize(copy)
        assert os.stat(copy).st_blocks * 512 <= 5 * MiB  # a sparse file: the rest takes no disk
        local = ModelSpec.model_validate({"name": "s", "source": {"local_path": smollm2}, "backend": "llama.cpp"})
        hub = local.model_copy(update={"source": src})
        assert request_summary(estimate_request(hub, copy)) == request_summary(estimate_request(local))
        served = m.served
        header_copy(src, str(tmp_path), m.url)  # kept per commit: nothing fetched again
        glob = Source(huggingface={"repo": "org/smol", "file": "*.gguf"})  # a glob names the same file
        assert header_copy(glob, str(tmp_path), m.url) == copy
        assert m.served == served
    finally:
        m.close()


def test_transformers_repo_from_config_and_safetensors_headers(tmp_path, qwen7b_dir, offline_off):
    files = {n: os.path.join(qwen7b_dir, n) for n in os.listdir(qwen7b_dir)}
    m = HubMirror({"Qwen/Qwen2.5-7B": files})
    try:
        src = Source(huggingface={"repo": "Qwen/Qwen2.5-7B"})
        folder = header_copy(src, str(tmp_path / "cache"), m.url)
        assert m.served < MiB  # 15 GB of (sparse) weights: only config, index and headers travel
        local = ModelSpec.model_validate({"name": "q", "source": {"local_path": qwen7b_dir}, "backend": "vllm"})
        hub = local.model_copy(update={"source": src})
        assert request_summary(estimate_request(hub, folder)) == request_summary(estimate_request(local))
    finally:
        m.close()


def test_what_the_hub_lacks_is_named(tmp_path, offline_off):
    m = HubMirror({"org/smol": {"a.gguf": b"GGUF"}})
    try:
        with pytest.raises(HubUnavailable, match="huggingface:org/none is not on the hub"):
            header_copy(Source(huggingface={"repo": "org/none"}), str(tmp_path), m.url)
        with pytest.raises(HubUnavailable, match="org/smol has no file b.gguf"):
            header_copy(Source(huggingface={"repo": "org/smol", "file": "b.gguf"}), str(tmp_path), m.url)
        with pytest.raises(HubUnavailable, match="no config.json"):
            header_copy(Source(huggingface={"repo": "org/smol"}), str(tmp_path), m.url)
    finally:
        m.close()
    with pytest.raises(HubUnreachable, match="cannot reach the hub"):
        header_copy(Source(huggingface={"repo": "org/smol"}), str(tmp_path), "http://127.0.0.1:1")
