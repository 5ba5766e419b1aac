"""A prefill/decode group's spec: its roles, how they hand KV across, and how tightly its members
gather. GPUStack 2.3.0's fields with their meaning (schemas/models.py RoleSpec, DisaggregationSpec,
GatherSpec); what gpuflow refuses, it refuses here, naming the field. Documented in
docs/guide/groups.md; deliberate differences in docs/gpustack-differences.md."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from scheduler.bounds import MAX_ITEMS, MAX_WORDS, Command, Labels, ShortText, Whole, Word
from scheduler.fields import Strict
from scheduler.gpu_selector import GPUSelector
from scheduler.groups.layers import TopologyLayer, chain, known_layer_ids
from scheduler.limits import REPLICAS_CEILING
from scheduler.params import tokens
from scheduler.units import GiB

ROUTER_CLAIM_RAM = 2 * GiB  # GPUStack's ROUTER_DEFAULT_MEMORY: a router holds no weights and books no GPU
MAX_ROLES = 3


class RoleName(str, Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    ROUTER = "router"


class PDMode(str, Enum):
    """A disaggregation recipe: an engine and its KV connector (GPUStack's pd-modes.yaml names)."""

    VLLM_NIXL = "vllm-nixl"
    VLLM_MOONCAKE = "vllm-mooncake"
    SGLANG_MOONCAKE = "sglang-mooncake"
    SGLANG_NIXL = "sglang-nixl"
    VLLM_ASCEND_MOONCAKE = "vllm-ascend-mooncake"
    CUSTOM = "custom"  # the user writes every connector parameter; the only mode that may mix engines


# Each recipe's engines, its KV connector and the accelerator vendors that connector talks to
# (GPUStack 2.3.0 assets/pd-modes.yaml: backends, gpu_filters.vendor). custom: any engine, any
# vendor, no connector of ours.
MODE_BACKENDS = {PDMode.VLLM_NIXL: ("vllm",), PDMode.VLLM_MOONCAKE: ("vllm",),
                 PDMode.SGLANG_MOONCAKE: ("sglang",), PDMode.SGLANG_NIXL: ("sglang",),
                 PDMode.VLLM_ASCEND_MOONCAKE: ("vllm",), PDMode.CUSTOM: ()}
MODE_CONNECTOR = {PDMode.VLLM_NIXL: "nixl", PDMode.VLLM_MOONCAKE: "mooncake", PDMode.SGLANG_MOONCAKE: "mooncake",
                  PDMode.SGLANG_NIXL: "nixl", PDMode.VLLM_ASCEND_MOONCAKE: "mooncake", PDMode.CUSTOM: None}
MODE_VENDORS = {PDMode.VLLM_NIXL: ("nvidia",), PDMode.VLLM_MOONCAKE: ("nvidia",),
                PDMode.SGLANG_MOONCAKE: ("nvidia",), PDMode.SGLANG_NIXL: ("nvidia",),
                PDMode.VLLM_ASCEND_MOONCAKE: ("ascend",), PDMode.CUSTOM: None}
PD_BACKENDS = ("vllm", "sglang", "custom")  # GPUStack's PD_BACKENDS: engines with a prompt KV to hand across


class Readiness(str, Enum):
    ANY_PER_ROLE = "any_per_role"  # serving once each role has one ready member
    ALL = "all"  # serving only when every member is ready


class GatherStrategy(str, Enum):
    MUST_GATHER = "MustGather"  # refuse a group that does not fit inside one domain of ``layer``
    PREFER_GATHER = "PreferGather"  # place it anyway, and report gather_unmet when looser than ``layer``


class RoleResources(Strict):
    ram: Annotated[int, Field(ge=1, le=1 << 50)] | None = None  # bytes; the router's only (default 2 GiB)


class RoleSpec(Strict):
    """One role. Every field left unset inherits the deployment's."""

    name: RoleName  # prefill, decode or router
    replicas: Whole = Field(default=1, ge=1, le=REPLICAS_CEILING)  # the x and y of xPyD; remove a role rather than 0
    backend: ShortText | None = None  # the role's engine; unset: the deployment's (mixing engines needs mode custom)
    backend_version: ShortText | None = None  # the role's engine version; unset: the deployment's
    run_command: Command | None = None  # the role's custom command; unset: the deployment's
    backend_parameters: list[Word] | None = Field(None, max_length=MAX_WORDS)  # [] clears the deployment's
    env: dict[Annotated[str, Field(max_length=256)], Annotated[str, Field(max_length=4096)]] | None = \
        Field(None, max_length=MAX_ITEMS)  # the role's environment, allowed as the deployment's env; unset: the deployment's
    worker_selector: Labels | None = None  # labels the role's hosts must have; unset: the deployment's
    gpu_selector: GPUSelector | None = None  # the GPUs the role's replicas must use; unset: the deployment's
    resources: RoleResources | None = None  # the router's RAM; refused on prefill and decode

    @field_validator("replicas", mode="before")
    @classmethod
    def _at_least_one(cls, v: object) -> object:
        if v == 0 and type(v) is int:
            raise ValueError("replicas 0: a role runs at least 1 replica; to drop a role, remove it from roles")
        return v


class Disaggregation(Strict):
    mode: PDMode  # the recipe: engine and KV connector (custom: the user writes the connector's parameters)
    vendor: Annotated[str, Field(min_length=1, max_length=64)] | None = None  # which accelerator vendor runs the group
    readiness: Readiness = Readiness.ANY_PER_ROLE  # any_per_role: serving once each role has a ready member; all: every member
    # the gateway skips the prefill for a prompt with fewer uncached tokens than this on the chosen decode
    # (llm-d's nonCachedTokens): the decode prefills it itself. 16, one vLLM KV block: under a block of new KV,
    # a hand-off (a round trip to a prefill, then a KV fetch) costs more than the decode's own prefill step
    skip_prefill_below: Whole = Field(default=16, ge=0, le=1 << 20)


class Gather(Strict):
    strategy: GatherStrategy | None = None  # MustGather refuses below layer; PreferGather places anyway and reports gather_unmet
    layer: Annotated[str, Field(min_length=1, max_length=64)] | None = None  # a layer id the cluster declares

    @model_validator(mode="after")
    def _layer_with_strategy(self) -> "Gather":
        if self.strategy == GatherStrategy.MUST_GATHER and not self.layer:
            raise ValueError("gather: strategy MustGather needs a layer (the layer it refuses below)")
        if self.layer and self.strategy is None:
            raise ValueError("gather: layer is set without a strategy (MustGather or PreferGather)")
        return self


# Engine flags both ends of a KV hand-off must agree on (GPUStack's pairing checks): two concrete
# values that differ are refused; a side that is silent (or says auto) is not.
PAIRING_MUST_MATCH = {
    "context length": ("--max-model-len", "--context-length", "--ctx-size"),
    "dtype": ("--dtype",),
    "KV cache dtype": ("--kv-cache-dtype",),
    "block size": ("--block-size", "--page-size"),
}


def _last(params: list[str], names: tuple[str, ...]) -> str | None:
    """The value argparse ends with: the last ``--k v`` or ``--k=v`` of any of ``names``."""
    toks, found = tokens(params), None
    for i, t in enumerate(toks[:-1]):
        if t in names or t.replace("_", "-") in names:
            found = toks[i + 1]
    return found


def role_params(role: RoleSpec, spec_params: list[str]) -> list[str]:
    """A role's effective engine parameters: its own when it gives any (even []), else the deployment's."""
    return list(spec_params) if role.backend_parameters is None else list(role.backend_parameters)


def role_problems(roles: list[RoleSpec], replicas: int, backend: str, params: list[str],
                  disaggregation: Disaggregation | None) -> list[str]:
    """What GPUStack 2.3.0 refuses of a group's roles (validation/pd/roles.py, pairing.py), in words
    that name the field; ``replicas``, ``backend`` and ``params`` are the deployment's."""
    names = [r.name for r in roles]
    out: list[str] = []
    if len(set(names)) != len(names):
        out.append(f"roles: a role appears twice ({', '.join(sorted({n.value for n in names if names.count(n) > 1}))})")
    if replicas not in (0, 1):
        out.append(f"replicas {replicas}: a deployment with roles takes replicas 0 or 1 (off or on); "
                   "scale it through roles[].replicas")
    for r in roles:
        if r.name == RoleName.ROUTER and r.replicas != 1:
            out.append(f"roles.router.replicas {r.replicas}: the router runs exactly 1 replica")
        if r.resources is not None and r.name != RoleName.ROUTER:
            out.append(f"roles.{r.name.value}.resources: only the router declares its RAM; "
                       "prefill and decode are sized from the model")
    if disaggregation is None:
        return out
    for want in (RoleName.PREFILL, RoleName.DECODE):
        if want not in names:
            out.append(f"roles: a disaggregated deployment needs a {want.value} role")
    mode = disaggregation.mode
    for r in roles:
        b = r.backend or backend
        if b not in PD_BACKENDS:
            out.append(f"roles.{r.name.value}.backend {b}: {b} cannot be disaggregated "
                       f"(engines that can: {', '.join(PD_BACKENDS)})")
        elif MODE_BACKENDS[mode] and b not in MODE_BACKENDS[mode] and r.name != RoleName.ROUTER:
            out.append(f"roles.{r.name.value}.backend {b}: disaggregation mode {mode.value} configures "
                       f"{', '.join(MODE_BACKENDS[mode])} only; mixing engines needs mode custom")
    vendors = MODE_VENDORS[mode]
    chosen = disaggregation.vendor
    if chosen and vendors is not None and chosen.lower() not in vendors:
        out.append(f"disaggregation.vendor {chosen}: mode {mode.value}'s connector runs on {', '.join(vendors)} only")
    by_name = {r.name: r for r in roles}
    if RoleName.PREFILL in by_name and RoleName.DECODE in by_name:
        p = role_params(by_name[RoleName.PREFILL], params)
        d = role_params(by_name[RoleName.DECODE], params)
        for label, flags in PAIRING_MUST_MATCH.items():
            pv, dv = _last(p, flags), _last(d, flags)
            if pv is not None and dv is not None and pv != dv and "auto" not in (pv, dv):
                out.append(f"roles: prefill and decode declare different {label} ({flags[0]} {pv} against "
                           f"{dv}); the KV hand-off needs both ends to agree")
    return out


def gather_problems(gather: Gather | None, declared: list[TopologyLayer]) -> list[str]:
    """A gather layer the cluster does not declare is refused: the solver could not enforce it."""
    if gather is None or gather.layer is None or gather.layer in known_layer_ids(declared):
        return []
    known = ", ".join(f"{x.id} ({x.name})" for x in chain(declared))
    return [f"gather.layer {gather.layer}: not a layer of this cluster (its layers: {known})"]


def role_of(roles: list[RoleSpec] | None, role: RoleName) -> RoleSpec:
    found = next((r for r in roles or [] if r.name == role), None)
    if found is None:
        raise KeyError(f"no {role.value} role")
    return found


def role_data(data: dict, role: RoleSpec) -> dict:
    """A role's effective spec as data: the deployment's fields (``data``, a ModelSpec's dump) with
    the role's overrides and replicas, and no group fields (scheduler/groups/roles.py role_spec)."""
    out = {k: v for k, v in data.items() if k not in ("roles", "disaggregation", "gather")}
    out["replicas"] = role.replicas
    for f in ("backend", "backend_version", "run_command", "env", "worker_selector", "gpu_selector"):
        v = getattr(role, f)
        if v is not None:
            out[f] = v.model_dump(exclude_defaults=True) if isinstance(v, GPUSelector) else v
    if role.backend_parameters is not None:
        out["backend_parameters"] = list(role.backend_parameters)
    return out


def router_ram(roles: list[RoleSpec] | None) -> int:
    """The router's RAM claim in bytes: its ``resources.ram``, else GPUStack's 2 GiB floor. A
    router loads no weights: its request is this RAM and no GPU, whatever its backend estimates."""
    r = role_of(roles, RoleName.ROUTER)
    return r.resources.ram if r.resources and r.resources.ram else ROUTER_CLAIM_RAM
