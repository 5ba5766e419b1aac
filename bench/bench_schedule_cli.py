"""`gpuflow schedule` wall time on a big cluster file, beyond interpreter start.

Writes a 1,000-worker cluster (8 GPUs each, two instances per worker) as JSON and as YAML, and
runs `python -m gpuflow schedule` on each with a spec that states its resources (no model files
to read), and on the JSON file with a vLLM spec whose local folder holds a Qwen2.5-7B-shaped
config.json and safetensors headers ("json+hf": read with the standard library, not
transformers, scheduler/hf/config.py). Prints the median wall time of each, of a bare `python -c pass`, and the difference.
Also prints whether the run imported transformers (it must not). The JSON file is timed twice:
as the environment runs Python (this machine sets PYTHONDONTWRITEBYTECODE, so the project's own
modules compile on every run) and with bytecode cached ("+pyc"), as an installed gpuflow runs. Noisy on a loaded machine:
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


HF_SPEC = """name: qwen
source: {{local_path: {path}}}
backend: vllm
"""


def hf_model(tmp: str) -> str:
    """A Qwen2.5-7B-shaped folder: config.json and 4 sparse safetensors shards (headers only)."""
    sys.path.insert(0, ROOT)
    from gpuflow.demo.synthetic import llama_like_hf

    return llama_like_hf(os.path.join(tmp, "qwen"), layers=28, hidden=3584, ff=18944, heads=28, kv_heads=4,
                         vocab=152064, max_pos=32768, arch="Qwen2ForCausalLM", model_type="qwen2", bias=True, shards=4)


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


def timed(cmd: list[str], reps: int, root: str = ROOT, env: dict | None = None) -> tuple[float, float, str]:
    """Median wall and CPU seconds (CPU: user + system of the child; on a loaded machine the
    steadier figure, since wall time includes waiting for a core)."""
    times, cpus, out = [], [], ""
    for _ in range(reps):
        t, c = time.perf_counter(), _cpu()
        p = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env={**(env or os.environ), "PYTHONPATH": root})
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
    print(f"{'checkout':>10} {'file':>9} {'wall ms':>8} {'beyond start':>13} {'CPU ms':>7} {'beyond start':>13}"
          f" {'transformers imported':>22}")
    probe = ("import runpy, sys; sys.argv = ['gpuflow'] + sys.argv[1:]\n"
             "try:\n    runpy.run_module('gpuflow', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print('TRANSFORMERS' if 'transformers' in sys.modules else 'NO-TRANSFORMERS', file=sys.stderr)")
    roots = {"this": ROOT, **({"compare": a.compare} if a.compare else {})}
    # "+pyc": the project's modules from bytecode, as an installed (non-editable) gpuflow runs;
    # the plain rows compile them on every run where PYTHONDONTWRITEBYTECODE is set.
    hf_spec = os.path.join(tmp, "hf-spec.yaml")
    with open(hf_spec, "w") as f:
        f.write(HF_SPEC.format(path=hf_model(tmp)))
    runs = [(kind, "", os.environ, spec) for kind in paths]
    runs.insert(1, ("json", "+pyc", cached_env(tmp), spec))
    runs.append(("json", "+hf", {**os.environ, "HF_HUB_OFFLINE": "1"}, hf_spec))
    for kind, note, env, model in runs:
        args = ["schedule", "--cluster", paths[kind], "--model", model]
        for label, root in roots.items():
            if note:
                timed([py, "-m", "gpuflow", *args], 1, root, env)  # writes the bytecode
            wall, cpu, _ = timed([py, "-m", "gpuflow", *args], a.reps, root, env)
            _, _, out = timed([py, "-c", probe, *args], 1, root, env)
            print(f"{label:>10} {kind + note:>9} {wall * 1000:>8.0f} {(wall - base) * 1000:>13.0f} {cpu * 1000:>7.0f}"
                  f" {(cpu - base_cpu) * 1000:>13.0f} {str('NO-TRANSFORMERS' not in out):>22}")


def cached_env(tmp: str) -> dict:
    """The environment with bytecode written and read, into a folder of this run's own."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": os.path.join(tmp, "pycache")}


if __name__ == "__main__":
    main()
