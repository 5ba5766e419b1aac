"""`gpuflow demo`: dry-run placements of the bundled examples, printed with their
explanation. Model files are real-format files written locally (sparse GGUF and safetensors
with Llama-3-8B Q5_K_M and Qwen2.5-7B shapes), since nothing is downloaded."""

from __future__ import annotations

import os

from gpuflow import files
from gpuflow.demo import synthetic
from views.render import dryrun as render
from scheduler.summary import request_summary, summary_text
from gpuflow.settings import Settings
from scheduler import scale_down
from scheduler.decide import decide
from scheduler.estimate import estimate_request


def _examples() -> str:
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def prepare(data_dir: str) -> dict[str, str]:
    os.makedirs(data_dir, exist_ok=True)
    gguf = os.path.join(data_dir, "Meta-Llama-3-8B-Instruct.Q5_K_M.gguf")
    if not os.path.exists(gguf):
        synthetic.write_llama_gguf(gguf + ".tmp", recipe="Q5_K_M", **synthetic.LLAMA3_8B)
        os.replace(gguf + ".tmp", gguf)
    qwen = os.path.join(data_dir, "Qwen2.5-7B-Instruct")
    if not os.path.exists(os.path.join(qwen, "config.json")):
        synthetic.llama_like_hf(qwen, layers=28, hidden=3584, ff=18944, heads=28, kv_heads=4, vocab=152064,
                                max_pos=32768, arch="Qwen2ForCausalLM", model_type="qwen2", bias=True, shards=4)
    return {"model-llama3-gguf.yaml": gguf, "model-qwen-vllm.yaml": qwen, "model-custom.yaml": None}


def run_demo(data_dir: str) -> int:
    ex = _examples()
    paths = prepare(data_dir)
    cluster_file = os.path.join(ex, "cluster.yaml")
    snapshot = files.load_cluster(cluster_file)
    settings = Settings()
    print(f"cluster: {cluster_file} ({len(snapshot.workers)} workers, {len(snapshot.instances)} instances)")
    for name, path in paths.items():
        spec_file = os.path.join(ex, name)
        spec = files.load_spec(spec_file)
        req = estimate_request(spec, path)
        d = decide(snapshot, spec, req, settings.scheduler)
        print(f"\n=== gpuflow schedule --cluster {cluster_file} --model {spec_file}" + (f" --model-path {path}" if path else ""))
        print(render.decision(d, summary_text(request_summary(req))))
    print(f"\n=== gpuflow rank-scale-down --cluster {cluster_file} --model llama3-8b-q5")
    print(render.ranking(scale_down.rank(snapshot, "llama3-8b-q5", config=settings.scheduler)))
    return 0
