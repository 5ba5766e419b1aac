"""A process's end as its host's agent saw it, carried on the host watch's report (issue 37).

The agent supervises every process it launched or adopted itself (worker_agent/supervision.py):
no activity per replica. When one ends (it exited, or failed its health check and was stopped),
the next watch report carries a ``ProcessEnd``; the host workflow hands the report, signed, to
host_seen, which tells the instance that holds the process's booking on that host
(``HostNews`` kind ``exited``), then acknowledges it in its next ``WatchAsk`` (``acked``), and the
agent forgets it. Until acknowledged, every report carries it again: a piece of news told twice
is the same news (the instance matches the key and the pid it launched)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field

from scheduler.errors import InvalidInput
from scheduler.naming import NAME_MAX, check_key

MAX_ENDED = 1000  # ends held for one report: more wait for the next one
REASON_MAX = 2000


def _key(value: str) -> str:
    """A process key (scheduler/naming.py check_key), refused as pydantic refuses a field."""
    try:
        return check_key(value)
    except InvalidInput as e:
        raise ValueError(str(e)) from None


Key = Annotated[str, Field(min_length=1, max_length=NAME_MAX + 41), AfterValidator(_key)]


class EndRef(BaseModel):
    """One process end, by its key (``instance`` or ``instance@part``) and pid."""

    key: Key
    pid: int = Field(ge=0, le=2**31)


class ProcessEnd(EndRef):
    """How it ended, in the agent's words (its exit code when the agent started it)."""

    returncode: int | None = Field(None, ge=-(2**31), le=2**31)
    reason: Annotated[str, Field(max_length=REASON_MAX)] = ""

    def ref(self) -> EndRef:
        return EndRef(key=self.key, pid=self.pid)


def refs(ended: list[ProcessEnd] | None) -> list[EndRef]:
    return [e.ref() for e in ended or []]
