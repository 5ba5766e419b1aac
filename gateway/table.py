"""The routing table: for each deployment, its RUNNING replicas, the per-replica concurrency
limit, its routing (when the spec pins one), and which tenants' keys may use it. Built by a pure function from what the store holds
(``routes()`` and the deployments' specs); the gateway swaps the whole table at once, never edits
it.

Who may use a deployment: the keys of its spec's ``tenant`` (``default`` when none), and of the
tenants its ``shared_with`` names (``"*"``: every tenant). A deployment of tenant ``default`` is
shared with every tenant. Who may use what is derived as the table is built, off the request
path: a request asks two sets (``may_use``)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Iterable

from store.serving import Members, Route
from gateway.cache_aware import ROUTINGS
from gateway.pd_pick import ANY_PER_ROLE, PDGroup
from gateway.prompt_tokens import source_of
from scheduler import params
from scheduler.spec import BACKEND_API, Api
from scheduler.errors import InvalidInput

# An engine's own limit on requests it runs at once, by backend: its flag names.
ENGINE_LIMIT_FLAGS: dict[str, tuple[str, ...]] = {
    "vllm": ("--max-num-seqs",),
    "llama.cpp": ("--parallel", "-np"),
    "sglang": ("--max-running-requests",),
}
DEFAULT_TENANT = "default"  # its deployments serve every tenant's keys
EVERYONE = "*"  # in shared_with: every tenant


@dataclass(frozen=True)
class Model:
    name: str
    limit: int  # requests in flight per replica
    replicas: tuple[Route, ...]
    tenant: str = DEFAULT_TENANT  # the spec's tenant
    shared_with: frozenset[str] = frozenset()  # tenants whose keys may use it besides its own ("*": all)
    routing: str | None = None  # the spec's routing (cache-aware, least-outstanding); None: the gateway's
    tokenizer: tuple | None = None  # where its tokenizer is (gateway/prompt_tokens.py source_of): for KV events
    openai: bool = True  # its engine serves the OpenAI API (the spec's ``api``, else its backend's: api_of)
    pd: PDGroup | None = None  # a prefill/decode group with no router: the gateway pairs its members (pd_pick.py)

    @property
    def size(self) -> int:
        """Its replicas, or a group's RUNNING members: what /v1/models shows, 0 when scaled to zero."""
        return len(self.replicas) + (len(self.pd.members) if self.pd is not None else 0)

    @property
    def public(self) -> bool:
        return self.tenant == DEFAULT_TENANT or EVERYONE in self.shared_with


@dataclass(frozen=True)
class Table:
    models: dict[str, Model]
    version: int = 0
    # who may use what, derived from ``models`` as the table is built (equality stays on models, version)
    public: frozenset[str] = field(default=None, compare=False, repr=False)  # every tenant's keys
    own: dict[str, frozenset[str]] = field(default=None, compare=False, repr=False)  # tenant -> its others
    listed: tuple = field(default=None, compare=False, repr=False)  # (public sorted, {tenant: its others sorted})

    def __post_init__(self):
        if self.public is None:
            public, own = access_of(self.models)
            object.__setattr__(self, "public", public)
            object.__setattr__(self, "own", own)
            object.__setattr__(self, "listed", (tuple(sorted(public)), {t: tuple(sorted(ns)) for t, ns in own.items()}))

    def names(self) -> list[str]:
        return sorted(self.models)

    def may_use(self, tenant: str, keyed: bool, name: str) -> bool:
        """Whether ``tenant``'s keys may use the model ``name`` (two set lookups); an open
        gateway's anonymous requests (``keyed`` False: no key exists) may use every model."""
        if not keyed:
            return name in self.models
        return name in self.public or name in self.own.get(tenant, ())

    def allowed(self, tenant: str, keyed: bool = True) -> list[str]:
        """The models ``tenant``'s keys may use, sorted (for a 404's message)."""
        if not keyed:
            return self.names()
        public, own = self.listed
        return list(heapq.merge(public, own.get(tenant, ())))

    def listed_for(self, tenant: str, keyed: bool = True) -> list[str]:
        """What /v1/models and the playground list: the models ``tenant``'s keys may use whose
        engines serve the OpenAI API (a spec's ``api: none`` is not one)."""
        return [n for n in self.allowed(tenant, keyed) if self.models[n].openai]


def access_of(models: dict[str, Model]) -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """The models every tenant's keys may use (tenant default's, and those shared with "*"), and
    for each tenant named as an owner or in a shared_with, the others its keys may use. Linear in
    the models and their shared_with lists."""
    public, own = set(), {}
    for n, m in models.items():
        if m.public:
            public.add(n)
            continue
        for t in (m.tenant, *m.shared_with):
            own.setdefault(t, set()).add(n)
    return frozenset(public), {t: frozenset(ns) for t, ns in own.items()}


def replica_limit(spec: dict[str, Any], default: int) -> int:
    """The engine's own flag where it has one, else the spec's ``max_concurrency``, else
    ``default``. A malformed flag is the deployment's problem: the default is used."""
    flags = ENGINE_LIMIT_FLAGS.get(str(spec.get("backend", "")), ())
    p = spec.get("backend_parameters") or []
    if flags and isinstance(p, list) and all(isinstance(x, str) for x in p):
        try:
            n = params.find_int(p, *flags, minimum=1)
        except InvalidInput:
            n = None
        if n:
            return n
    m = spec.get("max_concurrency")
    return m if isinstance(m, int) and not isinstance(m, bool) and m >= 1 else default


def owner(spec: dict[str, Any]) -> tuple[str, frozenset[str]]:
    """The spec's tenant and the tenants it is shared with. The store holds validated specs; a
    malformed value here shares nothing (never more than the spec says)."""
    t = spec.get("tenant")
    tenant = t if isinstance(t, str) and t else DEFAULT_TENANT
    sw = spec.get("shared_with")
    shared = frozenset(x for x in sw if isinstance(x, str)) if isinstance(sw, list) else frozenset()
    return tenant, shared


def routing_of(spec: dict[str, Any]) -> str | None:
    """The spec's ``routing``; anything else (none, or a value the store should never hold) is
    None: the gateway's default."""
    r = spec.get("routing")
    return r if r in ROUTINGS else None


def api_of(spec: dict[str, Any]) -> bool:
    """Whether the spec's engine serves the OpenAI API: its ``api``, else its backend's
    (scheduler/spec.py BACKEND_API: every backend's is openai)."""
    api = spec.get("api")
    if api in (Api.OPENAI.value, Api.NONE.value):
        return api == Api.OPENAI.value
    return BACKEND_API.get(str(spec.get("backend", "")), Api.OPENAI) == Api.OPENAI


def pd_of(spec: dict[str, Any], members: Members | None) -> PDGroup | None:
    """The group the gateway pairs itself: a spec with ``disaggregation`` and no ``router`` role
    (a router stays the group's only front door). The store holds validated specs; a value it
    should never hold is read as the default."""
    d, roles = spec.get("disaggregation"), spec.get("roles")
    if not isinstance(d, dict) or not isinstance(roles, list):
        return None
    if any(isinstance(r, dict) and r.get("name") == "router" for r in roles):
        return None
    mode = d.get("mode") if isinstance(d.get("mode"), str) else "custom"
    readiness = d.get("readiness") if d.get("readiness") in ("any_per_role", "all") else ANY_PER_ROLE
    skip = d.get("skip_prefill_below")
    skip = skip if isinstance(skip, int) and not isinstance(skip, bool) and skip >= 0 else PDGroup.skip_below
    m = members or Members()
    return PDGroup(mode, readiness, skip, m.routes, m.wanted)


def routers_serving(spec: dict[str, Any], routes: list[Route], members: Members | None) -> list[Route]:
    """A group with a router, rolled whole, runs a router per generation for a while: only the
    routers of the newest generation whose router RUNS and whose members are ready (the spec's
    readiness, as a group the gateway pairs) take requests, else the oldest generation's (it served
    before the roll). A request never reaches a new router before its prefills and decodes can
    serve it. One generation (no roll), or plain replicas: ``routes`` as they are."""
    gens = sorted({r.group_gen for r in routes if r.role == "router"}, reverse=True)
    if len(gens) < 2:
        return routes
    d = spec.get("disaggregation")
    readiness = d.get("readiness") if isinstance(d, dict) and d.get("readiness") in ("any_per_role", "all") \
        else ANY_PER_ROLE
    m = members or Members()
    group = PDGroup("custom", readiness, members=m.routes, wanted=m.wanted)
    g = next((g for g in gens if group.ready(g)), gens[-1])
    return [r for r in routes if r.group_gen == g]


def build(routes: Iterable[Route], specs: dict[str, dict[str, Any]], default_limit: int, version: int = 0,
          members: dict[str, Members] | None = None) -> Table:
    """Every deployment in ``specs`` (active ones) is routable, with or without replicas: a
    request for one with none waits for one. Routes of a deployment not in ``specs`` are left
    out (it is being deleted). A group with no router is served through its ``members``
    (store/serving.py group_members), paired here."""
    by: dict[str, list[Route]] = {name: [] for name in specs}
    for r in routes:
        if r.deployment in by:
            by[r.deployment].append(r)
    members = members or {}
    return Table({name: Model(name, replica_limit(specs[name], default_limit),
                              tuple(routers_serving(specs[name], rs, members.get(name))), *owner(specs[name]),
                              routing=routing_of(specs[name]), tokenizer=source_of(specs[name]),
                              openai=api_of(specs[name]), pd=pd_of(specs[name], members.get(name)))
                  for name, rs in by.items()}, version)
