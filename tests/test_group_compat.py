"""Which way an edit of a prefill/decode group rolls (scheduler/groups/compat.py), as a table: the
old group is a vLLM 1P1D (nixl) with ``--dtype float16`` and TP 1 on both roles unless a row says."""

from __future__ import annotations

import pytest

from scheduler.groups.compat import judge
from scheduler.groups.spec import RoleName
from scheduler.spec import ModelSpec

P, D, R = RoleName.PREFILL, RoleName.DECODE, RoleName.ROUTER


def group(params=("--dtype", "float16"), roles=None, **kw) -> ModelSpec:
    return ModelSpec.model_validate({
        "name": "pd", "backend": "vllm", "source": {"huggingface": {"repo": "Qwen/Qwen3-8B"}},
        "backend_parameters": list(params), "disaggregation": {"mode": "vllm-nixl"},
        "roles": roles or [{"name": "prefill"}, {"name": "decode"}], **kw})


def roles(p: dict | None = None, d: dict | None = None, r: dict | None = None) -> list[dict]:
    out = [{"name": "prefill", **(p or {})}, {"name": "decode", **(d or {})}]
    return out + ([{"name": "router", "backend": "custom", "run_command": "router", **r}] if r is not None else [])


OLD = group()
# (row, new spec, way, roles rolled, a word every reason must contain)
CASES = [
    ("a role's replicas", group(roles=roles(d={"replicas": 3})), "none", (), ""),
    ("readiness (the gateway's)", group(disaggregation={"mode": "vllm-nixl", "readiness": "all"}), "none", (), ""),
    ("priority", group(priority=5), "none", (), ""),
    ("decode's env", group(roles=roles(d={"env": {"OMP_NUM_THREADS": "4"}})), "roles", (D,), "env"),
    ("both roles' env: prefill then decode", group(env={"OMP_NUM_THREADS": "4"}), "roles", (P, D), "env"),
    ("decode's worker_selector", group(roles=roles(d={"worker_selector": {"tier": "b"}})), "roles", (D,),
     "worker_selector"),
    ("a parameter outside MUST_MATCH", group(params=("--dtype", "float16", "--max-num-seqs", "64")), "roles", (P, D),
     "backend_parameters"),
    # TP 1 -> 2 on prefill only: the cross pairs (2 -> 1) and (1 -> 1) are the new and the old spec's pairs
    ("prefill TP alone", group(roles=roles(p={"backend_parameters": ["--dtype", "float16", "-tp", "2"]})),
     "roles", (P,), "backend_parameters"),
    ("the router's command", group(roles=roles(r={"run_command": "router --v2"})),
     "whole", (), "roles change"),  # the old group had no router: the roles change
    ("the model", group(source={"huggingface": {"repo": "Qwen/Qwen3-14B"}}), "whole", (), "model"),
    ("dtype on both", group(params=("--dtype", "bfloat16")), "whole", (), "dtype"),
    # prefill silent on it (the spec's pairing check lets that pass), yet an old decode's KV differs from a new one's
    ("KV cache dtype on decode alone", group(roles=roles(d={"backend_parameters": ["--dtype", "float16",
                                                                                   "--kv-cache-dtype", "fp8"]})),
     "whole", (), "KV cache dtype"),
    ("block size", group(params=("--dtype", "float16", "--block-size", "32")), "whole", (), "block size"),
    ("KV cache dtype", group(params=("--dtype", "float16", "--kv-cache-dtype=fp8")), "whole", (), "KV cache dtype"),
    ("KV layout", group(env={"VLLM_ATTENTION_BACKEND": "FLASHINFER"}), "whole", (), "KV layout"),
    ("the engine's version", group(backend_version="0.11.0"), "whole", (), "engine"),
    ("the mode", group(disaggregation={"mode": "vllm-mooncake"}), "whole", (), "disaggregation.mode"),
    # TP 1 -> 2 on both: a new prefill (2) meets an old decode (1): 2 -> 1 is neither 1 -> 1 nor 2 -> 2
    ("TP on both", group(params=("--dtype", "float16", "--tensor-parallel-size", "2")), "whole", (), "TP 2 -> 1"),
    ("a role removed", group(roles=[{"name": "prefill"}, {"name": "decode"}, {"name": "router"}]), "whole", (),
     "roles change"),
    ("gather", group(gather={"strategy": "PreferGather", "layer": "host"}), "whole", (), "gather"),
    ("strategy recreate, dtype", group(params=("--dtype", "bfloat16"), rollout={"strategy": "recreate"}),
     "recreate", (), ""),
    ("strategy recreate, nothing that runs", group(rollout={"strategy": "recreate"}), "none", (), ""),
    ("no longer a group", ModelSpec.model_validate({"name": "pd", "backend": "vllm",
                                                    "source": {"huggingface": {"repo": "Qwen/Qwen3-8B"}}}),
     "recreate", (), "stops being a group"),
]


@pytest.mark.parametrize("row,new,way,rolled,word", CASES, ids=[c[0] for c in CASES])
def test_which_way_an_edit_rolls(row, new, way, rolled, word):
    j = judge(OLD, new)
    assert (j.way, j.roles) == (way, rolled), (row, j)
    assert all(word in w for w in j.why) or not word and way in ("none", "recreate"), (row, j.why)
    assert j.said().startswith({"none": "restarts nothing", "roles": "rolls role by role", "whole": "rolls the group whole",
                                "recreate": "recreates"}[way])


def test_tp_pairs_from_a_heterogeneous_group():
    # old P2 D4; new P2 D2: the roll pairs an old prefill (2) with a new decode (2) -> the new pair, and
    # a new prefill (2) with an old decode (4) -> the old pair: role by role (decode)
    old = group(roles=roles(p={"backend_parameters": ["-tp", "2"]}, d={"backend_parameters": ["-tp", "4"]}))
    new = group(roles=roles(p={"backend_parameters": ["-tp", "2"]}, d={"backend_parameters": ["-tp", "2"]}))
    assert (judge(old, new).way, judge(old, new).roles) == ("roles", (D,))
    # new P4 D2: a new prefill (4) meets an old decode (4): 4 -> 4 is neither 2 -> 4 nor 4 -> 2
    swap = group(roles=roles(p={"backend_parameters": ["-tp", "4"]}, d={"backend_parameters": ["-tp", "2"]}))
    j = judge(old, swap)
    assert j.way == "whole" and "TP 4 -> 4" in j.why[0], j.why


def test_a_custom_run_command_is_read_for_the_flags():
    base = {"name": "pd", "backend": "custom", "source": {"local_path": "/m"}, "disaggregation": {"mode": "custom"},
            "roles": [{"name": "prefill"}, {"name": "decode"}]}
    old = ModelSpec.model_validate({**base, "run_command": "serve --port {port} --block-size 16"})
    assert judge(old, ModelSpec.model_validate({**base, "run_command": "serve --port {port} --block-size 32"})).way == "whole"
    assert judge(old, ModelSpec.model_validate({**base, "run_command": "serve --port {port} --block-size 16 -v"})).way \
        == "roles"


def test_a_router_alone_rolls_alone_last():
    # a group with a router: the router's command changes (no KV passes through it): it rolls alone;
    # with the env of every role changed too, the order is prefill, decode, router
    old = group(roles=roles(r={}))
    assert judge(old, group(roles=roles(r={"run_command": "router --v2"}))).roles == (R,)
    j = judge(old, group(env={"OMP_NUM_THREADS": "4"}, roles=roles(r={"run_command": "router --v2"})))
    assert (j.way, j.roles) == ("roles", (P, D, R)), j


def test_a_deployment_wide_change_is_said_once_naming_both_roles():
    j = judge(OLD, group(params=("--dtype", "bfloat16")))
    assert j.why == ("dtype changes (prefill, decode: --dtype float16 -> bfloat16)",), j.why
