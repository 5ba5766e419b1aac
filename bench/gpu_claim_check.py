"""One short check of learned claims on a real NVIDIA GPU (issue 42), for a GPU host with python3,
torch and no gpuflow install (run from the repo root: PYTHONPATH=. python3 bench/gpu_claim_check.py).

1. The fraction gpuflow tells an engine (scheduler/claim_apply.py even_shares: the booked share of
   the card, rounded down to 4 decimals) caps a PyTorch process at the booked claim: with
   torch.cuda.set_per_process_memory_fraction(fraction) (the cap vLLM's --gpu-memory-utilization
   and SGLang's --mem-fraction-static amount to), a child allocates the claim less 256 MiB, then
   tries 512 MiB past the claim.
2. A real CUDA OOM's message, as a child process's stderr tail, is what the agent takes for an OOM
   (scheduler/claim_apply.py is_oom: such an exit re-places the replica and bumps its claim).

Prints each figure; exits 0 when both hold, 1 otherwise; "no GPU" and 0 without one."""

from __future__ import annotations

import subprocess
import sys

from scheduler.claim_apply import even_shares, is_oom

GiB, MiB = 2**30, 2**20
CHILD = r"""
import sys, torch
frac, first, more = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.cuda.set_per_process_memory_fraction(frac, 0)
a = torch.empty(first, dtype=torch.uint8, device="cuda")
print(f"allocated {first / 2**30:.2f} GiB under the cap", flush=True)
b = torch.empty(more, dtype=torch.uint8, device="cuda")
print("allocated past the claim: the cap did not hold", flush=True)
"""


def main() -> int:
    try:
        import torch
    except ImportError:
        print("no torch: no GPU check")
        return 0
    if not torch.cuda.is_available():
        print("no GPU")
        return 0
    total = torch.cuda.get_device_properties(0).total_memory
    claim = 10 * GiB + 300 * MiB  # a learned claim, as the recommender would give it
    share, frac = even_shares(claim, [total])
    print(f"GPU 0: {torch.cuda.get_device_name(0)}, {total / GiB:.1f} GiB; claim {claim / GiB:.2f} GiB -> share "
          f"{share / GiB:.3f} GiB, fraction {frac} (cap {frac * total / GiB:.3f} GiB)")
    p = subprocess.run([sys.executable, "-c", CHILD, str(frac), str(share - 256 * MiB), str(768 * MiB)],
                       capture_output=True, text=True, timeout=120)
    tail = " | ".join((p.stdout + p.stderr).strip().splitlines()[-5:])
    print(f"child exit code {p.returncode}: {tail[-600:]}")
    under = "under the cap" in p.stdout
    capped = p.returncode != 0 and "past the claim" not in p.stdout
    print(f"1. the claim less 256 MiB fits under the fraction: {under}; 512 MiB past the claim refused: {capped}")
    print(f"2. the agent reads that exit as an OOM (is_oom): {is_oom(tail)}")
    ok = under and capped and is_oom(tail) and frac * total <= share
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
