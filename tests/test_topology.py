"""Which helper processes a placement across several workers starts, where, and what the server
is then told (contracts/launch_parts.py)."""

from __future__ import annotations

from scheduler.cluster import Subordinate
from contracts import launch_parts as topology
from contracts.agent import LaunchRequest

MAIN = LaunchRequest(instance="m-0", model="m", backend="llama.cpp", model_path="/models/m.gguf", gpu_indexes=[0],
                     env={"HF_HOME": "/cache"}, distributed=True, offload_layers=31, tensor_split=[5, 3, 8])
# the RPC candidate lends two GPUs of h2 and one of h3, one subordinate entry per GPU
SUBS = [Subordinate(worker="h2", gpu_indexes=[0]), Subordinate(worker="h2", gpu_indexes=[1]),
        Subordinate(worker="h3", gpu_indexes=[2])]


def test_one_rpc_server_per_lent_gpu():
    parts = topology.rpc_servers(MAIN, SUBS)
    assert [(w, r.role, r.part, r.gpu_indexes, r.key) for w, r in parts] == [
        ("h2", "rpc-server", "rpc0", [0], "m-0@rpc0"),
        ("h2", "rpc-server", "rpc1", [1], "m-0@rpc1"),  # two on one host: two processes, two keys
        ("h3", "rpc-server", "rpc2", [2], "m-0@rpc2")]
    # helpers carry the instance's environment, not the server's model or split
    assert all(r.env == {"HF_HOME": "/cache"} and r.model_path is None and r.tensor_split is None for _, r in parts)
    server = topology.server_over_rpc(MAIN, ["10.0.0.2:50052", "10.0.0.2:50053", "10.0.0.3:50052"])
    assert server.rpc_servers == ["10.0.0.2:50052", "10.0.0.2:50053", "10.0.0.3:50052"]
    assert server.key == "m-0" and server.tensor_split == [5, 3, 8]


def test_ray_head_here_and_a_worker_on_each_subordinate():
    v = MAIN.model_copy(update={"backend": "vllm", "gpu_indexes": [0, 1]})
    subs = [Subordinate(worker="h2", gpu_indexes=[0, 1]), Subordinate(worker="h3", gpu_indexes=[0, 1])]
    head = topology.ray_head(v)
    assert (head.role, head.key, head.gpu_indexes) == ("ray-head", "m-0@ray-head", [0, 1])
    workers = topology.ray_workers(v, subs, "10.0.0.1:6379")
    assert [(w, r.role, r.ray_address, r.gpu_indexes) for w, r in workers] == [
        ("h2", "ray-worker", "10.0.0.1:6379", [0, 1]), ("h3", "ray-worker", "10.0.0.1:6379", [0, 1])]
    server = topology.server_over_ray(v, "10.0.0.1:6379", 3)
    assert (server.ray_address, server.pipeline_parallel) == ("10.0.0.1:6379", 3)  # 1 main + 2 subordinates


def test_sglang_rank_0_here_then_a_node_on_each_subordinate():
    sg = MAIN.model_copy(update={"backend": "sglang", "gpu_indexes": [0, 1], "vram_utilization": 0.8})
    subs = [Subordinate(worker="h2", gpu_indexes=[0, 1], claim={"vram_utilization": 0.7}),
            Subordinate(worker="h3", gpu_indexes=[3])]
    head = topology.sglang_head(sg, subs)
    # 3 nodes; TP = 2 + 2 + 1 = 5 GPUs; rank 0 is started without waiting (it is ready once all joined)
    assert (head.key, head.nnodes, head.node_rank, head.tp_total, head.wait_ready) == ("m-0", 3, 0, 5, False)
    nodes = topology.sglang_nodes(head, subs, "10.0.0.1:5000")
    assert [(w, r.role, r.key, r.node_rank, r.gpu_indexes, r.vram_utilization, r.dist_init_addr)
            for w, r in nodes] == [("h2", "sglang-node", "m-0@node1", 1, [0, 1], 0.7, "10.0.0.1:5000"),
                                   ("h3", "sglang-node", "m-0@node2", 2, [3], None, "10.0.0.1:5000")]
    assert all(r.model_path == sg.model_path and r.tp_total == 5 for _, r in nodes)  # the same command elsewhere
    server = topology.sglang_server(head, "10.0.0.1:5000")
    assert (server.key, server.wait_ready, server.dist_init_addr) == ("m-0", True, "10.0.0.1:5000")


def test_other_backends_are_refused_with_a_reason():
    assert topology.unsupported(MAIN) is None
    assert "custom is not launched across several workers" in topology.unsupported(
        MAIN.model_copy(update={"backend": "custom"}))
