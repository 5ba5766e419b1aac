"""Where foreign use comes from: a simulated GPU's ``vram_used_by_others`` in the agent's
inventory file, NVML's per-process split (the fake NVML can declare it too), and the GPU bench's
arithmetic (bench/gpu_foreign_memory.py) over real processes and the fake NVML."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from bench import gpu_foreign_memory as bench
from scheduler.errors import InvalidInput
from scheduler.units import GiB
from tests.fake_nvml import OTHER_PID, FakeNVML
from worker_agent.inventory import discover, free_for_gpuflow, from_nvml


def _inventory(tmp_path, gpus: list[dict], reserved: dict | None = None) -> str:
    p = tmp_path / "inv.yaml"
    p.write_text(yaml.safe_dump({"ram_total": "64 GiB", "gpus": gpus, **({"reserved": reserved} if reserved else {})}))
    return str(p)


@pytest.mark.parametrize("declared,foreign,free", [
    ({}, None, 24),                                        # nothing declared: unknown, all 24 GiB free
    ({"vram_used_by_others": "10 GiB"}, 10, 14),           # 24 - 10
    ({"vram_used_by_others": 0}, 0, 24),
    ({"vram_foreign": "3 GiB"}, 3, 21),                    # the snapshot's own name still reads
])
def test_a_simulated_gpu_declares_its_foreign_use(tmp_path, declared, foreign, free):
    r = discover("sim-1", _inventory(tmp_path, [{"index": 0, "vram_total": "24 GiB", **declared}]))
    [g] = r.gpus
    assert g.vram_foreign == (None if foreign is None else foreign * GiB)
    assert free_for_gpuflow(g) == free * GiB
    assert free_for_gpuflow(g, reserved_vram=2 * GiB) == max(free - 2, 0) * GiB  # the host's reserve too
    assert "vram_used_by_others" not in r.model_dump_json()  # it travels under the snapshot's name


@pytest.mark.parametrize("declared,problem", [
    ({"vram_used_by_others": "30 GiB"}, "more than its vram_total"),
    ({"vram_used_by_others": "1 GiB", "vram_foreign": "1 GiB"}, "not both"),
    ({"vram_used_by_others": "-1"}, "vram_used_by_others"),
    ({"vram_used_by_others": "lots"}, "vram_used_by_others"),
])
def test_a_bad_declaration_is_refused_naming_it(tmp_path, declared, problem):
    with pytest.raises(InvalidInput, match=problem):
        discover("sim-1", _inventory(tmp_path, [{"index": 0, "vram_total": "24 GiB", **declared}]))


def test_the_fake_nvml_declares_foreign_use_and_the_inventory_reports_it():
    """Card 0: 10 GiB held by another process; card 1: our 4 GiB and 1 GiB of another's (rounded
    up to 256 MiB steps: 1 GiB); card 2 lists no processes (unknown)."""
    ours = 4242

    nvml = FakeNVML([{"total": 141 * GiB, "vram_used_by_others": 10 * GiB},
                     {"total": 141 * GiB, "procs": [(ours, 4 * GiB)], "vram_used_by_others": GiB},
                     {"total": 141 * GiB, "used": GiB}])
    gpus = from_nvml(nvml, owner=lambda: (lambda pid: pid == ours))
    assert [(g.vram_used, g.vram_foreign) for g in gpus] == [(10 * GiB, 10 * GiB), (5 * GiB, GiB), (GiB, None)]
    assert nvml.open == 0


def _tree():
    """A real process in a session of its own (as the agent starts an engine) with a child of its
    own: (the leader, the child's pid)."""
    code = "import subprocess, time; c = subprocess.Popen(['sleep', '30']); print(c.pid, flush=True); time.sleep(30)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    return p, int(p.stdout.readline())


def test_the_gpu_bench_splits_a_process_tree_from_the_others():
    """gpuflow's leader holds 3 GiB, its child 1 GiB: ours 4 GiB by the probe and by the split;
    another process 10 GiB: foreign 10 GiB. Used 14 GiB."""
    leader, child = _tree()
    try:
        nvml = FakeNVML([{"total": 141 * GiB, "procs": [(leader.pid, 3 * GiB), (child, GiB)],
                          "vram_used_by_others": 10 * GiB}])
        nvml.nvmlInit()
        cards, probe, tree = bench.measure(nvml, leader.pid)
        assert {leader.pid, child} <= tree and OTHER_PID not in tree
        [c] = cards
        assert (c.used, c.ours, c.foreign) == (14 * GiB, 4 * GiB, 10 * GiB)
        assert probe == {0: 4 * GiB}
        text = "\n".join(bench.table(cards, probe, {0: 14 * GiB}, {leader.pid: 3 * GiB, child: GiB, OTHER_PID: 10 * GiB}, tree))
        assert "0         14.00      14.00         4.00         4.00      10.00" in text, text
        assert "gpuflow's tree 4.00 GiB, others 10.00 GiB" in text
        assert bench.unseen_pids(nvml) == []  # every pid NVML names is a process here
    finally:
        import os
        import signal

        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def test_the_gpu_bench_without_a_gpu_says_so_and_exits_0(capsys):
    assert bench.main([], nvml=FakeNVML([])) == 0
    assert capsys.readouterr().out.strip() == "no GPU"
    if from_nvml():
        pytest.skip("this machine has a GPU: the bench would run (bench/gpu_foreign_memory.py)")
    out = subprocess.run([sys.executable, "bench/gpu_foreign_memory.py"], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": ".", "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert (out.returncode, out.stdout.strip()) == (0, "no GPU"), out.stderr
