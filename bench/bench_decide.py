"""Decision latency and peak memory by cluster size: 10, 100, 1,000, 5,000 workers with 8 GPUs
each and two instances per worker, for a custom, a vLLM and a GGUF model. Prints a table.
Target: under 50 ms per decision at 1,000 workers. The cost per worker shows whether it grows
linearly (the operations do, exactly: a profile counts five times the calls at 5,000 workers as at
1,000; the wall time per worker steps up once, where the snapshot outgrows the CPU's caches, and
then holds). Run: make bench (or python bench/bench_decide.py).

Then the decide activity's own work on a real store (a SQLite file): 1,000 workers with 2,000 and
10,000 instances, and 5,000 workers with 10,000: the policy alone, the policy after a full
snapshot load (what every decision did before the cache), and the policy after an incremental
refresh of the cached snapshot with one booking between decisions (what it does now), and the
policy alone on that snapshot (the cache takes what it loads out of the garbage collector's
generations), the policy on a new snapshot whose per-worker sums (scheduler/occupancy.py) are
built rather than derived, and the whole of the activity's work after the estimate (refresh, policy,
decision record). Median and p95. ``--store-only`` skips the first table. Noisy on a loaded machine: compare rows of one run."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from gpuflow.demo import synthetic  # noqa: E402
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
    print(f"{'workers':>8} {'model':>7} {'candidates':>10} {'median ms':>10} {'us/worker':>10} {'peak MiB':>9}")
    for n in (10, 100, 1000, 2000, 3000, 5000):
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
            med = statistics.median(times)
            print(f"{n:>8} {name:>7} {len(d.candidates):>10} {med:>10.1f} {med * 1000 / n:>10.2f} {peak / 2**20:>9.1f}")
    searches(gguf_path)


def tight(n: int, free_gib: float, gpus: int = 8) -> ClusterSnapshot:
    """n workers whose 8 GPUs are claimed down to ``free_gib`` each: Llama-3-8B (7.3 GiB) fits no GPU."""
    workers, instances = [], []
    for w in range(n):
        workers.append({"name": f"w{w}", "ram_total": 512 * GiB,
                        "gpus": [{"index": i, "vram_total": 24 * GiB} for i in range(gpus)]})
        instances.append({"name": f"i{w}", "model": "other", "worker": f"w{w}", "gpu_indexes": list(range(gpus)),
                          "claim": {"vram": {i: int((24 - free_gib) * GiB) for i in range(gpus)}}})
    return ClusterSnapshot.model_validate({"workers": workers, "instances": instances})


def rpc_pool(sizes: list[float], main: float, cpu: bool) -> tuple[ClusterSnapshot, bool]:
    ws = [{"name": "main", "ram_total": 64 * GiB, "gpus": [{"index": 0, "vram_total": int(main * GiB)}]}]
    ws += [{"name": f"p{i}", "ram_total": 64 * GiB, "gpus": [{"index": 0, "vram_total": int(s * GiB)}]}
           for i, s in enumerate(sizes)]
    return ClusterSnapshot.model_validate({"workers": ws}), cpu


def searches(gguf_path: str) -> None:
    """The GGUF searches that enumerate: partial offload over several GPUs of each worker, and
    llama.cpp over RPC (every combination of up to 8 of at most 16 RPC-capable GPUs)."""
    print(f"\n{'case':>44} {'strategy':>16} {'candidates':>10} {'estimates':>9} {'ms':>8}")
    cases = [(f"{n} workers, 8 GPUs with 2 GiB free each", tight(n, 2), dict(cpu_offloading=True))
             for n in (10, 100, 1000)]
    for label, sizes, main, cpu in [
            ("RPC: 16 unequal GPUs, full offload at k=3", [1.3 + 0.1 * i for i in range(16)], 3.2, False),
            ("RPC: 16 equal 1.3 GiB GPUs, nothing fits", [1.3] * 16, 1.35, False),
            ("RPC: 16 equal 1.3 GiB GPUs, CPU offloading", [1.3] * 16, 1.35, True),
            ("RPC: 16 unequal ~1.3 GiB GPUs, CPU offl.", [1.26 + 0.01 * i for i in range(16)], 1.42, True)]:
        snap, cpu = rpc_pool(sizes, main, cpu)
        cases.append((label, snap, dict(cpu_offloading=cpu, distributed_inference_across_workers=True)))
    for label, snap, kw in cases:
        req = gguf_request(gguf_path, [])
        spec = ModelSpec(name="g", source={"local_path": gguf_path}, backend="llama.cpp", **kw)
        t = time.perf_counter()
        d = decide(snap, spec, req)
        ms = (time.perf_counter() - t) * 1000
        runs = sum(1 for k in req._runs if not (isinstance(k[0], str)))
        print(f"{label:>44} {d.strategy or '-':>16} {len(d.candidates):>10} {runs:>9} {ms:>8.0f}")


if __name__ == "__main__":
    main()
