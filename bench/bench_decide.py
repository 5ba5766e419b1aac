"""Decision latency and peak memory by cluster size: 10, 100, 1,000, 5,000 workers with 8 GPUs
each and two instances per worker, for a custom, a vLLM and a GGUF model. Prints a table.
Target: under 50 ms per decision at 1,000 workers. Run: make bench (or python bench/bench_decide.py).

Then the decide activity's own work on a real store (a SQLite file): 1,000 workers with 2,000 and
10,000 instances, and 5,000 workers with 10,000: the policy alone, the policy after a full
snapshot load (what every decision did before the cache), and the policy after an incremental
refresh of the cached snapshot with one booking between decisions (what it does now), and the
policy alone on that snapshot (the cache takes what it loads out of the garbage collector's
generations). Median
and p95. ``--store-only`` skips the first table. Noisy on a loaded machine: compare rows of one run."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from gpuflow import synthetic  # noqa: E402
from scheduler.cluster import ClusterSnapshot  # noqa: E402
from scheduler.decide import decide  # noqa: E402
from scheduler.estimate import gguf_request  # noqa: E402
from scheduler.hf.config import ModelParameters  # noqa: E402
from scheduler.request import FlatRequest  # noqa: E402
from scheduler.spec import ModelSpec  # noqa: E402
from scheduler.units import GiB  # noqa: E402


def snapshot(n: int) -> ClusterSnapshot:
    workers, instances = [], []
    for w in range(n):
        workers.append({"name": f"w{w}", "ram_total": 512 * GiB, "labels": {"zone": f"z{w % 4}"},
                        "gpus": [{"index": i, "vram_total": 80 * GiB, "vram_used": 2 * GiB} for i in range(8)]})
        for k in range(2):
            instances.append({"name": f"i{w}-{k}", "model": f"m{k}", "worker": f"w{w}", "gpu_indexes": [k],
                              "claim": {"ram": 4 * GiB, "vram": {k: 72 * GiB}}})
    return ClusterSnapshot.model_validate({"workers": workers, "instances": instances})


def main() -> None:
    if "--store-only" not in sys.argv:
        policy_table()
    from bench.decide_store import store_table

    store_table()


def policy_table() -> None:
    tmp = tempfile.mkdtemp()
    gguf_path = synthetic.write_llama_gguf(os.path.join(tmp, "l3.gguf"), recipe="Q5_K_M", **synthetic.LLAMA3_8B)
    t = time.perf_counter()
    gguf_req = gguf_request(gguf_path, [])
    est_ms = (time.perf_counter() - t) * 1000
    params = ModelParameters(num_attention_heads=28, num_kv_heads=4, head_dim=128, vocab_size=152064, num_layers=28)
    models = {
        "custom": (ModelSpec(name="c", source={"huggingface": {"repo": "o/c"}}, backend="custom", run_command="x"),
                   FlatRequest(vram=30 * GiB, ram=8 * GiB)),
        "vllm": (ModelSpec(name="v", source={"huggingface": {"repo": "o/v"}}, backend="vllm"),
                 FlatRequest(vram=19 * GiB, params=params)),
        "gguf": (ModelSpec(name="g", source={"local_path": gguf_path}, backend="llama.cpp"), gguf_req),
    }
    print(f"GGUF estimate (read header + {len(gguf_req.items)} offload items, once per model): {est_ms:.0f} ms")
    print(f"{'workers':>8} {'model':>7} {'candidates':>10} {'median ms':>10} {'peak MiB':>9}")
    for n in (10, 100, 1000, 5000):
        snap = snapshot(n)
        for name, (spec, req) in models.items():
            reps = 7 if n <= 1000 else 3
            times = []
            for _ in range(reps):
                t = time.perf_counter()
                d = decide(snap, spec, req)
                times.append((time.perf_counter() - t) * 1000)
            tracemalloc.start()
            decide(snap, spec, req)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            assert d.scheduled
            print(f"{n:>8} {name:>7} {len(d.candidates):>10} {statistics.median(times):>10.1f} {peak / 2**20:>9.1f}")


if __name__ == "__main__":
    main()
