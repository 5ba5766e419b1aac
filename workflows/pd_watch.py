"""The deployment workflow's watch on a prefill/decode group's disaggregation (issue 35): every
``PD_CHECK_S`` while it runs members, the group_pd_health activity reads its decodes' metrics
and judges ``pd_ineffective`` from them and the gateways' counts (activities/pd_health.py); the
answer shows in the workflow's status query (``gpuflow status``) and its Temporal UI details, and
clears with the next check once transfers resume. A check that fails keeps the last answer: it
never holds the deployment's loop (one try, short timeouts)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from contracts.autoscale import DeploymentRef
    from contracts.pd_health import GROUP_PD_HEALTH, PDHealth
    from workflows import common as c

PD_CHECK_S = 15.0  # a group's disaggregation is checked this often (the gateways' window is 30 s)
CHECK_CALL = dict(start_to_close_timeout=timedelta(seconds=20), heartbeat_timeout=c.CONTROL_HEARTBEAT,
                  retry_policy=RetryPolicy(maximum_attempts=1))


class PDWatch:
    """Mixed into ModelDeploymentWorkflow beside GroupSteps: ``_pd_check()`` on each pass of its
    loop, ``pd_degraded`` added to its view's degradations, ``_pd_lines()`` to its UI lines, and
    ``_pd_wait`` bounding its loop's wait."""

    pd_degraded: list[str]
    pd_why: str
    pd_checked: float

    def _pd_init(self) -> None:
        self.pd_degraded, self.pd_why, self.pd_checked = [], "", float("-inf")

    def _pd_due(self) -> bool:
        raw = getattr(self, "raw", {}) or {}
        return bool(raw.get("roles")) and not getattr(self, "deleting", False) and bool(getattr(self, "instances", []))

    async def _pd_check(self) -> None:
        """Ask the activity, at most every PD_CHECK_S; nothing to ask while the group runs no member."""
        if not self._pd_due():
            self.pd_degraded, self.pd_why = [], ""
            return
        now = workflow.time()
        if now - self.pd_checked < PD_CHECK_S:
            return
        self.pd_checked = now
        try:
            got: PDHealth = await workflow.execute_activity(GROUP_PD_HEALTH, DeploymentRef(deployment=self.name),
                                                            result_type=PDHealth, **CHECK_CALL)
        except ActivityError:
            return  # the store or a decode was not there: the last answer stands
        self.pd_degraded, self.pd_why = list(got.degradations), got.why

    def _pd_wait(self, default: timedelta) -> timedelta:
        """The loop's wait: no longer than the next check while the group runs members."""
        return min(default, c.secs(PD_CHECK_S)) if self._pd_due() else default

    def _pd_lines(self) -> list[str]:
        """``**degraded** pd_ineffective: gateway: 6 of 6 requests ...`` while raised."""
        return [f"**degraded** {k}: {self.pd_why}" for k in self.pd_degraded]
