"""A scale is a whole number (issue 40's low: ``scale true`` and ``scale "3"`` were accepted: the
data converter reads ``true`` as 1 and ``"3"`` as 3 for an ``int`` parameter). The client
(gpuflow/ops.py) and the deployment workflow's validator refuse anything else, naming it; a raw
``temporal workflow update`` is refused on a real server in tests/test_trust_keys_live.py."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from gpuflow.ops import _check_replicas
from scheduler.errors import InvalidInput
from scheduler.limits import REPLICAS_CEILING
from workflows.deployment import ModelDeploymentWorkflow

BAD = [
    (True, "'True' (bool)"),  # Python's True is 1; the converter made it 1 too
    (False, "'False' (bool)"),
    ("3", "'3' (str)"),
    (3.0, "'3.0' (float)"),
    (None, "'None' (NoneType)"),
]


@pytest.mark.parametrize("v, shown", BAD)
def test_the_client_refuses_what_is_not_a_whole_number(v, shown):
    with pytest.raises(InvalidInput, match=re.escape(f"replicas must be a whole number >= 0, got {shown}")):
        _check_replicas(v)


def validate(*args):
    wf = SimpleNamespace(limits=None, deleting=False, name="chat", raw={"name": "chat"})  # what the validator reads
    ModelDeploymentWorkflow._check_scale(wf, *args)


@pytest.mark.parametrize("v, shown", BAD + [(-1, "'-1' (int)")])
def test_the_workflow_refuses_what_is_not_a_whole_number(v, shown):
    with pytest.raises(ValueError, match=r"scale takes one whole number of replicas >= 0 .*, got " + re.escape(shown)):
        validate(v)


@pytest.mark.parametrize("args, why", [
    ((), "got 0 inputs"),
    ((1, 2), "got 2 inputs"),
    ((REPLICAS_CEILING + 1,), f"more than the ceiling of {REPLICAS_CEILING}"),
])
def test_the_workflow_takes_one_input_within_the_ceiling(args, why):
    with pytest.raises(ValueError, match=why):
        validate(*args)


@pytest.mark.parametrize("n", [0, 3, REPLICAS_CEILING])
def test_whole_numbers_pass(n):
    _check_replicas(n)
    validate(n)


def test_a_group_is_scaled_one_role_at_a_time():
    wf = SimpleNamespace(limits=None, deleting=False, name="pd", raw={"name": "pd", "roles": [{"name": "prefill"}]})
    with pytest.raises(ValueError, match=r"pd is a prefill/decode group: scale one role \(--role ROLE\), or switch "
                                         r"it off \(0\) or on \(1\)"):
        ModelDeploymentWorkflow._check_scale(wf, 2)
    for n in (0, 1):  # the group's own replicas: off or on
        ModelDeploymentWorkflow._check_scale(wf, n)
