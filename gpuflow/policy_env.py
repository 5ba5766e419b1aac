"""The scheduler's settings for the dry-run commands (`schedule`, `rank-scale-down`), read without
importing pydantic-settings when nothing in the environment could change them.

With no GPUFLOW_ variable set, `Settings().scheduler` is `PolicyConfig()`: the defaults. Building
it through `Settings` imports pydantic-settings, asyncio and the control plane's payload models,
about a tenth of a second that `gpuflow schedule` on a big file would spend before reading it. With
any GPUFLOW_ variable set (names match case-insensitively, as pydantic-settings matches them), the
full `Settings` reads and checks the environment, so its errors name a bad variable exactly as
every other command's do."""

from __future__ import annotations

import os

from scheduler.policy_config import PolicyConfig

PREFIX = "GPUFLOW_"


def policy_config() -> PolicyConfig:
    if not any(k.upper().startswith(PREFIX) for k in os.environ):
        return PolicyConfig()
    from gpuflow.settings import Settings

    return Settings().scheduler
