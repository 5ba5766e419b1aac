"""Which spec changes roll the replicas (workflows/rollout_steps.rolls), and the rollout block's
validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from scheduler.spec import ModelSpec
from workflows.rollout_steps import rolls

BASE = {"name": "m", "backend": "custom", "run_command": "serve --port {port}", "replicas": 1,
        "source": {"local_path": "/models/m"}, "resources": {"vram": 2**30, "ram": 2**30}}

CASES = [
    # change                                                   rolls?
    ({},                                                        False),  # the same spec
    ({"replicas": 4},                                           False),  # replicas only: never a restart
    ({"autoscaling": {"min_replicas": 1, "max_replicas": 3}},   False),  # autoscaling only
    ({"rollout": {"max_surge": 2, "surge_timeout_s": 5}},       False),  # the rollout block itself
    ({"replicas": 2, "rollout": {"strategy": "recreate"}},      False),  # all three at once: still none
    ({"run_command": "serve --port {port} --v2"},               True),   # the command
    ({"env": {"OMP_NUM_THREADS": "4"}},                         True),   # the environment
    ({"resources": {"vram": 2 * 2**30, "ram": 2**30}},          True),   # the resources
    ({"routing": "least-outstanding"},                          False),  # the gateways' choice: no replica reads it
    ({"max_concurrency": 8},                                    True),   # anything else runs differently
]


@pytest.mark.parametrize("change,expected", CASES)
def test_which_changes_roll(change, expected):
    old, new = ModelSpec.model_validate(BASE), ModelSpec.model_validate({**BASE, **change})
    assert rolls(old, new) is expected


def test_explicit_defaults_are_no_change():
    # rollout: {} spelled out, or the defaults written: the same spec as none
    a = ModelSpec.model_validate(BASE)
    b = ModelSpec.model_validate({**BASE, "rollout": {"strategy": "rolling", "max_surge": 1, "max_unavailable": 0}})
    assert not rolls(a, b)


@pytest.mark.parametrize("block,named", [
    ({"strategy": "blue-green"}, "rollout.strategy"),
    ({"max_surge": -1}, "rollout.max_surge"),
    ({"failure_threshold": 0}, "rollout.failure_threshold"),
    ({"surge_timeout": 5}, "rollout.surge_timeout"),  # a misspelt field is refused, not ignored
])
def test_a_bad_rollout_block_is_refused_naming_the_field(block, named):
    with pytest.raises(ValidationError) as e:
        ModelSpec.model_validate({**BASE, "rollout": block})
    assert named in str(e.value).replace("\n", ".")


@pytest.mark.parametrize("carried,named", [
    ({"version": -1}, "rollout: version"),                     # counts are >= 0
    ({"steps": "x"}, "rollout: steps"),                        # a list of steps, not a string
    ({"steps": [{}] * 101}, "rollout: steps"),                 # at most 100 kept
    ({"good": {"name": "x"}}, "rollout: source"),              # a spec to fall back on must be valid
])
def test_a_bad_carried_rollout_state_fails_naming_it(carried, named):
    from temporalio.exceptions import ApplicationError

    from workflows.rollout_steps import state_from

    with pytest.raises(ApplicationError) as e:
        state_from(carried)
    assert named in e.value.message and e.value.non_retryable
