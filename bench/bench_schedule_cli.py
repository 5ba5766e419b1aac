"""`gpuflow schedule` wall time on a big cluster file, beyond interpreter start.

Writes a 1,000-worker cluster (8 GPUs each, two instances per worker) as JSON and as YAML, and
runs `python -m gpuflow schedule` on each with a spec that states its resources (no model files
to read). Prints the median wall time of each, of a bare `python -c pass`, and the difference.
Also prints whether the run imported transformers (it must not). Noisy on a loaded machine:
compare the rows of one run. Run: python bench/bench_schedule_cli.py [--workers N] [--reps R]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SPEC = """name: my-engine
source: {local_path: /models/my-engine}
backend: custom
run_command: "my-server --port {port}"
resources: {vram: 30 GiB, ram: 8 GiB}
"""


def cluster(n: int) -> dict:
    workers, instances = [], []
    for w in range(n):
        workers.append({"name": f"w{w}", "ram_total": "512 GiB", "labels": {"zone": f"z{w % 4}"},
                        "gpus": [{"index": i, "vendor": "nvidia", "type": "cuda", "name": "H100",
                                  "vram_total": "80 GiB", "vram_used": "2 GiB"} for i in range(8)]})
        for k in range(2):
            instances.append({"name": f"i{w}-{k}", "model": f"m{k}", "worker": f"w{w}", "gpu_indexes": [k],
                              "claim": {"ram": "4 GiB", "vram": {str(k): "72 GiB"}}})
    return {"version": 1, "workers": workers, "instances": instances}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd: list[str], reps: int, root: str = ROOT) -> tuple[float, float, str]:
    """Median wall and CPU seconds (CPU: user + system of the child; on a loaded machine the
    steadier figure, since wall time includes waiting for a core)."""
    times, cpus, out = [], [], ""
    for _ in range(reps):
        t, c = time.perf_counter(), _cpu()
        p = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root})
        times.append(time.perf_counter() - t)
        cpus.append(_cpu() - c)
        out = p.stdout + p.stderr
        if p.returncode not in (0, 3):
            raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{out}")
    return statistics.median(times), statistics.median(cpus), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--compare", metavar="DIR", help="another checkout (say, main) to time in the same run")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    data = cluster(a.workers)
    paths = {"json": os.path.join(tmp, "cluster.json"), "yaml": os.path.join(tmp, "cluster.yaml")}
    with open(paths["json"], "w") as f:
        json.dump(data, f)
    import yaml

    with open(paths["yaml"], "w") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    spec = os.path.join(tmp, "spec.yaml")
    with open(spec, "w") as f:
        f.write(SPEC)
    py = sys.executable
    base, base_cpu, _ = timed([py, "-c", "pass"], a.reps)
    print(f"{a.workers} workers, median of {a.reps} runs; interpreter start {base * 1000:.0f} ms wall,"
          f" {base_cpu * 1000:.0f} ms CPU")
    print(f"{'checkout':>10} {'file':>6} {'wall ms':>8} {'beyond start':>13} {'CPU ms':>7} {'beyond start':>13}"
          f" {'transformers imported':>22}")
    probe = ("import runpy, sys; sys.argv = ['gpuflow'] + sys.argv[1:]\n"
             "try:\n    runpy.run_module('gpuflow', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print('TRANSFORMERS' if 'transformers' in sys.modules else 'NO-TRANSFORMERS', file=sys.stderr)")
    roots = {"this": ROOT, **({"compare": a.compare} if a.compare else {})}
    for kind, path in paths.items():
        args = ["schedule", "--cluster", path, "--model", spec]
        for label, root in roots.items():
            wall, cpu, _ = timed([py, "-m", "gpuflow", *args], a.reps, root)
            _, _, out = timed([py, "-c", probe, *args], 1, root)
            print(f"{label:>10} {kind:>6} {wall * 1000:>8.0f} {(wall - base) * 1000:>13.0f} {cpu * 1000:>7.0f}"
                  f" {(cpu - base_cpu) * 1000:>13.0f} {str('NO-TRANSFORMERS' not in out):>22}")


if __name__ == "__main__":
    main()
