"""A prefill/decode member's argv, env and ports per mode (worker_agent/pd_argv.py), checked
against the engines' published flags in the versions gpuflow's flag lists name:

- vLLM 0.11.0: ``--kv-transfer-config`` (JSON of KVTransferConfig: kv_connector, kv_role in
  kv_producer|kv_consumer|kv_both, kv_port, engine_id, kv_connector_module_path,
  kv_connector_extra_config; kv_port an int); the connectors its KVConnectorFactory registers (NixlConnector; no
  MooncakeConnector before a later release); envs.py ``VLLM_NIXL_SIDE_CHANNEL_HOST`` (default
  "localhost") and ``VLLM_NIXL_SIDE_CHANNEL_PORT`` (default 5557); nixl_connector.py's handshake
  listener binds ``base + dp_rank * tp_size + tp_rank``, so DP 1 with TP t binds base .. base+t-1.
- vllm-ascend 0.11.0rc0: ``MooncakeConnectorV1`` (registered by its plugin; the class is
  vllm_ascend.distributed.mooncake_connector.MooncakeConnector),
  kv_port a base (each TP rank handshakes on kv_port + rank), engine_id, and
  kv_connector_extra_config.prefill/decode.tp_size (asserted present; prefill's >= decode's).
- SGLang 0.5.3 server_args.py: ``--disaggregation-mode`` choices null|prefill|decode,
  ``--disaggregation-transfer-backend`` choices mooncake|nixl|ascend|fake,
  ``--disaggregation-bootstrap-port`` (default 8998; its bootstrap server runs on the prefill only,
  managers/disagg_service.py, bound to --host)."""

from __future__ import annotations

import json
import socket

import pytest

from contracts import launch_proof
from contracts.agent import PD_MODES, LaunchRequest
from scheduler.groups.spec import PDMode
from worker_agent import pd_argv
from worker_agent import processes as procs
from worker_agent.engines import EngineConfig, custom_argv, sglang_argv, vllm_argv
from worker_agent.pd_argv import PDPorts
from worker_agent.processes import PDWords, build_argv, free_ports

VLLM_0_11_CONNECTORS = {"SharedStorageConnector", "P2pNcclConnector", "LMCacheConnectorV1", "NixlConnector",
                        "MultiConnector", "OffloadingConnector"}  # vllm 0.11.0 kv_connector/factory.py
VLLM_KV_ROLES = {"kv_producer", "kv_consumer", "kv_both"}  # vllm 0.11.0 config/kv_transfer.py KVRole
VLLM_KV_KEYS = {"kv_connector", "engine_id", "kv_buffer_device", "kv_buffer_size", "kv_role", "kv_rank",
                "kv_parallel_size", "kv_ip", "kv_port", "kv_connector_extra_config", "kv_connector_module_path"}
SGLANG_MODES = {"null", "prefill", "decode"}  # sglang 0.5.3 server_args.py
SGLANG_BACKENDS = {"mooncake", "nixl", "ascend", "fake"}  # DISAGG_TRANSFER_BACKEND_CHOICES


def member(backend="vllm", pd="prefill", mode="vllm-nixl", gpus=(0,), params=(), **kw) -> LaunchRequest:
    return LaunchRequest(instance="pd-prefill-0", model="m", backend=backend, gpu_indexes=list(gpus),
                         model_path="/models/m", backend_parameters=list(params), pd_role=pd, pd_mode=mode, **kw)


def test_the_contract_names_every_mode_the_spec_has():
    assert set(PD_MODES) == {m.value for m in PDMode}


# --- custom: the placeholders ------------------------------------------------------------------------------

CMD = "srv --port {port} --pd-role {pd_role} --kv-port {kv_port} --bootstrap {bootstrap_port}"


@pytest.mark.parametrize("words, want", [
    (PDWords("prefill", 7001, 7002), ["srv", "--port", "8000", "--pd-role", "prefill", "--kv-port", "7001",
                                      "--bootstrap", "7002"]),
    (PDWords("decode", 7001, None), ["srv", "--port", "8000", "--pd-role", "decode", "--kv-port", "7001",
                                     "--bootstrap", ""]),
    (PDWords(), ["srv", "--port", "8000", "--pd-role", "", "--kv-port", "", "--bootstrap", ""]),  # a router: empty
])
def test_custom_placeholders(words, want):
    assert build_argv(CMD, 8000, None, [0], pd=words) == want
    assert build_argv("srv --kv={kv_port}", 1, None, [], pd=words)[1] == f"--kv={words.kv_port or ''}"  # inside a word


def test_custom_argv_gets_the_members_role_and_ports():
    cfg = EngineConfig(allow_custom=True, kv_port=7001, bootstrap_port=7002)
    req = member("custom", "decode", "custom", run_command=CMD)
    assert custom_argv(req, 8000, cfg)[3:] == ["--pd-role", "decode", "--kv-port", "7001", "--bootstrap", "7002"]


@pytest.mark.parametrize("req, want", [
    (member("custom", "prefill", "custom", run_command=CMD), PDPorts(kv=1, bootstrap=True)),
    (member("custom", "decode", "custom", run_command="srv --port {port} --kv-port {kv_port}"), PDPorts(kv=1)),
    (member("custom", None, None, run_command="srv --b {bootstrap_port}"), PDPorts(bootstrap=True)),  # any launch naming it
    (member("custom", "prefill", "custom", run_command="srv --port {port}"), PDPorts()),  # named nothing: picked nothing
    (member("vllm", "prefill", "vllm-nixl", gpus=(0, 1, 2, 3)), PDPorts(kv=4)),  # TP 4: ranks bind base .. base+3
    (member("vllm", "decode", "vllm-nixl"), PDPorts(kv=1)),
    (member("vllm", "prefill", "vllm-nixl", params=["--kv-transfer-config", "{}"]), PDPorts()),  # the spec's own
    (member("vllm", "prefill", "vllm-mooncake"), PDPorts(bootstrap=True)),
    (member("vllm", "decode", "vllm-mooncake"), PDPorts()),  # the decode runs no bootstrap server
    (member("vllm", "decode", "vllm-ascend-mooncake", gpus=(0, 1)), PDPorts(kv=2)),
    (member("sglang", "prefill", "sglang-mooncake"), PDPorts(bootstrap=True)),
    (member("sglang", "decode", "sglang-nixl"), PDPorts()),
    (member("sglang", "prefill", "sglang-nixl", role="sglang-node"), PDPorts()),  # only rank 0, the server
    (member("vllm", None, None), PDPorts()),  # a plain replica
])
def test_which_ports_a_launch_gets(req, want):
    assert pd_argv.ports_wanted(req) == want


@pytest.mark.parametrize("req, refused", [
    (member("vllm", "prefill", "vllm-nixl", distributed=True), True),
    (member("sglang", "decode", "sglang-mooncake", distributed=True), True),
    (member("vllm", "prefill", "vllm-nixl", distributed=True, params=["--kv-transfer-config", "{}"]), False),
    (member("custom", "prefill", "custom", distributed=True, run_command=CMD), False),  # its command decides
    (member("vllm", None, None, distributed=True), False),  # a plain replica across workers, as before
    (member("vllm", "prefill", "vllm-nixl"), False),
])
def test_a_member_across_several_workers_is_refused_naming_the_mode(req, refused):
    from worker_agent.engines import LaunchRefused, check_launch

    if not refused:
        check_launch(req, EngineConfig(allow_engine_flags=("--kv-transfer-config",)))
        return
    with pytest.raises(LaunchRefused, match=f"pd_mode {req.pd_mode}: a {req.pd_role} member placed across"):
        check_launch(req, EngineConfig())


# --- vLLM ---------------------------------------------------------------------------------------------------

def kv_config(argv: list[str]) -> dict:
    assert argv.count("--kv-transfer-config") == 1
    cfg = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert set(cfg) <= VLLM_KV_KEYS and cfg["kv_role"] in VLLM_KV_ROLES
    return cfg


@pytest.mark.parametrize("req, connector, role", [
    (member("vllm", "prefill", "vllm-nixl"), "NixlConnector", "kv_both"),
    (member("vllm", "decode", "vllm-nixl"), "NixlConnector", "kv_both"),  # a decode may prefill a short prompt itself
    (member("vllm", "prefill", "vllm-mooncake"), "MooncakeConnector", "kv_producer"),
    (member("vllm", "decode", "vllm-mooncake"), "MooncakeConnector", "kv_consumer"),
    (member("vllm", "prefill", "vllm-ascend-mooncake"), "MooncakeConnectorV1", "kv_producer"),
    (member("vllm", "decode", "vllm-ascend-mooncake"), "MooncakeConnectorV1", "kv_consumer"),
])
def test_vllm_kv_transfer_config_per_mode_and_role(req, connector, role):
    cfg = kv_config(vllm_argv(req, 8000, EngineConfig(kv_port=7100, bootstrap_port=7200)))
    assert (cfg["kv_connector"], cfg["kv_role"]) == (connector, role)
    if req.pd_mode == "vllm-nixl":
        assert connector in VLLM_0_11_CONNECTORS and set(cfg) == {"kv_connector", "kv_role"}


def test_vllm_nixl_side_channel_env_binds_the_agents_address_and_the_picked_base():
    req = member("vllm", "prefill", "vllm-nixl", gpus=(0, 1))
    assert pd_argv.pd_env(req, "10.0.0.5", 7100, None) == {"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.5",
                                                          "VLLM_NIXL_SIDE_CHANNEL_PORT": "7100"}
    assert pd_argv.recorded(7100, None) == 7100  # rank 0's port: what the prefill answers as remote_port
    assert pd_argv.pd_env(member("vllm", None, None), "10.0.0.5", None, None) == {}


def test_vllm_mooncake_bootstrap_env_on_the_prefill_only():
    assert pd_argv.pd_env(member("vllm", "prefill", "vllm-mooncake"), "h", None, 7200) == \
        {"VLLM_MOONCAKE_BOOTSTRAP_PORT": "7200"}
    assert pd_argv.pd_env(member("vllm", "decode", "vllm-mooncake"), "h", None, None) == {}


def test_vllm_ascend_config_names_both_roles_tp_and_a_port_base():
    req = member("vllm", "decode", "vllm-ascend-mooncake", gpus=(0, 1))
    cfg = kv_config(vllm_argv(req, 8000, EngineConfig(kv_port=7100)))
    assert "kv_connector_module_path" not in cfg  # registered by vllm-ascend's plugin, by that name
    assert cfg["kv_port"] == 7100 and cfg["engine_id"] == "pd-prefill-0"  # unique per member: its name
    extra = cfg["kv_connector_extra_config"]
    assert extra["prefill"]["tp_size"] >= extra["decode"]["tp_size"] == 2  # vllm-ascend asserts prefill >= decode


def test_the_specs_own_kv_transfer_config_wins_and_plain_replicas_get_none():
    own = member("vllm", "prefill", "vllm-nixl", params=["--kv-transfer-config", '{"kv_connector":"X"}'])
    assert vllm_argv(own, 8000, EngineConfig(kv_port=7100)).count("--kv-transfer-config") == 1  # the spec's
    assert pd_argv.pd_env(own, "h", 7100, None) == {}
    assert "--kv-transfer-config" not in vllm_argv(member("vllm", None, None), 8000, EngineConfig())
    assert "--kv-transfer-config" not in vllm_argv(member("vllm", None, "vllm-nixl"), 8000, EngineConfig())  # a router


# --- SGLang -------------------------------------------------------------------------------------------------

def disagg(argv: list[str]) -> dict[str, str]:
    out = {f: argv[argv.index(f) + 1] for f in argv if f.startswith("--disaggregation-")}
    assert out.get("--disaggregation-mode", "null") in SGLANG_MODES
    assert out.get("--disaggregation-transfer-backend", "mooncake") in SGLANG_BACKENDS
    return out


@pytest.mark.parametrize("req, want", [
    (member("sglang", "prefill", "sglang-mooncake"), {"--disaggregation-mode": "prefill",
     "--disaggregation-transfer-backend": "mooncake", "--disaggregation-bootstrap-port": "7200"}),
    (member("sglang", "decode", "sglang-mooncake"), {"--disaggregation-mode": "decode",
     "--disaggregation-transfer-backend": "mooncake"}),  # the decode's bootstrap port comes with each request
    (member("sglang", "prefill", "sglang-nixl"), {"--disaggregation-mode": "prefill",
     "--disaggregation-transfer-backend": "nixl", "--disaggregation-bootstrap-port": "7200"}),
    (member("sglang", "decode", "sglang-nixl"), {"--disaggregation-mode": "decode",
     "--disaggregation-transfer-backend": "nixl"}),
    (member("sglang", None, None), {}),
])
def test_sglang_disaggregation_flags_per_mode_and_role(req, want):
    boot = 7200 if pd_argv.ports_wanted(req).bootstrap else None
    argv = sglang_argv(req, 8000, EngineConfig(bootstrap_port=boot))
    assert disagg(argv) == want
    assert argv[argv.index("--host") + 1] == "127.0.0.1"  # the bootstrap server binds --host: the agent's address
    assert pd_argv.recorded(None, boot) == boot


# --- ports ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_free_ports_are_consecutive_free_and_not_handed_out_again(n):
    base = free_ports(n)
    got = range(base, base + n)
    for p in got:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # free: raises otherwise
        assert p in procs._handed_out  # remembered: no other launch of this agent gets it
    other = free_ports(n)
    assert not set(got) & set(range(other, other + n))  # the next launch's range is another


# --- the MAC covers the port ---------------------------------------------------------------------------------

def test_the_launch_mac_covers_the_bootstrap_port_and_older_macs_stay_valid():
    key = b"k" * 32
    old = launch_proof.body("pd-0", "", 10, 8000, "10.0.0.5", "n" * 16, None)
    assert launch_proof.body("pd-0", "", 10, 8000, "10.0.0.5", "n" * 16, None, None) == old  # none: the same body
    signed = launch_proof.body("pd-0", "", 10, 8000, "10.0.0.5", "n" * 16, None, 7200)
    mac = launch_proof.sign(key, "h1", signed)
    assert launch_proof.problem(key, "h1", signed, mac) is None
    moved = launch_proof.body("pd-0", "", 10, 8000, "10.0.0.5", "n" * 16, None, 7201)
    assert "does not verify" in launch_proof.problem(key, "h1", moved, mac)  # another port: refused
    assert "does not verify" in launch_proof.problem(key, "h1", old, mac)  # dropped: refused


# --- the store writes the port only with its host's word (a real SQLite store) -------------------------------

from tests.test_launch_proof import NONCE, world  # noqa: E402,F401  (the fixture: h1 and h2 joined, a-0 booked on h1)


def boot_launch(cred, signed: int | None, **edit):
    from contracts.control import InstanceRecord

    fields = launch_proof.body("a-0", "", 4242, 8000, "10.0.0.1", NONCE, None, signed)
    rec = dict(name="a-0", deployment="a", model="a", state="running", worker="h1", pid=4242, port=8000,
               address="10.0.0.1", bootstrap_port=signed, key_id=NONCE,
               launch_mac=launch_proof.sign(cred.key, cred.name, fields))
    return InstanceRecord(**{**rec, **edit})


@pytest.mark.parametrize("signed, recorded, refused", [
    (7200, 7200, False),  # the agent's figure: the row keeps it for the gateways
    (None, None, False),  # none (a router, a plain replica): the MAC of before
    (7200, 6666, True),  # edited after the MAC: the gateways would hand decodes another port
    (7200, None, True),  # dropped
    (None, 6666, True),  # added
])
def test_the_row_records_the_bootstrap_port_only_as_its_host_signed_it(world, signed, recorded, refused):
    from store import records
    from store.engine_keys import UnprovenLaunch

    engine, h1, _ = world
    rec = boot_launch(h1, signed, bootstrap_port=recorded)
    if refused:
        with pytest.raises(UnprovenLaunch, match="does not verify"):
            records.record_instance(engine, rec)
        assert records.instances_of(engine) == []  # nothing written
        return
    records.record_instance(engine, rec)
    assert records.instances_of(engine)[0].bootstrap_port == recorded


async def test_an_adopted_member_reports_the_same_bootstrap_port(tmp_path):
    """The pid file keeps the port: an agent restarted on the host (a new table on the same folder)
    adopts the engine and its LaunchResult carries the same figure, so the same MAC."""
    first = procs.ProcessTable(str(tmp_path))
    rec = first.start("pd-prefill-0", ["sleep", "30"], {}, 8000, bootstrap_port=7200)
    try:
        again = procs.ProcessTable(str(tmp_path)).find("pd-prefill-0")
        assert (again.pid, again.bootstrap_port) == (rec.pid, 7200)
    finally:
        await first.stop("pd-prefill-0", 1.0)
