"""Instance processes on this host: argv built without a shell, started in their own session,
recorded in a pid file per instance (so a restarted agent adopts what is still running), output
appended to a log file per instance, stopped by process group (SIGTERM, grace, SIGKILL).

An engine starts with a clean environment: ``base_env()`` (the few variables of the agent's own
that programs need to run at all), then the spec's allowed env, then gpuflow's own variables (GPU
visibility, RAY_ADDRESS). Nothing else of the agent's environment reaches it."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from scheduler.errors import InvalidInput
from scheduler.naming import path_in
from worker_agent.engine_key import read_redacted

PLACEHOLDERS = ("{port}", "{host}", "{model_path}", "{gpu_indexes}", "{kv_events_port}", "{api_key}", "{pd_role}",
                "{kv_port}", "{bootstrap_port}")


@dataclass(frozen=True)
class PDWords:
    """A prefill/decode member's placeholders (worker_agent/pd_argv.py): ``{pd_role}`` (prefill or
    decode; "" for a router or a plain replica), ``{kv_port}`` and ``{bootstrap_port}`` (ports the
    agent picked because the command names them; "" when none)."""

    pd_role: str | None = None
    kv_port: int | None = None
    bootstrap_port: int | None = None


def build_argv(run_command: str, port: int | None, model_path: str | None, gpu_indexes: list[int],
               host: str = "127.0.0.1", kv_events_port: int | None = None, api_key: str | None = None,
               pd: PDWords = PDWords()) -> list[str]:
    """Split ``run_command`` like a POSIX shell would (quotes honoured, nothing expanded) and
    substitute the placeholders inside each word. The result is exec'd directly. ``{api_key}`` is
    the replica's engine key (worker_agent/engine_key.py): in the argv, where any local user can
    read it (/proc/PID/cmdline); the table records and logs the argv with the placeholder instead."""
    try:
        words = shlex.split(run_command)
    except ValueError as e:
        raise InvalidInput(f"run_command {run_command!r}: {e}") from None
    if not words:
        raise InvalidInput("run_command is empty")

    def text(v: int | None) -> str:
        return "" if v is None else str(v)
    values = {"{port}": text(port), "{model_path}": model_path or "",
              "{gpu_indexes}": ",".join(map(str, gpu_indexes)), "{host}": host,
              "{kv_events_port}": text(kv_events_port), "{api_key}": api_key or "", "{pd_role}": pd.pd_role or "",
              "{kv_port}": text(pd.kv_port), "{bootstrap_port}": text(pd.bootstrap_port)}
    out = []
    for w in words:
        for k, v in values.items():
            w = w.replace(k, v)
        out.append(w)
    return out


# From the agent's own environment (its operator's): where programs are found (engines are looked
# up on the agent's PATH), the user's home and locale (caches and text decoding), the temporary
# folder, and where CUDA's libraries and toolkit are (containers set these; JIT kernels need
# CUDA_HOME). None of these can come from a spec (scheduler/spec_env.py OWNED).
BASE_NAMES = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "CUDA_HOME")


def base_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    out = {k: v for k, v in environ.items() if k in BASE_NAMES or k.startswith("LC_")}
    out.setdefault("PATH", os.defpath)
    return out


def launch_env(env: dict[str, str], environ: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a launch: ``env`` (the allowed spec env and gpuflow's variables)
    over the base, with no base name taken from ``env``."""
    base = base_env(environ)
    return {**{k: v for k, v in env.items() if k not in BASE_NAMES and not k.startswith("LC_")}, **base}


HANDED_OUT_S = 900.0  # a port given to a launch is not given again for this long (past ready_timeout_s)
_handed_out: dict[int, float] = {}  # port -> when (monotonic): this process's launches


def free_port(now: float | None = None) -> int:
    """A port free now, and not handed to another launch of this process in the last HANDED_OUT_S.
    The kernel hands out a released port again, and a server binds its port only once it has started
    (seconds later for a real engine, ``--start-delay`` for a simulated one): without the memory, two
    launches close together could both get it. A simulator's hundred hosts share one process, and
    500 launches in a burst met that way (one listener failed with 'address already in use')."""
    now = time.monotonic() if now is None else now
    while _handed_out:  # oldest first (insertion order): drop what has passed the window
        port, at = next(iter(_handed_out.items()))
        if now - at <= HANDED_OUT_S:
            break
        del _handed_out[port]
    for _ in range(64):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out[port] = now
            return port
    raise OSError(f"no free port that this process has not handed out in the last {HANDED_OUT_S:g} s")


def free_ports(n: int, now: float | None = None) -> int:
    """The first of ``n`` consecutive ports, each free now and not handed out lately (``free_port``'s
    memory): an engine that binds base + rank for each of its ranks (vLLM's NIXL side channel)."""
    if n <= 1:
        return free_port(now)
    now = time.monotonic() if now is None else now
    for _ in range(64):
        base = free_port(now)
        rest = range(base + 1, base + n)
        if base + n - 1 <= 65535 and all(p not in _handed_out and _bindable(p) for p in rest):
            _handed_out.update({p: now for p in rest})
            return base
    raise OSError(f"no {n} consecutive free ports")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def visibility_env(vendor: str, gpu_indexes: list[int]) -> dict[str, str]:
    """The placement's GPUs, by the indexes the inventory reported. NVML numbers NVIDIA cards in
    PCI bus order while CUDA's default is fastest first, so CUDA is told to count as NVML does:
    on a host with mixed cards, index 1 is then the same card for both."""
    ids = ",".join(map(str, gpu_indexes))
    if vendor == "amd":
        return {"ROCR_VISIBLE_DEVICES": ids}
    return {"CUDA_VISIBLE_DEVICES": ids, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def pid_alive(pid: int) -> bool:
    """Whether any process (ours or not) ``pid`` still runs; a zombie counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@dataclass
class Record:
    instance: str
    pid: int
    port: int | None
    argv: list[str]
    log: str
    started_at: float = field(default_factory=time.time)
    kv_events_port: int | None = None  # where its engine publishes KV-cache events (engines.py kv_events_config)
    key_id: str | None = None  # its engine key's nonce (engine_key.py): an adopted process keeps its key
    bootstrap_port: int | None = None  # its engine's KV hand-off port (pd_argv.py): an adopted process reports it again


class ProcessTable:
    runs = "processes"  # what a launch starts (contracts/host.py HostReport.runs); simulated: "nothing"

    def __init__(self, data_dir: str):
        self.run_dir = os.path.join(data_dir, "run")
        self.log_dir = os.path.join(data_dir, "logs")
        os.makedirs(self.run_dir, exist_ok=True)
        os.makedirs(self.log_dir, exist_ok=True)
        self.children: dict[int, subprocess.Popen] = {}
        self.poll_s = 1.0  # how often wait_exit looks at a real process
        # process key -> when (monotonic) the ledger last said it is booked here (the launch's booking
        # check, the orphan check): a booking that goes away is wound down, not cut (reconcile.py)
        self.booked_at: dict[str, float] = {}

    def _pidfile(self, instance: str) -> str:
        return path_in(self.run_dir, instance, ".json")

    def log_path(self, instance: str) -> str:
        return path_in(self.log_dir, instance, ".log")

    def secret_path(self, instance: str) -> str:
        """Where a launch's secret file is (SGLang's engine key: engine_key.py), beside its pid file."""
        return path_in(self.run_dir, instance, ".key.yaml")

    def start(self, instance: str, argv: list[str], env: dict[str, str], port: int | None,
              kv_events_port: int | None = None, key_id: str | None = None, secret: str | None = None,
              bootstrap_port: int | None = None) -> Record:
        """Start ``argv`` with ``env`` over the base environment (never over the agent's own).
        ``secret`` (the engine key) is never written: the log and the record (whose argv reaches
        the workflow's history) show ``{api_key}`` where an argv word holds it."""
        log = self.log_path(instance)
        shown = hide(argv, secret)
        with open(log, "ab") as out:
            out.write(f"--- gpuflow: starting {shlex.join(shown)}\n".encode())
            out.flush()
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 env=launch_env(env), start_new_session=True, close_fds=True)
        self.children[p.pid] = p
        rec = Record(instance, p.pid, port, shown, log, kv_events_port=kv_events_port, key_id=key_id,
                     bootstrap_port=bootstrap_port)
        tmp = self._pidfile(instance) + ".tmp"
        with open(tmp, "w") as f:
            json.dump(asdict(rec), f)
        os.replace(tmp, self._pidfile(instance))
        return rec

    def find(self, instance: str) -> Record | None:
        """The record of ``instance``; None when there is none (a key that is not a name has none)."""
        try:
            with open(self._pidfile(instance)) as f:
                return Record(**json.load(f))
        except (OSError, ValueError, TypeError, InvalidInput):
            return None

    def records(self) -> list[Record]:
        out = []
        for fn in sorted(os.listdir(self.run_dir)):
            if fn.endswith(".json"):
                r = self.find(fn[:-5])  # None for a file this table did not write
                if r:
                    out.append(r)
        return out

    def owner(self) -> Callable[[int], bool]:
        """Whether a pid belongs to a process this table started, as of now (the pid files are
        read once, here): each is started in its own session, so its descendants (an engine's
        workers) share the leader's session id. A pid this host cannot see (another PID
        namespace) is not ours."""
        leaders = {r.pid for r in self.records()}

        def ours(pid: int) -> bool:
            try:
                return os.getsid(pid) in leaders
            except OSError:
                return False
        return ours

    def owns(self, pid: int) -> bool:
        return self.owner()(pid)

    def returncode(self, pid: int) -> int | None:
        """None while running; the exit code when it is our child; -1 when an adopted process is gone."""
        p = self.children.get(pid)
        if p is not None:
            return p.poll()
        return None if pid_alive(pid) else -1

    async def wait_exit(self, pid: int, timeout: float) -> None:
        """Return within ``timeout`` seconds, or sooner once ``pid`` has ended (a caller then
        reads ``returncode``). A real process is looked at every second: nothing wakes this."""
        await asyncio.sleep(max(0.0, min(timeout, self.poll_s)))

    def alive(self, pid: int) -> bool:
        return self.returncode(pid) is None

    def tail(self, instance: str, lines: int = 5) -> str:
        """The last ``lines`` lines the latest start wrote (a failed start's reason): the log keeps
        every start's output, each after a ``--- gpuflow: starting`` line; earlier ones are left out."""
        try:
            with open(self.log_path(instance), "rb") as f:
                size = os.path.getsize(self.log_path(instance))
                text = read_redacted(f, max(0, size - 4096), size)[0].decode(errors="replace")  # no engine key
        except OSError:
            return ""
        return " | ".join(latest_run(text)[-lines:])

    def signal_group(self, pid: int, sig: int) -> None:
        try:
            os.killpg(pid, sig)  # started with start_new_session: pgid == pid
        except (ProcessLookupError, PermissionError):
            pass

    async def stop(self, instance: str, grace_s: float) -> bool:
        """SIGTERM the instance's process group, wait ``grace_s``, SIGKILL; forget it.
        Idempotent: False when nothing was recorded."""
        rec = self.find(instance)
        if rec is None:
            return False
        if self.alive(rec.pid):
            self.signal_group(rec.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while self.alive(rec.pid) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if self.alive(rec.pid):
                self.signal_group(rec.pid, signal.SIGKILL)
                while self.alive(rec.pid):
                    await asyncio.sleep(0.05)
        self.forget(instance)
        return True

    def seen_booked(self, key: str) -> None:
        self.booked_at[key] = time.monotonic()

    def forget(self, instance: str) -> None:
        for path in (self._pidfile(instance), self.secret_path(instance)):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def hide(argv: list[str], secret: str | None) -> list[str]:
    """``argv`` with ``{api_key}`` for ``secret`` wherever a word holds it."""
    return [w.replace(secret, "{api_key}") for w in argv] if secret else list(argv)


def latest_run(text: str) -> list[str]:
    """The non-empty lines of ``text`` (a log's end) after its last ``--- gpuflow`` marker: what the
    latest start wrote."""
    out = text.strip().splitlines()
    last = max((i for i, ln in enumerate(out) if ln.startswith("--- gpuflow")), default=-1)
    return [ln for ln in out[last + 1:] if ln.strip()]
