"""Memory gpuflow does not own, on a real GPU: what the agent's probe code computes against
nvidia-smi. Run from the repository root on a GPU host; no gpuflow install is needed:

    PYTHONPATH=. python3 bench/gpu_foreign_memory.py [--gpu 0] [--foreign-gib 10] [--ours-gib 4]

It needs python3 with torch and pynvml (nvidia-ml-py); it imports only worker_agent/nvml_procs.py
and worker_agent/memory_probe.py (the standard library besides). It starts two children on one
GPU, each allocating with torch and holding it:

- a "foreign" process (``--foreign-gib``, default 10), as another user's job would;
- a "gpuflow" process (``--ours-gib``, default 4), started in a session of its own as the agent
  starts an engine, which itself starts a worker child (a quarter of it: 3 + 1 GiB by default),
  as vLLM starts per-GPU workers: the agent counts the whole process tree.

Then it prints, per GPU: NVML's used and nvidia-smi's, gpuflow's own use as the memory probe
measures it (memory_probe.NvmlProbe over the tree) and as the inventory's split counts it
(nvml_procs.split), and the foreign use, against nvidia-smi's per-process figures. Each CUDA
process also holds a context (a few hundred MiB), counted with its process. The children are
stopped and the script exits within ``--timeout`` (60 s). Without a GPU it prints "no GPU" and
exits 0. In a container without the host's PID namespace NVML names host pids that /proc does not
show: the script says so, since the agent would then count gpuflow's own processes as foreign.

Measured on an H200 (torch 2.11, CUDA 13; 7 s): NVML used 16.41 GiB, nvidia-smi 15.81; ours 5.19
by the probe and by the split, foreign 10.60, the same as nvidia-smi's per-process sums. Each
CUDA process holds a context of about 0.6 GiB; NVML's used has 0.6 GiB more than the processes'
sum (the driver's reservation, nobody's process). With --foreign-gib 20 --ours-gib 8: 30.41 /
29.81, ours 9.19, foreign 20.60.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from worker_agent.memory_probe import NvmlProbe, Proc, read_procs, trees
from worker_agent.nvml_procs import CardUse, gpu_processes, nvml_session, split

GiB = 2**30
MiB = 2**20

HOLD = """
import sys, time, torch
gib, gpu, child = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
if child > 0:
    import subprocess
    subprocess.Popen([sys.executable, "-c", sys.argv[4], str(child), str(gpu), "0", "", sys.argv[5]])
x = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=f"cuda:{gpu}")
x.fill_(1)
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(float(sys.argv[5]) if len(sys.argv) > 5 else 55)
"""


def start(gib: float, gpu: int, child_gib: float, hold_s: float, own_session: bool) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOLD, str(gib), str(gpu), str(child_gib), HOLD, str(hold_s)],
                            stdout=subprocess.PIPE, text=True, start_new_session=own_session)


def wait_ready(p: subprocess.Popen, deadline: float, count: int = 1) -> bool:
    """The child (and its own child: ``count`` 2, one pipe) printed 'ready' (its memory is
    allocated and touched) before ``deadline``."""
    fd = p.stdout.fileno()
    os.set_blocking(fd, False)
    buf = ""
    while time.monotonic() < deadline:
        try:
            buf += os.read(fd, 4096).decode(errors="replace")
        except BlockingIOError:
            pass
        if buf.count("ready") >= count:
            return True
        if p.poll() is not None:
            return False
        time.sleep(0.2)
    return False


def smi() -> tuple[dict[int, int], dict[int, int]]:
    """nvidia-smi's figures: GPU index -> used bytes, and pid -> used bytes (compute apps)."""
    used, procs = {}, {}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            i, m = (s.strip() for s in line.split(","))
            used[int(i)] = int(m) * MiB
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            pid, m = (s.strip() for s in line.split(","))
            if m.isdigit():
                procs[int(pid)] = procs.get(int(pid), 0) + int(m) * MiB
    except (OSError, ValueError, subprocess.TimeoutExpired):
        pass
    return used, procs


def measure(nv, leader: int, proc_root: str = "/proc") -> tuple[list[CardUse], dict[int, int], set[int]]:
    """In an open NVML session: each card's split by the agent's rule (ours: the tree of the
    process gpuflow started, ``leader``), the probe's per-card figure for that tree, and the tree."""
    tree = trees({"ours": leader}, read_procs(proc_root)).get("ours", set())
    cards = split(nv, lambda pid: pid in tree)
    held = NvmlProbe(nv, proc_root)([Proc("ours", leader)]).get("ours")
    return cards, (held.gpus or {}) if held else {}, tree


def unseen_pids(nv, proc_root: str = "/proc") -> list[int]:
    """Pids NVML lists that /proc does not show (a container without the host's PID namespace)."""
    seen = read_procs(proc_root)
    out = []
    for i in range(nv.nvmlDeviceGetCount()):
        out += [p for p in (gpu_processes(nv, nv.nvmlDeviceGetHandleByIndex(i)) or {}) if p not in seen]
    return sorted(set(out))


def table(cards: list[CardUse], probe: dict[int, int], smi_used: dict[int, int], smi_procs: dict[int, int],
          tree: set[int]) -> list[str]:
    """Per GPU: NVML's used and nvidia-smi's, gpuflow's own (the probe's, the split's), foreign;
    then nvidia-smi's per-process sums for gpuflow's tree and the others (all GPUs)."""
    g = lambda b: "-" if b is None else f"{b / GiB:.2f}"  # noqa: E731
    lines = [f"{'GPU':<4} {'NVML used':>10} {'smi used':>10} {'ours(probe)':>12} {'ours(split)':>12} "
             f"{'foreign':>10}   (GiB)"]
    for c in cards:
        lines.append(f"{c.index:<4} {g(c.used):>10} {g(smi_used.get(c.index)):>10} {g(probe.get(c.index, 0)):>12} "
                     f"{g(c.ours):>12} {g(c.foreign):>10}")
    if smi_procs:
        ours = sum(b for p, b in smi_procs.items() if p in tree)
        lines.append(f"nvidia-smi per process: gpuflow's tree {g(ours)} GiB, others {g(sum(smi_procs.values()) - ours)} GiB")
    return lines


def main(argv: list[str] | None = None, nvml=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", type=int, default=0, help="the GPU both children allocate on")
    ap.add_argument("--foreign-gib", type=float, default=10.0, help="what the foreign process allocates")
    ap.add_argument("--ours-gib", type=float, default=4.0, help="what gpuflow's process tree allocates (3/4 + 1/4)")
    ap.add_argument("--timeout", type=float, default=60.0, help="the whole run's limit in seconds")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    with nvml_session(nvml) as nv:
        if nv is None or nv.nvmlDeviceGetCount() == 0:
            print("no GPU")
            return 0
        hold = max(a.timeout - 15, 10)
        foreign = start(a.foreign_gib, a.gpu, 0, hold, own_session=False)
        ours = start(a.ours_gib * 0.75, a.gpu, a.ours_gib * 0.25, hold, own_session=True)
        try:
            deadline = t0 + a.timeout - 10
            if not (wait_ready(foreign, deadline) and wait_ready(ours, deadline, 2)):
                print("the children did not allocate in time (no torch? no room on the GPU?)")
                return 1
            cards, probe, tree = measure(nv, ours.pid)
            used, procs = smi()
            print(f"foreign pid {foreign.pid} ({a.foreign_gib:g} GiB); gpuflow's tree {sorted(tree)} "
                  f"({a.ours_gib:g} GiB); CUDA contexts come on top of each")
            print("\n".join(table(cards, probe, used, procs, tree)))
            lost = unseen_pids(nv)
            if lost:
                print(f"NVML lists pids /proc does not show: {lost}: run the agent in the host's PID namespace, "
                      "or gpuflow's own processes count as foreign")
        finally:
            for p in (ours, foreign):
                try:
                    os.killpg(p.pid, signal.SIGKILL) if p is ours else p.kill()
                except ProcessLookupError:
                    pass
                p.wait(5)
    print(f"done in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
