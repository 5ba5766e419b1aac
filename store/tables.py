"""SQLModel tables. Byte counts are BIGINT (a GPU holds more than 2^31 bytes); structured fields
are JSON. Table names carry a ``gpuflow_`` prefix so the store can share a database."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, UniqueConstraint
from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _json(default=None, nullable: bool = False):
    return Field(default_factory=(lambda: default() if callable(default) else default),
                 sa_column=Column(JSON, nullable=nullable))


class WorkerRow(SQLModel, table=True):
    __tablename__ = "gpuflow_workers"
    name: str = Field(primary_key=True)
    state: str = "ready"
    cluster: str = "default"
    labels: dict[str, str] = _json(dict)
    ram_total: int = Field(default=0, sa_type=BigInteger)
    unified_memory: bool = False
    reserved_ram: int = Field(default=0, sa_type=BigInteger)
    reserved_vram: int = Field(default=0, sa_type=BigInteger)
    backends: list[str] | None = _json(None, nullable=True)
    gpus: list[dict[str, Any]] = _json(list)
    simulated: bool = False
    runs: str | None = None  # HostReport.runs: processes, nothing (gpuflow simulate); None: an older agent's
    commands: str | None = None  # HostReport.commands: the executables on its PATH (scheduler/command_set.py)
    kv_connectors: list[str] | None = _json(None, nullable=True)  # HostReport.kv_connectors (None: not reported)
    fingerprint: str = ""
    generation: int = 0  # bumped by every booking, release and inventory change on this worker
    state_reason: str = ""
    updated_at: datetime = Field(default_factory=utcnow)
    boot: str | None = None  # the agent run that last said hello (HostReport.boot)
    cordoned: bool | None = None  # an operator cordoned it: no new placements (None: never, or a store made before)
    cordon_reason: str | None = None


class DeploymentRow(SQLModel, table=True):
    __tablename__ = "gpuflow_deployments"
    name: str = Field(primary_key=True)
    spec: dict[str, Any] = _json(dict)
    replicas: int = 1
    state: str = "active"  # active | deleting | deleted
    updated_at: datetime = Field(default_factory=utcnow)


class InstanceRow(SQLModel, table=True):
    __tablename__ = "gpuflow_instances"
    name: str = Field(primary_key=True)
    deployment: str = Field(index=True)
    model: str = ""
    state: str = Field(default="pending", index=True)
    reason: str = ""
    worker: str | None = Field(default=None, index=True)
    gpu_indexes: list[int] = _json(list)
    placement: dict[str, Any] | None = _json(None, nullable=True)  # claim + subordinates while reserved
    decision: dict[str, Any] | None = _json(None, nullable=True)  # summary of the last decision
    restarts: int = 0
    pid: int | None = None
    port: int | None = None
    address: str | None = None  # where the gateway reaches the server: the host agent's advertised address
    kv_events_port: int | None = None  # the engine publishes its KV-cache events there (ZMQ PUB), on ``address``
    # its engine's API key (worker_agent/engine_key.py), made by the store from the launch's nonce and the
    # host's credential: what gateways send it. A secret: shown nowhere, never in a workflow's history
    engine_key: str | None = None
    queued_at: datetime | None = None  # when it entered the PENDING queue (its arrival); None once placed
    updated_at: datetime = Field(default_factory=utcnow)
    # its deployment started it (start_instances) and it is not deleted: only then is it booked
    # (store/ledger.py). False: a row its own workflow wrote (nobody asked for it), or deleted.
    # None: a row made before the column (an upgrade keeps such instances running)
    wanted: bool | None = None
    backend: str | None = None  # the backend its booking was made for: which parts it runs (contracts/booked_parts.py)
    role: str | None = None  # a prefill/decode group's member: prefill, decode or router (None: a plain replica)
    group_name: str | None = None  # and the deployment whose group it belongs to (store/groups.py)
    # which generation of its group (a rollout that replaces the group whole starts the next one beside it;
    # the gateway pairs a prefill and a decode of one generation only). None: a plain replica, or generation 0
    group_gen: int | None = None
    # where its engine's KV hand-off listens, on ``address``: SGLang's bootstrap port, vLLM NIXL's side
    # channel (the first rank's), a custom command's {bootstrap_port} (worker_agent/pd_argv.py). None: none
    bootstrap_port: int | None = None


class ReservationRow(SQLModel, table=True):
    """One line of the ledger: an instance holds ``vram`` bytes of one GPU (gpu_index -1: no GPU,
    RAM only) and ``ram`` bytes of the worker's memory."""

    __tablename__ = "gpuflow_reservations"
    __table_args__ = (UniqueConstraint("instance", "worker", "gpu_index", name="uq_reservation"),)
    id: int | None = Field(default=None, primary_key=True)
    instance: str = Field(index=True)
    worker: str = Field(index=True)
    gpu_index: int = -1
    vram: int = Field(default=0, sa_type=BigInteger)
    ram: int = Field(default=0, sa_type=BigInteger)
    role: str = "main"  # main | subordinate
    created_at: datetime = Field(default_factory=utcnow)


class ModelFileRow(SQLModel, table=True):
    __tablename__ = "gpuflow_model_files"
    worker: str = Field(primary_key=True)
    source: str = Field(primary_key=True)
    state: str = "ready"
    updated_at: datetime = Field(default_factory=utcnow)


class TenantsRow(SQLModel, table=True):
    """The applied tenants file (scheduler/tenancy/config.py), one row: ``version`` counts the
    applies, so readers (the gateway, the decide activity) re-parse only when it moved."""

    __tablename__ = "gpuflow_tenants"
    id: int = Field(default=1, primary_key=True)
    doc: dict[str, Any] = _json(dict)
    version: int = 0
    updated_at: datetime = Field(default_factory=utcnow)


class ClusterKeyRow(SQLModel, table=True):
    """The cluster's own credential (store/host_credentials.py), one row made once: its X25519
    private key and the join secret, each 32 bytes in base64url. Every control-plane worker and
    gateway sharing the database shares them; nothing of them crosses Temporal."""

    __tablename__ = "gpuflow_cluster_keys"
    id: int = Field(default=1, primary_key=True)
    private: str
    join_secret: str
    created_at: datetime = Field(default_factory=utcnow)


class HostCredentialRow(SQLModel, table=True):
    """A joined host: the public key it joined with (its reports must verify with it until an
    operator forgets the host), and the last hello accepted from it (a replay is not newer)."""

    __tablename__ = "gpuflow_host_credentials"
    name: str = Field(primary_key=True)
    public: str
    joined_at: datetime = Field(default_factory=utcnow)
    hello_ms: int = Field(default=0, sa_type=BigInteger)
    hello_mac: str = ""
