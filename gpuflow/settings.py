"""gpuflow's one settings object: environment variables with the GPUFLOW_ prefix, nested
sections with "__" (GPUFLOW_SCHEDULER__PLACEMENT=50, GPUFLOW_TEMPORAL__ADDRESS=host:7233),
validated once and passed down. Command-line flags override the environment; each flag that sets
a field here is made from the field (gpuflow/cli/flags.py): its name, its help (the description,
which states the default) and the variable that sets it too."""

from __future__ import annotations

import os

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from contracts.kv_connectors import KV_CONNECTORS, MAX_KV_CONNECTORS, known_kv_connectors
from contracts.timings import Timings
from contracts.limits import Limits
from scheduler.claims.settings import ClaimSettings
from scheduler.policy_config import PolicyConfig


def default_data_dir() -> str:
    return os.path.join(os.path.expanduser("~"), ".local", "share", "gpuflow")


class TemporalSettings(BaseModel):
    address: str = Field("localhost:7233", description="Temporal frontend host:port. Default localhost:7233.")
    namespace: str = Field("default", description="Temporal namespace. Default default.")
    tls_cert: str | None = Field(None, description="Client certificate (PEM file) for mTLS.")
    tls_key: str | None = Field(None, description="Client private key (PEM file) for mTLS.")
    tls_ca: str | None = Field(None, description="CA bundle (PEM file) to verify the server.")
    tls: bool = Field(False, description="Use TLS with the system's CA bundle (implied by the other tls_ fields).")
    api_key: str | None = Field(None, description="Temporal Cloud / server API key (implies TLS).")


class ServerSettings(BaseModel):
    """``gpuflow server``'s, the control-plane worker's."""

    metrics_address: str = Field("127.0.0.1:9400", description="Where its Prometheus endpoint listens: HOST:PORT, or off. Default 127.0.0.1:9400.")


class AgentSettings(BaseModel):
    """``gpuflow agent``'s (and ``gpuflow simulate``'s hosts'): how a host joins the cluster, and
    where it serves its metrics."""

    metrics_address: str = Field("127.0.0.1:9401", description="Where the agent's Prometheus endpoint listens: HOST:PORT, or off. Default 127.0.0.1:9401.")
    join_token: SecretStr | None = Field(None, description="The cluster's join token ('gpuflow hosts join-token' prints it), needed at a host's first start only: the agent then keeps a credential of its own in its data dir. Default none.")
    join_token_file: str | None = Field(None, description="A file holding the join token (keep it mode 0600). Default none.")
    kv_connectors: list[str] | None = Field(None, max_length=MAX_KV_CONNECTORS, description=f"The KV connectors this host's engines can run, for prefill/decode groups: {', '.join(KV_CONNECTORS)} (the variable takes a JSON list: '[\"nixl\"]'). Stated, instead of what the agent finds installed. Default: what it finds.")

    @field_validator("kv_connectors")
    @classmethod
    def _known(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else known_kv_connectors(v)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLOW_", env_nested_delimiter="__", extra="ignore")

    scheduler: PolicyConfig = PolicyConfig()
    temporal: TemporalSettings = TemporalSettings()
    server: ServerSettings = ServerSettings()
    agent: AgentSettings = AgentSettings()
    timings: Timings = Timings()
    limits: Limits = Limits()
    claims: ClaimSettings = ClaimSettings()  # learned memory claims (scheduler/claims/)
    data_dir: str = Field(default_factory=default_data_dir, description="Where gpuflow keeps its files. Default ~/.local/share/gpuflow.")
    database_url: str | None = Field(None, description="SQLAlchemy URL of the store; default a SQLite file in data_dir.")
    database_schema: str | None = Field(None, description="PostgreSQL schema for gpuflow's tables (default: the search_path).")
    hf_endpoint: str | None = Field(None, description="A Hugging Face mirror for estimates and downloads (default: HF_ENDPOINT, else huggingface.co).")
    capacity_hook: str | None = Field(None, description="Where the autoscaler reports demand the cluster cannot place: an http(s) URL (JSON POST) or a command (JSON on stdin); activities/capacity_hook.py. Default none.")
    decision_retention_days: float = Field(30.0, ge=0, le=3650, description="How long each placement decision's inputs (the snapshot and request its policy saw) are kept for 'gpuflow explain --replay'; the decision that placed each live replica is always kept. 0: keep none. Default 30.")
    workflow_sandbox: bool = Field(False, description="Run the control plane's workflows in Temporal's sandbox: its runtime determinism checks, for about a sixth more CPU per replica (gpuflow/server.py). Default off; the tests replay recorded histories under it.")
    allow_env: list[str] = Field([], description="Env patterns specs may set beyond the default allowlist (JSON list, e.g. GPUFLOW_ALLOW_ENV='[\"MYAPP_*\"]'); each agent must allow them too (--allow-env). Default none.")
    allow_engine_flags: list[str] = Field([], max_length=256, description="Engine flags specs may pass beyond each engine's allowlist (JSON list, e.g. GPUFLOW_ALLOW_ENGINE_FLAGS='[\"--enable-lora\"]'; exact spellings); each agent must allow them too (--allow-engine-flag). Flags gpuflow sets and flags that fetch from the network stay refused. Default none.")

    def __init__(self, **values):
        """As BaseSettings, except that an environment it cannot take is an InvalidInput naming the
        variable (gpuflow/settings_errors.py), not a traceback."""
        from gpuflow import settings_errors as why

        try:
            super().__init__(**values)
        except ValidationError as e:
            raise why.validation_problem(e, os.environ) from None
        except SettingsError as e:
            raise why.parse_problem(e, os.environ) from None
        unknown = why.unknown_keys(type(self), os.environ)
        if unknown:
            raise unknown

    def store_url(self) -> str:
        return self.database_url or f"sqlite:///{os.path.join(os.path.abspath(self.data_dir), 'gpuflow.db')}"
