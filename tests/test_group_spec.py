"""A group's spec (scheduler/groups/spec.py) and the cluster's topology layers (groups/layers.py):
what GPUStack 2.3.0 accepts is accepted, what it refuses is refused with the field named."""

import pytest
from pydantic import ValidationError

from scheduler.cluster import ClusterSnapshot, Worker
from scheduler.groups.layers import NODE_LAYER, RACK_LAYER, ZONE_LAYER, TopologyLayer, chain, domain_of
from scheduler.groups.roles import role_spec
from scheduler.groups.spec import RoleName, gather_problems, router_ram
from scheduler.spec import ModelSpec
from scheduler.units import GiB

PD = [{"name": "prefill"}, {"name": "decode"}]


def group(**kw):
    base = dict(name="g", source={"huggingface": {"repo": "org/m"}}, backend="vllm", roles=PD,
                disaggregation={"mode": "vllm-nixl"})
    base.update(kw)
    return ModelSpec(**base)


@pytest.mark.parametrize("kw", [
    {},  # 1P1D, vllm-nixl
    {"roles": [{"name": "prefill", "replicas": 2}, {"name": "decode"}, {"name": "router"}]},  # 2P1D + router
    {"roles": [{"name": "prefill", "replicas": 3}, {"name": "decode"}]},  # 3P1D
    {"gather": {"strategy": "MustGather", "layer": RACK_LAYER}},
    {"gather": {"strategy": "PreferGather", "layer": ZONE_LAYER}},
    {"gather": {"strategy": "PreferGather"}},  # PreferGather needs no layer: nothing is reported then
    {"disaggregation": {"mode": "sglang-mooncake"}, "backend": "sglang"},
    {"disaggregation": {"mode": "vllm-nixl", "vendor": "nvidia", "readiness": "all"}},
    # custom mode may mix engines across roles
    {"disaggregation": {"mode": "custom"}, "roles": [{"name": "prefill", "backend": "sglang"}, {"name": "decode"}]},
    # both sides say the same context length, or one side is silent: GPUStack agrees or cannot tell
    {"roles": [{"name": "prefill", "backend_parameters": ["--max-model-len=8192"]},
               {"name": "decode", "backend_parameters": ["--max-model-len", "8192"]}]},
    {"roles": [{"name": "prefill", "backend_parameters": ["--dtype", "auto"]},
               {"name": "decode", "backend_parameters": ["--dtype", "float16"]}]},  # auto: undecidable, not refused
    {"disaggregation": None, "roles": [{"name": "decode"}, {"name": "router"}]},  # roles without disaggregation
    {"replicas": 0},  # a group switched off
])
def test_accepted(kw):
    assert group(**kw).is_group


@pytest.mark.parametrize("kw,field", [
    ({"roles": [{"name": "encode"}, {"name": "decode"}]}, "roles.0.name"),  # outside the three
    ({"roles": [{"name": "prefill", "replicas": 0}, {"name": "decode"}]}, "replicas 0"),
    ({"gather": {"strategy": "MustGather"}}, "MustGather needs a layer"),
    ({"gather": {"layer": RACK_LAYER}}, "layer is set without a strategy"),
    ({"roles": [*PD, {"name": "router", "replicas": 2}]}, "roles.router.replicas 2"),
    ({"roles": [{"name": "prefill"}, {"name": "prefill"}, {"name": "decode"}]}, "a role appears twice"),
    ({"roles": [{"name": "prefill"}]}, "needs a decode role"),
    ({"replicas": 2}, "replicas 2"),  # a group's replicas are 0 or 1; roles carry the counts
    ({"roles": [{"name": "prefill", "resources": {"ram": GiB}}, {"name": "decode"}]}, "roles.prefill.resources"),
    ({"roles": [{"name": "prefill", "backend_parameters": ["--max-model-len=4096"]},
                {"name": "decode", "backend_parameters": ["--max-model-len=8192"]}]}, "different context length"),
    ({"roles": [{"name": "prefill", "backend_parameters": ["--dtype=float16"]},
                {"name": "decode", "backend_parameters": ["--dtype=bfloat16"]}]}, "different dtype"),
    ({"roles": [{"name": "prefill", "backend_parameters": ["--block-size=16"]},
                {"name": "decode", "backend_parameters": ["--block-size=32"]}]}, "different block size"),
    ({"disaggregation": {"mode": "sglang-nixl"}}, "configures sglang only"),  # a vllm deployment
    ({"backend": "llama.cpp", "source": {"local_path": "/m/x.gguf"}}, "llama.cpp cannot be disaggregated"),
    ({"disaggregation": {"mode": "vllm-nixl", "vendor": "amd"}}, "disaggregation.vendor amd"),
    ({"roles": None, "gather": {"strategy": "PreferGather"}}, "need roles"),
    ({"roles": [{"name": "prefill", "env": {"LD_PRELOAD": "/x.so"}}, {"name": "decode"}]}, "roles.prefill: env LD_PRELOAD"),
    ({"roles": [{"name": "prefill", "gpu_selector": {"gpu_ids": ["nocolon"]}}, {"name": "decode"}]}, "worker:type:index"),
    ({"roles": [{"name": "prefill", "surprise": 1}, {"name": "decode"}]}, "surprise"),
])
def test_refused_naming_the_field(kw, field):
    with pytest.raises(ValidationError) as e:
        group(**kw)
    assert field in str(e.value)


def test_a_role_inherits_what_it_leaves_unset():
    g = group(backend_parameters=["--max-model-len=8192"], env={"VLLM_LOGGING_LEVEL": "INFO"},
              roles=[{"name": "prefill", "replicas": 2, "backend_parameters": ["--max-model-len=8192", "--enforce-eager"]},
                     {"name": "decode", "env": {"VLLM_LOGGING_LEVEL": "DEBUG"}}, {"name": "router"}])
    p, d = role_spec(g, RoleName.PREFILL), role_spec(g, RoleName.DECODE)
    assert (p.replicas, p.backend_parameters, p.env) == (2, ["--max-model-len=8192", "--enforce-eager"],
                                                         {"VLLM_LOGGING_LEVEL": "INFO"})
    assert (d.replicas, d.backend_parameters, d.env) == (1, ["--max-model-len=8192"], {"VLLM_LOGGING_LEVEL": "DEBUG"})
    assert not p.is_group and not d.is_group
    assert router_ram(g.roles) == 2 * GiB  # GPUStack's router floor


LAYERS = [TopologyLayer(id="custom-00aa11", name="nvlink-domain", label_keys=["nvidia.com/gpu.clique"],
                        parent_layer=RACK_LAYER)]


def test_layers_root_to_leaf_with_the_clusters_own():
    assert [x.id for x in chain([])] == [ZONE_LAYER, RACK_LAYER, NODE_LAYER]
    assert [x.name for x in chain(LAYERS)] == ["zone", "rack", "nvlink-domain", "host"]


@pytest.mark.parametrize("labels,layer,domain", [
    ({"topology.gpustack.ai/zone": "z1", "topology.kubernetes.io/zone": "z9"}, ZONE_LAYER, "z1"),  # ours first
    ({"topology.kubernetes.io/zone": "z9"}, ZONE_LAYER, "z9"),  # the well-known key for the same layer
    ({"topology.kubernetes.io/rack": "r3"}, RACK_LAYER, "r3"),
    ({}, RACK_LAYER, None),  # unclassified at that layer
    ({"nvidia.com/gpu.clique": "c7"}, "custom-00aa11", "c7"),
    ({}, NODE_LAYER, "h1"),  # the host layer is the host itself
])
def test_a_hosts_domain_from_its_labels(labels, layer, domain):
    w = Worker(name="h1", ram_total=GiB, labels=labels)
    assert domain_of(w, next(x for x in chain(LAYERS) if x.id == layer)) == domain


@pytest.mark.parametrize("layers,problem", [
    ([LAYERS[0], LAYERS[0]], "declared twice"),
    ([TopologyLayer(id=RACK_LAYER, name="rack2", label_keys=["x"])], "built-in"),
    ([TopologyLayer(id="custom-000001", name="x", label_keys=["x"], parent_layer="custom-ffffff")], "not a layer"),
    ([TopologyLayer(id="custom-000001", name="x")], "names no label_keys"),
])
def test_a_clusters_layers_are_checked(layers, problem):
    with pytest.raises(ValidationError) as e:
        ClusterSnapshot(topology=layers)
    assert problem in str(e.value)


def test_an_unknown_gather_layer_is_refused_against_the_clusters_layers():
    g = group(gather={"strategy": "MustGather", "layer": "custom-00aa11"})
    assert gather_problems(g.gather, LAYERS) == []
    (problem,) = gather_problems(g.gather, [])
    assert problem.startswith("gather.layer custom-00aa11: not a layer of this cluster")


def test_the_standin_group_example_is_a_group_gpuflow_dev_can_run():
    # gpuflow/examples/model-pd-standin.yaml: what the groups page tells a newcomer to deploy on `gpuflow dev`
    import os

    import yaml

    path = os.path.join(os.path.dirname(__file__), "..", "gpuflow", "examples", "model-pd-standin.yaml")
    with open(path) as f:
        spec = ModelSpec.model_validate(yaml.safe_load(f))
    assert spec.is_group and [(r.name.value, r.replicas) for r in spec.roles] == [("prefill", 1), ("decode", 1)]
    # sized by what it states (vram 0 on a CPU host): nothing is read from its empty source folder
    assert spec.resources.vram == 0 and spec.cpu_offloading
    assert "--pd-role {pd_role}" in spec.run_command and "--kv-port {kv_port}" in spec.run_command
