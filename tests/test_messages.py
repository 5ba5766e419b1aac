"""One model per message of the deployment, host and autoscaler workflows (contracts/deployment.py,
contracts/control.py CordonAsk, contracts/host.py BookingQuery), validated as untrusted input by
each update's validator (workflows/messages.py): what fits is taken, anything else is refused
before it enters a history, the problem named. The validators run here against a stand-in for the
workflow's state (what they read of it); tests/test_messages_live.py sends the same through the
Temporal CLI to a real deployment."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from contracts.deployment import InstanceEnded, ScaleAsk
from workflows.deployment import ModelDeploymentWorkflow as D
from workflows.host import HostWorkflow as H

SPEC = {"name": "chat", "backend": "custom", "source": {"local_path": "/m"}, "run_command": "srv {port}"}


def deployment():
    return SimpleNamespace(limits=None, deleting=False, name="chat", raw={"name": "chat"}, _check_new=lambda new: D._check_new(
        deployment(), new))


def host():
    return SimpleNamespace(forgotten=False, state="not_ready", greeting=None, inp=SimpleNamespace(name="h1"),
                           _check_live=lambda what: None)


@pytest.mark.parametrize("check, args, refused", [
    # scale: a ScaleAsk, or the bare whole number the CLI, the autoscaler and `temporal workflow update --input 3` send
    (D._check_scale, (3,), None),
    (D._check_scale, ({"replicas": 3},), None),
    (D._check_scale, ({"replicas": 3, "by": "me"},), "by: Extra inputs are not permitted"),
    (D._check_scale, ({"replicas": "3"},), "replicas: not a whole number >= 0"),
    (D._check_scale, ([3],), "got '[3]' (list)"),
    (D._check_scale, (3, 4), 'scale takes one whole number of replicas >= 0 (or {"replicas": n}), got 2 inputs'),
    # update_spec: one model spec, named as the deployment's
    (D._check_spec, (SPEC,), None),
    (D._check_spec, ({**SPEC, "name": "other"},), "spec name 'other' does not match deployment 'chat'"),
    (D._check_spec, ({**SPEC, "backend": "tensorrt"},), "update_spec takes one model spec JSON object: backend:"),
    (D._check_spec, ("chat",), "update_spec takes one model spec JSON object: (top level)"),
    (D._check_spec, (), "update_spec takes one model spec JSON object, got 0 inputs"),
    # the updates that take nothing say so when given something
    (D._check_delete, (), None),
    (D._check_delete, ("now",), "delete takes no input; it was given 1 ('now')"),
    (D._check_accepted, ({"x": 1},), "accepted takes no input"),
    (D._check_undo, (1,), "rollout_undo takes no input"),
])
def test_the_deployments_updates_take_one_model_each(check, args, refused):
    if refused is None:
        check(deployment(), *args)
    else:
        with pytest.raises(ValueError) as e:
            check(deployment(), *args)
        assert refused in str(e.value)


@pytest.mark.parametrize("check, args, refused", [
    (H._check_cordon, (), None),  # no reason
    (H._check_cordon, ({"reason": "disk swap"},), None),
    (H._check_cordon, ({"reason": "ok", "by": "me"},), "cordon takes only a reason; it was given 'by'"),
    (H._check_cordon, ("ok",), 'cordon takes nothing or one JSON object {"reason": "..."}'),
    (H._check_cordon, ({}, {}), "got 2 inputs"),
    (H._check_booking, ({"instance": "chat-0"},), None),
    (H._check_booking, ({"instance": "chat-0", "part": "p9"},), "part: Extra inputs are not permitted"),
    (H._check_booking, ("chat-0",), "booking takes one BookingQuery JSON object"),
    (H._check_bookings, ({"instances": ["chat-0"]},), None),
    (H._check_bookings, ({"instances": "chat-0"},), "instances: Input should be a valid list"),
    (H._check_uncordon, ("x",), "uncordon takes no input"),
    (H._check_leave, (True,), "leave takes no input"),
    (H._check_forget, ({},), "forget takes no input"),
])
def test_the_hosts_updates_take_one_model_each(check, args, refused):
    if refused is None:
        check(host(), *args)
    else:
        with pytest.raises(ValueError) as e:
            check(host(), *args)
        assert refused in str(e.value)


@pytest.mark.parametrize("raw, instance", [
    ("chat-0", "chat-0"),  # a bare name: what replicas sent before the model, and old histories replay
    ({"instance": "chat-1"}, "chat-1"),
])
def test_instance_ended_takes_an_instance_or_its_bare_name(raw, instance):
    assert InstanceEnded.model_validate(raw).instance == instance


@pytest.mark.parametrize("raw", [{"name": "chat-0"}, "../etc", 42, {"instance": "chat-0", "x": 1}])
def test_instance_ended_refuses_what_is_not_one(raw):
    with pytest.raises(ValueError):
        InstanceEnded.model_validate(raw)


def test_scale_ask_reads_a_bare_number_as_its_replicas():
    assert ScaleAsk.model_validate(3) == ScaleAsk.model_validate({"replicas": 3}) == ScaleAsk(replicas=3)
