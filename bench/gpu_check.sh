#!/usr/bin/env bash
# One short check on a real NVIDIA host, for a lent GPU machine with no network (device tool) or any
# GPU host: what the agent discovers through NVML (topology, NUMA, NVLink, memory), the same with
# 10 GiB held by a process gpuflow did not start (vram_foreign), and bench/gpu_foreign_memory.py's
# split of gpuflow's own use and others' against nvidia-smi. Needs python3 with torch, pynvml and
# pydantic + PyYAML (carry pydantic's wheels where missing). Writes into ${OUT:-gpu-check}.
set -u
out=${OUT:-gpu-check}; mkdir -p "$out"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
discover='import json; from worker_agent.inventory import discover
r = discover("gpu-check"); print(r.model_dump_json(indent=1))
for g in r.gpus: print(f"GPU {g.index} {g.name}: total {g.vram_total/2**30:.1f} GiB, used {g.vram_used/2**30:.2f}, foreign {(g.vram_foreign or 0)/2**30:.2f} GiB, numa {g.numa_node}")'
{ nvidia-smi; nvidia-smi topo -m; } > "$out/smi.txt" 2>&1
timeout 60 python3 -c "$discover" > "$out/discover.txt" 2>&1; echo "discover rc=$?"
python3 -c 'import sys, time, torch
x = torch.empty(10 * 2**30, dtype=torch.uint8, device="cuda"); x.fill_(1); torch.cuda.synchronize()
print("holding", flush=True); time.sleep(45)' > "$out/holder.txt" 2>&1 &
holder=$!
for _ in $(seq 60); do grep -q holding "$out/holder.txt" 2>/dev/null && break; sleep 1; done
timeout 60 python3 -c "$discover" > "$out/discover_foreign.txt" 2>&1; echo "discover with a foreign 10 GiB rc=$?"
kill $holder 2>/dev/null; wait $holder 2>/dev/null
timeout 120 python3 bench/gpu_foreign_memory.py --timeout 90 > "$out/foreign.txt" 2>&1; echo "foreign split rc=$?"
tail -n 8 "$out/discover.txt" "$out/discover_foreign.txt"; cat "$out/foreign.txt"
