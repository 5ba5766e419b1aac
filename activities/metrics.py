"""The control plane's Prometheus series. Counters and the latency histogram are updated by the
control activities; the store-backed gauges are read from the store at scrape time."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy.engine import Engine
from sqlmodel import Session, func, select

from scheduler.foreign import degradations
from scheduler.groups.status import KINDS
from store import ledger
from store.group_health import group_degradations
from store.tables import InstanceRow, WorkerRow


def pending_kind(reason: str) -> str:
    """A bounded label for a PENDING instance's reason."""
    if reason.startswith("quota:"):
        return "quota"
    if reason.startswith("preempted by"):
        return "preempted"
    if reason.startswith("unschedulable"):
        return "unschedulable"
    if reason.startswith(("held back ", "StrictFIFO: behind")):  # the PENDING queue's word (wake_queue.py)
        return "held_back"
    if "unreachable" in reason:
        return "host_unreachable"
    return "not_decided_yet"


class StoreCollector:
    def __init__(self, engine: Engine):
        self.engine = engine

    def collect(self):
        states = GaugeMetricFamily("gpuflow_instances", "Model instances by state (the store's view).", labels=["state"])
        pending = GaugeMetricFamily("gpuflow_pending_instances", "PENDING instances by kind of reason.", labels=["reason"])
        reserved = GaugeMetricFamily("gpuflow_reserved_vram_bytes", "VRAM booked in the reservation ledger, per GPU.",
                                     labels=["worker", "gpu"])
        total = GaugeMetricFamily("gpuflow_gpu_vram_bytes", "VRAM of each GPU as its host reports it.", labels=["worker", "gpu"])
        hosts = GaugeMetricFamily("gpuflow_hosts", "Hosts by state.", labels=["state"])
        foreign_b, foreign_d = foreign_families()
        degraded = GaugeMetricFamily("gpuflow_group_degraded", "Prefill/decode groups' degradations: 1 while the group "
                                     "has it (ratio_unmet: a role runs fewer members than it wants; gather_unmet: its "
                                     "prefill/decode members share less than its PreferGather layer; pd_ineffective: its decodes "
                                     "serve requests without remote KV), else 0.",
                                     labels=["deployment", "kind"])
        try:
            booked = ledger.booked_per_gpu(self.engine)  # before the session: one connection at a time
            per_worker: dict[str, dict[int, int]] = {}
            for (n, i), b in booked.items():
                per_worker.setdefault(n, {})[i] = b
            with Session(self.engine) as s:
                for state, n in s.exec(select(InstanceRow.state, func.count()).group_by(InstanceRow.state)):
                    states.add_metric([state], n)
                kinds: dict[str, int] = {}
                for reason in s.exec(select(InstanceRow.reason).where(InstanceRow.state == "pending")):
                    kinds[pending_kind(reason)] = kinds.get(pending_kind(reason), 0) + 1
                for k, n in sorted(kinds.items()):
                    pending.add_metric([k], n)
                by_state: dict[str, int] = {}
                for w in s.exec(select(WorkerRow)):
                    by_state[w.state] = by_state.get(w.state, 0) + 1
                    for g in w.gpus or []:
                        total.add_metric([w.name, str(g["index"])], g["vram_total"])
                    add_foreign(foreign_b, foreign_d, w, per_worker.get(w.name, {}))
                for st, n in sorted(by_state.items()):
                    hosts.add_metric([st], n)
                for name, kinds in group_degradations(s).items():
                    for kind in KINDS:
                        degraded.add_metric([name, kind], 1 if kind in kinds else 0)
            for (w, g), b in sorted(booked.items()):
                reserved.add_metric([w, str(g)], b)
        except Exception:  # noqa: BLE001  a scrape must not fail because the store is busy
            return
        yield from (states, pending, reserved, total, hosts, degraded, foreign_b, foreign_d)


def foreign_families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    return (GaugeMetricFamily("gpuflow_host_foreign_memory_bytes", "GPU memory held by processes gpuflow did not "
                              "start (NVML's used less gpuflow's own processes; simulated: vram_used_by_others), as "
                              "the host reports it; absent where unknown.", labels=["worker", "gpu"]),
            GaugeMetricFamily("gpuflow_host_foreign_memory_degraded", "1 while the memory other processes hold on a "
                              "GPU is past the room the ledger's bookings leave there (total - reserve - booked): its "
                              "replicas may run out of memory; an alert, nothing is evicted. Else 0.",
                              labels=["worker", "gpu"]))


def add_foreign(in_bytes: GaugeMetricFamily, flag: GaugeMetricFamily, w: WorkerRow, booked: dict[int, int]) -> None:
    """One host's foreign use and its degradation flag per GPU (scheduler/foreign.py's judge)."""
    gpus = [SimpleNamespace(index=g["index"], vram_total=g["vram_total"], vram_foreign=g.get("vram_foreign"))
            for g in w.gpus or []]
    bad = {d.index for d in degradations(gpus, w.reserved_vram, booked)}
    for g in gpus:
        if g.vram_foreign is not None:
            in_bytes.add_metric([w.name, str(g.index)], g.vram_foreign)
            flag.add_metric([w.name, str(g.index)], 1 if g.index in bad else 0)


class ControlMetrics:
    def __init__(self, engine: Engine | None = None, registry: CollectorRegistry | None = None):
        self.registry = r = registry or CollectorRegistry()
        self.decisions = Counter("gpuflow_decisions", "Placement decisions made, by result.", ["result"], registry=r)
        self.decision_seconds = Histogram(
            "gpuflow_decision_seconds", "Time to make one placement decision: its share of the snapshot refresh "
            "(decisions made together share one), then filters and scoring.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5), registry=r)
        self.conflicts = Counter(
            "gpuflow_reservation_conflicts", "Bookings refused because the plan no longer fit the ledger "
            "(rejected): the replica decides again.", ["outcome"], registry=r)
        self.preemptions = Counter(
            "gpuflow_preemptions", "Replicas preempted: their GPUs moved to a replica of ``tenant`` in one ledger "
            "transaction (scheduler/tenancy/preemption.py).", ["tenant", "victim_tenant"], registry=r)
        self.kept_decisions = Counter(
            "gpuflow_decision_inputs_kept", "Decisions whose inputs were written to the store "
            "(activities/decision_keeper.py).", registry=r)
        self.kept_bytes = Counter(
            "gpuflow_decision_inputs_bytes", "Bytes written to the store for decisions' inputs (new compressed "
            "chunks and records; chunks seen before cost nothing).", registry=r)
        self.kept_encode_seconds = Counter(
            "gpuflow_decision_inputs_encode_seconds", "CPU time spent encoding decisions' inputs (digests of the "
            "changed rows, the manifest).", registry=r)
        if engine is not None:
            r.register(StoreCollector(engine))
