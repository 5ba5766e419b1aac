"""The agent's pure pieces: argv without a shell, GPU visibility, the inventory file, the
restart backoff, and the ledger lines of a plan."""

from __future__ import annotations

import pytest

from contracts.control import PlacementPlan
from store.ledger import plan_rows
from scheduler.errors import InvalidInput
from scheduler.units import GiB
from worker_agent.inventory import from_file
from worker_agent.processes import build_argv, visibility_env
from workflows.instance_machine import backoff


@pytest.mark.parametrize("command,port,path,gpus,argv", [
    ("srv --port {port}", 8000, None, [0], ["srv", "--port", "8000"]),
    # placeholders inside a word; quotes keep a word whole; nothing is expanded
    ("srv --model={model_path} --gpus {gpu_indexes}", None, "/m/x y", [1, 3], ["srv", "--model=/m/x y", "--gpus", "1,3"]),
    ("sh -c 'echo $HOME; rm -rf /'", None, None, [], ["sh", "-c", "echo $HOME; rm -rf /"]),  # one argv word, no shell
    ("srv `id` $(id) ; id", None, None, [], ["srv", "`id`", "$(id)", ";", "id"]),  # metacharacters stay literal
    ("srv {port}", None, None, [], ["srv", ""]),
])
def test_build_argv(command, port, path, gpus, argv):
    assert build_argv(command, port, path, gpus) == argv


@pytest.mark.parametrize("command,problem", [("", "empty"), ("srv 'unclosed", "No closing quotation")])
def test_build_argv_refuses(command, problem):
    with pytest.raises(InvalidInput, match=problem):
        build_argv(command, None, None, [])


@pytest.mark.parametrize("vendor,gpus,env", [
    ("nvidia", [0, 2], {"CUDA_VISIBLE_DEVICES": "0,2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),  # NVML's numbering
    ("amd", [1], {"ROCR_VISIBLE_DEVICES": "1"}),
    ("nvidia", [], {"CUDA_VISIBLE_DEVICES": "", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),  # CPU placement: none visible
])
def test_visibility(vendor, gpus, env):
    assert visibility_env(vendor, gpus) == env


@pytest.mark.parametrize("n,base,cap,delay", [
    (1, 10, 300, 10),    # 10 * 2^0
    (2, 10, 300, 20),    # 10 * 2^1
    (5, 10, 300, 160),   # 10 * 2^4
    (6, 10, 300, 300),   # 10 * 2^5 = 320, capped at 300
    (30, 10, 300, 300),
    (3, 0.5, 2, 2),      # 0.5 * 4 = 2
    (1030, 10, 300, 300),  # 10 * 2^1029 overflowed a float ("int too large to convert"): the exponent stops at 64
    (10**9, 10, 300, 300),  # the largest restart count an input may carry
    (10**9, 2592000, 2592000, 2592000),  # 30 days * 2^64 is still a float; capped at 30 days
])
def test_restart_backoff(n, base, cap, delay):
    assert backoff(n, base, cap) == delay


def test_inventory_file(tmp_path):
    p = tmp_path / "inv.yaml"
    p.write_text("ram_total: 64 GiB\nreserved: {vram: 1 GiB}\ngpus:\n  - {index: 0, vram_total: 24 GiB}\n")
    r = from_file("h1", str(p))
    assert (r.name, r.simulated, r.ram_total, r.reserved_vram, r.gpus[0].vram_total) == \
        ("h1", True, 64 * GiB, GiB, 24 * GiB)


def test_inventory_file_is_parsed_again_only_when_it_changed(tmp_path, monkeypatch):
    """The host's watch reads the file every few seconds: an unchanged file is not parsed again,
    a changed one is, and a broken edit is still named."""
    import yaml

    from worker_agent import inventory

    parses = []
    real = yaml.safe_load
    monkeypatch.setattr(inventory.yaml, "safe_load", lambda f: parses.append(1) or real(f))
    p = tmp_path / "inv.yaml"
    p.write_text("ram_total: 64 GiB\ngpus:\n  - {index: 0, vram_total: 24 GiB}\n")
    first = from_file("h1", str(p))
    again = from_file("h1", str(p))
    assert again == first and again.gpus[0] is not first.gpus[0] and len(parses) == 1  # equal, not shared
    p.write_text("ram_total: 64 GiB\ngpus:\n  - {index: 0, vram_total: 141 GiB}\n")  # its size and mtime moved
    assert from_file("h1", str(p)).gpus[0].vram_total == 141 * GiB and len(parses) == 2
    p.write_text("ram_total: [1\n")
    with pytest.raises(InvalidInput, match="inventory file"):
        from_file("h1", str(p))


@pytest.mark.parametrize("text,problem", [
    ("ram_total: 64 GiB\ngpus: [{index: 0}]\n", "vram_total"),
    ("ram_total: lots\n", "not a byte size"),
    ("ram_total: 1 GiB\ncolor: red\n", "color"),
    ("ram_total: [1\n", "inventory file"),
])
def test_inventory_file_errors_name_the_problem(tmp_path, text, problem):
    p = tmp_path / "inv.yaml"
    p.write_text(text)
    with pytest.raises(InvalidInput, match=problem):
        from_file("h1", str(p))


def test_missing_inventory_file(tmp_path):
    with pytest.raises(InvalidInput, match="No such file"):
        from_file("h1", str(tmp_path / "nope.yaml"))


def test_plan_rows_one_line_per_gpu_ram_once_per_worker():
    plan = PlacementPlan(worker="a", gpu_indexes=[0, 1], claim={"vram": {0: 10 * GiB, 1: 6 * GiB}, "ram": 4 * GiB},
                         subordinates=[{"worker": "b", "gpu_indexes": [], "claim": {"ram": 2 * GiB}}])
    rows = [(r.worker, r.gpu_index, r.vram // GiB, r.ram // GiB, r.role) for r in plan_rows("i", plan)]
    assert rows == [("a", 0, 10, 4, "main"),    # RAM booked on the first line of a worker
                    ("a", 1, 6, 0, "main"),
                    ("b", -1, 0, 2, "subordinate")]  # no GPU: one RAM-only line


@pytest.mark.parametrize("temporal,address", [
    ("127.0.0.1:7233", "127.0.0.1"),               # the route to a local server is loopback
    ("localhost:7233", "127.0.0.1"),               # IPv4 first: host:port lists take it as written
    ("no-such-host.invalid:7233", "127.0.0.1"),    # unresolvable: loopback, not a crash
])
def test_advertised_address(temporal, address):
    from worker_agent.agent import advertised_address

    assert advertised_address(temporal) == address
