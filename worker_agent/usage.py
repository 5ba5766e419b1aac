"""The agent's book of measured memory per replica: sampled every ``liveness_s`` through the probe
(worker_agent/memory_probe.py), the latest figures and the peak kept per replica, and handed to
the host's watch (activities.watch_host), which carries them to the control plane on its return.

Carried on the existing report, not a new message: the watch returns early only when a figure
moved enough to matter (``worth_reporting``: a replica came or went, a card's use moved by more
than a sixteenth and 64 MiB, a replica went over its claim or back); otherwise the figures ride
the watch's regular return (every 0.8 x host_watch_s). A replica whose use holds still, as a
loaded engine's does, costs no message of its own.

Only what a claim must hear at once returns the watch at once (``urgent``: an OOM, a replica over
its claim or back under it). The rest of the news (a replica came or went, a use moved) waits
``settle_s`` (the agent's: three samples, 30 s by default) from the sample that first showed it,
so the replicas a burst starts on one host, and an engine's memory growing as it loads, ride one
report. Each report is a workflow task and two local activities on the host's history: in a burst of
1,000 replicas on 100 hosts they were half a report per replica, a fifth of the Temporal server's
events (issue 37).

Only booked parts are measured and reported: a process is watched once the ledger said its part
is booked here (the launch's booking check, or supervise_instance's after an agent restart), and its
claim is the one the ledger booked for its server on this host, never a launch request's own
figures (a relaunch that carried an empty claim had wiped the replica's reported claim)."""

from __future__ import annotations

import threading
import time
from typing import Callable

from contracts.agent import LaunchRequest, instance_of
from contracts.host import Booking
from contracts.usage import GpuUse, ReplicaUse
from scheduler.spec_env import SIMULATED_VRAM_USE, env_problem
from worker_agent import sim_oom
from worker_agent.memory_probe import MemoryProbe, Proc
from worker_agent.processes import Record

MiB = 2**20
NOISE = 64 * MiB  # a move smaller than this (or than a sixteenth) is allocator noise, not news


def moved(a: int, b: int) -> bool:
    """True when ``b`` differs from ``a`` by more than max(64 MiB, a sixteenth of the larger)."""
    return abs(a - b) > max(NOISE, max(a, b) // 16)


def over(r: ReplicaUse) -> bool:
    return any(g.claimed and g.used > g.claimed for g in r.gpus)


def worth_reporting(last: dict[str, ReplicaUse] | None, now: dict[str, ReplicaUse]) -> bool:
    """Whether ``now`` is news against what the watch ``last`` carried (None: nothing yet)."""
    if last is None:
        return bool(now)
    if set(last) != set(now):
        return True
    for name, r in now.items():
        was = last[name]
        cards = {g.index: g.used for g in r.gpus}
        before = {g.index: g.used for g in was.gpus}
        if set(cards) != set(before) or over(r) != over(was) or moved(was.rss, r.rss):
            return True
        if any(moved(before[i], cards[i]) for i in cards):
            return True
    return False


def urgent(last: dict[str, ReplicaUse] | None, now: dict[str, ReplicaUse]) -> bool:
    """Whether ``now`` holds news a learned claim must hear at once: a replica went over its claim
    or back under it (one that came counts as under before)."""
    was = last or {}
    return any(over(r) != (over(was[name]) if name in was else False) for name, r in now.items())


def simulated_share(env: dict[str, str]) -> float | None:
    """The replica's GPUFLOW_SIMULATED_VRAM_USE (a share of its claim), None when unset or not a share."""
    v = env.get(SIMULATED_VRAM_USE)
    return float(v) if v is not None and env_problem(SIMULATED_VRAM_USE, v) is None else None


class UsageBook:
    def __init__(self, probe: MemoryProbe, clock: Callable[[], float] = time.time, settle_s: float = 0.0):
        """``settle_s``: how long news that is not urgent waits for the watch (0: none)."""
        self.probe, self.clock, self.settle_s = probe, clock, settle_s
        self._news_at: float | None = None  # when due() first saw news not yet carried (not urgent)
        self.requests: dict[str, LaunchRequest] = {}  # process key -> the request that launched or adopted it
        self.gpu_names: dict[int, str] = {}  # GPU index -> model, from the host's last inventory
        self.latest: dict[str, ReplicaUse] = {}  # instance -> its figures on this host
        self.sampled = False
        self._gone: dict[str, ReplicaUse] = {}  # the replicas the last sample no longer found
        self.oomed: dict[str, ReplicaUse] = {}  # replicas that ended out of GPU memory, to report once
        self.last_use: list[sim_oom.Use] = []  # the simulated replicas' use at the last sample, in start order
        self.reported: dict[str, ReplicaUse] | None = None  # what the watch last carried
        self._lock = threading.Lock()  # samples run in a thread; the watch reads from the event loop
        self.seq = 0  # counts the watches: a sample forgets only those made before its records were listed
        self._since: dict[str, int] = {}  # process key -> the seq of its watch

    def watch(self, req: LaunchRequest, booking: Booking) -> None:
        """A booked process of this host's to measure (launched or adopted): its server against the
        claim ``booking`` (the ledger's) holds here; a helper carries none."""
        server = req.role == "server" and not req.part
        with self._lock:
            self.seq += 1
            self._since[req.key] = self.seq
            self.requests[req.key] = req.model_copy(update={"vram_claim": dict(booking.vram_claim) if server else {},
                                                            "ram_claim": booking.ram_claim if server else 0})

    def watching(self, key: str) -> bool:
        return key in self.requests

    def sample(self, records: list[Record], listed: int | None = None) -> dict[str, ReplicaUse]:
        """Measure every process the table runs; keep the latest figures and each replica's peak.
        ``listed``: ``seq`` when ``records`` were listed (None: now). A process missing from them is
        forgotten only if it was watched before: one launched while this sample ran, in its thread,
        is in the table but not in ``records``, and is measured from the next sample on (forgetting it
        here had left such a replica unmeasured for good)."""
        listed = self.seq if listed is None else listed
        procs = []
        started = {rec.instance: rec.started_at for rec in records}
        for rec in records:
            req = self.requests.get(rec.instance)
            if req is None:  # not a booked part (watch): neither measured nor reported
                continue
            claim = req if req.role == "server" else None  # helpers carry no claim
            procs.append(Proc(rec.instance, rec.pid, dict(claim.vram_claim) if claim else {},
                              claim.ram_claim if claim else 0, share=simulated_share(req.env),
                              stated=claim.vram_stated if claim else 0))
        held = self.probe(procs)
        self.last_use = [sim_oom.Use(p.key, dict(held[p.key].gpus or {}))
                         for p in sorted(procs, key=lambda p: started.get(p.key, 0.0))
                         if p.key in held and held[p.key].measured == "simulated"]
        now = self.clock()
        by_instance: dict[str, ReplicaUse] = {}
        for p in procs:
            h = held.get(p.key)
            if h is None:
                continue
            name = instance_of(p.key)
            r = by_instance.get(name) or self._blank(name, p.key, now, h.measured)
            cards = {g.index: g for g in r.gpus}
            for i in sorted(set(h.gpus or {}) | set(p.vram_claim)):
                g = cards.setdefault(i, GpuUse(index=i))
                g.used += (h.gpus or {}).get(i, 0)
                g.claimed += p.vram_claim.get(i, 0)
            r.gpus = sorted(cards.values(), key=lambda g: g.index)
            r.rss += h.rss
            r.ram_claimed += p.ram_claim
            by_instance[name] = r
        with self._lock:
            for name, r in by_instance.items():
                r.gpu_model = next((self.gpu_names[g.index] for g in r.gpus if g.index in self.gpu_names), "")
                was = self.latest.get(name)
                peaks = {g.index: g.peak for g in was.gpus} if was else {}
                for g in r.gpus:
                    g.peak = max(g.used, peaks.get(g.index, 0))
                r.rss_peak = max(r.rss, was.rss_peak if was else 0)
            self._gone = {k: v for k, v in self.latest.items() if k not in by_instance}  # for mark_oom
            self.latest, self.sampled = by_instance, True
            sampled = {p.key for p in procs}
            for key in [k for k in self.requests if k not in sampled and self._since.get(k, 0) <= listed]:
                del self.requests[key]  # its process is gone from the table
                self._since.pop(key, None)
        return by_instance

    def out_of_memory(self, free: dict[int, int], foreign: dict[int, int]) -> dict[str, str]:
        """The simulated replicas (process keys) whose use at the last sample passes what their GPU
        has free (sim_oom.py), with the OOM message each; none on a host measured by NVML."""
        return sim_oom.victims(free, self.last_use, foreign)

    def _blank(self, name: str, key: str, at: float, measured: str) -> ReplicaUse:
        req = self.requests.get(name) or self.requests.get(key)
        return ReplicaUse(instance=name, measured=measured, at=at, source=req.source if req else "",
                          backend=req.backend if req else "",
                          parameters=" ".join(req.backend_parameters)[:4096] if req else "")

    def due(self) -> bool:
        """The watch should return now: a replica ran out of memory, the figures are urgent news, or
        news (worth_reporting) that has waited ``settle_s``."""
        with self._lock:
            if not self.sampled:
                return False
            if self.oomed or urgent(self.reported, self.latest):
                return True
            if not worth_reporting(self.reported, self.latest):
                self._news_at = None
                return False
            now = self.clock()
            if self._news_at is None:
                self._news_at = now
            return now - self._news_at >= self.settle_s

    def mark_oom(self, key: str) -> None:
        """``key``'s process ended out of GPU memory: its last figures go in the next report, marked."""
        with self._lock:
            last = self.latest.get(instance_of(key)) or self._gone.get(instance_of(key))
            if last is not None and key == last.instance:
                self.oomed[last.instance] = last.model_copy(update={"oom": True})

    def report(self) -> list[ReplicaUse] | None:
        """What the watch carries now (None before the first sample); remembered as reported. A
        replica that ran out of memory is in it once, with ``oom`` (unless it runs again already)."""
        with self._lock:
            if not self.sampled:
                return None
            self.reported = {k: v.model_copy(deep=True) for k, v in self.latest.items()}
            self._news_at = None
            gone = [v for k, v in self.oomed.items() if k not in self.latest]
            self.oomed = {}
            return [self.latest[k] for k in sorted(self.latest)] + gone
