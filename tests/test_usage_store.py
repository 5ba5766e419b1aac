"""Measured memory in the store (store/usage.py), on SQLite and PostgreSQL: one host's report in
one transaction of three statements however many replicas it names, the peak kept as the larger
of stored and reported, replicas the report no longer names forgotten, and the figures kept per
(model source, backend, parameters, GPU model) for learning claims later."""

from __future__ import annotations

import time

from sqlalchemy import event

from contracts.usage import GpuUse, ReplicaUse, UsageBatch
from scheduler.units import GiB, MiB
from store import usage
from tests.store_fixtures import store  # noqa: F401  (fixture)

SRC = "huggingface:bartowski/Qwen2.5-7B-Instruct-GGUF:Qwen2.5-7B-Instruct-Q4_K_M.gguf"


def rep(name: str, used: int, peak: int | None = None, claimed: int = 8 * GiB, params: str = "-c 8192",
        gpu: str = "NVIDIA L4", rss: int = GiB) -> ReplicaUse:
    return ReplicaUse(instance=name, gpus=[GpuUse(index=0, used=used, peak=used if peak is None else peak,
                                                  claimed=claimed)],
                      rss=rss, rss_peak=rss, ram_claimed=2 * GiB, measured="nvml", source=SRC, backend="llama.cpp",
                      parameters=params, gpu_model=gpu)


def statements(engine):
    """Count the statements each write sends (an executemany counts once)."""
    seen = []
    event.listen(engine, "before_cursor_execute", lambda *a, **k: seen.append(1))
    return seen


def test_latest_and_peak_per_replica_and_per_profile(store):  # noqa: F811
    _, _, engine = store
    # report 1: q-0 at 5.5 GiB; report 2: q-0 at 5.2 GiB (peak stays 5.5), q-1 appears at 6.1 GiB
    usage.record(engine, UsageBatch(host="g1", replicas=[rep("q-0", int(5.5 * GiB))]))
    usage.record(engine, UsageBatch(host="g1", replicas=[rep("q-0", int(5.2 * GiB), peak=int(5.2 * GiB)),
                                                         rep("q-1", int(6.1 * GiB))]))
    (row,) = usage.of_instance(engine, "q-0")
    assert (row.host, row.vram_used, row.vram_peak, row.vram_claimed) == ("g1", int(5.2 * GiB), int(5.5 * GiB), 8 * GiB)
    (prof,) = usage.profiles(engine)  # one (source, backend, parameters, GPU model): both replicas
    assert (prof.source, prof.backend, prof.parameters, prof.gpu_model) == (SRC, "llama.cpp", "-c 8192", "NVIDIA L4")
    assert (prof.vram_peak, prof.vram_claimed) == (int(6.1 * GiB), 8 * GiB)  # max(5.5, 5.2, 6.1)

    # other parameters or another card are another profile; another host's report leaves g1's rows alone
    usage.record(engine, UsageBatch(host="g2", replicas=[rep("q-2", 7 * GiB, params="-c 32768"),
                                                         rep("q-3", 5 * GiB, gpu="NVIDIA A10G")]))
    assert len(usage.profiles(engine)) == 3
    # g1 reports q-1 only: q-0 stopped there and is forgotten; an empty report forgets them all
    usage.record(engine, UsageBatch(host="g1", replicas=[rep("q-1", int(6.0 * GiB))]))
    assert usage.of_instance(engine, "q-0") == [] and usage.of_instance(engine, "q-1")[0].vram_peak == int(6.1 * GiB)
    usage.record(engine, UsageBatch(host="g1", replicas=[]))
    assert usage.of_instance(engine, "q-1") == [] and len(usage.of_instance(engine, "q-2")) == 1
    assert len(usage.profiles(engine)) == 3  # the profiles stay: they are what was learned


def test_a_host_of_a_thousand_replicas_is_one_transaction_of_three_statements(store):  # noqa: F811
    """1,000 replicas (10 parameter sets): one delete and two multi-row upserts, and BEGIN/COMMIT
    around them, well under a second. At 100 hosts each reporting every few minutes (or on news)
    the store sees well under one such transaction a second."""
    _, _, engine = store
    batch = UsageBatch(host="big", replicas=[rep(f"r-{i}", 5 * GiB + i * MiB, params=f"-c {1024 * (1 + i % 10)}")
                                             for i in range(1000)])
    usage.record(engine, batch)  # the first: inserts
    seen = statements(engine)
    t0 = time.perf_counter()
    assert usage.record(engine, batch) == 1000  # the second: updates
    took = time.perf_counter() - t0
    writes = len(seen)
    assert writes <= 5, writes  # delete + 2 upserts (+ BEGIN IMMEDIATE on SQLite, sent as a statement)
    assert took < 2.0, took
    assert len(usage.profiles(engine)) == 10
