"""gpuflow/cli/__init__.py's OWNERS table: ``gpuflow CMD`` imports only the module that registers
CMD (issue 37: a deploy process's start), so the table must say, for every cluster command, the
module that registers it, and nothing else. A command left out would still work (the whole parser),
one named for the wrong module would not parse: both are caught here."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys

import pytest

from gpuflow import cli
from tests.test_cli import EXAMPLES


def registered(key: str) -> set[str]:
    module, register = cli.REGISTRARS[key]
    sub = argparse.ArgumentParser().add_subparsers()
    getattr(importlib.import_module(module), register)(sub)
    return set(sub.choices)


def test_every_command_is_owned_by_the_module_that_registers_it():
    table = {cmd: key for key in cli.REGISTRARS for cmd in registered(key)}
    assert cli.OWNERS == table


def test_the_local_commands_are_nobody_s():
    assert not set(cli.OWNERS) & set(cli.LOCAL_COMMANDS + cli.QUICK_COMMANDS)


@pytest.mark.parametrize("argv", [
    ["deploy", "m.yaml", "--wait", "--timeout", "5"],
    ["status", "--json"],
    ["keys", "list"],
    ["rollout", "status", "web"],
    ["claims", "--json"],
])
def test_one_owner_parses_as_the_whole_parser(argv):
    whole = vars(cli.parser().parse_args(argv))
    one = vars(cli.parser(only=cli.OWNERS[argv[0]]).parse_args(argv))
    assert {k: v for k, v in one.items() if k != "fn"} == {k: v for k, v in whole.items() if k != "fn"}
    assert one["fn"].__qualname__ == whole["fn"].__qualname__


# What a cluster command's process is spared (issue 37): the dev stack, the simulator, the gateway;
# the dry runs' policy and its rendering; the stand-in engine and its HTTP server; the workflow
# classes (gpuflow/ops.py calls them by their names in contracts/ids.py: tests/test_call_names.py).
SPARED = ('gpuflow.dev', 'gpuflow.simulate', 'gpuflow.cli.gateway', 'scheduler.decide', 'views.render.dryrun',
          'gpuflow.demo.standin', 'http.server', 'workflows.deployment', 'workflows.instance', 'workflows.host')


def test_a_deploy_process_does_not_import_the_dev_stack_or_the_simulator():
    # the modules cmd_deploy imports when it runs (a first deploy, without --wait) as well as the parser's
    code = ("import sys; from gpuflow import cli; cli.parser(only=cli.OWNERS['deploy']).parse_args(['deploy', 'm.yaml']); "
            "from gpuflow import deploy_look, deploy_report, deploy_wait; "
            f"print(sorted(m for m in {SPARED!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# What a deploy reads and sends is a model spec and the deployment's input and view
# (contracts/deployment.py, contracts/timings.py): not the cluster snapshot's model, the host's
# report, the agent's contracts, the booking and the decision types (contracts/control.py's rest),
# the agent's log-reading workflow or a group's scale (gpuflow/group_ops.py). About a fifth of a
# deploy process's imports when it pulled them (issue 37: ten start at once in the bench's CLI mode).
NOT_A_DEPLOY_S = ('scheduler.cluster', 'contracts.control', 'contracts.host', 'contracts.agent', 'contracts.decision',
                  'contracts.booking_proof', 'worker_agent.log_reader', 'gpuflow.group_ops')


def test_a_deploy_process_does_not_import_the_other_commands_contracts():
    spec = os.path.join(EXAMPLES, "model-llama3-gguf.yaml")
    code = ("import sys; from gpuflow import cli; cli.parser(only=cli.OWNERS['deploy']).parse_args(['deploy', 'm.yaml']); "
            f"from gpuflow import deploy_look, deploy_report, deploy_wait, files, ops, runtime; files.load_spec({spec!r}); "
            f"print(sorted(m for m in {NOT_A_DEPLOY_S!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("command, argv, on", [
    # a cluster command: the collector is off while the start's modules load, then on, with what
    # the start made frozen (never scanned again)
    ("gpuflow.cli.cluster:cmd_deploy", ["deploy", "m.yaml"], True),
    # a dry run keeps it off for the whole short process
    ("gpuflow.cli:cmd_schedule", ["schedule", "--cluster", "c.json", "--model", "m.yaml"], False),
])
def test_the_collector_at_a_command_s_start(command, argv, on):
    module, name = command.split(":")
    code = (f"import gc, importlib; m = importlib.import_module({module!r}); "
            f"setattr(m, {name!r}, lambda a: print(gc.isenabled(), gc.get_freeze_count() > 0) or 0); "
            f"from gpuflow import cli; cli.main({argv!r})")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(on), str(on)]


# A deploy's start reads no installed distribution's metadata (issue 37): pydantic's search for
# plugins read every distribution's entry points when it built its first model (17-20 ms of CPU a
# process here), and the parser read gpuflow's version for --version (3-4 ms). `gpuflow --version`
# still reads it, when asked.
def test_a_deploy_process_start_reads_no_distribution_metadata():
    spec = os.path.join(EXAMPLES, "model-llama3-gguf.yaml")
    code = ("import importlib.metadata as md; read = []; found = md.Distribution.discover.__func__; "
            "md.Distribution.discover = classmethod(lambda cls, **kw: read.append(kw) or found(cls, **kw)); "
            "from gpuflow import cli; cli.parser(only=cli.OWNERS['deploy']).parse_args(['deploy', 'm.yaml']); "
            f"from gpuflow import deploy_look, files, ops; files.load_spec({spec!r}); "
            "print(len(read))")
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}  # as a user's shell has it
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip() == "0"
    version = subprocess.run([sys.executable, "-m", "gpuflow", "--version"], capture_output=True, text=True, env=env)
    assert version.returncode == 0 and version.stdout.startswith("gpuflow 0.") and version.stderr == ""
