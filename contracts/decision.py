"""A placement decision as the control plane keeps it: ``DecisionRecord``, the decide step's result
(activities/decider.py builds it, activities/tenancy.py adds the tenant's verdict), kept whole in
the instance workflow's history and answered by its ``status`` query (``gpuflow explain``).

Every part is a typed field: the request in a few figures (``RequestSummary``), the best
candidates (``CandidateView``), each filter's verdict (``FilterView``), the quota that refused it
and how many of its reasons are decisive. ``summary()`` gives the JSON ``gpuflow explain --json``
shows, in the shape it has always had; the ``*_row`` methods give the short summary the store
keeps in the instance's row (store/records.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field

from scheduler.bounds import Count, CpuText, Indexes, Lines, MAX_ITEMS, Name, ShortText, Text
from scheduler.cluster import Claim, Subordinate
from scheduler.groups.spec import RoleName
from scheduler.limits import MAX_GPUS

FIGURE_MAX = 2**63


def clip_figure(v: object) -> object:
    """A figure the estimate computed from a model file (a hostile header can make one vast) is
    cut to FIGURE_MAX rather than refused: refused, the decision that carries it would fail its
    activity on every retry (bounds never refuse what our own code wrote; scheduler/bounds.py)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return max(-FIGURE_MAX, min(v, FIGURE_MAX))
    return v


Figure = Annotated[int, BeforeValidator(clip_figure), Field(ge=-FIGURE_MAX, le=FIGURE_MAX)]  # bytes, layers, tokens
Score = Annotated[float, Field(le=1e9)]
MAX_WORKERS = 100_000  # workers one decision saw (a filter's removed list, the snapshot's generations)
MAX_CANDIDATES = 100  # candidates listed (activities/decider.py keeps the best TOP_CANDIDATES)
Digest = Annotated[str, Field(max_length=64, pattern=r"^[0-9a-f]{64}$")]  # a SHA-256, in hex


class PlacementPlan(BaseModel):
    """What the ledger books: the worker, its GPUs and claim, and the other workers' parts."""

    worker: Name
    gpu_indexes: Indexes = []
    claim: Claim = Claim()
    subordinates: list[Subordinate] = Field([], max_length=MAX_ITEMS)
    cpus: CpuText | None = None  # CPU pinning (spec cpu_pinning): the CPUs local to the GPUs, and their NUMA nodes
    numa_nodes: Indexes | None = None


class Victim(BaseModel):
    """A replica a decision preempts, with what the decision assumed it holds (the ledger checks
    that it still does, under its locks, before the move)."""

    name: Name
    deployment: Name
    tenant: Name = "default"
    plan: PlacementPlan


class RequestSummary(BaseModel):
    """scheduler/summary.py ``request_summary``: a GGUF file's figures, or a flat request's."""

    kind: Literal["gguf", "flat"]
    architecture: Text | None = None  # gguf: the file's own name for it, clipped like any text it brings
    layers: Figure | None = None
    context_size: Figure | None = None
    full_offload_vram: Figure | None = None
    full_offload_ram: Figure | None = None
    cpu_only_ram: Figure | None = None
    vram: Figure | None = None  # flat
    ram: Figure | None = None
    basis: Text | None = None
    kv_cache_bytes_per_token: Figure | None = None

    def as_dict(self) -> dict[str, Any]:
        """The dict request_summary gave (scheduler/summary.py ``summary_text`` reads it): a
        kind's own keys, ``kv_cache_bytes_per_token`` only when known."""
        keys = (["architecture", "layers", "context_size", "full_offload_vram", "full_offload_ram", "cpu_only_ram"]
                if self.kind == "gguf" else ["vram", "ram", "basis"])
        d = {"kind": self.kind, **{k: getattr(self, k) for k in keys}}
        if self.kind == "flat" and self.kv_cache_bytes_per_token:
            d["kv_cache_bytes_per_token"] = self.kv_cache_bytes_per_token
        return d


class CandidateView(BaseModel):
    """scheduler/decision.py ``Candidate.to_dict``: where, what it claims, and its scores (a
    placement is listed without them). The optional parts are None where to_dict leaves them out."""

    worker: Name
    gpu_indexes: Indexes = []
    claim: Claim = Claim()
    subordinates: list[Subordinate] = Field([], max_length=MAX_ITEMS)
    overcommit: Literal[True] | None = None
    link: ShortText | None = None
    cpus: CpuText | None = None
    numa_nodes: Indexes | None = None
    score: Score | None = None
    scores: dict[ShortText, Score] | None = Field(None, max_length=64)

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


class Removed(BaseModel):
    worker: Name
    reasons: Lines = []


class FilterView(BaseModel):
    """scheduler/decision.py ``FilterVerdict.to_dict``: how many workers a filter saw and kept,
    and why it removed each of the others."""

    filter: ShortText
    before: Count
    kept: Count
    removed: list[Removed] = Field([], max_length=MAX_WORKERS)
    note: Text | None = None

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


class GroupMember(BaseModel):
    """One member of a group's decision: its name, role and where it went (None: not placed)."""

    name: Name
    role: RoleName
    worker: Name | None = None
    gpu_indexes: Indexes = []


class GroupNote(BaseModel):
    """A prefill/decode group member's decision within its group's (issue 41): ``kind`` ``group``
    (the whole group formed at once, scheduler/groups/form.py) or ``scale_out`` (this member placed
    alone after formation); the domain it gathered into, every member, the degradations, or why the
    group did not fit, naming the role (``blocked``). The inputs are kept whole for both kinds
    (store/decision_codec.py ``encode_group``)."""

    kind: Literal["group", "scale_out"]
    group: Name  # the deployment whose members these are
    role: RoleName  # this member's
    scheduled: bool
    layer: ShortText | None = None  # the topology layer the group gathered in (None: the cluster)
    domain: Text | None = None  # that layer's domain (a zone's, a rack's name)
    path: list[Text] = Field([], max_length=32)  # the domain's address, root to leaf
    members: list[GroupMember] = Field([], max_length=MAX_ITEMS)
    degradations: list[ShortText] = Field([], max_length=8)
    reasons: Lines = []  # the group's notes (placed) or why it does not fit (not placed)
    blocked: RoleName | None = None  # not placed: the role that does not fit


class DecisionRecord(BaseModel):
    """The decide step's result: kept whole in the workflow history, so the UI shows it."""

    scheduled: bool
    plan: PlacementPlan | None = None
    strategy: ShortText | None = None
    score: Score | None = None
    reasons: Lines = []  # the decisive ones first (``decisive`` of them), then the rest
    request: RequestSummary | None = None
    placement: CandidateView | None = None  # the policy's chosen candidate (None when it is not placed)
    candidates: list[CandidateView] = Field([], max_length=MAX_CANDIDATES)  # the best, by score
    candidates_total: Count = 0  # candidates the policy weighed, listed or not
    filters: list[FilterView] = Field([], max_length=MAX_ITEMS)
    decisive: Count = 0  # how many of ``reasons`` decided that it is not placed (a quota: 1)
    quota: Text = ""  # the tenant's limit it would break: not placed, this reason first
    held: Text = ""  # the PENDING queue's word: it would have fit, but a replica ahead of it takes that capacity (activities/queue_gate.py)
    workers_seen: Count = 0
    generations: dict[Name, Annotated[int, Field(le=2**63)]] = Field({}, max_length=MAX_WORKERS)  # worker -> generation of the snapshot decided on
    tenant: Name = "default"  # the deployment's tenant, as the store had it
    victims: list[Victim] = Field([], max_length=MAX_GPUS * 4)  # placed by preempting these (scheduler/tenancy/preemption.py)
    preempt_why: Text = ""  # "to reclaim prod's guarantee" | "for a higher-priority deployment of its tenant"
    inputs: Digest | None = None  # what the policy saw, kept in the store under this digest (store/decision_log.py)
    group: GroupNote | None = None  # a prefill/decode group's member: its group's decision (None: a plain replica)

    @property
    def places_outright(self) -> bool:
        """It places the replica with a plan to book as it is (no victims to preempt first)."""
        return self.scheduled and self.plan is not None and not self.victims

    def request_text(self) -> dict[str, Any]:
        return self.request.as_dict() if self.request is not None else {}

    def summary(self) -> dict[str, Any]:
        """The record as ``gpuflow explain --json`` shows it: the top-level fields, with the policy's
        decision under ``decision`` (scheduler/decision.py ``to_dict``, the best candidates, their
        total, and the tenant's verdict: ``quota``, or the victims' names and ``preempt_why``)."""
        decision: dict[str, Any] = {
            "scheduled": self.scheduled,
            "placement": self.placement.as_dict() if self.placement is not None else None,
            "strategy": self.strategy,
            "score": round(self.score, 4) if self.score is not None else None,
            "candidates": [c.as_dict() for c in self.candidates],
            "filters": [f.as_dict() for f in self.filters],
            "reasons": list(self.reasons), "decisive": self.decisive,
            "candidates_total": self.candidates_total}
        if self.quota:
            decision["quota"] = self.quota
        if self.victims:
            decision.update(victims=[v.name for v in self.victims], preempt_why=self.preempt_why)
        return {"scheduled": self.scheduled, "plan": self.plan.model_dump(mode="json") if self.plan else None,
                "strategy": self.strategy, "score": self.score, "reasons": list(self.reasons),
                "request": self.request_text(), "decision": decision, "workers_seen": self.workers_seen,
                "generations": dict(self.generations), "tenant": self.tenant,
                "victims": [v.model_dump(mode="json") for v in self.victims], "preempt_why": self.preempt_why,
                "inputs": self.inputs, **({"group": self.group.model_dump(mode="json")} if self.group else {})}

    # --- what the store keeps in the instance's row (InstanceRecord.decision) -------------------
    def booked_row(self, request: str) -> dict[str, Any]:
        """Booked as decided (activities/place_batch.py): the request in words, where, and why."""
        return {"request": request, "strategy": self.strategy, "score": self.score,
                "placement": self.plan.model_dump(mode="json") if self.plan else None}

    def preempting_row(self, request: str) -> dict[str, Any]:
        """Booked by preemption (workflows/preempt_steps.py): the booking, and whom it preempts."""
        return {**self.booked_row(request), "victims": [v.name for v in self.victims], "preempt_why": self.preempt_why}

    def pending_row(self, request: str) -> dict[str, Any]:
        """Not placed (workflows/place_steps.py): the request in words, and the first reasons."""
        return {"request": request, "reasons": list(self.reasons[:20])}
