"""What GPU topology costs a multi-GPU decision: the same clusters of 8-GPU workers (three GPUs busy
each), once without topology and once as DGX-style boxes (NUMA {0-3} {4-7}, NVLink pairs), for a
custom 2-GPU model (100 GiB), vLLM at tensor parallel 2 and a GGUF model split over two cards.
With topology each worker offers up to gpu_sets.MAX_SETS sets instead of one. Prints a table;
compare the two rows of a size within one run. Run: python bench/bench_topology.py"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from gpuflow import synthetic  # noqa: E402
from scheduler.cluster import ClusterSnapshot  # noqa: E402
from scheduler.decide import decide  # noqa: E402
from scheduler.estimate import gguf_request  # noqa: E402
from scheduler.hf.config import ModelParameters  # noqa: E402
from scheduler.request import FlatRequest  # noqa: E402
from scheduler.spec import ModelSpec  # noqa: E402
from scheduler.units import GiB  # noqa: E402


def snapshot(n: int, topology: bool, vram: int) -> ClusterSnapshot:
    workers, instances = [], []
    for w in range(n):
        gpus = []
        for i in range(8):
            g = {"index": i, "vram_total": vram}
            if topology:
                g.update(numa_node=i // 4, nvlink_peers=[i ^ 1], pcie_switch=f"sw{i // 2}",
                         cpus="0-31,64-95" if i < 4 else "32-63,96-127")
            gpus.append(g)
        workers.append({"name": f"w{w}", "ram_total": 1024 * GiB, "gpus": gpus})
        for k in (0, 2, 5):  # issue 13's busy GPUs
            instances.append({"name": f"i{w}-{k}", "model": "other", "worker": f"w{w}", "gpu_indexes": [k],
                              "claim": {"vram": {k: vram}}})
    return ClusterSnapshot.model_validate({"workers": workers, "instances": instances})


def main() -> None:
    tmp = tempfile.mkdtemp()
    gguf_path = synthetic.write_llama_gguf(os.path.join(tmp, "l3.gguf"), recipe="Q5_K_M", **synthetic.LLAMA3_8B)
    params = ModelParameters(num_attention_heads=28, num_kv_heads=4, head_dim=128, vocab_size=152064, num_layers=28)
    models = {
        "custom": (ModelSpec(name="c", source={"local_path": "/m/c"}, backend="custom", run_command="x"),
                   FlatRequest(vram=100 * GiB, ram=8 * GiB), 80 * GiB),
        "vllm": (ModelSpec(name="v", source={"local_path": "/m/v"}, backend="vllm",
                           backend_parameters=["--tensor-parallel-size=2"]), FlatRequest(vram=19 * GiB, params=params),
                 80 * GiB),
        "gguf": (ModelSpec(name="g", source={"local_path": gguf_path}, backend="llama.cpp"),
                 gguf_request(gguf_path, ["--ctx-size=8192"]), 5 * GiB),
    }
    print(f"{'workers':>8} {'model':>7} {'topology':>9} {'candidates':>10} {'median ms':>10} {'gpus':>8} {'link':>7}")
    for n in (10, 100, 1000):
        for name, (spec, req, vram) in models.items():
            for topo in (False, True):
                snap = snapshot(n, topo, vram)
                times = []
                for _ in range(5 if n < 1000 else 3):
                    t = time.perf_counter()
                    d = decide(snap, spec, req)
                    times.append((time.perf_counter() - t) * 1000)
                assert d.scheduled, d.reasons
                p = d.placement
                print(f"{n:>8} {name:>7} {str(topo):>9} {len(d.candidates):>10} {statistics.median(times):>10.1f} "
                      f"{str(p.gpu_indexes):>8} {p.link or '-':>7}")


if __name__ == "__main__":
    main()
