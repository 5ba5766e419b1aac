"""How the host workflow takes a report (a hello, a watch's or a probe's answer, and the usage it
carries): checked first, in one local activity per report (activities/host_auth.py, the rule in
contracts/host_proof.py: its MAC with the host's own credential, its freshness, or a join with the
cluster's join token), then validated. Only a report that passes both may change anything; one
refused changes nothing (no state, no store write, no usage), and is shown (the status query's
``refusal``, the Temporal UI's current details) while the activity counts and logs it. The report
taken is handed to host_seen signed, with what it was checked for (its ReportCheck), and host_seen
checks it again before it writes the inventory (anybody's workflow of this id may call it while this
one is not running); a watch's nonce names this run (contracts/run_nonce.py).

Anyone who can reach Temporal can signal ``hello`` or answer a watch in a host's place: the check
is what makes that change nothing. A report whose MAC verifies but does not validate is the host's
own (an agent of another version, say): the host is NOT_READY with the reason, as before."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, get_args

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from contracts.activity_names import CHECK_HOST_REPORT
    from contracts.control import HostReport
    from contracts import run_nonce
    from contracts.host_auth import Purpose, Refusal, RefusalKind, ReportCheck, ReportVerdict
    from workflows import common as c
    from workflows.inputs import compact

REFUSAL_KINDS = get_args(RefusalKind)

Proven = tuple[HostReport, ReportCheck]  # a report taken (its auth dropped), and the check it passed
MAX_HELLOS = 4  # hellos queued between two looks; a flood drops the oldest (the probe still finds the host)


def checked_report(raw: Any, name: str) -> tuple[HostReport | None, str]:
    """(the report, "") when ``raw`` is a valid report of host ``name``; (None, why) otherwise. Reports
    arrive from the agent (or anyone who can signal this workflow): validated here, never by the SDK,
    whose failed decoding would drop the hello without a word or fail the workflow task forever."""
    if isinstance(raw, HostReport):
        raw = raw.model_dump(mode="json")
    if not isinstance(raw, dict):
        return None, f"its report is not a JSON object (got {type(raw).__name__})"
    try:
        report = HostReport.model_validate(raw)
    except ValidationError as e:
        return None, f"its report does not validate: {compact(e)}"[:1000]
    if report.name != name:
        return None, f"the report names host {report.name!r}"
    return report, ""


def _said(raw: Any, key: str, inside: str = "") -> str:
    """What an unverified report says it is (its boot, its public key), for the refusal shown."""
    v = raw.get(key) if isinstance(raw, dict) else None
    if inside:
        v = v.get(inside) if isinstance(v, dict) else None
    return v[:64] if isinstance(v, str) else ""


class HostReports:
    """The host workflow's side of the check: needs ``inp``, ``state``, ``reason``, ``_refuse`` and
    ``_show`` of the workflow (workflows/host.py)."""

    _refuse: Callable[[str], Awaitable[None]]  # the workflow's own (HostWorkflow._refuse), declared for the methods here
    _show: Callable[[], None]  # the workflow's own (HostWorkflow._show)

    def _init_reports(self, last_hello: int, refusal: Refusal | None) -> None:
        self.hellos: list[Any] = []  # hellos signalled, not yet checked (at most MAX_HELLOS)
        self.last_hello = last_hello  # the stamp (ms) of the last hello accepted
        self.refusal = refusal  # the last report refused
        self.greeting: Proven | None = None  # a report checked and valid, not yet taken in (host_seen)

    def _queue_hello(self, raw: Any) -> None:
        if len(self.hellos) >= MAX_HELLOS:
            self.hellos.pop(0)
        self.hellos.append(raw)

    async def _take_hellos(self) -> None:
        """Check the hellos signalled so far, in order: the last that passes is the greeting."""
        while self.hellos:
            proven = await self._checked(self.hellos.pop(0), "hello")
            if proven is not None:
                self.greeting = proven

    def _nonce(self) -> str:
        """A watch's nonce, made by this run (contracts/run_nonce.py)."""
        return run_nonce.nonce(workflow.info().run_id, workflow.uuid4().hex)

    async def _checked(self, raw: Any, purpose: Purpose, nonce: str = "") -> Proven | None:
        """``raw``, a report of this host, once it passed the check and validates (its auth dropped),
        with that check; None when it did not: refused (shown), or the host's own and invalid
        (NOT_READY, _refuse)."""
        check = ReportCheck(host=self.inp.name, purpose=purpose, report=raw if isinstance(raw, dict) else None,
                            nonce=nonce, now_ms=int(workflow.now().timestamp() * 1000), after_ms=self.last_hello)
        try:
            verdict = await workflow.execute_local_activity(CHECK_HOST_REPORT, check, result_type=ReportVerdict,
                                                            **c.STORE_LOCAL)
        except ActivityError as e:
            verdict = ReportVerdict(kind="unchecked", why=f"could not be checked: {c.cause(e)[1]}"[:1000])
        if not verdict.ok:
            self._refused(verdict, raw, purpose)
            return None
        if purpose == "hello":
            self.last_hello = max(self.last_hello, verdict.stamp_ms)
        report, why = checked_report(raw, self.inp.name)
        if report is None:
            if (self.state, self.reason) != ("not_ready", why):
                await self._refuse(why)
            return None
        return report.model_copy(update={"auth": None}), check

    async def _seen(self, proven: Proven) -> bool:
        """host_seen writes the report (checked again there); False, shown as refused, when it does not."""
        try:
            await workflow.execute_activity(c.HOST_SEEN, proven[1], **c.STORE_CALL)
            return True
        except ActivityError as e:
            kind, why = c.cause(e)
            if kind != "ReportRefused":
                raise
            details = getattr(e.cause, "details", None) or ("unchecked",)
            self._refused(ReportVerdict(kind=details[0] if details[0] in REFUSAL_KINDS else "unchecked", why=why),
                          proven[1].report, proven[1].purpose)
            return False

    def _refused(self, verdict: ReportVerdict, raw: Any, purpose: str) -> None:
        self.refusal = Refusal(kind=verdict.kind or "unchecked", why=verdict.why, at=workflow.now().isoformat(),
                               purpose=purpose, boot=_said(raw, "boot"), public=_said(raw, "auth", "public"))
        self._show()

