"""``gpuflow claims [--json]``: each fingerprint's learned memory claim (issue 42): the deployments
that use it, the estimate, what is booked, the learned claim, the peak, the confidence, and what
the claim would change and free (views/claims.py; words in views/render/claims.py). Through the
cluster's reads at --address (the answering control-plane worker's GPUFLOW_CLAIMS__* settings);
--data-dir/--database-url read the store itself, with this machine's settings."""

from __future__ import annotations

import json
import time

from gpuflow.cli.connection import offline, offline_flags, open_offline_store, run_command, settings_from, temporal_flags


def _show(view: dict, as_json: bool) -> None:
    from views.render.claims import text

    print(json.dumps(view, indent=2) if as_json else text(view))


def cmd_claims(a) -> int:
    if offline(a):
        from views.claims import claims as claims_view

        _show(claims_view(open_offline_store(a), settings_from(a).claims, time.time()), a.json)
        return 0
    from gpuflow import cluster_client as cl
    from gpuflow.runtime import connect

    s = settings_from(a)

    async def go():
        client = await connect(s.temporal)
        _show((await cl.claims(client)).view, a.json)

    return run_command(go())


def add_commands(sub) -> None:
    p = sub.add_parser("claims", help="learned memory claims: per fingerprint, the estimate, the learned claim, "
                                      "the peak, the confidence and what it would change")
    temporal_flags(p)
    offline_flags(p)
    p.add_argument("--json", action="store_true", help="print the view as JSON")
    p.set_defaults(fn=cmd_claims, temporal=True)
