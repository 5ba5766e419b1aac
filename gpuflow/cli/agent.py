"""The CLI's long-running processes of a cluster: ``gpuflow server`` (a control-plane worker) and
``gpuflow agent`` (a host's agent). Their flags come from the typed settings (gpuflow/settings.py)
and the agent's engine configuration (worker_agent/engines.py ``EngineConfig``): gpuflow/cli/flags.py."""

from __future__ import annotations

import argparse
import os
import socket

from gpuflow.cli.connection import run_command, settings_from, temporal_flags
from gpuflow.cli.flags import dataclass_flags, dataclass_from, setting
from gpuflow.runtime import connect
from scheduler.errors import InvalidInput
from worker_agent.log_retention import KEEP_LOGS


def cmd_server(a) -> int:
    from gpuflow.server import run_server

    s = settings_from(a)
    return run_command(run_server(s, metrics_address=s.server.metrics_address))


def _labels(a) -> dict[str, str]:
    bad = [kv for kv in a.label or [] if "=" not in kv or kv.startswith("=")]
    if bad:
        raise InvalidInput(f"--label takes KEY=VALUE, got {bad[0]!r}")
    return dict(kv.split("=", 1) for kv in a.label or [])


def _check_allowed(a) -> None:
    """The operator's extra env patterns and engine flags, refused now if they are not ones."""
    from scheduler.engine_flags import allow_flag_problem
    from scheduler.spec_env import allow_pattern_problem

    for why in filter(None, map(allow_pattern_problem, a.allow_env or [])):
        raise InvalidInput(why)
    for why in filter(None, map(allow_flag_problem, a.allow_engine_flag or [])):
        raise InvalidInput(why)


def _check_kv_connectors(a) -> None:
    """--kv-connector's names, refused now (exit 2) if gpuflow does not know one."""
    from contracts.host import known_kv_connectors

    try:
        known_kv_connectors(a.kv_connectors or [], "--kv-connector")
    except ValueError as e:
        raise InvalidInput(str(e)) from None


def cmd_agent(a) -> int:
    from gpuflow.cli.join import agent_credential
    from gpuflow.server import until_signalled
    from worker_agent.agent import advertised_address, run_agent
    from worker_agent.downloads import HubConfig
    from worker_agent.engines import EngineConfig

    _check_kv_connectors(a)
    s = settings_from(a)
    labels = _labels(a)
    _check_allowed(a)
    name = a.name or socket.gethostname()
    if a.inventory:  # a broken file is named now, not after a wait for an unreachable Temporal
        from worker_agent.inventory import from_file

        from_file(name, a.inventory)
    credential = agent_credential(a, s, name)  # the host's own (made from the join token at its first start)

    async def go():
        from gpuflow.metrics_http import parse_address, sdk_runtime, serve

        addr = parse_address(s.agent.metrics_address)
        runtime, sdk_addr = sdk_runtime() if addr else (None, None)
        client = await connect(s.temporal, wait_s=30, runtime=runtime)

        def serve_metrics(registry, extra):
            serve(addr, registry, sdk_addr, extra=extra)
            print(f"gpuflow agent {name}: metrics on http://{addr[0]}:{addr[1]}/metrics", flush=True)
        await run_agent(client, name, s.data_dir, s.timings, a.inventory, labels, stop=until_signalled(),
                        engines=dataclass_from(EngineConfig, a, a.engine_flags),
                        serve_metrics=serve_metrics if addr else None,
                        address=a.advertise_address or advertised_address(s.temporal.address),
                        hub=HubConfig(cache_dir=a.model_cache or os.path.join(s.data_dir, "models"),
                                      hf_endpoint=s.hf_endpoint), keep_logs=a.keep_logs, credential=credential,
                        kv_connectors=s.agent.kv_connectors)

    try:
        return run_command(go())
    finally:
        credential.close()


def _count(v: str) -> int:
    if not v.isdigit() or int(v) > 1_000_000:
        raise argparse.ArgumentTypeError(f"a whole number from 0 to 1000000, got {v!r}")
    return int(v)


def add_server(sub) -> None:
    p = sub.add_parser("server", help="run a control-plane worker (workflows and control activities)")
    temporal_flags(p)
    setting(p, "data_dir")
    setting(p, "database_url")
    setting(p, "server.metrics_address")
    setting(p, "capacity_hook")
    setting(p, "hf_endpoint")
    p.set_defaults(fn=cmd_server, temporal=True)


def add_agent(sub) -> None:
    from worker_agent.engines import EngineConfig

    p = sub.add_parser("agent", help="run the host agent (a Temporal worker on gpuflow-host-<name>)")
    temporal_flags(p)
    p.add_argument("--name", help="host name (default: this machine's hostname)")
    p.add_argument("--inventory", help="simulated inventory file (YAML/JSON); without it NVML is asked")
    p.add_argument("--label", action="append", help="KEY=VALUE worker label (repeatable)")
    setting(p, "data_dir")
    p.set_defaults(engine_flags=dataclass_flags(p, EngineConfig))
    p.add_argument("--advertise-address",
                   help="the address other hosts reach this host's rpc-server, Ray head and SGLang rank 0 on "
                        "(default: the local address that routes to the Temporal server)")
    p.add_argument("--model-cache", help="where hub models are downloaded (default: DATA_DIR/models)")
    setting(p, "hf_endpoint")
    setting(p, "agent.metrics_address")
    p.add_argument("--keep-logs", type=_count, default=KEEP_LOGS, metavar="N",
                   help=f"keep the logs of the last N instances that ended on this host, for 'gpuflow logs' "
                        f"(default {KEEP_LOGS}; a running instance's log is always kept)")
    setting(p, "agent.kv_connectors", flag="--kv-connector", dest="kv_connectors", action="append", metavar="NAME",
            more="Repeatable.")
    setting(p, "agent.join_token_file", metavar="FILE")
    setting(p, "agent.join_token", metavar="TOKEN", more="Other local users can read a process's arguments: "
                                                        "prefer --join-token-file or the variable.")
    p.set_defaults(fn=cmd_agent, temporal=True)
