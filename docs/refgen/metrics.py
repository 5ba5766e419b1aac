"""The metrics reference: every series in the prometheus-client registries gpuflow builds, made
here the way each process makes them: the control plane's (``ControlMetrics`` over a store, with
the activities that add to it, as ``gpuflow server`` wires them), an agent's (``AgentMetrics``)
and a gateway's (``gateway.metrics.Metrics``)."""

from __future__ import annotations

import contextlib
import pathlib
import tempfile

from docs.refgen.md import code, head, table

SUFFIX = {"counter": "_total", "histogram": " (`_bucket`, `_sum`, `_count`)", "summary": " (`_sum`, `_count`)"}


def _labels(registry, family) -> list[str]:
    """A family's label names: from its collector (a Counter, Gauge, Histogram with no child yet
    has no sample to read them from), else from the family itself."""
    collector = registry._names_to_collectors.get(family.name)  # noqa: SLF001  prometheus-client's own index
    names = getattr(collector, "_labelnames", None) or getattr(family, "_labelnames", None)
    if not names:
        names = sorted({k for s in family.samples for k in s.labels if k != "le"})
    return list(names)


def series(registry) -> list[tuple[str, str, list[str], str]]:
    """(exposed name, type, labels, help) for each family, sorted by name."""
    out = []
    for fam in registry.collect():
        out.append((fam.name, fam.type, _labels(registry, fam), " ".join(fam.documentation.split())))
    return sorted(out)


@contextlib.contextmanager
def registries():
    """The three processes' registries, each built as its process builds it, over a fresh store."""
    from activities.metrics import ControlMetrics
    from activities.worker_set import control_activities
    from gateway.metrics import Metrics
    from store import db
    from worker_agent.metrics import AgentMetrics
    from worker_agent.processes import ProcessTable

    with tempfile.TemporaryDirectory(prefix="gpuflow-docs-") as tmp:
        engine = db.make_engine(f"sqlite:///{pathlib.Path(tmp) / 'gpuflow.db'}")
        db.init_db(engine)
        control = ControlMetrics(engine)
        acts = control_activities(engine, None, metrics=control, keep_days=0)
        try:
            def nothing():
                raise RuntimeError("no inventory: the docs' agent reports no GPU")

            agent = AgentMetrics("HOST", nothing, ProcessTable(tmp), health=lambda: {})
            yield {"control plane (`gpuflow server --metrics-address`)": control.registry,
                   "agent (`gpuflow agent --metrics-address`)": agent.registry,
                   "gateway (`/metrics` on the gateway's address)": Metrics().registry}
        finally:
            acts.runner.shutdown(wait=False)
            engine.dispose()


def names() -> dict[str, list[str]]:
    """Each process's series names as exposed (for the docs' tests)."""
    with registries() as regs:
        return {proc: [n + SUFFIX.get(t, "").split(" ")[0] if t == "counter" else n for n, t, _, _ in series(r)]
                for proc, r in regs.items()}


def page() -> str:
    intro = ("Every series each gpuflow process serves in Prometheus' text format. The control plane and each "
             "agent also append the Temporal SDK's own `temporal_*` series; an agent serves each engine's own "
             "metrics (vLLM's `vllm:*` and the like) at `/instances/<name>/metrics`. prometheus-client adds a "
             "`<name>_created` timestamp beside each counter and histogram. How to scrape them, and the "
             "Grafana dashboard: [Metrics and the dashboard](../operations/metrics.md).\n")
    parts = [head("Metrics reference", "metrics", "the prometheus-client registries the processes build", intro)]
    with registries() as regs:
        for proc, r in regs.items():
            rows = [(code(n + ("_total" if t == "counter" else "")) + (SUFFIX[t] if t in ("histogram", "summary") else ""),
                     t, ", ".join(f"`{x}`" for x in labels) or "-", h) for n, t, labels, h in series(r)]
            parts.append(f"## The {proc}\n\n" + table(("series", "type", "labels", "meaning"), rows))
    return "\n".join(parts)
