"""The CLI's cluster commands: server, agent, deploy, scale, delete, status, explain, hosts
(``dev`` lives in gpuflow/dev/__init__.py). Every command that talks to Temporal takes --address and
--namespace (and TLS / API-key options); the environment (GPUFLOW_TEMPORAL__*) gives defaults."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys

from gpuflow import files, ops
from gpuflow.render import cluster as render_cluster
from gpuflow.runtime import connect
from gpuflow.cli.connection import run_command, settings_from, temporal_flags
from scheduler.errors import InvalidInput
from worker_agent.log_reader import KEEP_LOGS


def cmd_server(a) -> int:
    from gpuflow.server import run_server

    return run_command(run_server(settings_from(a), metrics_address=a.metrics_address))


def cmd_agent(a) -> int:
    from gpuflow.server import until_signalled
    from worker_agent.agent import advertised_address, run_agent
    from worker_agent.downloads import HubConfig
    from worker_agent.engines import EngineConfig

    s = settings_from(a)
    bad = [kv for kv in a.label or [] if "=" not in kv or kv.startswith("=")]
    if bad:
        raise InvalidInput(f"--label takes KEY=VALUE, got {bad[0]!r}")
    labels = dict(kv.split("=", 1) for kv in a.label or [])
    from scheduler.spec_env import allow_pattern_problem

    for why in filter(None, map(allow_pattern_problem, a.allow_env or [])):
        raise InvalidInput(why)
    from scheduler.engine_flags import allow_flag_problem

    for why in filter(None, map(allow_flag_problem, a.allow_engine_flag or [])):
        raise InvalidInput(why)
    name = a.name or socket.gethostname()
    if a.inventory:  # a broken file is named now, not after a wait for an unreachable Temporal
        from worker_agent.inventory import from_file

        from_file(name, a.inventory)
    from gpuflow.cli.join import agent_credential

    credential = agent_credential(a, s, name)  # the host's own (made from the join token at its first start)

    async def go():
        from gpuflow.metrics_http import parse_address, sdk_runtime, serve

        addr = parse_address(a.metrics_address)
        runtime, sdk_addr = sdk_runtime() if addr else (None, None)
        client = await connect(s.temporal, wait_s=30, runtime=runtime)

        def serve_metrics(registry, extra):
            serve(addr, registry, sdk_addr, extra=extra)
            print(f"gpuflow agent {name}: metrics on http://{addr[0]}:{addr[1]}/metrics", flush=True)
        engines = EngineConfig(allow_custom=a.allow_custom, vllm=a.vllm, sglang_python=a.sglang_python,
                               llama_server=a.llama_server, llama_cpp_python=a.llama_cpp_python,
                               rpc_server=a.rpc_server, ray=a.ray, model_roots=tuple(a.model_root or ()),
                               allow_env=tuple(a.allow_env or ()), allow_remote_code=a.allow_remote_code,
                               allow_engine_flags=tuple(a.allow_engine_flag or ()), kv_events=a.kv_events)
        await run_agent(client, name, s.data_dir, s.timings, a.inventory, labels, stop=until_signalled(),
                        engines=engines, serve_metrics=serve_metrics if addr else None,
                        address=a.advertise_address or advertised_address(s.temporal.address),
                        hub=HubConfig(cache_dir=a.model_cache or os.path.join(s.data_dir, "models"),
                                      hf_endpoint=s.hf_endpoint), keep_logs=a.keep_logs, credential=credential)

    try:
        return run_command(go())
    finally:
        credential.close()


def cmd_deploy(a) -> int:
    """Deploy, say what changed (stdout) and warn of what the change undoes or replaces (stderr);
    with --wait, the verdict's exit code (gpuflow/deploy_wait.py)."""
    from gpuflow import deploy_report, deploy_wait

    s = settings_from(a)
    spec = files.load_spec(a.spec)
    if a.timeout is not None and not a.wait:
        raise InvalidInput("--timeout goes with --wait")

    async def go():
        client = await connect(s.temporal)
        before = await ops.current(client, spec.name)
        n, source = deploy_report.replicas_to_apply("replicas" in spec.model_fields_set, spec.replicas, a.replicas,
                                                    before.replicas if before else None)
        new = spec.model_copy(update={"replicas": n})
        view = await ops.deploy(client, new, s.timings, n)
        raw = new.model_dump(mode="json", exclude_none=True)
        said = deploy_report.report(view.name, before and {"spec": before.spec, "replicas": before.replicas},
                                    raw, view.replicas, source, before is not None and _rolls(before.spec, new))
        for line in said.warnings:
            print(line, file=sys.stderr, flush=True)
        print("\n".join(said.said), flush=True)
        if not a.wait:
            if said.said and "nothing changed" not in said.said[0]:
                for line in (await deploy_wait.first_look(client, view.name, LOOK_S)).lines:
                    print(f"warning: {line}", file=sys.stderr, flush=True)
            return 0
        v = await deploy_wait.wait(client, view.name, a.timeout or WAIT_S,
                                   lambda line: print(line, file=sys.stderr, flush=True))
        print("\n".join(v.lines), file=sys.stdout if v.code == 0 else sys.stderr, flush=True)
        return v.code

    return run_command(go())


WAIT_S = 300.0  # deploy --wait's default --timeout
LOOK_S = 10.0  # deploy without --wait: how long it looks for a replica no host can take, to say why (exit 0 stays)


def _rolls(old_raw: dict, new) -> bool:
    from scheduler.spec import ModelSpec
    from workflows.rollout_steps import rolls

    try:
        return rolls(ModelSpec.model_validate(old_raw), new)
    except ValueError:  # the running spec no longer validates here: a change, as the workflow sees it
        return True


def cmd_scale(a) -> int:
    s = settings_from(a)

    async def go():
        view = await ops.scale(await connect(s.temporal), a.name, a.replicas)
        print(f"deployment {view.name}: {view.replicas} replica(s) wanted")

    return run_command(go())


def cmd_delete(a) -> int:
    s = settings_from(a)

    async def go():
        def left(n: int) -> None:  # on stderr: stdout keeps the one line that says it is done
            print(f"deployment {a.name}: deleting, {n} instance(s) still stopping", file=sys.stderr, flush=True)

        view = await ops.delete(await connect(s.temporal), a.name, wait=a.wait, progress=left)
        if view.broken:
            print(f"deployment {view.name}: was broken ({view.broken}); its workflow was terminated and "
                  f"{len(view.instances)} instance(s) told to stop")
            return
        print(f"deployment {view.name}: " + ("deleted" if a.wait else "deleting"))

    return run_command(go())


def cmd_status(a) -> int:
    s = settings_from(a)

    async def go():
        from gpuflow.serving_view import add_reasons, add_serving, open_store, store_states

        # the store itself only when named (offline use); otherwise the control plane reads it
        store = open_store(s, True) if a.database_url or a.data_dir else None
        from gpuflow.cli.autoscale import add_status
        from gpuflow.cluster_client import add_serving as add_serving_through

        client = await connect(s.temporal)
        known = store_states(store) if a.summary and store is not None else None
        st = await ops.status(client, a.name, known_states=known)
        st = (add_reasons(add_serving(st, store, per_instance=not a.summary), store) if store is not None
              else await add_serving_through(client, st, per_instance=not a.summary))
        if not a.summary:  # the last lines of each ERROR replica's log, read on its host
            from gpuflow.status_logs import error_tails

            st = await error_tails(client, st)
        # one line per autoscaled deployment: queried only where its autoscaler can answer now, a
        # broken one (say, started by hand with a garbage input) reported at once with the reason
        asked = await ops.autoscalers(client, [d["name"] for d in st["deployments"] if not d.get("broken")])
        fine = [d for d in st["deployments"] if d["name"] in asked and asked[d["name"]] is None]
        auto = await add_status(client, {**st, "deployments": fine})
        for d in st["deployments"]:
            if asked.get(d["name"]):
                d["autoscaler"] = {"broken": asked[d["name"]]}
                auto += f"\nautoscaler {d['name']}: BROKEN: {asked[d['name']]}"
        print(json.dumps(st, indent=2) if a.json else render_cluster.status(st, a.summary) + auto)

    return run_command(go())


def cmd_explain(a) -> int:
    s = settings_from(a)
    if a.history or a.replay or a.snapshot:
        from gpuflow.cli.explain import cmd_audit

        return cmd_audit(a, s)

    async def go():
        from gpuflow import cluster_client
        from gpuflow.serving_view import open_store, pending_reason

        client = await connect(s.temporal)
        d = await ops.explain(client, a.instance)
        now = None
        if d.get("state") == "pending":  # the store itself only when named (offline use), else through the control plane
            now = pending_reason(open_store(s, True), a.instance) if a.database_url or a.data_dir \
                else await cluster_client.pending_reason(client, a.instance)
        if now:  # what status and queue show: the queue keeps it current
            d["now"] = now
        from gpuflow.render.explain import explain

        print(json.dumps(d, indent=2) if a.json else explain(d))

    return run_command(go())


def cmd_hosts(a) -> int:
    s = settings_from(a)
    if a.action == "join-token":
        if a.names:
            raise InvalidInput("gpuflow hosts join-token takes no host names")
        from gpuflow.cli.join import print_join_token

        return print_join_token(s)
    if a.action and not a.names:
        raise InvalidInput(f"gpuflow hosts {a.action} needs the names of the hosts to {a.action}")
    if a.reason is not None and a.action != "cordon":
        raise InvalidInput("--reason goes with 'gpuflow hosts cordon HOST'")

    async def act():
        client = await connect(s.temporal)
        for name in a.names:
            print(await ops.forget_host(client, name) if a.action == "forget"
                  else await ops.cordon(client, name, a.action == "cordon", a.reason or ""))

    if a.action:
        return run_command(act())

    async def go():
        hs = await ops.hosts(await connect(s.temporal))
        out = [h.model_dump(mode="json") for h in hs]
        print(json.dumps(out, indent=2) if a.json else render_cluster.hosts(out))

    return run_command(go())


def cmd_logs(a) -> int:
    from gpuflow.server import until_signalled

    s = settings_from(a)

    async def go():
        # Ctrl-C (or SIGTERM) ends --follow between reads. asyncio's own handling would cancel the
        # task instead, and a cancellation landing inside the Temporal client's polling can be lost.
        stop = until_signalled()
        client = await connect(s.temporal)
        worker = await ops.log_host(client, a.instance)
        chunk = await ops.read_log(client, a.instance, offset=-a.bytes, worker=worker)
        if not chunk.found:
            raise InvalidInput(f"host {worker} has no log of {a.instance}: not started yet, or dropped (an agent keeps "
                               f"the logs of the last --keep-logs instances that ended there)")
        while True:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            if not chunk.more:  # caught up: done, or wait for more
                if not a.follow:
                    break
                try:
                    await asyncio.wait_for(stop.wait(), 1.0)
                    break
                except asyncio.TimeoutError:
                    pass
            chunk = await ops.read_log(client, a.instance, offset=chunk.offset, worker=worker)

    try:
        return run_command(go())
    except KeyboardInterrupt:
        return 0


def _count(v: str) -> int:
    if not v.isdigit() or int(v) > 1_000_000:
        raise argparse.ArgumentTypeError(f"a whole number from 0 to 1000000, got {v!r}")
    return int(v)


def _positive(v: str) -> int:
    if not v.isdigit() or int(v) < 1:
        raise argparse.ArgumentTypeError(f"a number of bytes >= 1, got {v!r}")
    return int(v)


def _seconds(v: str) -> float:
    try:
        f = float(v)
    except ValueError:
        f = -1.0
    if not 0 < f <= 86400:
        raise argparse.ArgumentTypeError(f"seconds, more than 0 and at most 86400, got {v!r}")
    return f


def add_commands(sub) -> None:
    p = sub.add_parser("logs", help="an instance's output, read on its host")
    temporal_flags(p)
    p.add_argument("instance", help="an instance, or one of its helper processes (INSTANCE@rpc0, INSTANCE@ray-head; "
                                    "see 'gpuflow status --json')")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new output (Ctrl-C ends)")
    p.add_argument("--bytes", type=_positive, default=8192, help="how much of the end to show first (default 8192)")
    p.set_defaults(fn=cmd_logs, temporal=True)

    p = sub.add_parser("server", help="run a control-plane worker (workflows and control activities)")
    temporal_flags(p)
    p.add_argument("--data-dir")
    p.add_argument("--database-url", help="SQLAlchemy URL (default: SQLite file in the data dir; or GPUFLOW_DATABASE_URL)")
    p.add_argument("--metrics-address", default="127.0.0.1:9400", help="Prometheus endpoint HOST:PORT, or off")
    p.add_argument("--capacity-hook", help="command or http(s) URL told the demand the autoscaler cannot place "
                   "(JSON; or GPUFLOW_CAPACITY_HOOK)")
    p.add_argument("--hf-endpoint", help="a Hugging Face mirror for estimating hub models from their headers "
                                         "(default: GPUFLOW_HF_ENDPOINT, else HF_ENDPOINT, else huggingface.co)")
    p.set_defaults(fn=cmd_server, temporal=True)

    p = sub.add_parser("agent", help="run the host agent (a Temporal worker on gpuflow-host-<name>)")
    temporal_flags(p)
    p.add_argument("--name", help="host name (default: this machine's hostname)")
    p.add_argument("--inventory", help="simulated inventory file (YAML/JSON); without it NVML is asked")
    p.add_argument("--label", action="append", help="KEY=VALUE worker label (repeatable)")
    p.add_argument("--data-dir")
    p.add_argument("--allow-custom", action="store_true",
                   help="run custom backends' run_command (off by default: it runs any program)")
    p.add_argument("--allow-env", action="append", metavar="PATTERN",
                   help="also let specs set these env variables (a name, or a prefix ending in '*'; repeatable); "
                        "gpuflow's own variables stay off limits")
    p.add_argument("--allow-remote-code", action="store_true",
                   help="let specs pass --trust-remote-code and other flags that run code from the model's files "
                        "or import it by name (--worker-extension-cls, --middleware, ...; off by default)")
    p.add_argument("--allow-engine-flag", action="append", metavar="FLAG",
                   help="also let specs pass this engine flag, spelled exactly, with any value (repeatable; beyond "
                        "each engine's list in docs/formats.md); flags gpuflow sets and flags that fetch from the "
                        "network stay refused")
    p.add_argument("--kv-events", action="store_true",
                   help="start vLLM and SGLang publishing their KV-cache events on a port picked here, for the "
                        "gateways' cache-aware routing (off by default: the engines bind it on every interface and "
                        "it carries every prompt's token ids; docs/routing.md)")
    p.add_argument("--vllm", default="vllm", help="the vllm executable (default: vllm on PATH)")
    p.add_argument("--sglang-python", default="python3", help="the Python that has sglang installed")
    p.add_argument("--llama-server", default="llama-server", help="the llama-server executable")
    p.add_argument("--llama-cpp-python", help="serve llama.cpp models with this Python's llama-cpp-python[server] "
                                               "instead of llama-server")
    p.add_argument("--rpc-server", default="rpc-server",
                   help="llama.cpp's rpc-server, run when a placement lends this host's GPUs over RPC")
    p.add_argument("--ray", default="ray", help="the ray executable, for vLLM across several hosts")
    p.add_argument("--advertise-address",
                   help="the address other hosts reach this host's rpc-server, Ray head and SGLang rank 0 on "
                        "(default: the local address that routes to the Temporal server)")
    p.add_argument("--model-cache", help="where hub models are downloaded (default: DATA_DIR/models)")
    p.add_argument("--hf-endpoint",
                   help="a Hugging Face mirror (default: GPUFLOW_HF_ENDPOINT, else HF_ENDPOINT, else huggingface.co)")
    p.add_argument("--metrics-address", default="127.0.0.1:9401", help="Prometheus endpoint HOST:PORT, or off")
    p.add_argument("--keep-logs", type=_count, default=KEEP_LOGS, metavar="N",
                   help=f"keep the logs of the last N instances that ended on this host, for 'gpuflow logs' "
                        f"(default {KEEP_LOGS}; a running instance's log is always kept)")
    p.add_argument("--model-root", action="append",
                   help="a directory model files may come from (repeatable); paths outside every root are refused")
    p.add_argument("--join-token-file", metavar="FILE",
                   help="a file holding the cluster's join token ('gpuflow hosts join-token' prints it; or "
                        "GPUFLOW_AGENT__JOIN_TOKEN), needed at this host's first start only: the agent then keeps a "
                        "credential of its own in its data dir")
    p.add_argument("--join-token", metavar="TOKEN",
                   help="the join token itself (other local users can read a process's arguments: prefer "
                        "--join-token-file or GPUFLOW_AGENT__JOIN_TOKEN)")
    p.set_defaults(fn=cmd_agent, temporal=True)

    p = sub.add_parser("deploy", help="create or update a deployment from a model spec")
    temporal_flags(p)
    p.add_argument("spec", help="model spec (YAML or JSON)")
    p.add_argument("--replicas", type=int, help="the replica count (default: the file's replicas; a file that "
                                                 "names none keeps a running deployment's count)")
    p.add_argument("--wait", action="store_true",
                   help="return once every replica is RUNNING (exit 0), one is ERROR (1) or cannot be placed (3)")
    p.add_argument("--timeout", type=_seconds, help=f"with --wait: give up after this many seconds, exit 1 "
                                                    f"(default {WAIT_S:g})")
    p.set_defaults(fn=cmd_deploy, temporal=True)

    p = sub.add_parser("scale", help="change a deployment's replicas")
    temporal_flags(p)
    p.add_argument("name")
    p.add_argument("replicas", type=int)
    p.set_defaults(fn=cmd_scale, temporal=True)

    p = sub.add_parser("delete", help="stop a deployment's instances and remove it")
    temporal_flags(p)
    p.add_argument("name")
    p.add_argument("--wait", action="store_true", help="return once every instance has stopped")
    p.set_defaults(fn=cmd_delete, temporal=True)

    p = sub.add_parser("status", help="deployments with their instances, and hosts")
    temporal_flags(p)
    p.add_argument("name", nargs="?", help="one deployment (without it: every deployment, the gateways and the hosts)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--summary", action="store_true", help="counts by state, not a row per instance and host")
    p.add_argument("--data-dir", help="offline use: read in-flight counts, gateways and PENDING reasons from the "
                                      "store's SQLite file in this directory, not through the control plane")
    p.add_argument("--database-url", help="offline use: read them from this store (a SQLAlchemy URL), not through "
                                          "the control plane")
    p.set_defaults(fn=cmd_status, temporal=True)

    p = sub.add_parser("explain", help="the recorded placement decision of an instance; --replay: would this build "
                                       "decide the same; --history: a deployment's decisions")
    temporal_flags(p)
    p.add_argument("instance", help="an instance (a deployment, with --history)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--replay", action="store_true",
                   help="re-run the decision with this build's policy on the inputs the control plane kept, and "
                        "say whether it decides the same (exit 0) or differently (exit 1, with the differences)")
    p.add_argument("--decision", metavar="INPUTS", help="with --replay/--snapshot: the decision whose inputs' digest "
                                                        "starts so (from --history; default: the latest)")
    p.add_argument("--snapshot", metavar="FILE", help="write the cluster the decision saw as a cluster file (and "
                                                      "its spec beside it), for 'gpuflow schedule --cluster FILE'")
    p.add_argument("--with-settings", action="store_true",
                   help="with --replay: the scorer weights of this process's settings (GPUFLOW_SCHEDULER__*), not "
                        "the recorded ones: would a change of weights decide differently")
    p.add_argument("--history", action="store_true", help="the deployment's decisions over time, each with its "
                                                          "inputs' digest")
    p.add_argument("--limit", type=int, default=200, help="with --history: the last this many (default 200)")
    p.add_argument("--data-dir", help="where the store's SQLite file is, for a PENDING instance's current reason "
                                      "and the kept decisions (--replay, --history)")
    p.add_argument("--database-url", help="the store (default: SQLite in the data dir, read when it exists)")
    p.set_defaults(fn=cmd_explain, temporal=True)

    p = sub.add_parser("hosts", help="hosts with their state and GPUs; 'hosts forget HOST': one gone for good; "
                                     "'hosts cordon HOST': no new replicas there; 'hosts join-token': the token "
                                     "a new host joins with",
                       description="List the hosts, or forget hosts that are gone for good: a NOT_READY host "
                                   "that holds no reservation leaves the store and the listing (its agent, if it "
                                   "ever says hello again, brings it back). Cordon a host: no new replica is "
                                   "placed there while the replicas running there keep running; uncordon it: "
                                   "it takes new replicas again, PENDING ones first. Print the cluster's join token "
                                   "(read from the store: --data-dir/--database-url): a new host's agent needs it "
                                   "at its first start.")
    temporal_flags(p)
    p.add_argument("action", nargs="?", choices=["forget", "cordon", "uncordon", "join-token"],
                   metavar="forget|cordon|uncordon|join-token",
                   help="forget, cordon or uncordon the HOSTs named, or print the join token (without it: list "
                        "every host)")
    p.add_argument("names", nargs="*", metavar="HOST", help="a host name, as 'gpuflow hosts' lists it")
    p.add_argument("--reason", help="with cordon: why, shown beside the host (at most 200 characters: letters, "
                                    "digits, spaces and .,:;_()#@+=/'-)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--data-dir", help="with join-token: the store's SQLite file gpuflow.db in this directory")
    p.add_argument("--database-url", help="with join-token: the store's SQLAlchemy URL")
    p.set_defaults(fn=cmd_hosts, temporal=True)
