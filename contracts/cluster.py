"""What crosses Temporal for the cluster's two workflows: the cluster workflow's updates
(workflows/cluster.py, id ``cluster``: the operator's changes to the cluster's configuration, the
tenants file, API keys and their revocation) and the reads workflow's queries
(workflows/cluster_reads.py, id ``cluster-reads``: keys, key usage, tenants, the PENDING queue,
what ``gpuflow status`` adds about serving, and the audit). Message names are in contracts/ids.py;
the activities that write the store are activities/cluster.py's, registered under the names below;
the reads are answered by activities/cluster_reads.py ``StoreReads``.

Every field is checked against an allowlist: anyone who can reach Temporal can send these. A key
crosses as its public id, its salt and the salted hash of its secret (store/keys.py's scheme,
computed by the client): the secret itself has no field here, so it can reach no history."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contracts.scopes import (ADMIN_SCOPES, CLUSTER_ADMIN, METRICS, SCOPES, TENANT, TENANT_ADMIN,  # noqa: F401
                              admin_scope)
from scheduler.bounds import Flag
from scheduler.naming import NAME_MAX, NAME_PATTERN

# activity names (task queue gpuflow-control): the writes; the reads are queries, no activity
APPLY_TENANTS = "cluster_apply_tenants"
ADD_KEY = "cluster_add_key"
REVOKE_KEY = "cluster_revoke_key"
KEY_LIMITS = "cluster_key_limits"

KEY_ID = r"^[0-9a-f]{12}$"  # the public part of a key: gpuflow-<id>-<secret>
KEY_TENANT = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
# a key's description: letters and digits of any script, spaces and everyday punctuation
KEY_NAME = r"^[\w .,:;@/()'+=#&-]{0,200}$"
PAGE_MAX = 500  # rows one read answers; the CLI asks page after page (each page one query)
SERVING_MAX = 500  # instances one serving read names


Scope = Literal[SCOPES]  # what a key may do: contracts/scopes.py


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StrictMessage(Message):
    """A message whose every field is exactly its type: ``true`` is no count, ``"yes"`` and ``1``
    no boolean, ``"3"`` no number (the probe's ``admin: "yes"`` made an admin key)."""

    model_config = ConfigDict(extra="forbid", strict=True)


LIMIT_FIELDS = ("requests_per_s", "tokens_per_min", "max_concurrent")  # a key's own (gateway/tenant_limits.py)


class KeyLimitFields(StrictMessage):
    """An API key's own limits, beside its tenant's (None: none of its own)."""

    requests_per_s: float | None = Field(None, gt=0, le=1_000_000, description="Requests a second, then 429.")
    tokens_per_min: int | None = Field(None, ge=1, le=10**12, description="Tokens a minute (prompt and answer), then 429.")
    max_concurrent: int | None = Field(None, ge=1, le=1_000_000, description="Requests in flight at once, then 429.")


class KeyAdd(StrictMessage):
    """A new key as the client made it: the secret stays with the client. ``admin`` is the form
    of the days before scopes (an older CLI sends it): it means ``admin_scope(tenant)`` and is
    refused beside another scope."""

    id: Annotated[str, Field(pattern=KEY_ID, max_length=12)]
    tenant: Annotated[str, Field(pattern=KEY_TENANT, max_length=64)]
    name: Annotated[str, Field(pattern=KEY_NAME, max_length=200)] = ""
    salt: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$", max_length=32)]  # 16 random bytes, hex
    hash: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", max_length=64)]  # HMAC-SHA-256(salt, secret), hex
    scope: Scope = TENANT
    admin: Flag = False
    limits: KeyLimitFields | None = None  # its own limits, beside its tenant's

    @model_validator(mode="after")
    def _one_scope(self) -> "KeyAdd":
        if self.admin and self.scope not in (TENANT, admin_scope(self.tenant)):
            raise ValueError(f"admin: true means scope {admin_scope(self.tenant)} for tenant {self.tenant}; "
                             f"it was sent with scope {self.scope}: send the scope alone")
        return self

    @property
    def granted(self) -> str:
        """The scope the key gets."""
        return admin_scope(self.tenant) if self.admin else self.scope


class KeyRevoke(StrictMessage):
    id: Annotated[str, Field(pattern=KEY_ID, max_length=12)]


class KeyLimits(KeyLimitFields):
    """``gpuflow keys edit``: the limits given are set, those in ``clear`` removed, the others kept."""

    id: Annotated[str, Field(pattern=KEY_ID, max_length=12)]
    clear: list[Literal[LIMIT_FIELDS]] = Field([], max_length=3)

    @model_validator(mode="after")
    def _set_or_clear(self) -> "KeyLimits":
        both = [f for f in self.clear if getattr(self, f) is not None]
        if both:
            raise ValueError(f"{both[0]} is both set and cleared: give one")
        return self


class KeyView(Message):
    """A key as it is listed: never the secret, nor its hash. ``admin``: the scope is tenant-admin
    or cluster-admin (what an older reader of this view knew)."""

    id: str
    tenant: str
    name: str = ""
    created_at: str  # ISO 8601, UTC
    revoked_at: str | None = None
    admin: bool = False
    scope: Scope = TENANT
    requests_per_s: float | None = None  # its own limits (None: its tenant's only)
    tokens_per_min: int | None = None
    max_concurrent: int | None = None


class Page(StrictMessage):
    offset: int = Field(0, ge=0, le=10_000_000)
    limit: int = Field(PAGE_MAX, ge=1, le=PAGE_MAX)


class KeysPage(Message):
    keys: list[KeyView] = []
    total: int = 0


class UsageCounts(Message):
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated_tokens: int = 0  # of the prompt and completion tokens, those a gateway estimated (store/key_usage.py)


class UsageRow(Message):
    """One tenant's use (``key_id`` None), or one key's (``""``: an open gateway's requests, no key),
    over the last hour and the last day (store/key_usage.py)."""

    tenant: str
    key_id: str | None = None
    hour: UsageCounts = UsageCounts()
    day: UsageCounts = UsageCounts()


class UsagePage(Message):
    rows: list[UsageRow] = []  # by tenant: its total, then its keys by id; those with use in the last day
    total: int = 0


class TenantsApply(Message):
    """The tenants file as JSON; the workflow's validator reads it as a TenantsFile."""

    file: dict[str, Any]


class TenantsApplied(Message):
    version: int
    tenants: list[str] = []  # the file's tenant names (at most the first 20)
    count: int = 0  # how many the file names
    queueing: str = "BestEffortFIFO"
    reasons: int = 0  # waiting replicas whose reason changed under the new file


class TenantsPage(Message):
    queueing: str = "BestEffortFIFO"
    rows: list[dict[str, Any]] = []  # gpuflow/cli/tenants.py's rows
    total: int = 0


class QueuePage(Message):
    queueing: str = "BestEffortFIFO"
    rows: list[dict[str, Any]] = []  # gpuflow/cli/queue.py's rows
    total: int = 0
    # False: each row's reason as the store holds it, because judging the queue afresh took longer
    # than a read may (activities/cluster_reads.py JUDGE_S); that judgement records its verdicts when done
    judged: bool = True


class ServingAsk(Message):
    instances: list[Annotated[str, Field(pattern=NAME_PATTERN, max_length=NAME_MAX)]] = Field(
        [], max_length=SERVING_MAX)


class ServingView(Message):
    gateways: list[str] = []  # the live gateways' base URLs
    in_flight: dict[str, int] = {}  # instance -> requests the live gateways have in flight on it
    reasons: dict[str, str] = {}  # PENDING instance -> its current reason, as the store keeps it


class SettingsAsk(StrictMessage):
    """``gpuflow settings``: the cluster's policy as the answering control-plane worker holds it."""


class SettingsView(Message):
    """The cluster's timings and limits, from the answering ``gpuflow server``'s settings: what
    every deployment gets (``per_deployment``: the timings a spec may set for itself).
    ``timings`` None: that worker holds none of its own (a deployment keeps its input's)."""

    timings: dict[str, Any] | None = None
    limits: dict[str, Any] = {}
    per_deployment: list[str] = []
    worker: str = ""  # which worker answered (its identity)


class ClaimsAsk(StrictMessage):
    """``gpuflow claims`` and the console's Claims page: the learned claims, the most samples first."""

    limit: int = Field(500, ge=1, le=2000)  # fingerprints in one answer (each about 1 KiB)


class ClaimsView(Message):
    """views/claims.py's view as JSON ({mode, settings, claims: [row]}), with the answering
    worker's GPUFLOW_CLAIMS__* settings; ``total``: fingerprints in the store (``limit`` shown)."""

    view: dict[str, Any] = {}
    total: int = 0


class AuditAsk(Message):
    """``gpuflow explain NAME --replay | --history`` through the control plane."""

    name: Annotated[str, Field(pattern=NAME_PATTERN, max_length=NAME_MAX)]  # an instance; a deployment (history, steps)
    history: bool = False
    limit: int = Field(200, ge=1, le=1000)
    decision: Annotated[str, Field(pattern=r"^[0-9a-f]{0,64}$", max_length=64)] = ""  # a kept digest's start
    with_settings: bool = False  # replay with the caller's settings (``policy``), not the recorded ones
    # the caller's scheduler settings (scheduler/policy_config.py PolicyConfig, as JSON): with_settings
    # replays with these, never with the answering worker's; untrusted, validated by the worker
    policy: dict[Annotated[str, Field(max_length=64)], Any] | None = Field(None, max_length=64)


class AuditView(Message):
    """A replay (activities/decision_replay.replay's dict), or ``rows`` of a history."""

    replay: dict[str, Any] | None = None
    rows: list[dict[str, Any]] = Field([], max_length=1000)
