#!/usr/bin/env python3
"""An example capacity hook: append the autoscaler's unmet demand to a JSON-lines file and say
what a node-pool autoscaler would be asked for. Use it with
``gpuflow server --capacity-hook "python3 deploy/hooks/log-demand.py /var/log/gpuflow-demand.jsonl"``.
Replace the print with a call to your cloud's API or your node-pool autoscaler."""

import json
import sys
import time

demand = json.load(sys.stdin)
path = sys.argv[1] if len(sys.argv) > 1 else "gpuflow-demand.jsonl"
with open(path, "a") as f:
    f.write(json.dumps({"at": time.time(), **demand}) + "\n")
per = demand["per_replica"]
print(f"{demand['deployment']}: {demand['replicas']} more replica(s) of {per.get('gpus') or 1} GPU(s), "
      f"{per['vram_bytes'] / 2**30:.1f} GiB VRAM and {per['ram_bytes'] / 2**30:.1f} GiB RAM each")
