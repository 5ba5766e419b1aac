"""``gpuflow schedule`` for a prefill/decode group, as people and scripts use it: the real CLI process
on real files, its JSON and its exit codes (0 placed, 2 bad input, 3 does not fit)."""

import json

import pytest

from tests.test_cli import gpuflow, write

GiB = 1024**3
RACK = "topology.gpustack.ai/rack"


def host(name, rack, gpus=2, gib=24, vendor="nvidia", **kw):
    return {"name": name, "ram_total": "256 GiB", "labels": {RACK: rack},
            "gpus": [{"index": i, "vram_total": f"{gib} GiB", "vendor": vendor} for i in range(gpus)], **kw}


# Two racks: r1 holds a (2 GPUs) and b (2 GPUs); r2 holds c (4 GPUs). Every member wants 20 GiB
# (resources), one 24 GiB GPU each.
CLUSTER = {"workers": [host("a", "r1"), host("b", "r1"), host("c", "r2", gpus=4)]}


def spec(**kw):
    base = {"name": "pd", "backend": "vllm", "source": {"huggingface": {"repo": "org/m"}},
            "resources": {"vram": "20 GiB", "ram": "8 GiB"}, "disaggregation": {"mode": "vllm-nixl"},
            "roles": [{"name": "prefill", "replicas": 1}, {"name": "decode", "replicas": 1}]}
    base.update(kw)
    return base


def run(tmp_path, cluster, model, *extra, check):
    return gpuflow("schedule", "--cluster", write(tmp_path, "c.yaml", cluster),
                   "--model", write(tmp_path, "m.yaml", model), "--json", *extra, check=check)


def test_a_1p1d_group_is_placed_whole(tmp_path):
    out = json.loads(run(tmp_path, CLUSTER, spec(), check=0).stdout)
    assert out["scheduled"] is True
    roles = sorted(m["role"] for m in out["members"])
    assert roles == ["decode", "prefill"]
    assert all(m["worker"] in ("a", "b", "c") and len(m["gpu_indexes"]) == 1 for m in out["members"])
    assert set(out["requests"]) == {"prefill", "decode"}


def test_2p1d_and_a_router_under_mustgather_at_the_rack(tmp_path):
    # 3 GPU members: r1 has 4 GPUs over 2 hosts, r2 has 4 on one host; both hold the group, and the
    # group lands inside one rack, the router (RAM only, no GPU) with it
    model = spec(roles=[{"name": "prefill", "replicas": 2}, {"name": "decode"}, {"name": "router"}],
                 gather={"strategy": "MustGather", "layer": "builtin-000003"})
    out = json.loads(run(tmp_path, CLUSTER, model, check=0).stdout)
    assert out["scheduled"] is True
    assert sorted(m["role"] for m in out["members"]) == ["decode", "prefill", "prefill", "router"]
    racks = {"a": "r1", "b": "r1", "c": "r2"}
    assert len({racks[m["worker"]] for m in out["members"]}) == 1
    router = next(m for m in out["members"] if m["role"] == "router")
    assert router["gpu_indexes"] == []


def test_a_group_whose_decode_cannot_fit_names_the_role_and_books_nothing(tmp_path):
    # the decode role asks for hosts labelled tier=h200; no host is: prefill alone would fit, and is
    # not placed either
    model = spec(roles=[{"name": "prefill"}, {"name": "decode", "worker_selector": {"tier": "h200"}}])
    p = run(tmp_path, CLUSTER, model, check=3)
    out = json.loads(p.stdout)
    assert out["scheduled"] is False and out["members"] == []
    assert out["role"] == "decode"
    assert any("decode" in r for r in out["reasons"]) and any("tier" in r for r in out["reasons"])
    text = gpuflow("schedule", "--cluster", write(tmp_path, "c.yaml", CLUSTER), "--model",
                   write(tmp_path, "m.yaml", model), check=3).stdout
    assert "GROUP UNSCHEDULABLE: decode does not fit; nothing is booked" in text


@pytest.mark.parametrize("model,extra,said", [
    (spec(gather={"strategy": "MustGather", "layer": "custom-abcdef"}), (), "gather.layer custom-abcdef"),
    (spec(), ("--scale-out", "encode"), "not a role of pd"),
    (spec(roles=None, disaggregation=None), ("--scale-in", "decode"), "has no roles"),
    (spec(roles=[{"name": "prefill", "replicas": 0}, {"name": "decode"}]), (), "replicas 0"),
    (spec(), ("--scale-in", "decode"), "no decode member of group pd"),
])
def test_bad_input_exits_2_naming_it(tmp_path, model, extra, said):
    p = run(tmp_path, CLUSTER, model, *extra, check=2)
    assert said in p.stderr


def member(name, role, worker, gpu):
    return {"name": name, "model": "pd", "worker": worker, "gpu_indexes": [gpu], "role": role, "group": "pd",
            "claim": {"ram": 8 * GiB, "vram": {str(gpu): 20 * GiB}}}


# A skewed start, 3P1D: prefills on a:0, a:1 and c:0, the decode on c:1
SKEWED = {**CLUSTER, "instances": [member("pd-1", "prefill", "a", 0), member("pd-2", "prefill", "a", 1),
                                   member("pd-3", "prefill", "c", 0), member("pd-4", "decode", "c", 1)]}


def test_scale_out_places_a_decode_beside_the_prefills(tmp_path):
    # pairing: a decode on a pairs with a's 2 prefills, on c with c's 1, on b with none; a is full
    # (both GPUs held), so c, with 2 free GPUs and 1 prefill beside it, wins over b
    out = json.loads(run(tmp_path, SKEWED, spec(roles=[{"name": "prefill", "replicas": 3}, {"name": "decode"}]),
                         "--scale-out", "decode", check=0).stdout)
    assert out["role"] == "decode" and out["scheduled"] is True
    assert out["placement"]["worker"] == "c"


def test_scale_in_removes_the_prefill_with_fewest_decodes_beside_it(tmp_path):
    # retention: pd-1 and pd-2 (on a) have no decode beside them; pd-3 (on c) has pd-4. One of a's goes
    out = json.loads(run(tmp_path, SKEWED, spec(roles=[{"name": "prefill", "replicas": 3}, {"name": "decode"}]),
                         "--scale-in", "prefill", check=0).stdout)
    assert out["victim"] in ("pd-1", "pd-2")
    assert [m["name"] for m in out["members"]][-1] == "pd-3"


@pytest.mark.parametrize("model,extra,said", [
    # a live cluster's layers are the vocabulary's: a custom layer no cluster file declares is refused
    (spec(gather={"strategy": "MustGather", "layer": "custom-abcdef"}), (), "gather.layer custom-abcdef"),
    # a group's size is its roles' replicas
    (spec(), ("--replicas", "2"), "scale NAME N --role ROLE"),
])
def test_deploy_refuses_a_bad_group_before_it_reaches_temporal(tmp_path, model, extra, said):
    # no Temporal at this address: refused (exit 2) before any connection is tried (that would exit 4)
    p = gpuflow("deploy", write(tmp_path, "m.yaml", model), *extra, "--address", "127.0.0.1:1", check=2)
    assert said in p.stderr


def test_the_examples_a_newcomer_runs(tmp_path):
    # gpuflow/examples/cluster-racks.yaml: racks r1 (r1-a, r1-b) and r2 (r2-a, r2-b, the latter with
    # Kubernetes' keys), 2 x 80 GiB GPUs each; pd-demo's 2 prefills and 1 decode already in r1.
    # model-pd.yaml: 2P1D + router, 60 GiB a member, MustGather at the rack.
    import os

    from tests.test_cli import EXAMPLES

    cluster, model = os.path.join(EXAMPLES, "cluster-racks.yaml"), os.path.join(EXAMPLES, "model-pd.yaml")
    # r1 has 1 free GPU (r1-b:1), r2 has 4: the group forms in r2 (r2-b read by its Kubernetes keys)
    out = json.loads(gpuflow("schedule", "--cluster", cluster, "--model", model, "--json", check=0).stdout)
    assert out["domain"]["layer"] == "builtin-000003" and out["domain"]["path"][-1] == "r2"
    assert {m["worker"] for m in out["members"]} <= {"r2-a", "r2-b"}
    text = gpuflow("schedule", "--cluster", cluster, "--model", model, check=0).stdout
    assert "GROUP SCHEDULED: 4 members, gathered in rack z1 / r2" in text
    # one more decode: the floor is r1 (where the members are), and r1-b:1 is its one free GPU
    out = json.loads(gpuflow("schedule", "--cluster", cluster, "--model", model, "--scale-out", "decode", "--json",
                             check=0).stdout)
    assert (out["placement"]["worker"], out["placement"]["gpu_indexes"]) == ("r1-b", [1])
    # scale-in of a prefill: pd-demo-1 (on r1-b, no decode beside it) goes, not pd-demo-0 (beside the decode)
    out = json.loads(gpuflow("schedule", "--cluster", cluster, "--model", model, "--scale-in", "prefill", "--json",
                             check=0).stdout)
    assert out["victim"] == "pd-demo-1"
