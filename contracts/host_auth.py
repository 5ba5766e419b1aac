"""What a host's report carries to prove who made it, and what the control plane's check of it takes
and answers (contracts/host_proof.py is the check; contracts/credential.py the cryptography). Plain
pydantic models: the host workflow imports them, and nothing here does I/O or cryptography.

A report (contracts/host.HostReport) carries an ``auth``: the host's public key, its join proof, a
stamp and a MAC over the rest of the report. Every field of it may be read by anyone who can read a
workflow's history: none is a secret (contracts/credential.py says why)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from contracts.process_end import MAX_ENDED, EndRef
from scheduler.bounds import Name, ShortText, Text

PUBLIC_PATTERN = r"^[A-Za-z0-9_-]{43}$"  # a 32-byte X25519 public key in base64url, no padding
MAC_PATTERN = r"^[0-9a-f]{64}$"  # an HMAC-SHA256 in hex
STAMP_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"  # a hello's milliseconds, or a watch's nonce (a UUID)
MAX_MS = 2**53  # a time in milliseconds since the epoch: past the year 285,000

# How far a hello's stamp (the agent's clock) may be from the workflow's clock, either way. A hello
# outside it is refused, so one replayed from a history older than this joins or restates nothing;
# a host whose clock is off by more is told so, and comes READY through the watch's probe (its nonce
# comes from the workflow, not from a clock). Kerberos allows the same five minutes.
HELLO_SKEW_S = 300

Purpose = Literal["hello", "watch"]

# Why a report was refused: the label of gpuflow_host_reports_refused_total{reason}, a bounded set
RefusalKind = Literal["unsigned", "garbage", "not_joined", "other_credential", "mac", "stale", "replay",
                      "unchecked"]


class HostAuth(BaseModel):
    """A report's proof of origin: ``mac`` is HMAC(host key, purpose, host, stamp, the report without
    its auth); ``proof`` (HMAC(join secret, host, public)) joins a host the control plane does not
    know yet, and is carried on every report so a host forgotten and back joins again."""

    model_config = ConfigDict(extra="forbid")
    public: str = Field(max_length=43, pattern=PUBLIC_PATTERN)
    proof: str = Field("", max_length=64, pattern=r"^([0-9a-f]{64})?$")
    stamp: str = Field(max_length=64, pattern=STAMP_PATTERN)
    mac: str = Field(max_length=64, pattern=MAC_PATTERN)


class WatchAsk(BaseModel):
    """The host watch's input (the agent's watch_host): the inventory's fingerprint the workflow
    knows ("" for a probe: any report answers), and a nonce its report must be signed with, made by
    the workflow (workflow.uuid4()), so a report taken from an older watch's history answers nothing."""

    known: str = Field("", max_length=64)
    nonce: str = Field(min_length=1, max_length=64, pattern=STAMP_PATTERN)
    # the process ends the control plane has told their instances (contracts/process_end.py): the
    # agent forgets them; an end not acknowledged is reported again
    acked: list[EndRef] = Field([], max_length=MAX_ENDED)


class ReportCheck(BaseModel):
    """One report to check (activities/host_auth.py, a local activity of the host workflow): as it
    arrived (``report``, free JSON until its MAC verifies), what it says it is, and the workflow's
    own figures: its clock (``now_ms``), the stamp of the last hello it accepted (``after_ms``) and,
    for a watch, the nonce it sent."""

    host: Name
    purpose: Purpose
    report: dict[str, Any] | None = None  # None: what arrived was not a JSON object
    nonce: str = Field("", max_length=64)
    now_ms: int = Field(ge=0, le=MAX_MS)
    after_ms: int = Field(0, ge=0, le=MAX_MS)


class ReportVerdict(BaseModel):
    """The check's answer: ``ok``, or the refusal's ``kind`` and ``why``. ``joined``: this report
    joined the host (its credential was recorded); ``stamp_ms``: an accepted hello's stamp."""

    ok: bool = False
    kind: RefusalKind | Literal[""] = ""
    why: Text = ""
    joined: bool = False
    stamp_ms: int = Field(0, ge=0, le=MAX_MS)


class Refusal(BaseModel):
    """The last report a host workflow refused, as its status query and the Temporal UI show it:
    what it was, why, when, and who it said it came from (its agent run and public key, unverified)."""

    kind: ShortText
    why: Text
    at: ShortText = ""
    purpose: ShortText = ""
    boot: ShortText = ""
    public: ShortText = ""
