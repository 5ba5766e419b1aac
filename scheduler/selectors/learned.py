"""vLLM's and SGLang's candidates when the request books a learned claim (scheduler/claim_apply.py):
the claim in equal shares over the replica's GPUs, in place of the whole card's fraction, each GPU
holding its share; the engine is told the fraction of its card that share is (vram_utilization),
so it takes what was booked and no more. A candidate across several workers is left out: the
engines' share flags are per card, and a learned claim is booked on one worker's GPUs only."""

from __future__ import annotations

from dataclasses import replace

from scheduler.claim_apply import even_shares
from scheduler.decision import Candidate, Context


def learned(req) -> bool:
    return getattr(req, "learned", None) is not None


def even_out(ctx: Context, found: tuple[str | None, list[Candidate]], msgs: list[str]) -> tuple[str | None, list[Candidate]]:
    """``found`` (a strategy's name and candidates) rewritten for the learned claim: those whose
    every GPU can hold an equal share, with that share booked."""
    name, cands = found
    totals = {(w.name, g.index): g.vram_total for w in ctx.snapshot.workers for g in w.gpus}
    out = []
    for c in cands:
        if c.subordinates:
            continue
        share, frac = even_shares(ctx.request.vram, [totals[(c.worker, i)] for i in c.gpu_indexes])
        alloc = ctx.allocatable[c.worker].vram
        if any(alloc.get(i, 0) < share for i in c.gpu_indexes):
            continue
        out.append(replace(c, claim=replace(c.claim, vram={i: share for i in c.gpu_indexes},
                                            vram_utilization=frac or None)))
    if cands and not out:
        msgs.append("A learned claim is booked in equal shares on one worker's GPUs; no candidate's GPUs each hold "
                    "their share.")
    return (name if out else None), out
