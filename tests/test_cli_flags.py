"""The CLI's flags come from the typed settings (gpuflow/cli/flags.py), so no default is written
twice: a flag that sets a settings field takes its help from the field's description (which states
the default) and leaves the default to the environment, else the field; the agent's engine flags
take name, help and default from EngineConfig's fields. Every command keeps every flag it had."""

from __future__ import annotations

import argparse
import os

import pytest

from gpuflow.cli import parser
from gpuflow.cli.connection import settings_from
from gpuflow.cli.flags import dataclass_from
from gpuflow.settings import AgentSettings, ServerSettings, Settings, TemporalSettings
from worker_agent.engines import EngineConfig

# the flags each command had before they were made from the settings (issue 34): kept, every one
FLAGS = {
    "logs": "--address --api-key --bytes --follow,-f --namespace --tls-ca --tls-cert --tls-key instance",
    "server": "--address --api-key --capacity-hook --data-dir --database-url --hf-endpoint --metrics-address "
              "--namespace --tls-ca --tls-cert --tls-key",
    "agent": "--address --advertise-address --allow-custom --allow-engine-flag --allow-env --allow-remote-code "
             "--api-key --data-dir --hf-endpoint --inventory --join-token --join-token-file --keep-logs --kv-connector "
             "--kv-events --label --llama-cpp-python --llama-server --metrics-address --model-cache --model-root "
             "--name --namespace --ray --rpc-server --sglang-python --tls-ca --tls-cert --tls-key --vllm",
    "deploy": "--address --api-key --namespace --replicas --timeout --tls-ca --tls-cert --tls-key --wait spec",
    "scale": "--address --api-key --namespace --role --tls-ca --tls-cert --tls-key name replicas",
    "delete": "--address --api-key --namespace --tls-ca --tls-cert --tls-key --wait name",
    "status": "--address --api-key --data-dir --database-url --json --namespace --summary --tls-ca --tls-cert "
              "--tls-key name",
    "explain": "--address --api-key --data-dir --database-url --decision --history --json --limit --namespace "
               "--replay --snapshot --tls-ca --tls-cert --tls-key --with-settings instance",
    "hosts": "--address --api-key --data-dir --database-url --json --namespace --reason --tls-ca --tls-cert "
             "--tls-key action names",
    # a group's one role with --role (issue 35)
    "autoscale": "--address --api-key --json --namespace --role --tls-ca --tls-cert --tls-key name",
    # the prefix index's size in blocks of text or, since issue 39, in tokens as engines count their cache;
    # --no-route-cost: the guard alone, without the measured cost's veto (issue 39)
    "gateway": "--address --allow-anonymous --api-key --body-timeout --connect-timeout --data-dir --database-url "
               "--first-byte-timeout --header-timeout --http-client --idle-timeout --listen --max-body "
               "--max-concurrency --max-queue --metrics-key-required --namespace --no-kv-events --no-route-cost "
               "--prefix-cache-blocks --prefix-cache-tokens --public-name --queue-timeout --route-slack --routing --temporal-ui-url --tls-ca "
               "--tls-cert --tls-key --tokenizer-root",
    # the stand-in engine; its simulated GPU and prefill/decode role (issue 35) from --block-tokens to --sim-gpu
    "standin": "--api-key --block-tokens --engine-id --exit-after-s --host --kv-blocks --kv-hold-s --kv-host --kv-port --kv-token-s "
               "--max-seqs --model-name --pd-role --port --prefill-chunk --prefill-token-s --sim-gpu --token-s",
}


def command(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def action(cmd: str, flag: str) -> argparse.Action:
    return next(a for a in command(cmd)._actions if flag in a.option_strings)


@pytest.mark.parametrize("cmd, flags", FLAGS.items())
def test_every_command_keeps_every_flag(cmd, flags):
    got = sorted(",".join(a.option_strings) or a.dest for a in command(cmd)._actions
                 if not isinstance(a, argparse._HelpAction))
    assert " ".join(got) == flags


@pytest.mark.parametrize("cmd, flag, model, field, env", [
    ("deploy", "--address", TemporalSettings, "address", "GPUFLOW_TEMPORAL__ADDRESS"),
    ("hosts", "--api-key", TemporalSettings, "api_key", "GPUFLOW_TEMPORAL__API_KEY"),
    ("server", "--metrics-address", ServerSettings, "metrics_address", "GPUFLOW_SERVER__METRICS_ADDRESS"),
    ("agent", "--metrics-address", AgentSettings, "metrics_address", "GPUFLOW_AGENT__METRICS_ADDRESS"),
    ("server", "--capacity-hook", Settings, "capacity_hook", "GPUFLOW_CAPACITY_HOOK"),
    ("agent", "--join-token-file", AgentSettings, "join_token_file", "GPUFLOW_AGENT__JOIN_TOKEN_FILE"),
])
def test_a_settings_flag_says_what_its_field_says_and_leaves_the_default_to_it(cmd, flag, model, field, env):
    a = action(cmd, flag)
    assert model.model_fields[field].description.rstrip(".") in a.help and env in a.help
    assert a.default is None  # unset, the environment decides, else the field's default


@pytest.mark.parametrize("argv, env, where, want", [
    (["server"], {}, "server.metrics_address", "127.0.0.1:9400"),  # the field's default
    (["agent"], {}, "agent.metrics_address", "127.0.0.1:9401"),
    (["server"], {"GPUFLOW_SERVER__METRICS_ADDRESS": "off"}, "server.metrics_address", "off"),  # the environment's
    (["server", "--metrics-address", "0.0.0.0:1"], {"GPUFLOW_SERVER__METRICS_ADDRESS": "off"},
     "server.metrics_address", "0.0.0.0:1"),  # the flag wins
    (["deploy", "x.yaml"], {"GPUFLOW_TEMPORAL__ADDRESS": "t:7233"}, "temporal.address", "t:7233"),
    (["deploy", "x.yaml", "--address", "u:1"], {"GPUFLOW_TEMPORAL__ADDRESS": "t:7233"}, "temporal.address", "u:1"),
    (["agent", "--join-token", "gft_x"], {}, "agent.join_token", "gft_x"),  # a secret, read as the section reads it
    (["status", "--data-dir", "/d"], {}, "data_dir", "/d"),
])
def test_settings_from_the_environment_then_the_flags(monkeypatch, argv, env, where, want):
    for k in [k for k in os.environ if k.startswith("GPUFLOW_")]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    got = settings_from(parser().parse_args(argv))
    for part in where.split("."):
        got = getattr(got, part)
    assert (got.get_secret_value() if hasattr(got, "get_secret_value") else got) == want


def test_the_agents_engine_flags_are_engine_configs_fields():
    a = parser().parse_args(["agent"])
    assert dataclass_from(EngineConfig, a, a.engine_flags) == EngineConfig()  # unset: EngineConfig's own defaults
    vllm = action("agent", "--vllm")
    assert vllm.default == EngineConfig().vllm and vllm.help.endswith(f"(default {EngineConfig().vllm})")
    a = parser().parse_args(["agent", "--vllm", "/opt/vllm", "--model-root", "/m", "--model-root", "/n",
                             "--allow-env", "MYAPP_*", "--kv-events"])
    got = dataclass_from(EngineConfig, a, a.engine_flags)
    assert (got.vllm, got.model_roots, got.allow_env, got.kv_events) == ("/opt/vllm", ("/m", "/n"), ("MYAPP_*",), True)


@pytest.mark.parametrize("argv, blocks", [
    ([], 16384),  # the default: blocks of 128 characters
    (["--prefix-cache-blocks", "128"], 128),
    # vLLM's num_gpu_blocks 2,048 x block_size 16 = 32,768 tokens; x 4 characters / 128 = 1,024 blocks
    (["--prefix-cache-tokens", "32768"], 1024),
    (["--prefix-cache-blocks", "128", "--prefix-cache-tokens", "32768"], 1024),  # tokens, given, win
    (["--prefix-cache-tokens", "10"], 1),  # 10 x 4 / 128 = 0: at least one block
])
def test_the_gateways_prefix_index_is_sized_in_blocks_of_text_or_in_tokens(argv, blocks):
    from gateway.config import GatewaySettings

    a = parser().parse_args(["gateway", *argv])
    assert dataclass_from(GatewaySettings, a, a.gateway_flags).prefix_cache_blocks == blocks
    assert "128 characters" in action("gateway", "--prefix-cache-blocks").help  # its unit, in --help
    assert "tokens" in action("gateway", "--prefix-cache-tokens").help


@pytest.mark.parametrize("argv, cost", [([], True), (["--no-route-cost"], False)])
def test_the_gateways_cost_veto_can_be_switched_off(argv, cost):
    from gateway.app import Gateway
    from gateway.config import GatewaySettings

    a = parser().parse_args(["gateway", *argv])
    s = dataclass_from(GatewaySettings, a, a.gateway_flags)
    assert s.route_cost is cost
    assert Gateway(None, s).balancer.knobs.cost is cost  # what the balancer's choices are made with
