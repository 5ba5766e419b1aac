"""GPU topology in placement, through the dry-run CLI (``gpuflow schedule --json``): which GPU set
a multi-GPU replica gets on a DGX-style box, what ``topology_policy`` refuses, and that a cluster
without topology decides exactly as before.

The box (issue 13): 8 GPUs, NUMA node 0 = GPUs 0-3, node 1 = GPUs 4-7, NVLink pairs (0,1) (2,3)
(4,5) (6,7), each pair under its own PCIe switch. Busy GPUs are fully claimed by another model.
Interconnect scores (scheduler/interconnect.py): nvlink 100, NUMA node 50, across sockets 0; with
the default weight 10 the topology term adds 10, 5 or 0 to equal placement scores.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.test_cli import EXAMPLES, gpuflow, write

NODE_CPUS = {0: "0-31,64-95", 1: "32-63,96-127"}


def box(busy, vram="80 GiB", topology=True) -> dict:
    gpus = []
    for i in range(8):
        g = {"index": i, "name": "A100", "vram_total": vram}
        if topology:
            g.update(numa_node=i // 4, pcie_switch=f"sw{i // 2}", nvlink_peers=[i ^ 1], cpus=NODE_CPUS[i // 4])
        gpus.append(g)
    insts = [{"name": f"busy-{i}", "model": "other", "worker": "dgx1", "gpu_indexes": [i],
              "claim": {"vram": {i: vram}}} for i in busy]
    return {"version": 1, "workers": [{"name": "dgx1", "ram_total": "1 TiB", "gpus": gpus}], "instances": insts}


def custom(policy="none", vram="100 GiB", **more) -> dict:
    """Needs two 80 GiB GPUs (100 GiB > 80); 450 GiB needs six."""
    return {"name": "tp", "source": {"local_path": "/models/tp"}, "backend": "custom", "run_command": "serve {port} --gpus {gpu_indexes}",
            "resources": {"vram": vram, "ram": "8 GiB"}, "topology_policy": policy, **more}


def schedule(tmp_path, cluster, spec, *extra, check=0, name="x"):
    p = gpuflow("schedule", "--cluster", write(tmp_path, f"{name}-cluster.yaml", cluster),
                "--model", write(tmp_path, f"{name}-model.yaml", spec), "--json", *extra, check=check)
    return json.loads(p.stdout)


@pytest.mark.parametrize("busy, by_memory, want, link", [
    # the case: free 1 3 4 6 7; by memory 1,3 (NUMA node, no NVLink); 6,7 share NVLink and a switch
    ((0, 2, 5), [1, 3], [6, 7], "nvlink"),
    # one NVLink pair left whole: free 0 3 4 5 7; by memory 0,3; only (4,5) is whole
    ((1, 2, 6), [0, 3], [4, 5], "nvlink"),
    # no pair left whole, and by memory the pair crosses sockets: free 3 4 6; 4,6 share NUMA node 1
    ((0, 1, 2, 5, 7), [3, 4], [4, 6], "node"),
])
def test_the_best_joined_pair_wins(tmp_path, busy, by_memory, want, link):
    out = schedule(tmp_path, box(busy), custom())
    assert out["strategy"] == "multi_gpu" and out["placement"]["gpu_indexes"] == want
    assert out["placement"]["link"] == link
    first = out["candidates"][0]  # the set memory alone picks comes first, and loses only on topology
    assert first["gpu_indexes"] == by_memory and first["scores"]["placement"] == out["candidates"][1]["scores"]["placement"]
    best = next(c for c in out["candidates"] if c["gpu_indexes"] == want)
    assert best["scores"]["topology"] == {"nvlink": 10.0, "node": 5.0}[link]  # 100 or 50, x 10/100
    # without topology the same box decides as it always did (GPUStack: by memory alone)
    plain = schedule(tmp_path, box(busy, topology=False), custom(), name="plain")
    assert plain["placement"]["gpu_indexes"] == by_memory and "link" not in plain["placement"]
    assert all(set(c["scores"]) == {"placement", "locality"} for c in plain["candidates"])


def test_the_topology_weight_is_a_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLOW_SCHEDULER__TOPOLOGY", "0")
    out = schedule(tmp_path, box((0, 2, 5)), custom())
    assert out["placement"]["gpu_indexes"] == [1, 3] and "topology" not in out["candidates"][0]["scores"]


ONLY_3_AND_4 = (0, 1, 2, 5, 6, 7)  # one GPU left on each socket


@pytest.mark.parametrize("policy, busy, vram, want, refusal", [
    ("single-numa-node", ONLY_3_AND_4, "100 GiB", None,
     "single-numa-node: GPUs 3 and 4 are on NUMA nodes 0 and 1 (worker dgx1)"),
    ("best-effort", ONLY_3_AND_4, "100 GiB", [3, 4],  # admitted across sockets, and said so
     "best-effort: GPUs 3 and 4 are on NUMA nodes 0 and 1 (worker dgx1); admitted"),
    ("none", ONLY_3_AND_4, "100 GiB", [3, 4], None),
    # restricted: 2 GPUs could share one node on this box (4 per node), so 3+4 breaks it
    ("restricted", ONLY_3_AND_4, "100 GiB", None,
     "restricted: GPUs 3 and 4 are on NUMA nodes 0 and 1 (worker dgx1); 1 NUMA node could hold 2 of its GPUs"),
    # six GPUs cannot be on fewer than 2 nodes of 4: restricted admits them, single-numa-node cannot
    ("restricted", (0, 1), "450 GiB", [2, 3, 4, 5, 6, 7], None),
    ("single-numa-node", (0, 1), "450 GiB", None, "single-numa-node: GPUs 2, 3, 4, 5, 6 and 7 are on NUMA nodes"),
    # a pair on one node is always fine
    ("single-numa-node", (0, 2, 5), "100 GiB", [6, 7], None),
])
def test_topology_policy(tmp_path, policy, busy, vram, want, refusal):
    out = schedule(tmp_path, box(busy), custom(policy, vram), check=0 if want else 3)
    if want:
        assert out["placement"]["gpu_indexes"] == want
        assert refusal is None or refusal in out["reasons"]
    else:
        assert out["placement"] is None and any(r.startswith(refusal) for r in out["reasons"]), out["reasons"]


def test_a_worker_without_numa_data_is_not_refused(tmp_path):
    """Topology Manager: no hint means no preference; the pair is admitted."""
    out = schedule(tmp_path, box(ONLY_3_AND_4, topology=False), custom("single-numa-node"))
    assert out["placement"]["gpu_indexes"] == [3, 4]
    assert "cpu pinning: worker dgx1 reports no NUMA node or local CPUs for GPUs [3, 4]; the engine will run unpinned" \
        in out["reasons"]


def test_pinning_carries_the_numa_nodes_cpus(tmp_path):
    out = schedule(tmp_path, box((0, 2, 5)), custom(cpu_pinning=True))
    assert (out["placement"]["cpus"], out["placement"]["numa_nodes"]) == ("32-63,96-127", [1])
    out = schedule(tmp_path, box((0, 2, 5)), custom("single-numa-node"))  # implies pinning
    assert out["placement"]["cpus"] == "32-63,96-127"
    assert "cpus" not in schedule(tmp_path, box((0, 2, 5)), custom())["placement"]


def test_vllm_tensor_parallel_gets_the_nvlink_pair(tmp_path, qwen7b_dir):
    spec = {"name": "qwen", "source": {"local_path": qwen7b_dir}, "backend": "vllm",
            "backend_parameters": ["--tensor-parallel-size=2"]}
    out = schedule(tmp_path, box((0, 2, 5)), spec)
    assert (out["strategy"], out["placement"]["gpu_indexes"], out["placement"]["link"]) == ("multi_gpu", [6, 7], "nvlink")
    assert out["placement"]["claim"]["vram_utilization"] == 0.9
    plain = schedule(tmp_path, box((0, 2, 5), topology=False), spec, name="plain")
    assert plain["placement"]["gpu_indexes"] == [1, 3]


def test_llama_cpp_tensor_split_gets_the_nvlink_pair(tmp_path, llama3_gguf):
    """Llama 3 8B Q5_K_M needs 7.04 GiB at ctx 8192 (gpuflow estimate): two 5 GiB cards, split evenly."""
    spec = {"name": "llama", "source": {"local_path": llama3_gguf}, "backend": "llama.cpp",
            "backend_parameters": ["--ctx-size=8192"]}
    out = schedule(tmp_path, box((0, 2, 5), vram="5 GiB"), spec)
    assert (out["strategy"], out["placement"]["gpu_indexes"], out["placement"]["link"]) == ("multi_gpu", [6, 7], "nvlink")
    assert out["placement"]["claim"]["tensor_split"] == [5 * 2**30, 5 * 2**30]
    plain = schedule(tmp_path, box((0, 2, 5), vram="5 GiB", topology=False), spec, name="plain")
    assert plain["placement"]["gpu_indexes"] == [1, 3] and len(plain["candidates"]) == 1


def test_manual_selection_of_more_gpus_than_needed(tmp_path):
    spec = custom(gpu_selector={"gpu_ids": [f"dgx1:cuda:{i}" for i in (1, 3, 6, 7)], "gpus_per_replica": 2})
    cluster = {**box((0, 2, 5)), "model_files": [{"worker": "dgx1", "source": "/models/tp"}]}  # manual: path checked
    out = schedule(tmp_path, cluster, spec)
    assert (out["strategy"], out["placement"]["gpu_indexes"]) == ("manual", [6, 7])


@pytest.mark.parametrize("cluster, want, link, cpus", [
    ("cluster-nvlink-8gpu.yaml", [6, 7], "nvlink", "32-63,96-127"),
    ("cluster-pcie-2socket.yaml", [2, 3], "hostbridge", "24-47,72-95"),
])
def test_the_examples(cluster, want, link, cpus):
    p = gpuflow("schedule", "--cluster", os.path.join(EXAMPLES, cluster),
                "--model", os.path.join(EXAMPLES, "model-tp2.yaml"), "--json", check=0)
    out = json.loads(p.stdout)
    assert (out["placement"]["gpu_indexes"], out["placement"]["link"], out["placement"]["cpus"]) == (want, link, cpus)
    text = gpuflow("schedule", "--cluster", os.path.join(EXAMPLES, cluster),
                   "--model", os.path.join(EXAMPLES, "model-tp2.yaml"), check=0).stdout
    assert f"GPUs {want} by strategy multi_gpu" in text and f"link {link}, pinned to CPUs {cpus}" in text
