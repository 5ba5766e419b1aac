"""The environment's GPUFLOW_ variables when Settings cannot take them: an InvalidInput whose
lines name the variable, never pydantic's traceback, and a typo in a section's key is refused
rather than ignored (its default would silently stay in force)."""

import os
import subprocess
import sys

import pytest

from gpuflow.policy_env import policy_config
from gpuflow.settings import Settings
from scheduler.errors import InvalidInput

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "gpuflow", "examples")


@pytest.fixture
def env(monkeypatch):
    for k in list(os.environ):
        if k.upper().startswith("GPUFLOW_"):
            monkeypatch.delenv(k)

    def set_(**kv):
        for k, v in kv.items():
            monkeypatch.setenv(k, v)
    return set_


@pytest.mark.parametrize("variables, line", [
    # a value its field refuses: the variable and the value
    ({"GPUFLOW_SCHEDULER__PLACEMENT": "abc"},
     "  GPUFLOW_SCHEDULER__PLACEMENT: Input should be a valid number, unable to parse string as a number (got 'abc')"),
    # names match whatever their case; the line names the variable as it was set
    ({"gpuflow_scheduler__Locality": "-2"},
     "  gpuflow_scheduler__Locality: Input should be greater than or equal to 0 (got '-2')"),
    # a whole section as JSON: the variable, then the key inside it
    ({"GPUFLOW_SCHEDULER": '{"placement": -1}'},
     "  GPUFLOW_SCHEDULER: placement: Input should be greater than or equal to 0 (got -1)"),
    ({"GPUFLOW_SCHEDULER": "5"},
     "  GPUFLOW_SCHEDULER: Input should be a valid dictionary or instance of PolicyConfig (got 5)"),
    # JSON that does not parse (pydantic-settings names only the field)
    ({"GPUFLOW_SCHEDULER": "{bad"},
     "  GPUFLOW_SCHEDULER: not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ({"GPUFLOW_ALLOW_ENV": "MYAPP_*"}, "  GPUFLOW_ALLOW_ENV: not valid JSON: Expecting value: line 1 column 1 (char 0)"),
    # keys under a field that takes one value
    ({"GPUFLOW_SCHEDULER__PLACEMENT__X": "1"},
     "  GPUFLOW_SCHEDULER__PLACEMENT__X: Input should be a valid number; placement takes one value, with no keys under it"),
    # a key its section does not have: refused, with the nearest one
    ({"GPUFLOW_SCHEDULER__PLACMENT": "50"},
     "  GPUFLOW_SCHEDULER__PLACMENT: scheduler has no setting 'placment'; did you mean GPUFLOW_SCHEDULER__PLACEMENT?"),
    ({"GPUFLOW_TEMPORAL__ZZZ": "1"},
     "  GPUFLOW_TEMPORAL__ZZZ: temporal has no setting 'zzz'; it has address, api_key, namespace, tls, tls_ca, tls_cert, tls_key"),
    ({"GPUFLOW_TEMPORAL__TLS": "maybe"},
     "  GPUFLOW_TEMPORAL__TLS: Input should be a valid boolean, unable to interpret input (got 'maybe')"),
])
def test_bad_environment_names_the_variable(env, variables, line):
    env(**variables)
    with pytest.raises(InvalidInput) as e:
        Settings()
    assert str(e.value) == "the environment's settings are invalid:\n" + line


def test_every_problem_at_once(env):
    env(GPUFLOW_SCHEDULER__PLACEMENT="-1", GPUFLOW_LIMITS__MAX_REPLICAS="many")
    with pytest.raises(InvalidInput) as e:
        Settings()
    assert [ln.split(":")[0].strip() for ln in str(e.value).splitlines()[1:]] == \
        ["GPUFLOW_SCHEDULER__PLACEMENT", "GPUFLOW_LIMITS__MAX_REPLICAS"]


@pytest.mark.parametrize("variables, placement, locality", [
    ({}, 100.0, 5.0),  # the defaults
    ({"GPUFLOW_SCHEDULER__PLACEMENT": "50"}, 50.0, 5.0),
    # the JSON section, then a nested variable over it (pydantic-settings' merge)
    ({"GPUFLOW_SCHEDULER": '{"placement": 3}', "GPUFLOW_SCHEDULER__LOCALITY": "7"}, 3.0, 7.0),
    # GPUFLOW_ names that no setting has are read elsewhere (GPUFLOW_PUBLISH_ADDRESS): left alone
    ({"GPUFLOW_PUBLISH_ADDRESS": "10.0.0.1", "GPUFLOW_TEST_ANYTHING": "x"}, 100.0, 5.0),
])
def test_good_environment_still_reads(env, variables, placement, locality):
    env(**variables)
    s = Settings().scheduler
    assert (s.placement, s.locality) == (placement, locality)
    assert policy_config() == s  # the dry runs' reader: the same settings, with or without pydantic-settings


@pytest.mark.parametrize("variables", [
    {"GPUFLOW_SCHEDULER__PLACEMENT": "-1"},
    {"gpuflow_scheduler__placement": "abc"},  # names match case-insensitively, as pydantic-settings matches them
    {"GPUFLOW_TIMINGS__SETTLE_S": "soon"},  # another section's bad value stops the dry runs too, as every command
])
def test_dry_runs_refuse_what_settings_refuse(env, variables):
    env(**variables)
    with pytest.raises(InvalidInput) as direct:
        Settings()
    with pytest.raises(InvalidInput) as dry:
        policy_config()
    assert str(dry.value) == str(direct.value)


def test_values_passed_in_code_are_named_by_field(env):
    with pytest.raises(InvalidInput) as e:
        Settings(data_dir=["not", "a", "path"])
    assert str(e.value).splitlines()[1] == "  data_dir: Input should be a valid string (got ['not', 'a', 'path'])"


def test_cli_says_it_in_one_line_exit_2():
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("GPUFLOW_")}
    p = subprocess.run([sys.executable, "-m", "gpuflow.cli", "schedule", "--cluster", os.path.join(EXAMPLES, "cluster.yaml"),
                        "--model", os.path.join(EXAMPLES, "model-custom.yaml")],
                       capture_output=True, text=True, env={**env, "GPUFLOW_SCHEDULER__PLACEMENT": "abc"})
    assert p.returncode == 2, p.stderr
    assert p.stderr == ("gpuflow: error: the environment's settings are invalid:\n  GPUFLOW_SCHEDULER__PLACEMENT: "
                        "Input should be a valid number, unable to parse string as a number (got 'abc')\n")
