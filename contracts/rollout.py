"""A deployment's rollout: the probe of its replicas (activities/rollout_probe.py runs it; the
deployment workflow reads it between rollout steps, workflows/rollout_steps.py), the rollout's state
the workflow carries across continue-as-new, and the ``rollout`` query's answer."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer

from scheduler.bounds import Count, Flag, Name, ShortText, Text
from scheduler.limits import REPLICAS_CEILING
from scheduler.spec import ModelSpec

ROLLOUT_PROBE = "rollout_probe"


class ReplicaProbe(BaseModel):
    name: str
    state: str  # the instance's state, or "gone" when its workflow does not answer
    reason: str = ""
    restarts: int = 0
    answers: bool = False  # RUNNING and its server answered HTTP (any status below 500)


ROLLOUT_METRICS = "rollout_metrics"


class GatewayCounts(BaseModel):
    """Every live gateway's counters for one deployment, summed (activities/rollout_probe.py): the
    requests answered, those answered 5xx, and the request-duration histogram's cumulative buckets
    (upper bound in seconds, as text -> count). What a gateway serves is read as untrusted: bounded."""

    answered: Annotated[float, Field(ge=0, le=1e15)] = 0.0
    errors: Annotated[float, Field(ge=0, le=1e15)] = 0.0
    buckets: Annotated[dict[Annotated[str, Field(max_length=32)], Annotated[float, Field(ge=0, le=1e15)]],
                       Field(max_length=64)] = {}
    gateways: Count = 0  # gateways read


class MetricsAsk(BaseModel):
    """The rollout_metrics activity's input: the deployment whose gateway counters to sum."""

    deployment: Name


class ReplicaProbes(BaseModel):
    """The probe's answer: one ReplicaProbe per name asked (contracts/control.py InstanceNames)."""

    probes: list[ReplicaProbe] = Field([], max_length=10_000)


# --- the rollout's state, carried across continue-as-new (workflows/rollout_steps.py) --------------

KEEP_STEPS = 100  # steps kept in the log
KEEP_HISTORY = 10  # versions kept, each with its spec: how far `gpuflow rollout undo` can look back
MAX_NAMES = 2 * REPLICAS_CEILING  # instances a step names, or a map keeps (instances and those stopping)
Since = Annotated[float, Field(ge=0, le=1e11)]  # a workflow time, in seconds since the epoch
Spec = Annotated[ModelSpec, PlainSerializer(lambda s: s.model_dump(mode="json", exclude_none=True))]
Result = Literal["rolling", "baking", "good", "deployed", "replaced", "rolled back", "halted"]
Way = Literal["", "none", "roles", "whole", "recreate"]  # how a group's edit rolls (scheduler/groups/compat.py)
RoleWord = Literal["prefill", "decode", "router"]


class RolloutStep(BaseModel):
    """One step of a rollout, as its log keeps it: what it did (``begin``, ``start``, ``stop``,
    ``wait``, ``done``, ``rollback``, ``undo``, ``recreate``), to which replicas, and why."""

    at: ShortText = ""  # workflow time, ISO
    action: ShortText
    names: Annotated[list[Name], Field(max_length=MAX_NAMES)] = []
    reason: Text = ""
    fallback: Flag = False  # a stop-first step: no GPU was spare to surge a new replica first
    version: Count = 0  # the target version when it was taken


class OutcomeView(BaseModel):
    """One version of the deployment's spec and how it ended: ``rolling`` (the rollout to it is
    under way), ``baking`` (its last step taken, it runs on probation for ``rollout.bake_s``),
    ``good`` (its rollout finished and its bake passed: every replica ran it, answered, and did not
    fail nor restart for ``bake_s``), ``deployed``
    (applied without a rollout: the first spec, or a group recreated), ``replaced`` (a newer
    spec came before its rollout finished), ``rolled back`` (a replica of it failed; ``reason``
    says which), ``halted`` (it failed while being rolled back to)."""

    model_config = ConfigDict(extra="forbid")

    version: Count
    result: Result
    reason: Text = ""
    at: ShortText = ""  # when the result was recorded (workflow time, ISO)
    undo_of: Count | None = None  # applied by `gpuflow rollout undo`: the version whose spec it is


class Outcome(OutcomeView):
    """A version with its spec (what undo goes back to)."""

    spec: Spec

    def raw(self) -> dict[str, Any]:
        return self.spec.model_dump(mode="json", exclude_none=True)


class RolloutState(BaseModel):
    """The rollout's state in the deployment workflow: carried across continue-as-new
    (DeploymentInput.rollout), and untrusted like every input: nothing unknown, every field bounded."""

    model_config = ConfigDict(extra="forbid")

    version: Count = 0  # the target spec's version
    latest: Count = 0  # the highest version handed out
    versions: Annotated[dict[Name, Count], Field(max_length=MAX_NAMES)] = {}  # instance -> the version it runs (absent: 0)
    rolling: Flag = False
    from_version: Count = 0
    good: dict[str, Any] | None = None  # the last good spec (as written) while a rollout runs
    good_version: Count = 0
    rolled_back: Flag = False
    status: Text = ""
    steps: Annotated[list[RolloutStep], Field(max_length=KEEP_STEPS)] = []
    pending_since: Annotated[dict[Name, Since], Field(max_length=MAX_NAMES)] = {}
    answering_since: Annotated[dict[Name, Since], Field(max_length=MAX_NAMES)] = {}
    history: Annotated[list[Outcome], Field(max_length=KEEP_HISTORY)] = []  # oldest first; the current and good kept
    # a prefill/decode group's (workflows/group_roll.py): which way its last edit rolls and why, the roles rolling
    # (in order), the generation new members join (their rows' group_gen), and each member's generation
    way: Way = ""
    why: Text = ""
    roles: Annotated[list[RoleWord], Field(max_length=3)] = []
    gen: Count = 0  # the target's generation
    good_gen: Count = 0  # the generation of the good spec a rollback returns to
    gen_latest: Count = 0  # the highest generation handed out
    gens: Annotated[dict[Name, Count], Field(max_length=MAX_NAMES)] = {}  # member -> its generation (absent: 0)
    forming_since: Since | None = None  # a whole roll: since when its new generation waits to be placed
    # the bake and the progress deadline (scheduler/rollout_bake.py; issue 38)
    bake_since: Since | None = None  # since when the target version bakes (None: not baking)
    bake_base: Annotated[dict[Name, Count], Field(max_length=MAX_NAMES)] = {}  # replica -> restarts when the bake saw it first
    progress_at: Since | None = None  # the last change the rollout made or saw
    progress_key: Annotated[str, Field(max_length=64)] = ""  # what it saw then (rollout_bake.progress_key)
    bake_counts: GatewayCounts | None = None  # the gateways' counters when the bake began (metric checks)


class UndoView(BaseModel):
    """Where ``gpuflow rollout undo`` would go (``to``: a version, or None) and what it says."""

    to: Count | None = None
    says: Text = ""


class RolloutView(BaseModel):
    """The deployment workflow's ``rollout`` query: progress, old and new replicas, the steps and
    the versions kept (without their specs)."""

    name: Name
    status: Text
    rolling: bool
    version: Count
    from_version: Count
    desired: Count
    old: list[Name]
    new: list[Name]
    stopping: list[Name]
    can_undo: bool
    undo: UndoView
    steps: list[RolloutStep]
    history: list[OutcomeView]
    way: Way = ""  # a group's: none | roles | whole | recreate (scheduler/groups/compat.py)
    why: Text = ""  # a group's: which way its last edit rolls, and why
    gen: Count = 0  # a group's: the generation its target runs as
    baking: bool = False  # the last step taken: the target version runs on probation (rollout.bake_s)
    bake_left_s: Annotated[float, Field(ge=0)] = 0.0  # of the bake
    bake_judged: Text = ""  # what the bake judges
