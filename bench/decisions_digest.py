"""Every decision on a table of randomized clusters, one JSON line each, to compare two checkouts
of the policy: a change meant to be a pure speed-up must print the same bytes.

    mkdir /tmp/old && git archive <commit> | tar -x -C /tmp/old
    python bench/decisions_digest.py --root /tmp/old > old.jsonl   # the old policy, this table
    python bench/decisions_digest.py > new.jsonl && cmp old.jsonl new.jsonl

Clusters come from tests/random_cluster.py (seeded; each also after a burst of changes): custom,
vLLM, SGLang and GGUF models, spread and binpack, topology policies and CPU pinning, with and
without an instance being re-placed. Each line holds the whole decision (Decision.to_dict), the
place activity's record (contracts.decision_of.decision_record, as DecisionRecord.summary shows it) and, per cluster, the scale-down
ranks. ``--seeds N`` (default 120)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--seeds", type=int, default=120)
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.root))
    import importlib.util

    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "random_cluster.py")
    spec_ = importlib.util.spec_from_file_location("random_cluster", here)  # this checkout's table, whatever the root
    random_cluster = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(random_cluster)
    changed, snapshot_dict = random_cluster.changed, random_cluster.snapshot_dict
    from contracts.decision_of import decision_record
    from gpuflow.demo import synthetic
    from scheduler import scale_down
    from scheduler.cluster import ClusterSnapshot
    from scheduler.decide import decide
    from scheduler.estimate import gguf_request
    from scheduler.hf.config import ModelParameters
    from scheduler.request import FlatRequest
    from scheduler.spec import ModelSpec
    from scheduler.units import GiB
    print(f"policy from {os.path.dirname(decide.__code__.co_filename)}", file=sys.stderr)

    params = ModelParameters(num_attention_heads=32, num_kv_heads=8, head_dim=128, vocab_size=128256, num_layers=32)
    hf = {"huggingface": {"repo": "o/m"}}
    specs = []
    for s in ("spread", "binpack"):
        specs += [
            (ModelSpec(name="m", source=hf, backend="custom", run_command="x", cpu_offloading=True, placement_strategy=s), None),
            (ModelSpec(name="m", source=hf, backend="custom", run_command="x --gpu-memory-utilization 0.5",
                       placement_strategy=s), None),
            (ModelSpec(name="other", source=hf, backend="vllm", placement_strategy=s), params),
            (ModelSpec(name="m", source=hf, backend="sglang", placement_strategy=s, topology_policy="restricted"), None),
            (ModelSpec(name="m", source=hf, backend="vllm", distributed_inference_across_workers=True, placement_strategy=s,
                       topology_policy="best-effort", cpu_pinning=True), params)]
    gp = synthetic.write_llama_gguf(os.path.join(tempfile.mkdtemp(), "l3.gguf"), recipe="Q5_K_M", **synthetic.LLAMA3_8B)
    greq = gguf_request(gp, [])
    gguf = [ModelSpec(name="m", source={"local_path": gp}, backend="llama.cpp", placement_strategy=s)
            for s in ("spread", "binpack")]
    out = sys.stdout
    for seed in range(a.seeds):
        for d in (snapshot_dict(seed), changed(seed, snapshot_dict(seed))):
            snap = ClusterSnapshot.model_validate(d)
            for ex in [None] + [i.name for i in snap.instances][:2]:
                cases = [(k, sp, FlatRequest(vram=v * GiB, ram=2 * GiB, params=p))
                         for k, (sp, p) in enumerate(specs) for v in (4, 20, 60, 150)]
                cases += [(f"gguf{k}", sp, greq) for k, sp in enumerate(gguf)]
                for k, spec, req in cases:
                    dd = decide(snap, spec, req, exclude=ex)
                    rec = decision_record(dd, req, len(snap.workers), {})  # first: it builds only the top candidates
                    kept = rec.summary() if hasattr(rec, "summary") else rec.model_dump(mode="json")  # typed since issue 29
                    out.write(json.dumps([seed, k, ex, dd.to_dict(), kept], sort_keys=True) + "\n")
            for m in ("m", "other"):
                for s in ("spread", "binpack"):
                    out.write(json.dumps([seed, m, s, [r.to_dict() for r in scale_down.rank(snap, m, s)]]) + "\n")


if __name__ == "__main__":
    main()
