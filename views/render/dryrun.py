"""Human-readable tables for the dry-run commands (``--json`` gives the machine form)."""

from __future__ import annotations

from scheduler.decision import Decision
from scheduler.units import gib

TABLE_ROWS = 30  # candidates a table lists: more are the best by score (--json lists every one)


def text_table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _vram(claim) -> str:
    return ", ".join(f"{i}:{gib(b)}" for i, b in claim.vram.items()) or "-"


def decision(d: Decision, request_summary: str) -> str:
    out = [f"request: {request_summary}"]
    if d.scheduled:
        p = d.placement
        subs = "".join(f" + {s.worker}{s.gpu_indexes}" for s in p.subordinates)
        out.append(f"SCHEDULED on {p.worker} GPUs {p.gpu_indexes}{subs} by strategy {d.strategy}, score {d.score:.2f}"
                   + (f", link {p.link}" if p.link else "") + (f", pinned to CPUs {p.cpus}" if p.cpus else ""))
    else:
        out.append("UNSCHEDULABLE")
    out.append("")
    out.append("filters:")
    rows = [[v.name, f"{len(v.kept)}/{v.before}", "; ".join(f"{w}: {', '.join(r)}" for w, r in v.removed.items()) or "-"]
            for v in d.filters]
    out.append(text_table(rows, ["filter", "kept", "removed (why)"]))
    if d.candidates:
        out.append("")
        total = len(d.candidates)
        shown = list(d.candidates) if total <= TABLE_ROWS else d.top(TABLE_ROWS)
        if d.placement is not None and not any(c is d.placement for c in shown):
            shown.append(d.placement)  # the pick among equals by rounded score: listed too
        more = f" the best {len(shown)} of {total:,} by score; --json lists every one" if len(shown) < total else ""
        out.append(f"candidates ({d.strategy}):{more}")
        names = list(shown[0].scores)
        links = any(c.link for c in shown)
        rows = []
        for c in shown:
            mark = "*" if c is d.placement else ""
            subs = " ".join(f"+{s.worker}{s.gpu_indexes}" for s in c.subordinates)
            rows.append([mark, c.worker + (" " + subs if subs else ""), str(c.gpu_indexes), _vram(c.claim),
                         f"{gib(c.claim.ram)}", *[f"{c.scores[n]:.2f}" for n in names], f"{c.score:.2f}"]
                        + ([c.link or "-"] if links else []))
        out.append(text_table(rows, ["", "worker", "gpus", "vram GiB", "ram GiB", *names, "score"] + (["link"] if links else [])))
    if d.reasons:
        out.append("")
        out.append("reasons:")
        out.extend(f"  - {r}" for r in d.reasons)
    return "\n".join(out)


def ranking(ranked) -> str:
    if not ranked:
        return "no instances"
    names = list(ranked[0].scores)
    rows = [[str(i + 1), r.instance.name, r.instance.state.value, r.instance.worker or "-", str(r.instance.gpu_indexes),
             *[f"{r.scores[n]:.3f}" for n in names], f"{r.score:.3f}"] for i, r in enumerate(ranked)]
    return "removal order (first removed first):\n" + text_table(rows, ["#", "instance", "state", "worker", "gpus", *names, "score"])
