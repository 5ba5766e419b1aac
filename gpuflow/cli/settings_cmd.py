"""``gpuflow settings [--json]``: the cluster's policy as its control plane holds it: the timings
every deployment gets (grace periods, liveness, backoff caps: the answering ``gpuflow server``'s
GPUFLOW_TIMINGS__*), which of them a spec may set for its own deployment (``timings:``), and the
operator's limits. Asked through the control plane (the reads workflow's ``settings`` query), so
what it prints is what a deployment started now gets, whatever this shell's environment says."""

from __future__ import annotations

import json

from gpuflow.cli.connection import run_command, settings_from, temporal_flags


def text(view) -> str:
    out = [f"the cluster's settings (answered by control-plane worker {view.worker}):"]
    if view.timings is None:
        out.append("  timings: this worker holds none of its own (a deployment keeps those it was started with)")
    else:
        out.append(f"  {'TIMING':<26}{'VALUE':>12}  WHO SETS IT")
        for k, v in view.timings.items():
            who = "cluster; a spec may set its own (timings:)" if k in view.per_deployment else "cluster"
            out.append(f"  {k:<26}{v:>12g}  {who}")
    out.append(f"  {'LIMIT':<26}{'VALUE':>12}")
    out += [f"  {k:<26}{v:>12g}" for k, v in view.limits.items()]
    out.append("set with GPUFLOW_TIMINGS__<NAME> / GPUFLOW_LIMITS__<NAME> where 'gpuflow server' runs "
               "(docs/operations/settings.md); a CLI's environment changes none of them")
    return "\n".join(out)


def cmd_settings(a) -> int:
    from gpuflow import cluster_client as cl
    from gpuflow.runtime import connect

    s = settings_from(a)

    async def go():
        view = await cl.settings(await connect(s.temporal))
        print(json.dumps(view.model_dump(), indent=2) if a.json else text(view))

    return run_command(go())


def add_commands(sub) -> None:
    p = sub.add_parser("settings", help="the cluster's timings and limits, as its control plane holds them "
                                        "(what every deployment gets; which timings a spec may set)")
    temporal_flags(p)
    p.add_argument("--json", action="store_true", help="the answer as JSON")
    p.set_defaults(fn=cmd_settings, temporal=True)
