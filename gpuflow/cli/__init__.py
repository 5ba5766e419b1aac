"""The gpuflow command line. Dry-run commands: schedule, estimate, rank-scale-down, dry-run (once
named demo, an alias kept); ``standin``, gpuflow's stand-in engine.

Exit codes: 0 done (scheduled); 1 Temporal reported an error; 2 invalid input (a file, spec, name
or argument); 3 unschedulable (schedule); 4 unreachable: Temporal, or a host through it, did not
answer; 130 interrupted; 141 the reader of stdout left (``| head``), quietly.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import sys

# pydantic looks for plugins (the "pydantic" entry points of every installed distribution) when it
# builds its first model: 17-20 ms of CPU in each gpuflow process here, 2% of a `gpuflow deploy`'s
# start (issue 37). gpuflow uses none. Set before any model is built; an operator who wants one sets the
# variable (to "" for all of them). Engines never inherit it (worker_agent/processes.py base_env).
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from scheduler.errors import GpuflowError, InvalidInput  # noqa: E402

# The dry runs' modules (the policy, the estimate, their rendering) are imported by their commands:
# every other command, `gpuflow deploy` among them, starts without them (issue 37).

EPILOG = """\
start here: 'gpuflow dev' runs Temporal, a control plane and an agent on this machine;
then 'gpuflow deploy SPEC', 'gpuflow status', 'gpuflow explain INSTANCE', 'gpuflow logs INSTANCE'.

exit codes: 0 done; 1 Temporal reported an error; 2 invalid input; 3 unschedulable (schedule);
4 Temporal (or a host through it) did not answer; 130 interrupted; 141 stdout closed early."""
EXIT_OK, EXIT_INVALID, EXIT_UNSCHEDULABLE, EXIT_UNREACHABLE = 0, 2, 3, 4
EXIT_PIPE = 128 + 13  # SIGPIPE: the reader of stdout went away


def cmd_schedule(a) -> int:
    from gpuflow import files
    from gpuflow.policy_env import policy_config
    from scheduler.decide import decide
    from scheduler.estimate import estimate_request
    from scheduler.summary import request_summary, summary_text
    from views.render import dryrun as render

    snapshot = files.load_cluster(a.cluster)
    spec = files.load_spec(a.model)
    if spec.is_group or a.scale_out or a.scale_in:
        from gpuflow.cli import groups

        return groups.schedule(a, snapshot, spec, policy_config())
    req = estimate_request(spec, files.model_files_path(spec, a.model, a.model_path))
    d = decide(snapshot, spec, req, policy_config())
    summary = request_summary(req)
    if a.json:
        print(json.dumps({**d.to_dict(), "request": summary}, indent=2))
    else:
        print(render.decision(d, summary_text(summary)))
    return EXIT_OK if d.scheduled else EXIT_UNSCHEDULABLE


def _csv(v: str | None, cast):
    if v is None:
        return None
    try:
        return tuple(cast(x) for x in v.split(",") if x != "")
    except ValueError:
        raise InvalidInput(f"{v!r} is not a comma-separated list") from None


def cmd_estimate(a) -> int:
    from scheduler.units import MiB
    from views.render.estimate_json import gguf_json, hf_json

    path = a.model
    if os.path.isdir(path):
        out = hf_json(path)
        print(json.dumps(out, indent=2) if a.json else "\n".join(f"{k}: {v}" for k, v in out.items()))
        return EXIT_OK
    footprint = _csv(a.platform_footprint, int) or (150, 250)
    if len(footprint) != 2:
        raise InvalidInput(f"--platform-footprint takes RAM,VRAM in MiB, got {a.platform_footprint!r}")
    out = gguf_json(path, dict(
        ctx_size=a.ctx_size, parallel_size=a.parallel_size, batch_size=a.batch_size, ubatch_size=a.ubatch_size,
        cache_type_k=a.cache_type_k, cache_type_v=a.cache_type_v, flash_attention=a.flash_attention,
        mmap=a.mmap, gpu_layers=a.gpu_layers, tensor_split=_csv(a.tensor_split, float), rpc=_csv(a.rpc, str) or (),
        platform_ram=footprint[0] * MiB, platform_vram=footprint[1] * MiB, in_max_ctx_size=a.in_max_ctx_size),
        step=a.gpu_layers_step)
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        from views.render.estimate_json import table

        print(table(out))
    return EXIT_OK


def cmd_rank(a) -> int:
    from gpuflow import files
    from gpuflow.policy_env import policy_config
    from scheduler import scale_down
    from scheduler.spec import PlacementStrategy
    from views.render import dryrun as render

    snapshot = files.load_cluster(a.cluster)
    if not any(i.model == a.model for i in snapshot.instances):
        raise InvalidInput(f"{a.cluster}: no instance of model {a.model!r}")
    ranked = scale_down.rank(snapshot, a.model, PlacementStrategy(a.strategy), policy_config())
    if a.json:
        print(json.dumps({"model": a.model, "strategy": a.strategy, "order": [r.to_dict() for r in ranked]}, indent=2))
    else:
        print(render.ranking(ranked))
    return EXIT_OK


def cmd_dry_run(a) -> int:
    from gpuflow.demo.dryrun import run_demo

    if a.command == "demo":  # the old name, kept as an alias: 'make demo' is the live stack, this one is not
        print("gpuflow: 'gpuflow demo' is now 'gpuflow dry-run' (the offline dry run); 'make demo' or "
              "'gpuflow dev --demo' runs the live stack", file=sys.stderr)
    return run_demo(a.data_dir)


def cmd_standin(a) -> int:
    from gpuflow.demo.standin import serve

    return serve(a)


def version() -> str:
    """This gpuflow's version, as installed (pyproject.toml's)."""
    from importlib.metadata import PackageNotFoundError, version as installed

    try:
        return installed("gpuflow")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


class _Version(argparse.Action):
    """``--version``: the version read when asked for, not while every command's parser is built
    (the installed distribution's metadata: 3-4 ms of CPU, and importlib.metadata where nothing else
    imports it)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0,
                         help=help or "show the program's version number and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"gpuflow {version()}")  # to stdout, as argparse's own version action
        parser.exit()


def parser(local_only: bool = False, only: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser; ``only``: of the cluster's commands, register only that module's
    (``REGISTRARS``), as ``main`` does for a command it knows the owner of."""
    p = argparse.ArgumentParser(prog="gpuflow", description="GPU-cluster orchestrator for LLM inference servers",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("schedule", help="dry run: where would one replica (or a prefill/decode group) go, and why")
    s.add_argument("--cluster", required=True, help="cluster snapshot (YAML or JSON)")
    s.add_argument("--model", required=True, help="model spec (YAML or JSON); with roles, the whole group is placed")
    s.add_argument("--model-path", help="local copy of the model files (for hub sources)")
    s.add_argument("--json", action="store_true")
    one = s.add_mutually_exclusive_group()
    one.add_argument("--scale-out", metavar="ROLE", help="a group: place one more ROLE member beside the group's "
                     "members in the cluster file (instances with role and group)")
    one.add_argument("--scale-in", metavar="ROLE", help="a group: name the ROLE member that scale-in removes")
    s.set_defaults(fn=cmd_schedule)

    e = sub.add_parser("estimate", help="memory estimate of a GGUF file (gguf-parser's flags) or a HF directory")
    e.add_argument("model", metavar="MODEL_FILE_OR_DIR")
    e.add_argument("--ctx-size", type=int)
    e.add_argument("--in-max-ctx-size", action="store_true")
    e.add_argument("--parallel-size", type=int, default=1)
    e.add_argument("--batch-size", type=int, default=2048)
    e.add_argument("--ubatch-size", type=int, default=512)
    e.add_argument("--gpu-layers", type=int, default=-1)
    e.add_argument("--gpu-layers-step", type=int, default=0)
    e.add_argument("--tensor-split")
    e.add_argument("--rpc")
    e.add_argument("--flash-attention", action="store_true")
    e.add_argument("--mmap", dest="mmap", action="store_true", default=True)
    e.add_argument("--no-mmap", dest="mmap", action="store_false")
    e.add_argument("--cache-type-k", default="f16")
    e.add_argument("--cache-type-v", default="f16")
    e.add_argument("--platform-footprint", help="RAM,VRAM in MiB (default 150,250)")
    e.add_argument("--json", action="store_true")
    e.set_defaults(fn=cmd_estimate)

    r = sub.add_parser("rank-scale-down", help="a model's instances in removal order")
    r.add_argument("--cluster", required=True)
    r.add_argument("--model", required=True, help="model name")
    r.add_argument("--strategy", choices=["spread", "binpack"], default="spread")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=cmd_rank)

    for name, what in (("dry-run", "dry-run placements of the bundled examples, offline (no Temporal needed; "
                                   "the live stack is 'make demo' or 'gpuflow dev --demo')"),
                       ("demo", "the old name of 'gpuflow dry-run' (an alias)")):
        d = sub.add_parser(name, help=what)
        d.add_argument("--data-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "gpuflow", "demo"))
        d.set_defaults(fn=cmd_dry_run)

    si = sub.add_parser("standin", help="gpuflow's stand-in engine: answers the OpenAI API with canned text, runs "
                                        "no model (a spec's run_command: 'gpuflow standin --port {port} --host {host}')")
    if only is None:  # a cluster command's parse (``only``) never reads the stand-in's flags
        from gpuflow.demo.standin import add_arguments
        add_arguments(si)
    si.set_defaults(fn=cmd_standin)

    if not local_only:
        for key, (module, register) in REGISTRARS.items():
            if only is None or key == only:
                getattr(importlib.import_module(module), register)(sub)
    return p


# Which module registers each cluster command, and how: ``gpuflow deploy ...`` imports only
# gpuflow.cli.cluster's, not the dev stack's, the simulator's or the gateway's (about a third of a
# deploy process's 1 s of CPU, paid by every CLI call; issue 37). tests/test_cli_owners.py checks
# the table against what each module registers; a command not in it gets the whole parser.
REGISTRARS = {
    "cluster": ("gpuflow.cli.cluster", "add_commands"),
    "dev": ("gpuflow.dev", "add_command"),
    "gateway": ("gpuflow.cli.gateway", "add_commands"),
    "simulate": ("gpuflow.simulate", "add_command"),
    "rollout": ("gpuflow.cli.rollout", "add_commands"),  # gpuflow rollout status|undo
    "autoscale": ("gpuflow.cli.autoscale", "add_commands"),  # gpuflow autoscale NAME
    "tenants": ("gpuflow.cli.tenants", "add_commands"),  # gpuflow tenants [apply FILE]
    "queue": ("gpuflow.cli.queue", "add_commands"),  # the PENDING queue and why each waits
    "claims": ("gpuflow.cli.claims", "add_commands"),  # the learned memory claims
    "settings": ("gpuflow.cli.settings_cmd", "add_commands"),  # the cluster's timings and limits
}
OWNERS = {"agent": "cluster", "delete": "cluster", "deploy": "cluster", "explain": "cluster", "hosts": "cluster",
          "logs": "cluster", "scale": "cluster", "server": "cluster", "status": "cluster", "dev": "dev",
          "gateway": "gateway", "keys": "gateway", "simulate": "simulate", "rollout": "rollout",
          "autoscale": "autoscale", "tenants": "tenants", "queue": "queue", "claims": "claims", "settings": "settings"}

LOCAL_COMMANDS = ("schedule", "estimate", "rank-scale-down")  # dry runs: no Temporal client to import
QUICK_COMMANDS = ("standin", "--version")  # nor these (the stand-in engine starts in a fraction of a second)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    local = bool(argv) and argv[0] in LOCAL_COMMANDS + QUICK_COMMANDS
    # The start (the command's modules, the parser) makes objects that live as long as the process:
    # the cyclic collector's passes over them as they were made were about a sixth of a `gpuflow
    # deploy` process's imports (issue 37). It is off meanwhile; then they are frozen (never scanned
    # again) and it collects what the command makes. A dry run keeps it off: one short process that
    # builds a snapshot of tens of thousands of objects and ends (the collector's passes over them
    # were about half of loading a 1,000-worker file).
    gc.disable()
    owner = None if local or not argv else OWNERS.get(argv[0])  # None: the whole parser (help, a typo)
    args = parser(local_only=local, only=owner).parse_args(argv)
    if not (local and argv[0] in LOCAL_COMMANDS):
        gc.freeze()
        gc.enable()
    try:
        code = args.fn(args)
    except GpuflowError as e:
        from gpuflow.runtime import Unreachable

        print(f"gpuflow: error: {e}", file=sys.stderr)
        code = EXIT_UNREACHABLE if isinstance(e, Unreachable) else EXIT_INVALID
    except BrokenPipeError:
        code = _reader_gone()
    except Exception as e:  # noqa: BLE001  Temporal's errors, named; anything else is a bug and keeps its traceback
        from temporalio.client import WorkflowFailureError
        from temporalio.service import RPCError

        if not isinstance(e, (RPCError, WorkflowFailureError)):
            raise
        from gpuflow.broken import cause_message

        print(f"gpuflow: error: Temporal: {cause_message(e)}", file=sys.stderr)  # the innermost cause's words
        code = 1
    except KeyboardInterrupt:
        code = 130
    if getattr(args, "temporal", False):
        # The Temporal SDK's core threads can crash CPython's finalisation (sdk-python #300):
        # leave without it once our own work is done.
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            code = _reader_gone()
        sys.stderr.flush()
        os._exit(code)
    return code


def _reader_gone() -> int:
    """stdout's reader left (``gpuflow status --json | head``): end quietly, as ``cat`` does, with
    the exit status of a process ended by SIGPIPE. What is still buffered goes nowhere (Python's
    own flush at exit would otherwise print a second error)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_PIPE


if __name__ == "__main__":
    sys.exit(main())
