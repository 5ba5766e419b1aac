"""Measured memory per replica in words (views/usage.py gives the figures): the ``VRAM``
column of ``gpuflow status`` and the ``memory:`` lines of ``explain``."""

from __future__ import annotations

from typing import Any

from scheduler.units import gib


def column(v: dict[str, Any] | None) -> str:
    """'7.2/8.0 GiB' (used/claimed), '7.2/- GiB' without a claim, '-' when nothing is measured."""
    if not v or v.get("measured") == "none":
        return "-"
    claimed = f"{gib(v['claimed']):.1f}" if v.get("claimed") else "-"
    return f"{gib(v['used']):.1f}/{claimed} GiB"


def warning(v: dict[str, Any] | None) -> str:
    """'VRAM over its claim: 9.1 GiB used of 8.0 GiB claimed' where a card holds more than booked."""
    if not v or not v.get("over"):
        return ""
    return f"VRAM over its claim: {gib(v['used']):.1f} GiB used of {gib(v['claimed']):.1f} GiB claimed"


def lines(v: dict[str, Any] | None) -> list[str]:
    """``explain``'s account: each host's cards, used (peak) of claimed, and RSS."""
    if not v:
        return []
    how = {"nvml": "NVML per process",
           "simulated": "simulated GPUs: the spec's GPUFLOW_SIMULATED_VRAM_USE of resources.vram, else a share of "
                        "the claim (gpuflow simulate --vram-use-ratio, 0.9)",
           "none": "no per-process GPU figures on this host"}.get(v.get("measured"), v.get("measured"))
    out = ["", f"memory measured ({how}): VRAM {column(v)}, peak {gib(v['peak']):.1f} GiB; "
               f"RSS {gib(v['rss']):.2f} GiB, peak {gib(v['rss_peak']):.2f} GiB"]
    for host, h in sorted((v.get("hosts") or {}).items()):
        cards = ", ".join(f"GPU {g['index']} {gib(g['used']):.2f} (peak {gib(g['peak']):.2f}) of "
                          f"{gib(g['claimed']):.2f} GiB" for g in h["gpus"]) or "no GPU"
        out.append(f"  {host}: {cards}")
    if v.get("over"):
        out.append(f"  {warning(v)}")
    return out
