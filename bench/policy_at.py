"""The autoscaling policy as it was at a commit, loaded beside today's for a before/after in one
run (bench/bench_autoscaler.py). The modules the policy needs (config, rules, evidence, signals,
histogram, policy) are read with ``git show COMMIT:scheduler/autoscale/NAME.py`` into a package of
their own (``scheduler.autoscale`` renamed in their imports), so the old and the new policy live in
one process; what they import from outside the package (``scheduler.fields``) is today's.

    mod = load("340958a")   # mod.policy.decide, mod.config.Autoscaling, mod.signals.combine

Needs git and the repository's history (a clean error otherwise: a source tarball has no
history)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tempfile
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = ("histogram", "signals", "evidence", "config", "rules", "policy")  # in import order


class NoHistory(RuntimeError):
    pass


def _show(commit: str, name: str) -> str:
    try:
        got = subprocess.run(["git", "-C", ROOT, "show", f"{commit}:scheduler/autoscale/{name}.py"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NoHistory(f"git could not be run ({e}): the bench's 'before' needs the repository's history") from None
    if got.returncode != 0:
        raise NoHistory(f"git show {commit}:scheduler/autoscale/{name}.py failed: {got.stderr.strip()[:200]}")
    return got.stdout


def load(commit: str) -> types.SimpleNamespace:
    """The policy's modules at ``commit``, as ``.histogram``, ``.signals``, ..., ``.policy``."""
    pkg = f"autoscale_at_{commit[:12]}"
    if pkg not in sys.modules:
        where = tempfile.mkdtemp(prefix="gpuflow-policy-")
        os.makedirs(os.path.join(where, pkg))
        open(os.path.join(where, pkg, "__init__.py"), "w").close()
        for name in MODULES:
            text = _show(commit, name).replace("scheduler.autoscale.", f"{pkg}.")
            text = text.replace("from scheduler.autoscale import", f"from {pkg} import")
            with open(os.path.join(where, pkg, f"{name}.py"), "w") as f:
                f.write(text)
        sys.path.insert(0, where)
    return types.SimpleNamespace(**{m: importlib.import_module(f"{pkg}.{m}") for m in MODULES})
