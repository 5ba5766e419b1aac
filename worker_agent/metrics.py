"""The agent's Prometheus series: GPU memory as discovered, instance processes it supervises,
each replica's measured memory against its claim (usage.py), and launch counters.

The replica series carry an ``instance`` label (the gpuflow instance, e.g. web-0): Prometheus
would rename it exported_instance beside its own target label, so the agents' scrape job keeps
it with ``honor_labels: true`` (deploy/prometheus)."""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily

from contracts.host import HostReport
from worker_agent.processes import ProcessTable
from worker_agent.usage import UsageBook


class HostCollector:
    def __init__(self, name: str, discover: Callable[[], HostReport], table: ProcessTable,
                 health: Callable[[], dict[int, tuple[float, float]]] | None = None, usage: UsageBook | None = None):
        self.name, self.discover, self.table, self.health = name, discover, table, health
        self.usage = usage

    def collect(self):
        total = GaugeMetricFamily("gpuflow_agent_gpu_vram_total_bytes", "GPU memory.", labels=["host", "gpu", "simulated"])
        used = GaugeMetricFamily("gpuflow_agent_gpu_vram_used_bytes", "GPU memory in use (NVML; absent when simulated).",
                                 labels=["host", "gpu"])
        foreign = GaugeMetricFamily("gpuflow_agent_gpu_vram_foreign_bytes",
                                    "GPU memory held by processes gpuflow did not start (NVML).", labels=["host", "gpu"])
        procs = GaugeMetricFamily("gpuflow_agent_instances", "Instance processes on this host by state.",
                                  labels=["host", "state"])
        try:
            r = self.discover()
        except Exception:  # noqa: BLE001
            r = None
        for g in r.gpus if r else []:
            total.add_metric([self.name, str(g.index), str(r.simulated).lower()], g.vram_total)
            if g.vram_used is not None:
                used.add_metric([self.name, str(g.index)], g.vram_used)
            if g.vram_foreign is not None:
                foreign.add_metric([self.name, str(g.index)], g.vram_foreign)
        alive = sum(self.table.alive(rec.pid) for rec in self.table.records())
        procs.add_metric([self.name, "running"], alive)
        util = GaugeMetricFamily("gpuflow_agent_gpu_utilization_percent", "GPU utilization (NVML).", labels=["host", "gpu"])
        temp = GaugeMetricFamily("gpuflow_agent_gpu_temperature_celsius", "GPU temperature (NVML).", labels=["host", "gpu"])
        for idx, (u, t) in sorted((self.health() if self.health else {}).items()):
            util.add_metric([self.name, str(idx)], u)
            temp.add_metric([self.name, str(idx)], t)
        yield from (total, used, foreign, procs, util, temp)
        yield from self._replicas()

    def _replicas(self):
        """Each replica's last sample: VRAM used, its peak and claim per GPU; RSS."""
        used = GaugeMetricFamily("gpuflow_instance_vram_used_bytes", "GPU memory a replica's processes hold "
                                 "(NVML per process; simulated: the claim times --vram-use-ratio).",
                                 labels=["host", "instance", "gpu"])
        peak = GaugeMetricFamily("gpuflow_instance_vram_peak_bytes", "The most GPU memory seen held by a replica.",
                                 labels=["host", "instance", "gpu"])
        claimed = GaugeMetricFamily("gpuflow_instance_vram_claimed_bytes", "GPU memory the ledger booked for a "
                                    "replica.", labels=["host", "instance", "gpu"])
        rss = GaugeMetricFamily("gpuflow_instance_rss_bytes", "Resident memory of a replica's process tree.",
                                labels=["host", "instance"])
        for r in (self.usage.latest if self.usage else {}).values():
            for g in r.gpus:
                labels = [self.name, r.instance, str(g.index)]
                used.add_metric(labels, g.used)
                peak.add_metric(labels, g.peak)
                claimed.add_metric(labels, g.claimed)
            rss.add_metric([self.name, r.instance], r.rss)
        yield from (used, peak, claimed, rss)


class AgentMetrics:
    def __init__(self, name: str, discover: Callable[[], HostReport], table: ProcessTable,
                 registry: CollectorRegistry | None = None,
                 health: Callable[[], dict[int, tuple[float, float]]] | None = None, usage: UsageBook | None = None):
        self.registry = r = registry or CollectorRegistry()
        self.launches = Counter("gpuflow_agent_launches", "Instance processes started or adopted.",
                                ["host", "backend", "adopted"], registry=r)
        self.failures = Counter("gpuflow_agent_launch_failures", "Launches that failed (engine missing, exited, "
                                "never ready).", ["host", "backend"], registry=r)
        self.exits = Counter("gpuflow_agent_process_exits", "Supervised processes that ended on their own (each "
                             "leads to a restart).", ["host", "backend"], registry=r)
        self.orphans = Counter("gpuflow_agent_orphans_stopped", "Processes stopped because their instance was gone "
                               "or placed on another host (why: gone | elsewhere).", ["host", "why"], registry=r)
        r.register(HostCollector(name, discover, table, health, usage))


def engine_metrics_proxy(table: ProcessTable, address: str = "127.0.0.1") -> Callable[[str], tuple[int, bytes] | None]:
    """/instances/<name>/metrics: the engine's own Prometheus text (vLLM's
    vllm:num_requests_waiting, vllm:time_per_output_token_seconds, KV-cache usage, ...), fetched
    from the instance's port, so one scrape target per host serves every engine on it."""
    import urllib.error
    import urllib.request

    def handle(path: str) -> tuple[int, bytes] | None:
        parts = path.strip("/").split("/")
        if len(parts) != 3 or parts[0] != "instances" or parts[2] != "metrics":
            return None
        rec = table.find(parts[1])
        if rec is None or rec.port is None or not table.alive(rec.pid):
            return 404, f"no running instance {parts[1]} with a port on this host\n".encode()
        try:
            with urllib.request.urlopen(f"http://{address}:{rec.port}/metrics", timeout=5) as r:
                return 200, r.read()
        except (urllib.error.URLError, OSError) as e:
            return 502, f"instance {parts[1]}: the engine's /metrics did not answer: {e}\n".encode()

    return handle
