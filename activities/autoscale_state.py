"""What the autoscaler carries from one interval to the next, as plain JSON (the workflow holds it
and passes it back in, so a control-plane worker can die between two steps): the previous scrape
of every source (an engine by instance name, a gateway by its id), the recent samples the policy
reads (each with its window's histograms, sparse: only the bounds its observations need), and the
policy's state (samples and state in the JSON form of scheduler/autoscale/codec.py, which the
kept steps share). Histogram bounds are written as strings ("inf" for +Inf): JSON has no infinity. A
carry written before a field existed decodes with that field's default (a sample without
histograms is no latency evidence; no ``last_step_at`` is no step yet), so running autoscalers
carry on."""

from __future__ import annotations

from dataclasses import asdict

from scheduler.autoscale.scrape import Scrape
from scheduler.autoscale.codec import hist_in, hist_out, sample_in, sample_out, state_in

MAX_SAMPLES = 400  # a bound on what is carried, whatever the windows


def scrape_out(s: Scrape) -> dict:
    return {"gauges": dict(s.gauges), "histograms": {k: hist_out(h) for k, h in s.histograms.items()}}


def scrape_in(d: dict) -> Scrape:
    return Scrape(gauges={str(k): float(v) for k, v in (d.get("gauges") or {}).items()},
                  histograms={str(k): hist_in(h) for k, h in (d.get("histograms") or {}).items()})


class Carry:
    """The carried state, decoded."""

    def __init__(self, d: dict | None):
        d = d or {}
        self.scrapes = {str(k): scrape_in(v) for k, v in (d.get("scrapes") or {}).items()}
        self.samples = [sample_in(s) for s in (d.get("samples") or [])]
        self.policy = state_in(d.get("policy"))
        self.hooked = dict(d.get("hooked") or {})  # the last demand told the capacity hook, and when
        # a prefill/decode group's: each role's own samples and policy state (scheduler/autoscale/roles.py)
        self.role_samples = {_role(k): [sample_in(s) for s in v] for k, v in (d.get("role_samples") or {}).items()}
        self.role_policy = {_role(k): state_in(v) for k, v in (d.get("role_policy") or {}).items()}

    def keep(self, now: float, window_s: float) -> None:
        """Only the samples the policy can still read (``window_s`` back), at most MAX_SAMPLES."""
        self.samples = [s for s in self.samples if now - s.at <= window_s][-MAX_SAMPLES:]
        self.role_samples = {r: [s for s in v if now - s.at <= window_s][-MAX_SAMPLES:]
                             for r, v in self.role_samples.items()}

    def out(self) -> dict:
        return {"scrapes": {k: scrape_out(v) for k, v in self.scrapes.items()},
                "samples": [sample_out(s) for s in self.samples], "policy": asdict(self.policy),
                "hooked": self.hooked,
                **({"role_samples": {r: [sample_out(s) for s in v] for r, v in self.role_samples.items()},
                    "role_policy": {r: asdict(p) for r, p in self.role_policy.items()}} if self.role_policy
                   or self.role_samples else {})}


def _role(k: object) -> str:
    if k not in ("prefill", "decode"):
        raise ValueError(f"carried role {k!r} is not prefill or decode")
    return str(k)
