"""``gpuflow dev``: the whole system on one machine. The Temporal dev server (SQLite file in the
data directory, UI), one control-plane worker and host agents, each a child process; Ctrl-C
stops every process it started, the inference servers included. ``--demo`` adds simulated
hosts and deployments (gpuflow/demo/live.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from gpuflow.dev.serving import add_engine_flags, agent_engine_args, parse_gateway_port
from gpuflow.dev.temporal import DevServer
from gpuflow.ports import port_open, server_port
from gpuflow.settings import default_data_dir
from worker_agent.processes import ProcessTable


def with_own_bin(path: str) -> str:
    """``path`` with this environment's bin folder first (a venv's: its ``gpuflow`` and its
    python), so the stack's agents find them for a spec's command ('gpuflow standin ...') even
    where the shell that ran ``make demo`` never put the venv on its PATH."""
    own = os.path.dirname(sys.executable)
    rest = [p for p in path.split(os.pathsep) if p and p != own]
    return os.pathsep.join([own, *rest])


JOIN_S = 60.0  # gpuflow dev: how long it waits for its own host to join before it says it is up anyway


class Stack:
    """The processes of one gpuflow installation on this machine (also what the tests drive)."""

    def __init__(self, data_dir: str, port: int = 7233, ui_port: int | None = 8233, database_url: str | None = None,
                 env: dict[str, str] | None = None, temporal_args: list[str] | None = None,
                 metrics_defaults: bool = False):
        self.data_dir = os.path.abspath(data_dir)
        self.temporal = DevServer(os.path.join(self.data_dir, "temporal"), port=port, ui_port=ui_port,
                                  extra_args=temporal_args)
        self.env = {**os.environ, "GPUFLOW_TEMPORAL__ADDRESS": self.temporal.address,
                    "GPUFLOW_TEMPORAL__NAMESPACE": "default", "GPUFLOW_DATA_DIR": self.data_dir, **(env or {})}
        self.env["PATH"] = with_own_bin(self.env.get("PATH", ""))
        if database_url:
            self.env["GPUFLOW_DATABASE_URL"] = database_url
        self.database_url = database_url or f"sqlite:///{os.path.join(self.data_dir, 'gpuflow.db')}"
        self.servers: list[subprocess.Popen] = []
        self.gateways: dict[str, subprocess.Popen] = {}  # base URL -> its process
        self.agents: dict[str, subprocess.Popen] = {}
        self.metrics: dict[str, str] = {}  # process -> its Prometheus endpoint
        self.metrics_defaults = metrics_defaults  # first server on 9400, first agent on 9401, when free
        self.token: str | None = None  # the cluster's join token (join_token), once read from the store
        self.log_dir = os.path.join(self.data_dir, "logs")
        os.makedirs(self.log_dir, exist_ok=True)

    def _spawn(self, log_name: str, *args: str) -> subprocess.Popen:
        with open(os.path.join(self.log_dir, log_name), "ab") as out:
            return subprocess.Popen([sys.executable, "-m", "gpuflow", *args], env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def _metrics_port(self, default: int) -> str:
        taken = {a.rsplit(":", 1)[1] for a in self.metrics.values()}
        if self.metrics_defaults and str(default) not in taken and not port_open("127.0.0.1", default):
            return f"127.0.0.1:{default}"
        return f"127.0.0.1:{server_port()}"  # below the ephemeral range: another process binds it seconds later

    def start_temporal(self) -> None:
        self.temporal.start()

    def join_token(self) -> str:
        """The cluster's join token, read from this stack's store (its tables and the cluster's keys
        made first, before any process of the stack starts: store/host_credentials.py). The agents
        this stack starts find it in their environment (GPUFLOW_AGENT__JOIN_TOKEN), never in argv,
        which every local user can read; the stack's other processes hold the store anyway."""
        if self.token is None:
            from store import db, host_credentials

            engine = db.make_engine(self.database_url, schema=self.env.get("GPUFLOW_DATABASE_SCHEMA"))
            try:
                db.init_db(engine)
                self.token = host_credentials.join_token(engine)
            finally:
                engine.dispose()
            assert self.token is not None
            self.env["GPUFLOW_AGENT__JOIN_TOKEN"] = self.token
        return self.token

    def start_server(self) -> subprocess.Popen:
        self.join_token()  # the store made before the server reads it, and the token for the agents
        addr = self._metrics_port(9400)
        p = self._spawn(f"server-{len(self.servers)}.log", "server", "--metrics-address", addr)
        self.servers.append(p)
        self.metrics[f"server-{len(self.servers) - 1}"] = addr
        return p

    def start_agent(self, name: str, inventory: str | None = None, labels: dict[str, str] | None = None,
                    extra: list[str] | None = None, allow_custom: bool = True) -> subprocess.Popen:
        # the dev stack's agents serve its owner's own commands: custom run commands are on
        self.join_token()
        args = ["agent", "--name", name] + (["--allow-custom"] if allow_custom else []) + \
            (["--inventory", inventory] if inventory else [])
        addr = self._metrics_port(9401)
        args += ["--metrics-address", addr] + (extra or [])
        self.metrics[f"agent {name}"] = addr
        for k, v in (labels or {}).items():
            args += ["--label", f"{k}={v}"]
        p = self._spawn(f"agent-{name}.log", *args)
        self.agents[name] = p
        return p

    def wait_joined(self, name: str, timeout_s: float = JOIN_S, every_s: float = 0.2) -> str | None:
        """Until agent ``name`` (started by this stack) has joined and its host is READY in the
        store; None then, else why not (its process ended, or not within ``timeout_s``)."""
        from store import db, records

        engine = db.make_engine(self.database_url, schema=self.env.get("GPUFLOW_DATABASE_SCHEMA"))
        log = os.path.join(self.log_dir, f"agent-{name}.log")
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                if any(w.name == name and w.state == "ready" for w in records.workers(engine)):
                    return None
                if self.agents[name].poll() is not None:
                    return f"the agent {name} exited with code {self.agents[name].returncode}; its log: {log}"
                if time.monotonic() > deadline:
                    return f"host {name} has not joined within {timeout_s:g} s (it may still); its agent's log: {log}"
                time.sleep(every_s)
        finally:
            engine.dispose()

    def start_gateway(self, port: int, host: str = "127.0.0.1") -> str:
        """``gpuflow gateway`` on host:port against this stack's store; its base URL once it listens."""
        from gpuflow.dev.serving import gateway_argv, wait_listening
        from scheduler.errors import InvalidInput

        if port_open(host, port):
            raise InvalidInput(f"port {host}:{port} is already in use; pick another with --gateway-port (0: no gateway)")
        log = os.path.join(self.log_dir, f"gateway-{len(self.gateways)}.log")
        with open(log, "ab") as out:
            p = subprocess.Popen(gateway_argv(f"{host}:{port}", self.database_url, self.temporal.address,
                                          self.temporal.ui), env=self.env,
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        url = f"http://{host}:{port}/v1"
        self.gateways[url] = p
        why = wait_listening(p, host, port, log)
        if why:
            raise InvalidInput(why)
        return url

    def instance_processes(self, host: str) -> ProcessTable:
        return ProcessTable(os.path.join(self.data_dir, "agent", host))

    def kill_host(self, name: str, processes: bool = True) -> None:
        """A host vanishing: its agent and every process it runs die at once (SIGKILL). With
        ``processes=False`` only the agent dies (a network split, as the control plane sees it)."""
        p = self.agents.pop(name)
        _signal(p, signal.SIGKILL)
        p.wait()
        table = self.instance_processes(name)
        for r in table.records() if processes else []:
            table.signal_group(r.pid, signal.SIGKILL)

    def stop(self, kill: bool = False) -> None:
        """Stop every process the stack started: SIGTERM and a grace each (Ctrl-C on ``gpuflow
        dev``: an agent's worker lets its activities run for its own grace, 2 s, and the Temporal
        server shuts down), or, with ``kill``, SIGKILL at once: a test's teardown, where nothing
        is read after the stop and the graces cost about 3 s a stack."""
        sig = signal.SIGKILL if kill else signal.SIGTERM
        for p in list(self.gateways.values()) + list(self.agents.values()) + self.servers:
            _signal(p, sig)
        for p in list(self.gateways.values()) + list(self.agents.values()) + self.servers:
            _wait(p)
        self.gateways.clear()
        agent_root = os.path.join(self.data_dir, "agent")
        for host in os.listdir(agent_root) if os.path.isdir(agent_root) else []:
            table = self.instance_processes(host)
            for r in table.records():
                table.signal_group(r.pid, sig)
                table.forget(r.instance)
        self.agents.clear()
        self.servers.clear()
        self.temporal.stop(grace=0.0 if kill else 10.0)


def _signal(p: subprocess.Popen, sig: int) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass


def _wait(p: subprocess.Popen, grace: float = 10.0) -> None:
    try:
        p.wait(grace)
    except subprocess.TimeoutExpired:
        _signal(p, signal.SIGKILL)
        p.wait()


DEMO_MARK = ".gpuflow-demo"


def fresh_demo_dir(path: str) -> None:
    """The demo starts from a clean slate, in a directory only the demo uses."""
    import shutil

    from scheduler.errors import InvalidInput

    if os.path.isdir(path) and os.listdir(path):
        if not os.path.exists(os.path.join(path, DEMO_MARK)):
            raise InvalidInput(f"--data-dir {path} holds files that are not a previous demo's; "
                               "the demo starts from scratch, so give it an empty or new directory")
        shutil.rmtree(path)
    os.makedirs(path, exist_ok=True)
    open(os.path.join(path, DEMO_MARK), "w").close()


def start_line(data_dir: str, demo: bool) -> str:
    """What the stack keeps, said first: the demo starts empty every run; ``gpuflow dev`` keeps
    its keys, tenants, deployments and workflow history in its data dir across runs."""
    if demo:
        return (f"the demo starts empty: {data_dir} was cleared (keys, tenants, deployments, history). "
                f"To keep state across runs, use 'gpuflow dev' (data kept in "
                f"{os.path.join(default_data_dir(), 'dev')}, or --data-dir DIR)")
    return f"data: {data_dir} (kept across runs: keys, tenants, deployments, workflow history)"


def path_hint() -> str | None:
    """The line that puts this install's commands on PATH, when ``gpuflow`` is not found there."""
    import shutil

    here = os.path.dirname(sys.executable)
    if shutil.which("gpuflow") or not os.path.exists(os.path.join(here, "gpuflow")):
        return None
    return f"gpuflow is not on PATH; the commands below need, in each shell:  export PATH=\"{here}:$PATH\""


DEFAULT_PORT = 7233  # the Temporal dev server's


def cmd_dev(a) -> int:
    data_dir = a.data_dir or os.path.join(default_data_dir(), "demo" if a.demo else "dev")
    if a.demo:
        fresh_demo_dir(data_dir)
    print(start_line(data_dir, a.demo), flush=True)
    hint = path_hint()
    if hint:
        print(hint, flush=True)
    flags = list(getattr(a, "allow_engine_flag", None) or ())  # one operator here: the control plane allows them too
    # the stock stack serves metrics on 9400/9401 where free; one on other ports (a second stack, a
    # test) takes free ports: two stacks starting at once both saw 9400 free, and one server died on it
    stack = Stack(data_dir, port=a.port, ui_port=a.ui_port, metrics_defaults=a.port == DEFAULT_PORT,
                  env={"GPUFLOW_ALLOW_ENGINE_FLAGS": json.dumps(flags)} if flags else None)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored (`cmd &`)
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGHUP, interrupt)
    try:
        stack.start_temporal()
        print(f"Temporal dev server: {stack.temporal.address}  (UI {stack.temporal.ui}, data {stack.temporal.db})",
              flush=True)
        stack.start_server()
        engines = agent_engine_args(a)
        gateway = _gateway(stack, a.gateway_port)
        if a.demo:
            from gpuflow.demo.live import run_live_demo

            code = run_live_demo(stack, gateway, (a.agent_name, engines), stays_up=not a.exit_after_demo)
        else:
            code = 0
            stack.start_agent(a.agent_name, a.inventory, extra=engines)
            if "--llama-cpp-python" in engines:
                print(f"llama.cpp models run through this Python's llama-cpp-python ({sys.executable})", flush=True)
            # "up" once this machine's host has joined: a deploy sent at once (a script, 'deploy --wait')
            # found no host and was judged unschedulable ("Matched 0 workers"), exit 3
            why = stack.wait_joined(a.agent_name)
            if why:
                print(f"warning: {why}", flush=True)
        if code or (a.demo and a.exit_after_demo):
            return code  # the stack stops now: none of its addresses is printed
        for proc, addr in stack.metrics.items():
            print(f"Prometheus metrics of {proc}: http://{addr}/metrics", flush=True)
        if not a.demo:
            print(f"status: gpuflow status --address {stack.temporal.address}", flush=True)
            print(f"another host joins with the token 'gpuflow hosts join-token --data-dir {data_dir}' prints, in its "
                  "agent's GPUFLOW_AGENT__JOIN_TOKEN (or --join-token-file FILE)", flush=True)
        print("gpuflow dev is up; Ctrl-C stops every process it started.", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("\nstopping...", flush=True)
        return 0
    finally:
        stack.stop()


def _gateway(stack: Stack, port: int) -> str | None:
    """The gateway's base URL, printed; None (said why) when it is off or did not start: the rest
    of the stack runs without it."""
    from scheduler.errors import InvalidInput

    if not port:
        return None
    try:
        url = stack.start_gateway(port)
    except InvalidInput as e:
        print(f"no gateway: {e}", flush=True)
        return None
    print(f"OpenAI-compatible gateway: {url}  (a request's \"model\" is a deployment's name)", flush=True)
    print(f"web console: {url.removesuffix('/v1')}/console/", flush=True)
    return url


def add_command(sub) -> None:
    import socket

    p = sub.add_parser("dev", help="the embedded stack: Temporal dev server, control plane and a local agent")
    p.add_argument("--demo", action="store_true", help="add simulated hosts and deployments, print the result")
    p.add_argument("--exit-after-demo", action="store_true", help="stop everything once the demo has printed")
    p.add_argument("--data-dir", help="default ~/.local/share/gpuflow/dev (kept across runs), "
                                      "or .../demo with --demo (cleared at each demo)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--ui-port", type=int, default=8233)
    p.add_argument("--agent-name", default=socket.gethostname())
    p.add_argument("--inventory", help="simulated inventory for the local agent (default: NVML, else CPU only)")
    p.add_argument("--gateway-port", type=parse_gateway_port, default=8080,
                   help="the OpenAI-compatible gateway on 127.0.0.1:PORT (default 8080; 0 or off: none)")
    add_engine_flags(p)
    p.set_defaults(fn=cmd_dev, temporal=True)
