"""What each workflow shows in the Temporal UI: a static summary and details set when it starts
(``static_details``), and its current details (``workflow.set_current_details``) as its state
changes. Markdown, as the UI renders it; pure functions of what the caller holds, so the workflows
call them deterministically. Names and reasons come from users: they are shown inside code spans,
never as markup."""

from __future__ import annotations

from typing import Any, Iterable

from contracts.host_kinds import HOST_KINDS, host_kind
from scheduler import foreign

GIB = 1 << 30
MAX_TEXT = 4000  # the UI shows a few lines; a long reason is cut


def code(v: Any) -> str:
    """``v`` as an inline code span, whatever backticks it holds (CommonMark: a fence longer than
    any run of backticks inside, padded where the text starts or ends with one)."""
    s = str(v).replace("\n", " ")
    longest = run = 0
    for ch in s:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def _gib(n: int | float) -> str:
    return f"{n / GIB:.1f} GiB"


def _lines(items: Iterable[str]) -> str:
    text = "\n".join(items)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 3] + "..."


def source_key(spec: dict[str, Any]) -> str:
    src = spec.get("source") or {}
    for kind in ("huggingface", "model_scope", "modelscope"):
        if isinstance(src.get(kind), dict):
            return f"{kind}:{src[kind].get('repo', '')}" + (f" {src[kind]['file']}" if src[kind].get("file") else "")
    if src.get("local_path"):
        return f"local:{src['local_path']}"
    return "-"


def deployment_details(spec: dict[str, Any], replicas: int | None) -> str:
    """A deployment: its model, backend, replicas wanted and tenant."""
    auto = spec.get("autoscaling") or None
    want = replicas if replicas is not None else spec.get("replicas", 1)
    return _lines([
        f"**model** {code(source_key(spec))}",
        f"**backend** {code(spec.get('backend', '-'))}",
        f"**replicas wanted** {want}" + (" (autoscaled)" if auto else ""),
        f"**tenant** {code(spec.get('tenant') or 'default')}"])


def deployment_current(state: str, spec: dict[str, Any], wanted: int, instances: int, rolling: bool,
                       group: list[str] | None = None) -> str:
    """A deployment now: its state, the replicas wanted and the instances it holds, a rollout; a
    prefill/decode group's lines (``group``: its roles' counts, why it waits, its degradations)."""
    return _lines([f"**{state.upper()}** {wanted} replica(s) wanted, {instances} instance(s)"
                   + (" · rolling upgrade under way" if rolling else ""), *(group or []), deployment_details(spec, wanted)])


def instance_details(spec: dict[str, Any], deployment: str) -> str:
    """A replica, as it starts: its model and deployment."""
    return _lines([f"**model** {code(source_key(spec))}", f"**deployment** {code(deployment)}",
                   f"**backend** {code(spec.get('backend', '-'))}"])


def instance_current(state: str, reason: str, plan: Any, restarts: int, inputs: str | None) -> str:
    """A replica now: its state and reason, and once placed its host, GPUs and claim."""
    out = [f"**{state.upper()}**" + (f" {code(reason[:500])}" if reason else "")]
    if plan is not None:
        gpus = ",".join(map(str, plan.gpu_indexes)) or "none"
        claim = plan.claim
        out.append(f"**host** {code(plan.worker)} **GPUs** {gpus}")
        out.append(f"**claim** {_gib(sum(claim.vram.values()))} VRAM, {_gib(claim.ram)} RAM")
        for s in plan.subordinates:
            out.append(f"**also on** {code(s.worker)} GPUs {','.join(map(str, s.gpu_indexes)) or 'none'}")
    if restarts:
        out.append(f"**restarts** {restarts}")
    if inputs:
        out.append(f"**decision inputs** {code(inputs[:16])} ({code('gpuflow explain --replay')})")
    return _lines(out)


def host_details(report: Any) -> str:
    """A host: its GPUs and kind (contracts/host_kinds.py HOST_KINDS)."""
    kind = host_kind(report.simulated, getattr(report, "runs", None))
    out = [f"**{kind}** host, {len(report.gpus)} GPU(s), {_gib(report.ram_total)} RAM", f"_{HOST_KINDS[kind]}_"]
    out += [f"GPU {g.index}: {code(g.name or g.type)} {_gib(g.vram_total)}"
            + (f", {foreign.words(g.vram_foreign)}" if g.vram_foreign else "") for g in report.gpus[:16]]
    if len(report.gpus) > 16:
        out.append(f"... and {len(report.gpus) - 16} more")
    for d in (getattr(report, "foreign_degraded", None) or [])[:16]:  # an alert, never an eviction
        out.append("**DEGRADED** " + foreign.Degraded(d.index, d.foreign, d.booked, d.room).text())
    return _lines(out)


def host_current(state: str, reason: str = "", cordoned: bool = False, cordon_reason: str = "") -> str:
    """A host's state, and whether an operator cordoned it (no new replicas), with the reason."""
    out = [f"**{state.upper()}**" + (f" {code(reason[:500])}" if reason else "")]
    if cordoned:
        out.append("**CORDONED** no new replicas" + (f" {code(cordon_reason[:500])}" if cordon_reason else ""))
    return _lines(out)


def autoscaler_details(auto: dict[str, Any] | None) -> str:
    """An autoscaler: its bounds and rules."""
    if not auto:
        return "no autoscaling in the spec"
    out = [f"**replicas** {auto.get('min_replicas', '?')} to {auto.get('max_replicas', '?')}"]
    for r in auto.get("rules") or ["queue_tpot (the default)"]:
        text = ", ".join(f"{k}={v}" for k, v in sorted(r.items()) if v is not None) if isinstance(r, dict) else str(r)
        out.append("**rule** " + code(text))
    return _lines(out)


def autoscaler_current(rec: dict[str, Any]) -> str:
    """An autoscaler now: its last step (a record of its history: activities/autoscale.py)."""
    running = (rec.get("signals") or {}).get("running_replicas")
    return _lines([f"**last step** {code(rec.get('direction', '-'))} by rule {code(rec.get('rule', '-'))}: "
                   f"{code(str(rec.get('done', '-'))[:200])}",
                   f"**why** {code(str(rec.get('reason', ''))[:500])}"]
                  + ([f"**running replicas** {running}"] if running is not None else []))
