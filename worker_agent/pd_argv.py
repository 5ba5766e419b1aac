"""A prefill/decode member's engine flags, environment and KV ports, per disaggregation mode
(scheduler/groups/spec.py PDMode), for the engine versions gpuflow's flag lists name (vLLM 0.11.0,
SGLang 0.5.3; vllm-ascend 0.11.0rc0). The gateway is the group's router and speaks each mode's
protocol (gateway/pd_*.py); the engines only need their own side of the hand-off:

| mode | prefill | decode | ports the agent picks |
| --- | --- | --- | --- |
| vllm-nixl | --kv-transfer-config NixlConnector kv_both; VLLM_NIXL_SIDE_CHANNEL_HOST/PORT | the same | side channel: TP ports from a base (rank r listens on base + r) |
| vllm-mooncake | MooncakeConnector kv_producer; VLLM_MOONCAKE_BOOTSTRAP_PORT | MooncakeConnector kv_consumer | bootstrap: 1, prefill only |
| vllm-ascend-mooncake | MooncakeConnectorV1 kv_producer, kv_port, engine_id, both roles' tp_size | the same, kv_consumer | kv_port: TP ports from a base (rank r: base + r) |
| sglang-mooncake, sglang-nixl | --disaggregation-mode prefill --disaggregation-transfer-backend B --disaggregation-bootstrap-port P | --disaggregation-mode decode --disaggregation-transfer-backend B | bootstrap: 1, prefill only |
| custom | what run_command says: {pd_role} {kv_port} {bootstrap_port} | the same | one each for {kv_port} and {bootstrap_port} when named |

Where the engine listens: vLLM's NIXL side channel on VLLM_NIXL_SIDE_CHANNEL_HOST (its default,
localhost, is unreachable from another host), SGLang's bootstrap server on --host; both the
agent's advertised address. The recorded port (LaunchResult.bootstrap_port, the instance row's) is
the one another end is told: the bootstrap port, else the side channel's base (rank 0's).

A spec that configures the hand-off itself (its own --kv-transfer-config, --disaggregation-mode,
where the operator allows it) gets none of this and no port, as a spec's own --kv-events-config."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduler import params

if TYPE_CHECKING:  # annotations only: the CLI's `gpuflow agent` flags are built without it (issue 37)
    from contracts.agent import LaunchRequest

# each mode's connector words (vLLM 0.11.0 registers NixlConnector; MooncakeConnector came in a
# later vLLM; vllm-ascend 0.11.0rc0 registers MooncakeConnectorV1; SGLang 0.5.3's
# DISAGG_TRANSFER_BACKEND_CHOICES: mooncake, nixl, ascend, fake)
SGLANG_BACKEND = {"sglang-mooncake": "mooncake", "sglang-nixl": "nixl"}
VLLM_MODES = ("vllm-nixl", "vllm-mooncake", "vllm-ascend-mooncake")
# the flags by which a spec configures the hand-off itself (then gpuflow adds none and picks no port)
OWN_FLAGS = {"vllm": ("--kv-transfer-config",), "sglang": ("--disaggregation-mode",)}


@dataclass(frozen=True)
class PDPorts:
    """What a launch needs picked: ``kv`` consecutive KV ports (0: none), and a bootstrap port."""

    kv: int = 0
    bootstrap: bool = False


def tp_size(req: LaunchRequest) -> int:
    """The engine's tensor parallelism: its GPUs here (each TP rank binds its own KV port)."""
    return max(1, req.tp_total or len(req.gpu_indexes))


def configured(req: LaunchRequest) -> bool:
    """The spec sets the hand-off itself (a flag the operator allowed): gpuflow adds nothing."""
    own = OWN_FLAGS.get(req.backend, ())
    return bool(own) and params.has(list(req.backend_parameters), *own)


def problems(req: LaunchRequest) -> list[str]:
    """What this agent cannot launch of a member's mode: a member across several workers (its other
    ranks would need the hand-off's ports too, which only rank 0's agent picks), unless the spec
    configures the hand-off itself."""
    if req.role != "server" or req.pd_role is None or req.pd_mode in (None, "custom") or not req.distributed:
        return []
    if configured(req):
        return []
    return [f"pd_mode {req.pd_mode}: a {req.pd_role} member placed across several workers is not disaggregated "
            "by gpuflow yet (place it on one worker, or configure the KV connector in backend_parameters)"]


def ports_wanted(req: LaunchRequest) -> PDPorts:
    """The ports this launch's KV hand-off binds, for the agent to pick free ones: a custom
    command's named placeholders (on any launch), or the mode's (a prefill or decode member)."""
    if req.role != "server":
        return PDPorts()
    if req.backend == "custom":
        cmd = req.run_command or ""
        return PDPorts(kv=int("{kv_port}" in cmd), bootstrap="{bootstrap_port}" in cmd)
    if req.pd_role is None or req.pd_mode is None or configured(req):
        return PDPorts()
    if req.pd_mode in ("vllm-nixl", "vllm-ascend-mooncake") and req.backend == "vllm":
        return PDPorts(kv=tp_size(req))
    if req.pd_role == "prefill" and (req.pd_mode == "vllm-mooncake" and req.backend == "vllm"
                                     or req.pd_mode in SGLANG_BACKEND and req.backend == "sglang"):
        return PDPorts(bootstrap=True)
    return PDPorts()


def recorded(kv_port: int | None, bootstrap_port: int | None) -> int | None:
    """The port the instance row keeps (the other end's hand-off port): bootstrap, else KV base."""
    return bootstrap_port if bootstrap_port is not None else kv_port


def _json(v: dict) -> str:
    return json.dumps(v, separators=(",", ":"))


def vllm_flags(req: LaunchRequest, kv_port: int | None) -> list[str]:
    """vLLM's --kv-transfer-config for the member's mode and role ([] when none applies)."""
    if req.pd_role is None or req.pd_mode not in VLLM_MODES or configured(req):
        return []
    if req.pd_mode == "vllm-nixl":
        # kv_both: a decode may also prefill a prompt itself (the gateway skips short prompts' prefill)
        return ["--kv-transfer-config", _json({"kv_connector": "NixlConnector", "kv_role": "kv_both"})]
    role = "kv_producer" if req.pd_role == "prefill" else "kv_consumer"
    if req.pd_mode == "vllm-mooncake":
        return ["--kv-transfer-config", _json({"kv_connector": "MooncakeConnector", "kv_role": role})]
    # vllm-ascend registers MooncakeConnectorV1 (vllm_ascend/distributed/__init__.py) when vLLM loads it
    # as its platform plugin; no kv_connector_module_path: vLLM's fallback would look for a class by that
    # name, which that module does not have. Both roles' TP (prefill's >= decode's): ours for both
    tp = tp_size(req)
    return ["--kv-transfer-config", _json({
        "kv_connector": "MooncakeConnectorV1", "kv_role": role, "kv_port": kv_port, "engine_id": req.instance,
        "kv_connector_extra_config": {"prefill": {"dp_size": 1, "tp_size": tp}, "decode": {"dp_size": 1, "tp_size": tp}}})]


def sglang_flags(req: LaunchRequest, bootstrap_port: int | None) -> list[str]:
    """SGLang's --disaggregation-* for the member's mode and role ([] when none applies); the
    bootstrap server runs on the prefill only (SGLang 0.5.3 disagg_service.py)."""
    backend = SGLANG_BACKEND.get(req.pd_mode or "")
    if req.pd_role is None or backend is None or configured(req):
        return []
    out = ["--disaggregation-mode", req.pd_role, "--disaggregation-transfer-backend", backend]
    if req.pd_role == "prefill" and bootstrap_port is not None:
        out += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
    return out


def pd_env(req: LaunchRequest, address: str, kv_port: int | None, bootstrap_port: int | None) -> dict[str, str]:
    """The variables the mode's connector reads (gpuflow's own: a spec's env cannot set them)."""
    if req.pd_role is None or req.backend != "vllm" or configured(req):
        return {}
    if req.pd_mode == "vllm-nixl" and kv_port is not None:
        return {"VLLM_NIXL_SIDE_CHANNEL_HOST": address, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(kv_port)}
    if req.pd_mode == "vllm-mooncake" and bootstrap_port is not None:
        return {"VLLM_MOONCAKE_BOOTSTRAP_PORT": str(bootstrap_port)}
    return {}
