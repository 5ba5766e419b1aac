"""Measured memory per replica: what a host agent samples of each replica it runs (GPU memory per
card, from NVML's per-process list over the replica's process tree, and the tree's RSS), as it
crosses Temporal on the host's report (HostReport.usage, contracts/host.py) and, batched per host,
into the store (the activity ``record_usage``). Imports only ``scheduler``.

The figures are bytes; ``claimed`` is what the ledger booked for the replica on that card (the
launch request carries it), so "used against claimed" needs no second look-up."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from scheduler.bounds import MAX_TEXT, Index, Name, ShortText, Text
from scheduler.limits import MAX_BYTES, MAX_GPUS

RECORD_USAGE = "record_usage"

MAX_REPLICAS = 4096  # replicas one host reports (an agent runs 64 by default)

Bytes = Annotated[int, Field(ge=0, le=MAX_BYTES)]

# How the VRAM figure was known: nvml (the driver's per-process list), simulated (the claim times
# the simulator's --vram-use-ratio), none (no per-process figure here: no NVML, or the driver lists
# no processes, as in some containers). RSS is measured wherever the process is on this host.
Measured = Literal["nvml", "simulated", "none"]


class GpuUse(BaseModel):
    index: Index
    used: Bytes = 0  # the latest sample
    peak: Bytes = 0  # the most seen since the agent started watching this replica
    claimed: Bytes = 0


class ReplicaUse(BaseModel):
    """One replica's memory on one host (its helpers there, instance@part, are summed in)."""

    instance: Name
    gpus: list[GpuUse] = Field([], max_length=MAX_GPUS)
    rss: Bytes = 0
    rss_peak: Bytes = 0
    ram_claimed: Bytes = 0
    measured: Measured = "none"
    at: float = Field(0.0, ge=0, le=2**40)  # the sample's time (seconds since the epoch, the agent's clock)
    # what the figures belong to, for learning claims later: the model's source key, the engine,
    # its parameters (joined, as the spec says them) and the cards' model
    source: Text = ""
    backend: ShortText = ""
    parameters: Annotated[str, Field(max_length=MAX_TEXT)] = ""
    gpu_model: ShortText = ""
    oom: bool = False  # it ended out of GPU memory: these are its last figures (learned claims bump at once)

    @property
    def vram_used(self) -> int:
        return sum(g.used for g in self.gpus)

    @property
    def vram_peak(self) -> int:
        return sum(g.peak for g in self.gpus)

    @property
    def vram_claimed(self) -> int:
        return sum(g.claimed for g in self.gpus)


class UsageBatch(BaseModel):
    """Every replica one host runs, as its last report said: the store writes them in one
    transaction (store/usage.py), and forgets the host's replicas the batch no longer names."""

    host: Name
    replicas: list[ReplicaUse] = Field([], max_length=MAX_REPLICAS)
