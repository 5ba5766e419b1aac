"""Whether a prefill/decode group really disaggregates: ``pd_ineffective`` is raised when its
decodes serve requests without the prefill's KV (vllm #42895: a decode that prefills everything
itself while every member reports healthy). Pure: the evidence is passed in, with ``now``.

Two witnesses, either one enough:
- the gateways' own counts (gateway/, reported to store/pd_counts.py): per deployment, requests
  ``disaggregated`` (decoded from a prefill's KV), ``skipped`` (a short prompt the decode prefilled
  by choice: by design, never counted against the group), ``fallback`` (no prefill could serve: the
  decode served it whole) and ``transfer_failures``;
- the decode members' engine metrics where they publish them: the prompt tokens by where they came
  from (vLLM's ``vllm:prompt_tokens_by_source{source=local_compute|local_cache_hit|
  external_kv_transfer}``; the stand-in's remote and local prefill counts).

Each witness is a series of cumulative samples (counts since its process started). The gateways'
are read over the last ``WINDOW_S`` (what each gateway added; one that restarted inside the window
counts from zero), summed; a decode's over its last step (its last two samples: they are taken on
its deployment's checks), its local prefills less those the gateways skipped by choice over the
same span. Either raises ``pd_ineffective`` when at least ``MIN_EVIDENCE`` requests were served
with or without remote KV and at least ``SHARE`` of them without. It clears by itself once
transfers resume: the window then holds remote ones only, or too few of the others.

GPUStack 2.3.0 keeps no such marker on the row ("deliberately no PD-effectiveness marker": its
ratio lives in Prometheus, ``gpustack:pd_prompt_tokens_by_source`` from vLLM's
``vllm:prompt_tokens_by_source``); gpuflow raises it where every other degradation shows."""

from __future__ import annotations

from dataclasses import dataclass, fields

WINDOW_S = 30.0  # the judgement reads what the last 30 s added: a minute-long outage shows, a cured one clears within it
MIN_EVIDENCE = 3  # requests without and with remote KV, at least: one stray fallback (a prefill's restart) is no verdict
SHARE = 0.5  # of those, at least half served without remote KV: the group has collapsed into aggregated serving
ENGINE_WINDOW_S = 120.0  # a decode's metrics are read on its deployment's checks (30 s apart by default): its last two within 2 min
ENGINE = "engine:"  # the source of a decode's own metrics (engine:<instance>)
SKIP_TOKENS = 16  # a group's skip threshold when not told (the gateway's default skip_prefill_below)
REQUESTS, TOKENS = "requests", "tokens"  # what a decode's metrics count its prefills in


@dataclass
class PDCounts:
    """A gateway's counts for one deployment, cumulative since the gateway started."""

    disaggregated: int = 0  # decoded from a prefill's KV
    skipped: int = 0  # short prompt: decode prefilled locally by choice
    fallback: int = 0  # no prefill could serve: the decode served it whole
    transfer_failures: int = 0  # a KV hand-off that failed (retried or not)

    def __add__(self, o: "PDCounts") -> "PDCounts":
        return PDCounts(*(getattr(self, f.name) + getattr(o, f.name) for f in fields(self)))

    def __sub__(self, o: "PDCounts") -> "PDCounts":
        return PDCounts(*(getattr(self, f.name) - getattr(o, f.name) for f in fields(self)))


@dataclass(frozen=True)
class Sample:
    """One source's cumulative counts for one deployment at ``at_s`` (seconds since the epoch).
    ``source``: the gateway's id, or ``engine:<instance>`` for a decode's own metrics."""

    source: str
    deployment: str
    at_s: float
    counts: PDCounts


def added(series: list[Sample]) -> PDCounts:
    """What one source's series (oldest first, one deployment) added between its first and last
    sample. A count that went down means the source restarted in between: from there on, its counts
    start at zero, so what it added is the newest sample whole plus what came before the restart."""
    out = PDCounts()
    for before, after in zip(series, series[1:]):
        step = after.counts - before.counts
        if any(getattr(step, f.name) < 0 for f in fields(step)):
            step = after.counts  # restarted: everything it holds now came after
        out = out + step
    return out


def window_added(samples: list[Sample], now_s: float, window_s: float = WINDOW_S) -> dict[str, PDCounts]:
    """Per deployment: what every source added over [now_s - window_s, now_s], summed."""
    series: dict[tuple[str, str], list[Sample]] = {}
    for s in sorted(samples, key=lambda s: s.at_s):
        if now_s - window_s <= s.at_s <= now_s:
            series.setdefault((s.deployment, s.source), []).append(s)
    out: dict[str, PDCounts] = {}
    for (dep, _), got in series.items():
        out[dep] = out.get(dep, PDCounts()) + added(got)
    return out


def ineffective(c: PDCounts, min_evidence: int = MIN_EVIDENCE, share: float = SHARE) -> bool:
    """Decodes served requests without remote KV: of those served disaggregated or as a fallback
    (skipped ones are by design), at least ``min_evidence`` and ``share`` of them were fallbacks."""
    seen = c.fallback + c.disaggregated
    return seen >= min_evidence and c.fallback > 0 and c.fallback >= share * seen


def is_engine(source: str) -> bool:
    return source.startswith(ENGINE)


def engine_source(instance: str, unit: str) -> str:
    """``engine:pd-3`` (a decode that counts requests) or ``engine:pd-3#tokens`` (prompt tokens)."""
    return f"{ENGINE}{instance}" + ("#tokens" if unit == TOKENS else "")


def last_step(series: list[Sample]) -> tuple[float, float, PDCounts] | None:
    """(from, to, what it added) between one source's last two samples; None with fewer than two."""
    if len(series) < 2:
        return None
    return series[-2].at_s, series[-1].at_s, added(series[-2:])


def engine_added(samples: list[Sample], now_s: float, skip_tokens: int,
                 window_s: float = ENGINE_WINDOW_S) -> dict[str, tuple[PDCounts, float]]:
    """Per deployment: what its decodes' own metrics say they prefilled between each decode's last
    two samples within ``window_s`` (disaggregated: from remote KV; fallback: locally), in requests,
    with the span it covers. Locally by choice is not counted: the gateways' ``skipped`` over the
    same span is taken off (a token count takes off ``skip_tokens`` per skipped request, the most
    a skipped prompt leaves uncached). A decode counted in tokens weighs its tokens as requests of
    ``skip_tokens``."""
    series: dict[tuple[str, str], list[Sample]] = {}
    for s in sorted(samples, key=lambda s: s.at_s):
        if is_engine(s.source) and now_s - window_s <= s.at_s <= now_s:
            series.setdefault((s.deployment, s.source), []).append(s)
    gateways = [s for s in samples if not is_engine(s.source)]
    out: dict[str, tuple[PDCounts, float]] = {}
    for (dep, source), got in series.items():
        step = last_step(got)
        if step is None:
            continue
        t0, t1, c = step
        skipped = window_added([g for g in gateways if g.deployment == dep], t1, t1 - t0).get(dep, PDCounts()).skipped
        per = max(1, skip_tokens) if source.endswith("#tokens") else 1
        local = max(0, c.fallback - skipped * per)
        c = PDCounts(disaggregated=-(-c.disaggregated // per), fallback=-(-local // per),
                     transfer_failures=c.transfer_failures)
        have, span = out.get(dep, (PDCounts(), 0.0))
        out[dep] = (have + c, max(span, t1 - t0))
    return out


def judge(samples: list[Sample], now_s: float, skip_tokens: dict[str, int] | None = None,
          window_s: float = WINDOW_S) -> dict[str, str]:
    """Deployment -> why it is ``pd_ineffective`` now (those that are not are left out): the
    gateways' counts over the last ``window_s``, else its decodes' own metrics over their last step.
    ``skip_tokens``: a deployment's skip threshold in uncached tokens (SKIP_TOKENS when not named)."""
    out: dict[str, str] = {}
    for dep, c in window_added([s for s in samples if not is_engine(s.source)], now_s, window_s).items():
        if ineffective(c):
            out[dep] = "gateway: " + why(c, window_s)
    by_dep: dict[str, list[Sample]] = {}
    for s in samples:
        by_dep.setdefault(s.deployment, []).append(s)
    for dep, mine in sorted(by_dep.items()):
        got = None if dep in out else engine_added(mine, now_s, (skip_tokens or {}).get(dep, SKIP_TOKENS)).get(dep)
        if got is not None and ineffective(got[0]):
            out[dep] = "decodes: " + why(got[0], got[1])
    return out


def why(c: PDCounts, window_s: float = WINDOW_S) -> str:
    """``12 of 14 requests in the last 30 s served without remote KV (5 transfer failures)``."""
    seen = c.fallback + c.disaggregated
    tail = f" ({c.transfer_failures} transfer failures)" if c.transfer_failures else ""
    return f"{c.fallback} of {seen} requests in the last {window_s:.0f} s served without remote KV{tail}"
