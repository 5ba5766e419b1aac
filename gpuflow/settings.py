"""gpuflow's one settings object: environment variables with the GPUFLOW_ prefix, nested
sections with "__" (GPUFLOW_SCHEDULER__PLACEMENT=50), validated once and passed down."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict

from scheduler.policy_config import PolicyConfig


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLOW_", env_nested_delimiter="__", extra="ignore")

    scheduler: PolicyConfig = PolicyConfig()
