"""The CLI's cluster commands: deploy, scale, delete, status, explain, hosts, logs (``server`` and
``agent``: gpuflow/cli/agent.py; ``dev``: gpuflow/dev/__init__.py). Every command that talks to
Temporal takes --address and --namespace (and TLS / API-key options); the environment
(GPUFLOW_TEMPORAL__*) gives defaults. Flags that set a setting are made from it (gpuflow/cli/flags.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from gpuflow import files, ops
from views.render import cluster as render_cluster
from gpuflow.runtime import connect
from gpuflow.cli.agent import add_agent, add_server
from gpuflow.cli.connection import run_command, settings_from, temporal_flags
from gpuflow.cli.flags import setting
from scheduler.errors import InvalidInput
from scheduler.groups.spec import RoleName, gather_problems


def cmd_deploy(a) -> int:
    """Deploy, say what changed (stdout) and warn of what the change undoes or replaces (stderr);
    with --wait, the verdict's exit code (gpuflow/deploy_wait.py)."""
    from gpuflow import deploy_look, deploy_report, deploy_wait

    s = settings_from(a)
    spec = files.load_spec(a.spec)
    if a.timeout is not None and not a.wait:
        raise InvalidInput("--timeout goes with --wait")

    # a live cluster's layers are the vocabulary's (zone, rack, host): a gather layer outside them is refused here
    problems = gather_problems(spec.gather, []) if spec.is_group else []
    if problems:
        raise InvalidInput("; ".join(problems))
    if spec.is_group and a.replicas not in (None, 0, 1):
        raise InvalidInput("--replicas: a prefill/decode group takes 0 (off) or 1 (on); its size is its roles' "
                           "replicas (roles[].replicas in the file, or gpuflow scale NAME N --role ROLE)")
    if spec.is_group and a.replicas is not None:  # off or on: the group's own replicas, its roles' kept
        spec = spec.model_copy(update={"replicas": a.replicas})

    async def go():
        client = await connect(s.temporal)
        before = await ops.current(client, spec.name)
        if spec.is_group:  # its size is its roles' replicas: no count is passed, none compared
            new, n, source = spec, None, "its roles"
        else:
            n, source = deploy_report.replicas_to_apply("replicas" in spec.model_fields_set, spec.replicas, a.replicas,
                                                        before.replicas if before else None)
            new = spec.model_copy(update={"replicas": n})
        view = await ops.deploy(client, new, None, n)  # the cluster's timings (its control plane's), not this env's
        raw = new.model_dump(mode="json", exclude_none=True)
        was = before and {"spec": before.spec, "replicas": before.replicas,
                          "members": len(set(before.instances) | set(before.stopping))}
        said = deploy_report.report(view.name, was,
                                    raw, view.replicas, source, before is not None and _rolls(before.spec, new))
        for line in said.warnings:
            print(line, file=sys.stderr, flush=True)
        print("\n".join(said.said), flush=True)
        if not a.wait:
            if said.said and "nothing changed" not in said.said[0]:
                if spec.is_group:  # its members' count is its roles' (the status says it)
                    lines = (await deploy_wait.first_look(client, view.name, LOOK_S)).lines
                else:  # from visibility, the full status only when placing stalls (issue 37)
                    lines = await deploy_look.first_look(client, view.name, view.replicas or 0, LOOK_S)
                for line in lines:
                    print(f"warning: {line}", file=sys.stderr, flush=True)
            return 0
        v = await deploy_wait.wait(client, view.name, a.timeout or WAIT_S,
                                   lambda line: print(line, file=sys.stderr, flush=True))
        print("\n".join(v.lines), file=sys.stdout if v.code == 0 else sys.stderr, flush=True)
        return v.code

    return run_command(go())


WAIT_S = 300.0  # deploy --wait's default --timeout
LOG_BYTES = 8192  # logs: how much of the end it shows first
HISTORY_LIMIT = 200  # explain --history: the last this many decisions
LOOK_S = 10.0  # deploy without --wait: how long it looks for a replica no host can take, to say why (exit 0 stays)


def _rolls(old_raw: dict, new) -> bool:
    from scheduler.spec import ModelSpec
    from workflows.group_steps import restarts_group
    from workflows.rollout_steps import rolls

    if new.is_group or old_raw.get("roles"):  # any change but roles[].replicas replaces members (scheduler/groups/compat.py)
        return restarts_group(old_raw, new.model_dump(mode="json", exclude_none=True))
    try:
        return rolls(ModelSpec.model_validate(old_raw), new)
    except ValueError:  # the running spec no longer validates here: a change, as the workflow sees it
        return True


def cmd_scale(a) -> int:
    s = settings_from(a)

    async def go():
        if a.role:  # one role of a prefill/decode group; its other members keep running
            from gpuflow import group_ops  # here: no other command needs it (issue 37: a deploy's start)

            view = await group_ops.scale_role(await connect(s.temporal), a.name, a.role, a.replicas)
            wanted = ", ".join(f"{r.name.value} {r.replicas}" for r in group_ops.roles_of(view.spec))
            print(f"deployment {view.name}: {a.role} {a.replicas} replica(s) wanted (roles: {wanted})")
            return
        view = await ops.scale(await connect(s.temporal), a.name, a.replicas)
        if view.spec.get("roles"):  # a group: 0 off, 1 on (the workflow refuses any other count)
            print(f"deployment {view.name}: the group is " + ("off: every member stops, its roles kept" if a.replicas == 0
                                                             else f"on: {view.replicas} member(s) wanted"))
            return
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
        try:
            d = await ops.explain(client, a.instance)
        except InvalidInput:  # no instance workflow: a group's member whose group has not formed?
            from gpuflow.cli.explain import kept_member

            d = await kept_member(client, s, a)
            if d is None:
                raise
        now = None
        if d.get("state") == "pending":  # the store itself only when named (offline use), else through the control plane
            now = pending_reason(open_store(s, True), a.instance) if a.database_url or a.data_dir \
                else await cluster_client.pending_reason(client, a.instance)
        if now:  # what status and queue show: the queue keeps it current
            d["now"] = now
        from views.render.explain import explain

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
    from gpuflow import instance_logs
    from gpuflow.server import until_signalled

    s = settings_from(a)

    async def go():
        # Ctrl-C (or SIGTERM) ends --follow between reads. asyncio's own handling would cancel the
        # task instead, and a cancellation landing inside the Temporal client's polling can be lost.
        stop = until_signalled()
        client = await connect(s.temporal)
        worker = await instance_logs.log_host(client, a.instance)
        chunk = await instance_logs.read_log(client, a.instance, offset=-a.bytes, worker=worker)
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
            chunk = await instance_logs.read_log(client, a.instance, offset=chunk.offset, worker=worker)

    try:
        return run_command(go())
    except KeyboardInterrupt:
        return 0


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
    for add in (add_logs, add_server, add_agent, add_deploy, add_scale, add_delete, add_status, add_explain,
                add_hosts):
        add(sub)


def add_logs(sub) -> None:
    p = sub.add_parser("logs", help="an instance's output, read on its host")
    temporal_flags(p)
    p.add_argument("instance", help="an instance, or one of its helper processes (INSTANCE@rpc0, INSTANCE@ray-head; "
                                    "see 'gpuflow status --json')")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new output (Ctrl-C ends)")
    p.add_argument("--bytes", type=_positive, default=LOG_BYTES, help=f"how much of the end to show first (default {LOG_BYTES})")
    p.set_defaults(fn=cmd_logs, temporal=True)


def add_deploy(sub) -> None:
    p = sub.add_parser("deploy", help="create or update a deployment from a model spec")
    temporal_flags(p)
    p.add_argument("spec", help="model spec (YAML or JSON)")
    p.add_argument("--replicas", type=int, help="the replica count (default: the file's replicas; a file that "
                                                 "names none keeps a running deployment's count; a prefill/decode group: 0 off, 1 on)")
    p.add_argument("--wait", action="store_true",
                   help="return once every replica is RUNNING (exit 0), one is ERROR (1) or cannot be placed (3)")
    p.add_argument("--timeout", type=_seconds, help=f"with --wait: give up after this many seconds, exit 1 "
                                                    f"(default {WAIT_S:g})")
    p.set_defaults(fn=cmd_deploy, temporal=True)


def add_scale(sub) -> None:
    p = sub.add_parser("scale", help="change a deployment's replicas (or one role's, with --role)")
    temporal_flags(p)
    p.add_argument("name")
    p.add_argument("replicas", type=int, help="the replica count; a prefill/decode group without --role: 0 switches it "
                                              "off (every member stops, its roles kept), 1 on (formed whole again)")
    p.add_argument("--role", choices=[r.value for r in RoleName],
                   help="a prefill/decode group: change this role's replicas only; no other member restarts")
    p.set_defaults(fn=cmd_scale, temporal=True)


def add_delete(sub) -> None:
    p = sub.add_parser("delete", help="stop a deployment's instances and remove it")
    temporal_flags(p)
    p.add_argument("name")
    p.add_argument("--wait", action="store_true", help="return once every instance has stopped and its workflow has closed")
    p.set_defaults(fn=cmd_delete, temporal=True)


def add_status(sub) -> None:
    p = sub.add_parser("status", help="deployments with their instances, and hosts")
    temporal_flags(p)
    p.add_argument("name", nargs="?", help="one deployment (without it: every deployment, the gateways and the hosts)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--summary", action="store_true", help="counts by state, not a row per instance and host")
    setting(p, "data_dir", help="offline use: read in-flight counts, gateways and PENDING reasons from the store's "
                                "SQLite file in this directory, not through the control plane")
    setting(p, "database_url", help="offline use: read them from this store (a SQLAlchemy URL), not through the "
                                    "control plane")
    p.set_defaults(fn=cmd_status, temporal=True)


def add_explain(sub) -> None:
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
    p.add_argument("--limit", type=int, default=HISTORY_LIMIT,
                   help=f"with --history: the last this many (default {HISTORY_LIMIT})")
    setting(p, "data_dir", help="where the store's SQLite file is, for a PENDING instance's current reason and the "
                                "kept decisions (--replay, --history)")
    setting(p, "database_url", help="the store (default: SQLite in the data dir, read when it exists)")
    p.set_defaults(fn=cmd_explain, temporal=True)


HOSTS_WHAT = ("List the hosts, or forget hosts that are gone for good: a NOT_READY host that holds no reservation "
              "leaves the store and the listing (its agent, if it ever says hello again, brings it back). Cordon a "
              "host: no new replica is placed there while the replicas running there keep running; uncordon it: it "
              "takes new replicas again, PENDING ones first. Print the cluster's join token (read from the store: "
              "--data-dir/--database-url): a new host's agent needs it at its first start.")


def add_hosts(sub) -> None:
    p = sub.add_parser("hosts", help="hosts with their state and GPUs; 'hosts forget HOST': one gone for good; "
                                     "'hosts cordon HOST': no new replicas there; 'hosts join-token': the token "
                                     "a new host joins with", description=HOSTS_WHAT)
    temporal_flags(p)
    p.add_argument("action", nargs="?", choices=["forget", "cordon", "uncordon", "join-token"],
                   metavar="forget|cordon|uncordon|join-token",
                   help="forget, cordon or uncordon the HOSTs named, or print the join token (without it: list "
                        "every host)")
    p.add_argument("names", nargs="*", metavar="HOST", help="a host name, as 'gpuflow hosts' lists it")
    p.add_argument("--reason", help="with cordon: why, shown beside the host (at most 200 characters: letters, "
                                    "digits, spaces and .,:;_()#@+=/'-)")
    p.add_argument("--json", action="store_true")
    setting(p, "data_dir", help="with join-token: the store's SQLite file gpuflow.db in this directory")
    setting(p, "database_url", help="with join-token: the store's SQLAlchemy URL")
    p.set_defaults(fn=cmd_hosts, temporal=True)
