"""bench_routing's figures: one phase's summary, the rounds pooled, the printed table and issue 39's
targets (met or not, with the figure)."""

from __future__ import annotations

import statistics



def believed(route: str) -> bool:
    """The gateway chose the replica believing it held some of the prompt (``matched=M/N``, M > 0)."""
    m = route.split("matched=", 1)[1].split("/", 1)[0] if "matched=" in route else "0"
    return m.isdigit() and int(m) > 0


def pct(xs, p):
    return statistics.quantiles(xs, n=100, method="inclusive")[p - 1] if len(xs) > 1 else float("nan")


def summary(res, ideal, seconds, cpu, replicas, counted) -> dict:
    """One phase. ``counted``: which requests' figures count (those that arrived after the warm-up);
    throughput, failures and CPU count every request."""
    ok = [r for r in res if r["ok"]]
    kept = [(r, i) for r, i, c in zip(res, ideal, counted) if c and r["ok"]]
    ttft = [r["ttft"] for r, _ in kept if "ttft" in r]
    prompt = sum(r["usage"]["prompt_tokens"] for r, _ in kept)
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r, _ in kept]
    per = [sum(r.get("replica") == n for r in ok) for n in replicas]
    return {"n": len(res), "failed": len(res) - len(ok), "rps": len(ok) / seconds, "ttft": ttft,
            "misses": sum(c == 0 for c in cached), "counted": len(kept),
            "held_missed": sum(believed(r.get("route", "")) and c == 0 for (r, _), c in zip(kept, cached)),
            "cached": sum(cached), "prompt": prompt,
            "ideal": sum(i for _, i in kept), "spread": max(per) / max(statistics.mean(per), 1e-9),
            "cpu_ms": cpu * 1000 / max(len(ok), 1)}


def merge(rows: list[dict]) -> dict:
    """Rounds together: TTFT percentiles of every counted request of every round (pooled), the
    hit rate and full misses over them; req/s, spread and CPU the rounds' mean; each round's p90
    kept (``p90s``) to show how much a round swings."""
    ttft = [t for r in rows for t in r["ttft"]]
    counted = sum(r["counted"] for r in rows)
    return {"n": sum(r["n"] for r in rows), "failed": sum(r["failed"] for r in rows),
            "rps": statistics.mean(r["rps"] for r in rows), "p50": pct(ttft, 50), "p90": pct(ttft, 90),
            "p99": pct(ttft, 99), "miss": sum(r["misses"] for r in rows) / max(counted, 1),
            "held_missed": sum(r["held_missed"] for r in rows),
            "hit": sum(r["cached"] for r in rows) / max(sum(r["prompt"] for r in rows), 1),
            "vs_ideal": sum(r["cached"] for r in rows) / max(sum(r["ideal"] for r in rows), 1),
            "spread": statistics.mean(r["spread"] for r in rows), "cpu_ms": statistics.mean(r["cpu_ms"] for r in rows),
            "guard": sum(r["guard"] for r in rows), "p90s": [pct(r["ttft"], 90) for r in rows]}


def table(results: dict) -> None:
    for kind, by in results.items():
        print(f"\n{kind}")
        print(f"{'policy':<21}{'requests':>9}{'failed':>7}{'req/s':>7}{'TTFT p50':>10}{'p90':>8}{'p99':>8}"
              f"{'full miss':>10}{'held->0':>8}{'hit':>6}{'/ideal':>8}{'spread':>7}{'gw CPU ms/req':>15}{'guard':>7}"
              f"  p90 by round (ms)")
        for pol, m in by.items():
            rounds = " ".join(f"{x * 1000:.0f}" for x in m["p90s"])
            held = m["held_missed"] if pol.startswith("cache-aware") else "-"  # a baseline's choices carry no belief
            print(f"{pol:<21}{m['n']:>9}{m['failed']:>7}{m['rps']:>7.2f}{m['p50'] * 1000:>8.0f}ms"
                  f"{m['p90'] * 1000:>6.0f}ms{m['p99'] * 1000:>6.0f}ms{m['miss']:>10.1%}{held:>8}{m['hit']:>6.0%}"
                  f"{m['vs_ideal']:>8.0%}{m['spread']:>7.2f}{m['cpu_ms']:>15.2f}{m['guard']:>7.0f}  {rounds}")


def targets(results: dict) -> list[tuple[str, bool, str]]:
    """Issue 39's targets, each (what, met, the figure)."""
    out = []
    fill = results.get("cache-filling")
    if fill and {"cache-aware", "pinned", "least-outstanding"} <= set(fill):
        ca, pin, lo = fill["cache-aware"], fill["pinned"], fill["least-outstanding"]
        out.append(("cache-filling: TTFT p90 within 1.2x of the pinned ideal", ca["p90"] <= 1.2 * pin["p90"],
                    f"{ca['p90'] / pin['p90']:.2f}x ({ca['p90'] * 1000:.0f} vs {pin['p90'] * 1000:.0f} ms)"))
        out.append(("cache-filling: TTFT p90 >= 5x better than least-outstanding", lo["p90"] >= 5 * ca["p90"],
                    f"{lo['p90'] / ca['p90']:.1f}x"))
    for kind, by in results.items():
        if kind != "no-prefix" and {"cache-aware", "sglang"} <= set(by):
            ca, sg = by["cache-aware"], by["sglang"]
            out.append((f"{kind}: SGLang's rule beaten at TTFT p90 and p99", ca["p90"] < sg["p90"] and ca["p99"] < sg["p99"],
                        f"p90 {ca['p90'] * 1000:.0f} vs {sg['p90'] * 1000:.0f} ms, p99 {ca['p99'] * 1000:.0f} vs "
                        f"{sg['p99'] * 1000:.0f} ms"))
    for kind, by in results.items():  # "within 5%" read as no regression: better by more than 5% is met
        if {"cache-aware", "least-outstanding"} <= set(by):
            ca, lo = by["cache-aware"], by["least-outstanding"]
            ok = ca["rps"] >= 0.95 * lo["rps"] and all(ca[k] <= 1.05 * lo[k] for k in ("p50", "p90", "p99"))
            out.append((f"{kind}: no figure > 5% worse than least-outstanding (req/s; TTFT p50, p90, p99)", ok,
                        ", ".join(f"{k} {ca[k] / lo[k]:.2f}x" for k in ("rps", "p50", "p90", "p99"))))
    out.append(("0 failed requests", all(m["failed"] == 0 for by in results.values() for m in by.values()), ""))
    return out


def report(results: dict) -> None:
    table(results)
    print("\ntargets (issue 39)")
    for what, ok, fig in targets(results):
        print(f"  [{'met' if ok else 'NOT met'}] {what}: {fig}")
