"""The control plane's /metrics as bench/bench_fleet.py reads them around a burst: the decisions'
histogram (gpuflow_decision_seconds) and what keeping their inputs cost
(gpuflow_decision_inputs_*, activities/decision_keeper.py), summed over the workers."""

from __future__ import annotations

import urllib.request


def decision_hist(addr: str) -> tuple[float, float, list[tuple[float, float]]]:
    """(sum, count, [(upper bound, cumulative count)]) of gpuflow_decision_seconds."""
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=10).read().decode()
    total = count = 0.0
    buckets = []
    for ln in text.splitlines():
        if ln.startswith("gpuflow_decision_seconds_sum"):
            total = float(ln.split()[-1])
        elif ln.startswith("gpuflow_decision_seconds_count"):
            count = float(ln.split()[-1])
        elif ln.startswith("gpuflow_decision_seconds_bucket"):
            le = ln.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(ln.split()[-1])))
    return total, count, buckets


def decision_hists(addrs: list[str]) -> tuple[float, float, list[tuple[float, float]]]:
    """gpuflow_decision_seconds summed over every control-plane worker (their buckets are the same)."""
    parts = [decision_hist(a) for a in addrs]
    buckets = [(le, sum(p[2][i][1] for p in parts)) for i, (le, _) in enumerate(parts[0][2])]
    return sum(p[0] for p in parts), sum(p[1] for p in parts), buckets


def kept(addrs: list[str]) -> dict[str, float]:
    """The gpuflow_decision_inputs_* counters (activities/decision_keeper.py), summed over the workers."""
    out = {"kept": 0.0, "bytes": 0.0, "encode_s": 0.0}
    names = {"gpuflow_decision_inputs_kept_total": "kept", "gpuflow_decision_inputs_bytes_total": "bytes",
             "gpuflow_decision_inputs_encode_seconds_total": "encode_s"}
    for a in addrs:
        for ln in urllib.request.urlopen(f"http://{a}/metrics", timeout=10).read().decode().splitlines():
            k = ln.split(" ")[0]
            if k in names:
                out[names[k]] += float(ln.split()[-1])
    return out


def kept_delta(a: dict[str, float], b: dict[str, float]) -> str:
    n = b["kept"] - a["kept"]
    if n <= 0:
        return "decisions' inputs: none kept (GPUFLOW_DECISION_RETENTION_DAYS=0)"
    return (f"decisions' inputs kept: {n:.0f}, {(b['bytes'] - a['bytes']) / n / 1024:.1f} KiB and "
            f"{(b['encode_s'] - a['encode_s']) / n * 1000:.2f} ms of encoding per decision")


def hist_delta(a, b) -> str:
    n = b[1] - a[1]
    if n <= 0:
        return "no decisions"
    mean = (b[0] - a[0]) / n
    p95 = next(le for (le, c1), (_, c0) in zip(b[2], a[2]) if c1 - c0 >= 0.95 * n)
    return f"mean {mean * 1000:.1f} ms, p95 <= {p95 * 1000:g} ms ({n:.0f} decisions)"
