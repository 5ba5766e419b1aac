"""Replay every decision a store kept with this build's policy (placements, refusals, preemptions
and autoscaler steps), and report the ones it decides differently: a policy change (code, or
weights) shows what it would have changed before it ships.

    python bench/replay_all.py --data-dir DIR | --database-url URL [--with-settings] [--set KEY=VALUE ...]
        [--limit N] [--json]

``--with-settings`` replays placements with this process's scorer weights (GPUFLOW_SCHEDULER__*)
instead of the recorded ones; ``--set placement=0`` changes one weight on top (repeatable). Prints one line per
decision that differs (replica, when, recorded outcome, outcome now, the first differences), then
the counts and the replay rate. Exit 0 when every decision replays the same, 1 when some differ,
2 when some could not be replayed (their inputs pruned or unreadable)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpuflow.settings import Settings  # noqa: E402
from scheduler.decision_inputs import DecisionInputs  # noqa: E402
from scheduler.errors import GpuflowError  # noqa: E402
from scheduler.policy_config import PolicyConfig  # noqa: E402
from store import db, decision_log  # noqa: E402
from store.decision_replay import load, replay_row  # noqa: E402


def weights(a) -> PolicyConfig | None:
    if not a.with_settings and not a.set:
        return None
    base = (Settings().scheduler if a.with_settings else PolicyConfig()).model_dump()
    for kv in a.set or []:
        k, _, v = kv.partition("=")
        if k not in base:
            raise SystemExit(f"--set {kv}: no weight {k!r} (there are: {', '.join(sorted(base))})")
        base[k] = float(v) if isinstance(base[k], float) else int(v)
    return PolicyConfig.model_validate(base)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir")
    ap.add_argument("--database-url")
    ap.add_argument("--with-settings", action="store_true")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE")
    ap.add_argument("--limit", type=int, default=0, help="the first N decisions only (0: all)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    url = a.database_url or db.sqlite_url(os.path.join(a.data_dir or Settings().data_dir, "gpuflow.db"))
    engine = db.make_engine(url, schema=os.environ.get("GPUFLOW_DATABASE_SCHEMA"))
    policy = weights(a)
    cache: dict[str, DecisionInputs] = {}  # replicas decided together share one set of inputs

    def inputs(digest: str) -> DecisionInputs:
        if digest not in cache:
            cache.clear()
            cache[digest] = load(engine, digest)
        return cache[digest]

    same = differ = failed = 0
    out = []
    t0 = time.perf_counter()
    for k, row in enumerate(decision_log.every(engine)):
        if a.limit and k >= a.limit:
            break
        where = {"instance": row.instance, "kind": row.kind, "at": row.at.isoformat(), "inputs": row.digest}
        try:
            r = replay_row(engine, row, policy=policy, inputs=inputs)
        except (KeyError, ValueError, GpuflowError) as e:
            failed += 1
            out.append({**where, "error": f"{type(e).__name__}: {e}"})
            continue
        if r["same"]:
            same += 1
            continue
        differ += 1
        out.append({**where, "recorded": r["recorded"], "now": r["now"], "differences": r["differences"]})
    took = time.perf_counter() - t0
    total = same + differ + failed
    if a.json:
        print(json.dumps({"same": same, "different": differ, "failed": failed, "decisions": out}, indent=2))
    else:
        for d in out:
            if "error" in d:
                print(f"{d['at'][:19]} {d['instance']}: not replayed: {d['error']}")
            else:
                print(f"{d['at'][:19]} {d['instance']} (inputs {d['inputs'][:12]}): {d['recorded']}  ->  {d['now']}")
                for line in d["differences"][:5]:
                    print(f"    {line}")
        print(f"{total} decisions replayed in {took:.2f} s ({total / took if took else 0:.0f}/s): {same} the same, "
              f"{differ} different, {failed} not replayable")
    return 2 if failed else 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
