"""A group's part of ``gpuflow status`` (views/group_status.py group_view), its text
(views/render/cluster.py) and ``deploy --wait``'s verdict on it (gpuflow/deploy_wait.py judge)."""

import pytest

from contracts.control import DeploymentView
from gpuflow.deploy_wait import judge
from views.group_status import group_view
from views.render.cluster import status as status_text

SPEC = {"name": "pd", "backend": "vllm", "roles": [{"name": "prefill", "replicas": 2}, {"name": "decode"}]}


def view(instances, members, forming=(), waiting="", degraded=()):
    return DeploymentView(name="pd", replicas=1, instances=list(instances), spec=SPEC, members=members,
                          forming=list(forming), waiting=waiting, degraded=list(degraded))


def row(name, state, worker="a"):
    return {"name": name, "state": state, "worker": worker}


def dep(v, insts):
    return {"name": "pd", "replicas": 1, "backend": "vllm", "instances": insts, **group_view(v, insts)}


MEMBERS = {"pd-0": "prefill", "pd-1": "prefill", "pd-2": "decode"}


@pytest.mark.parametrize("insts,forming,waiting,degraded,roles,kinds,code", [
    # every member running: prefill 2/2, decode 1/1; deploy --wait is done (0)
    ([row("pd-0", "running"), row("pd-1", "running"), row("pd-2", "running")], [], "", [],
     "prefill 2/2, decode 1/1", [], 0),
    # not formed: no workflow yet, the three named members wait PENDING with the group's reason (3)
    ([], ["pd-0", "pd-1", "pd-2"], "unschedulable: decode does not fit: ...", [], "prefill 0/2, decode 0/1",
     ["ratio_unmet"], 3),
    # formed, a prefill still starting: a role short is ratio_unmet, and --wait waits (None)
    ([row("pd-0", "running"), row("pd-1", "starting"), row("pd-2", "running")], [], "", [],
     "prefill 1/2, decode 1/1", ["ratio_unmet"], None),
    # formed looser than its PreferGather layer: gather_unmet, as the workflow's formation said
    ([row("pd-0", "running"), row("pd-1", "running"), row("pd-2", "running")], [], "", ["gather_unmet"],
     "prefill 2/2, decode 1/1", ["gather_unmet"], 0),
    # every member running, but the workflow's last check found the decodes serving without remote KV
    # (workflows/pd_watch.py): pd_ineffective shows; it serves, so --wait is done (0)
    ([row("pd-0", "running"), row("pd-1", "running"), row("pd-2", "running")], [], "", ["gather_unmet", "pd_ineffective"],
     "prefill 2/2, decode 1/1", ["gather_unmet", "pd_ineffective"], 0),
])
def test_a_groups_status_row(insts, forming, waiting, degraded, roles, kinds, code):
    d = dep(view([i["name"] for i in insts], MEMBERS, forming, waiting, degraded), insts)
    assert d["group"]["roles"] == roles and d["group"]["degradations"] == kinds
    assert d["wanted"] == 3
    assert all(i["role"] == MEMBERS[i["name"]] for i in d["instances"])  # every row carries its role
    assert judge(d, None).code == code


def test_the_text_names_each_role_and_why_it_waits():
    insts = []
    d = dep(view([], MEMBERS, ["pd-0", "pd-1", "pd-2"], "unschedulable: decode does not fit"), insts)
    text = status_text({"deployments": [d]})
    assert "deployment pd (vllm): a group: prefill 0/2, decode 0/1" in text
    assert "degraded: ratio_unmet" in text and "waiting: unschedulable: decode does not fit" in text
    assert "pd-2 (decode)" in text


def test_the_text_says_why_pd_ineffective_was_raised():
    # the workflow's last check (workflows/pd_watch.py) said why; a degradation without words shows bare
    why = "gateway: 6 of 6 requests to a decode were prefilled there, none pulled KV from a prefill"
    insts = [row("pd-0", "running"), row("pd-1", "running"), row("pd-2", "running")]
    v = view([i["name"] for i in insts], MEMBERS, degraded=["gather_unmet", "pd_ineffective"])
    v = v.model_copy(update={"degraded_why": {"pd_ineffective": why}})
    d = dep(v, insts)
    assert d["group"]["why"] == {"pd_ineffective": why}
    assert f"  degraded: gather_unmet; pd_ineffective ({why})\n" in status_text({"deployments": [d]})


def test_a_plain_deployment_has_no_group_part():
    v = DeploymentView(name="m", replicas=2, instances=["m-0"], spec={"name": "m", "backend": "vllm"})
    insts = [row("m-0", "running")]
    assert group_view(v, insts) == {} and insts[0]["role"] is None
