"""``gpuflow explain``'s audit parts: ``--replay`` re-runs a kept decision and says whether it would
decide the same; ``--history`` lists a deployment's kept decisions; ``--snapshot FILE`` writes the
cluster a decision saw as a file ``gpuflow schedule --cluster`` reads.

With ``--address`` alone they go through the control plane (the cluster workflow's ``audit``
update): a control-plane worker reads the store and replays with the policy of the build it runs.
With ``--data-dir``/``--database-url`` they read that store here and replay with this build's
policy (offline, and how a policy change is checked before it ships; ``--snapshot`` needs the
store). The record compared against is the instance workflow's own when it names the kept inputs
(offline), else the store's copy of it. Exit codes: 0 the same decision, 1 a different one, 2 the
inputs are not kept (or not readable)."""

from __future__ import annotations

import json
import os
import re

from sqlalchemy.engine import Engine

from contracts.decision import DecisionRecord
from views.render import replay as render_replay
from scheduler.errors import InvalidInput
from scheduler.group_inputs import KINDS
from store.decision_replay import history, load, load_group, replay

SAME, DIFFERENT = 0, 1


def write_snapshot(engine: Engine, digest: str, path: str, kind: str = "placement") -> tuple[str, str]:
    """The kept inputs' cluster as a cluster file (JSON), and their spec beside it (a group member's:
    the group's spec, its topology layers in the cluster file); both paths."""
    inp = load_group(engine, digest) if kind in KINDS else load(engine, digest)
    spec_path = os.path.splitext(path)[0] + ".spec.json"
    for p, doc in ((path, inp.snapshot.model_dump(mode="json", exclude_defaults=True)),
                   (spec_path, inp.spec.model_dump(mode="json", exclude_none=True))):
        with open(p, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    return path, spec_path


def cmd_audit(a, s) -> int:
    """``explain NAME --history | --replay | --snapshot FILE`` (gpuflow/cli/cluster.py parses them)."""
    from gpuflow.cli.connection import run_command

    if a.decision and not re.match(r"^[0-9a-f]{1,64}$", a.decision):
        raise InvalidInput(f"--decision {a.decision[:80]!r}: give the start of a kept inputs' digest (hex, from --history)")
    if a.database_url or a.data_dir:
        return _offline(a, s)
    if a.snapshot:
        raise InvalidInput("--snapshot writes the kept inputs to a file here: give the store with --data-dir or "
                           "--database-url")

    async def go() -> int:
        from gpuflow import cluster_client
        from gpuflow.runtime import connect

        got = await cluster_client.audit(await connect(s.temporal), a.instance, history=a.history, limit=a.limit,
                                         decision=a.decision or "", with_settings=a.with_settings,
                                         policy=s.scheduler.model_dump(mode="json"))  # this caller's settings
        return _show(a, got)

    return run_command(go())


def _show(a, got: dict) -> int:
    if a.history:
        rows = got["rows"]
        print(json.dumps(rows, indent=2) if a.json else render_replay.history(a.instance, rows))
        return 0
    print(json.dumps(got, indent=2) if a.json else render_replay.replay(got))
    return SAME if got["same"] else DIFFERENT


def _offline(a, s) -> int:
    from gpuflow.cli.connection import run_command
    from gpuflow.serving_view import open_store

    engine = open_store(s, True)
    if a.history:
        return _show(a, {"rows": history(engine, a.instance, a.limit)})

    async def go() -> int:
        recorded = None if a.decision else await _recorded(s, a.instance)
        code = 0
        if a.snapshot:
            from store import decision_log

            digest = a.decision or (recorded.inputs if recorded is not None else None)
            row = decision_log.latest(engine, a.instance, digest)
            if row is None:
                raise InvalidInput(f"no kept decision of {a.instance}")
            cluster, spec = write_snapshot(engine, row.digest, a.snapshot, row.kind)
            print(f"wrote the cluster {a.instance}'s decision saw to {cluster} and its spec to {spec}: "
                  f"gpuflow schedule --cluster {cluster} --model {spec}")
        if a.replay:
            code = _show(a, replay(engine, a.instance, recorded, a.decision, s.scheduler if a.with_settings else None))
        return code

    return run_command(go())


async def kept_member(client, s, a) -> dict | None:
    """``gpuflow explain MEMBER`` for a prefill/decode group's member that has no instance workflow
    (its group has not formed: nothing was started): its kept decision as explain shows a record
    (the group's refusal, naming the role that does not fit), read from the store named or through
    the control plane; None when it has none."""
    try:
        if a.database_url or a.data_dir:
            from gpuflow.serving_view import open_store

            got = replay(open_store(s, True), a.instance, None)
        else:
            from gpuflow import cluster_client

            got = await cluster_client.audit(client, a.instance, history=False, limit=1, decision="",
                                             with_settings=False)
    except InvalidInput:
        return None
    if got.get("kind") not in KINDS or "record" not in got:
        return None
    return {"instance": a.instance, "state": "pending" if not got["record"]["scheduled"] else "unknown",
            **got["record"]}


async def _recorded(s, name: str) -> DecisionRecord | None:
    """The decision the instance's workflow holds; None when the workflow is gone (the store's copy
    is then the record)."""
    from gpuflow import ops
    from gpuflow.runtime import connect

    try:
        return (await ops.instance(await connect(s.temporal), name)).decision
    except Exception:  # noqa: BLE001  (no workflow, or no Temporal here: the store's copy is the record)
        return None
