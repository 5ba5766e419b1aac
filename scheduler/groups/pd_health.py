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

Each witness is a series of cumulative samples (counts since its process started); the judgement
reads what each source added over the last ``WINDOW_S`` (a source that restarted inside the window
counts from zero), sums the sources, and raises ``pd_ineffective`` when at least ``MIN_EVIDENCE``
requests (or prefills) were served whole-or-remote and at least ``SHARE`` of them were served
without remote KV. It clears by itself once transfers resume: the window then holds remote ones
only, or too few of the others."""

from __future__ import annotations

from dataclasses import dataclass, fields

WINDOW_S = 30.0  # the judgement reads what the last 30 s added: a minute-long outage shows, a cured one clears within it
MIN_EVIDENCE = 3  # requests without and with remote KV, at least: one stray fallback (a prefill's restart) is no verdict
SHARE = 0.5  # of those, at least half served without remote KV: the group has collapsed into aggregated serving


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


def why(c: PDCounts, window_s: float = WINDOW_S) -> str:
    """``12 of 14 requests in the last 30 s served without remote KV (5 transfer failures)``."""
    seen = c.fallback + c.disaggregated
    tail = f" ({c.transfer_failures} transfer failures)" if c.transfer_failures else ""
    return f"{c.fallback} of {seen} requests in the last {window_s:g} s served without remote KV{tail}"
