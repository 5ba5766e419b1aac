"""A spec whose command cannot run on a host is refused there by the placement (issue 36): the
agent reports the executables on its PATH (worker_agent/capabilities.py, as a Bloom filter:
scheduler/command_set.py), the command filter (scheduler/filters/command.py) keeps a custom spec
off the hosts without its command, naming host and command; gpuflow simulate's hosts, which start
nothing, report no set and keep every spec. The two kinds of host have two words (contracts/host.py)."""

from __future__ import annotations

import os
import stat

import pytest

from contracts.host import HOST_KINDS, HostReport, host_kind
from scheduler.command_set import MAX_CHARS, encode, holds
from scheduler.decide import decide
from scheduler.request import FlatRequest
from scheduler.spec import ModelSpec
from scheduler.units import GiB
from tests.conftest import cluster, gpu, worker
from worker_agent.capabilities import path_commands, with_capabilities

REQ = FlatRequest(vram=4 * GiB, ram=GiB)
HAS = encode(["python3", "my-server", "bash"])
LACKS = encode(["python3", "bash"])


def custom(command: str) -> ModelSpec:
    return ModelSpec(name="m", source={"huggingface": {"repo": "o/m"}}, backend="custom", run_command=command,
                     placement_strategy="binpack")


def hosts(*sets) -> list:
    """h1, h2, ... each one 24 GiB GPU; h1 the fullest (binpack's first choice), with these command sets."""
    return [worker(f"h{i}", 64, [gpu(0, 24, used=8 if i == 1 else None)], commands=s) for i, s in enumerate(sets, 1)]


@pytest.mark.parametrize("command, sets, placed, removed", [
    ("my-server --port {port}", (LACKS, HAS), "h2", {"h1"}),  # h1 has no my-server: the next fit
    ("my-server --port {port}", (LACKS, LACKS), None, {"h1", "h2"}),  # on no host: PENDING, why named
    ("my-server --port {port}", (LACKS, None), "h2", {"h1"}),  # h2 reported no set (simulate's, older): kept
    ("/opt/bin/my-server --port {port}", (LACKS, LACKS), "h1", None),  # a path: the agent decides at launch
    ("{model_path}/serve --port {port}", (LACKS, LACKS), "h1", None),  # a placeholder: likewise
    ("python3 -m http.server {port}", (LACKS, HAS), "h1", None),  # on every host
])
def test_a_custom_command_goes_only_where_its_agent_found_it(command, sets, placed, removed):
    d = decide(cluster(hosts(*sets)), custom(command), REQ)
    assert (d.placement.worker if d.scheduled else None) == placed
    v = next((v for v in d.filters if v.name == "command"), None)
    assert (set(v.removed) if v and v.removed else None) == removed
    if removed and not placed:  # the reason names the host and the command, as PENDING shows it
        assert d.reasons[0] == "'my-server' is on the PATH of no host of h1, h2."
        assert d.reasons[1] == "command: worker h1: cannot start 'my-server': no such command on the host's PATH"


def test_a_cluster_whose_agents_report_no_set_decides_as_before():
    d = decide(cluster(hosts(None, None)), custom("my-server {port}"), REQ)
    assert "command" not in [v.name for v in d.filters] and d.placement.worker == "h1"
    vllm = ModelSpec(name="v", source={"huggingface": {"repo": "o/v"}}, backend="vllm")
    assert "command" not in [v.name for v in decide(cluster(hosts(LACKS)), vllm, REQ).filters]


def test_the_set_says_no_to_what_it_lacks_and_rarely_yes():
    names = [f"cmd-{i}" for i in range(1600)]  # a server's PATH: about 1,600 executables
    s = encode(names)
    assert len(s) < 3000 and all(holds(s, n) for n in names)  # 10 bits a name: 2,000 bytes, base64
    false = sum(bool(holds(s, f"other-{i}")) for i in range(10_000))
    assert false < 200  # (1 - e^(-7/10))^7 = 0.8%: about 80 in 10,000, well under 2%
    assert holds("bloom2:7:AAAA", "x") is None and holds("not a set", "x") is None  # unknown: as if not reported
    assert encode(f"n{i}" for i in range(MAX_CHARS * 8 // 10)) is None  # too many to report


def executable(folder, name: str, mode: int = stat.S_IEXEC) -> None:
    p = folder / name
    p.write_text("#!/bin/sh\n")
    p.chmod(p.stat().st_mode | mode)


def test_the_agent_reports_the_executables_on_its_path(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    executable(a, "my-server")
    executable(b, "tool")
    (b / "notes.txt").write_text("not executable")
    (b / "dir").mkdir()
    s = path_commands(os.pathsep.join([str(a), str(b), str(tmp_path / "gone")]))
    assert [holds(s, n) for n in ("my-server", "tool", "notes.txt", "dir")] == [True, True, False, False]
    assert path_commands(None) is None
    r = HostReport(name="h", ram_total=1)
    assert with_capabilities(r, ["custom"], "processes", s).commands == s
    assert with_capabilities(r, ["custom"], "nothing", s).model_dump(include={"runs", "commands"}) == \
        {"runs": "nothing", "commands": None}  # gpuflow simulate's: starts nothing, any command does
    assert with_capabilities(r, ["vllm"], "processes", s).commands is None  # no custom commands here


@pytest.mark.parametrize("simulated, runs, kind", [
    (False, "processes", "real"),
    (True, "processes", "mock-gpus"),  # the demo's and the tests' hosts: real engine processes
    (True, "nothing", "simulated"),  # gpuflow simulate's: nothing runs
    (True, None, "simulated"),  # an older agent's report: the word it had
    (False, None, "real"),
])
def test_two_words_for_two_kinds_of_host(simulated, runs, kind):
    assert host_kind(simulated, runs) == kind and kind in HOST_KINDS
