"""``gpuflow explain``'s audit parts: ``--replay`` re-runs a recorded decision with this build's
policy, on the inputs the control plane kept (store/decision_log.py), and says whether it would
decide the same; ``--snapshot FILE`` writes those inputs' cluster as a file ``gpuflow schedule
--cluster`` reads; ``--history`` lists a deployment's decisions over time.

The recorded decision compared against is the one the instance's workflow history holds (its
``status`` query), matched to the kept inputs by their digest; once the workflow is gone, the
store's copy of the record. Exit codes: 0 the same decision, 1 a different one, 2 the inputs are
not kept (or not readable)."""

from __future__ import annotations

import json
import os
from typing import Any

from sqlalchemy.engine import Engine

from activities import autoscale_inputs
from activities.decision_inputs import DecisionInputs, decode, dict_differences, differences, run_policy
from contracts.decision import DecisionRecord
from gpuflow.render import replay as render_replay
from scheduler.errors import InvalidInput
from scheduler.policy_config import PolicyConfig
from store import decision_log

SAME, DIFFERENT = 0, 1


def load(engine: Engine, digest: str) -> DecisionInputs:
    try:
        manifest = decision_log.blob(engine, digest)
    except KeyError:
        raise InvalidInput(f"the inputs {digest[:12]} are not kept in this store (pruned past the retention, "
                           "written by another store, or decided before gpuflow kept them)") from None
    return decode(manifest, lambda d: decision_log.blob(engine, d))


def replay(engine: Engine, instance: str, recorded: DecisionRecord | None, digest: str | None = None,
           policy: PolicyConfig | None = None) -> dict[str, Any]:
    """The replay of ``instance``'s decision: the one ``recorded`` (the workflow's record) names,
    else the store's newest (or the one whose digest starts with ``digest``). ``policy``: weights
    to replay with instead of the recorded ones."""
    want = digest or (recorded.inputs if recorded is not None else None)
    row = decision_log.latest(engine, instance, want)
    if row is None:
        if recorded is not None and recorded.inputs is None:
            raise InvalidInput(f"{instance}'s decision was made before gpuflow kept decisions' inputs: nothing to replay")
        raise InvalidInput(f"no kept decision of {instance}" + (f" with inputs {want[:12]}" if want else ""))
    if row.kind == "autoscale":
        return _replay_step(engine, row)
    if recorded is None or (digest and recorded.inputs != row.digest):
        recorded = DecisionRecord.model_validate(decision_log.record_of(row))
    inp = load(engine, row.digest)
    if instance not in inp.names:
        raise InvalidInput(f"the inputs {row.digest[:12]} are not {instance}'s (they decided {', '.join(inp.names)})")
    if policy is not None:
        inp.policy = policy
    now = run_policy(inp)[inp.names.index(instance)]
    diff = differences(recorded, now)
    return {"instance": instance, "kind": "placement", "inputs": row.digest, "at": row.at.isoformat(),
            "names": inp.names, "same": not diff, "differences": diff,
            "recorded": render_replay.outcome(recorded), "now": render_replay.outcome(now),
            "saw": f"{len(inp.snapshot.workers)} hosts, {len(inp.snapshot.instances)} replicas"}


def _replay_step(engine: Engine, row: decision_log.DecisionRow) -> dict[str, Any]:
    """An autoscaler step re-run on its kept inputs (activities/autoscale_inputs.py)."""
    try:
        data = decision_log.blob(engine, row.digest)
    except KeyError:
        raise InvalidInput(f"the inputs {row.digest[:12]} of {row.deployment}'s autoscaler step are not kept "
                           "(pruned past the retention)") from None
    recorded, now = decision_log.record_of(row), autoscale_inputs.replay(data)
    diff = dict_differences(recorded, now)
    return {"instance": row.instance, "kind": "autoscale", "inputs": row.digest, "at": row.at.isoformat(),
            "names": [row.deployment], "same": not diff, "differences": diff,
            "recorded": render_replay.step(recorded), "now": render_replay.step(now),
            "saw": f"{len(json.loads(data).get('samples', []))} samples"}


def write_snapshot(engine: Engine, digest: str, path: str) -> tuple[str, str]:
    """The kept inputs' cluster as a cluster file (JSON), and their spec beside it; both paths."""
    inp = load(engine, digest)
    spec_path = os.path.splitext(path)[0] + ".spec.json"
    for p, doc in ((path, inp.snapshot.model_dump(mode="json", exclude_defaults=True)),
                   (spec_path, inp.spec.model_dump(mode="json", exclude_none=True))):
        with open(p, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    return path, spec_path


def history(engine: Engine, deployment: str, limit: int) -> list[dict[str, Any]]:
    """The deployment's kept decisions, oldest first: placements, refusals (the decisive reason),
    preemptions and autoscaler steps."""
    return [{"at": r.at.isoformat(), "kind": r.kind, "instance": r.instance, "outcome": r.outcome, "reason": r.reason,
             "inputs": r.digest} for r in decision_log.history(engine, deployment, limit)]


def cmd_audit(a, s) -> int:
    """``explain NAME --history | --replay | --snapshot FILE`` (gpuflow/cli/cluster.py parses them)."""
    from gpuflow.cli.connection import run_command
    from gpuflow.serving_view import open_store

    engine = open_store(s, bool(a.database_url or a.data_dir))
    if engine is None:
        raise InvalidInput(f"no store at {s.store_url()}: decisions' inputs are kept in the control plane's store; "
                           "pass its --data-dir or --database-url")
    if a.history:
        rows = history(engine, a.instance, a.limit)
        print(json.dumps(rows, indent=2) if a.json else render_replay.history(a.instance, rows))
        return 0

    async def go() -> int:
        recorded = None if a.decision else await _recorded(s, a.instance)
        code = 0
        if a.snapshot:
            digest = a.decision or (recorded.inputs if recorded is not None else None)
            row = decision_log.latest(engine, a.instance, digest)
            if row is None:
                raise InvalidInput(f"no kept decision of {a.instance}")
            cluster, spec = write_snapshot(engine, row.digest, a.snapshot)
            print(f"wrote the cluster {a.instance}'s decision saw to {cluster} and its spec to {spec}: "
                  f"gpuflow schedule --cluster {cluster} --model {spec}")
        if a.replay:
            r = replay(engine, a.instance, recorded, a.decision, s.scheduler if a.with_settings else None)
            print(json.dumps(r, indent=2) if a.json else render_replay.replay(r))
            code = SAME if r["same"] else DIFFERENT
        return code

    return run_command(go())


async def _recorded(s, name: str) -> DecisionRecord | None:
    """The decision the instance's workflow holds; None when the workflow is gone (the store's copy
    is then the record)."""
    from gpuflow import ops
    from gpuflow.runtime import connect

    try:
        return (await ops.instance(await connect(s.temporal), name)).decision
    except InvalidInput:
        return None
