"""The check of every report a host workflow takes (a hello, a watch's or a probe's answer, and the
usage it carries), run as one local activity per report BEFORE the report changes anything: the
host's public key and the cluster's keys are read from the store here, so the key a host shares with
the control plane never enters a workflow's history. The rule is contracts/host_proof.py's; this
file reads and records what it needs (store/host_credentials.py).

A report that passes may join its host (its public key is recorded) and, a hello, becomes the
host's last accepted one. A report refused is counted (``gpuflow_host_reports_refused_total``,
labelled by the kind of reason) and logged with the reason; the workflow shows it and changes
nothing else."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter
from sqlalchemy.engine import Engine
from temporalio import activity

from activities import callers
from activities.runner import Runner
from contracts import credential as cr
from contracts.activity_names import CHECK_HOST_REPORT
from contracts.host_auth import ReportCheck, ReportVerdict
from contracts.host_proof import ClusterKeys, judge, refused
from store import host_credentials

log = logging.getLogger("gpuflow.hosts")
KEY_CACHE = 4096  # host keys kept (one X25519 exchange each saved per report): more than any cluster's hosts


class HostAuthActivities:
    def __init__(self, engine: Engine, reads: Engine, runner: Runner, registry: CollectorRegistry | None = None):
        """``reads``: the read-only engine (db.reader); ``registry``: the control plane's metrics."""
        self.engine, self.reads, self.runner = engine, reads, runner
        self.refused = Counter("gpuflow_host_reports_refused", "Host reports refused by their host workflow's "
                               "check (contracts/host_proof.py), by kind of reason.", ["reason"],
                               registry=registry or CollectorRegistry())
        self._cluster: ClusterKeys | None = None
        self._keys: dict[str, bytes] = {}  # a host's public key -> the key it shares with the control plane

    def all(self) -> list:
        return [self.check_host_report]

    @activity.defn(name=CHECK_HOST_REPORT)
    async def check_host_report(self, check: ReportCheck) -> ReportVerdict:
        """The verdict on one report (contracts/host_proof.py), with what it joins or renews
        recorded; a refusal counted and logged. A local activity of the host's own workflow."""
        callers.check(CHECK_HOST_REPORT, check)
        verdict = await self.runner.submit(self.check, check)
        if not verdict.ok:
            self.refused.labels(verdict.kind).inc()
            log.warning("refused a report of host %s (%s): %s", check.host, verdict.kind, verdict.why)
        return verdict

    def check(self, check: ReportCheck) -> ReportVerdict:
        """The blocking part: read, judge, record."""
        if self._cluster is None:
            self._cluster = host_credentials.ensure_cluster(self.engine)
        known = host_credentials.known(self.reads, check.host)
        verdict = judge(check, self._cluster, known, self._key)
        if not verdict.ok or (known is not None and check.purpose == "watch"):
            return verdict  # nothing to record: a refusal, or a known host's watch
        assert check.report is not None
        auth = check.report["auth"]
        if not host_credentials.accept(self.engine, check.host, auth["public"], verdict.stamp_ms,
                                       auth["mac"] if verdict.stamp_ms else ""):
            return refused("other_credential", f"host {check.host} is joined with another credential: stop that "
                                               f"agent, or run 'gpuflow hosts forget {check.host}' once it is gone")
        return verdict

    def recheck(self, check: ReportCheck) -> ReportVerdict:
        """The same rule again, recording nothing, for a report already taken (activities/hosts.py
        host_seen): only a joined host's report passes (a join is the check's to record)."""
        known = host_credentials.known(self.reads, check.host)
        if known is None:
            return refused("not_joined", f"host {check.host} has not joined (or was forgotten): its report "
                                         "writes no inventory")
        if self._cluster is None:
            self._cluster = host_credentials.ensure_cluster(self.engine)
        return judge(check, self._cluster, known, self._key)

    def _key(self, public: str) -> bytes:
        key = self._keys.get(public)
        if key is None:
            assert self._cluster is not None
            if len(self._keys) >= KEY_CACHE:
                self._keys.clear()
            key = self._keys[public] = cr.host_key(self._cluster.secret, public)
        return key
