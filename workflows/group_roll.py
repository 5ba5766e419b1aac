"""A prefill/decode group's rollout in its deployment's workflow (issue 35): the group half of
workflows/rollout_steps.py. The edit was judged as it arrived (rollout_steps.change_spec with
scheduler/groups/compat.py ``judge``): ``roles`` or ``whole``; each loop pass while it rolls takes
one step here, derived from the members as they are (their version, their probe), so a restarted
worker resumes from them.

- **Role by role.** Each changed role in turn (prefill, decode, router) rolls with the ordinary
  policy (scheduler/rollout.py ``next_step``: surge a new member of that role, placed alone beside
  the group; once it answers, drain and stop an old one; stop-first after ``surge_timeout_s``
  unplaced). Old and new members of the other roles pair meanwhile: compat judged their KV alike.
- **Whole.** A new generation of every member is formed beside the old, in one booking
  (form_group, its rows' group_gen = the old + 1); the gateways pair only within a generation and
  serve the newest ready one. Once every new member answers, the old generation is drained and
  stopped (``next_whole_step``); unplaced for ``surge_timeout_s``, the old goes first (recorded).
- A new member that fails rolls back to the last good spec the same way (for a whole roll: the
  old generation, still serving, becomes the target again and the new one is stopped).
While a group rolls, its roles are not otherwise kept (workflows/group_steps.py ``_group_step``
takes over once the roll is done)."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contracts.control import InstanceNames
    from contracts.rollout import ROLLOUT_PROBE, ReplicaProbes
    from scheduler.groups.spec import RoleName, role_of
    from scheduler.rollout import DONE, FORM, ROLLBACK, START, STOP, WAIT, Replica, Step, next_step, next_whole_step
    from scheduler.spec import ModelSpec
    from workflows import common as c
    from workflows import rollout_steps as ro


class GroupRoll:
    """The deployment workflow's group rollout (mixed into GroupSteps)."""

    async def _group_roll_step(self, spec: ModelSpec) -> None:
        r = self.ro
        keep = set(self.instances) | set(self.forming) | set(self.stopping)
        self.members = {n: x for n, x in self.members.items() if n in keep}
        stale = [n for n in self.forming if r.versions.get(n, 0) != r.version]  # named for a version rolled past
        if stale:
            await self._forget(stale)
        if not self.instances and not self.stopping and not self.forming:  # nothing ran the version before
            self._roll_done(f"no member ran version {r.from_version}: version {r.version} is formed whole")
            return await self._group_step(spec)
        now = workflow.now().timestamp()
        probed: ReplicaProbes = await workflow.execute_activity(
            ROLLOUT_PROBE, InstanceNames(names=list(self.instances)), result_type=ReplicaProbes, **c.STORE_CALL)
        reps = ro.seen(r, probed.probes, now)
        for n in self.forming:
            r.pending_since.setdefault(n, now)
        s = self._whole_step(spec, reps, now) if r.way == "whole" else self._roles_step(spec, reps, now)
        await self._take(spec, s, now)

    def _split(self, names: list[str], reps: dict[str, Replica]) -> tuple[list[Replica], list[Replica]]:
        """``names``' replicas, old (another version) and new (the target's)."""
        old = [reps[n] for n in names if n in reps and self.ro.versions.get(n, 0) != self.ro.version]
        new = [reps[n] for n in names if n in reps and self.ro.versions.get(n, 0) == self.ro.version]
        return old, new

    def _whole_step(self, spec: ModelSpec, reps: dict[str, Replica], now: float) -> Step:
        old, new = self._split(list(self.instances), reps)
        named = [n for n in self.forming if self.ro.versions.get(n, 0) == self.ro.version]
        desired = sum(x.replicas for x in spec.roles or [])
        for x in spec.roles or [] if new else []:  # a new member that ended: one more of its role, alone
            if sum(self.members.get(m.name) == x.name.value for m in new) < x.replicas:
                return Step(START, role=x.name.value, reason=f"the new generation lacks a {x.name.value} member")
        return next_whole_step(spec.rollout, desired, old, new, len(named), self.ro.forming_since, now)

    def _roles_step(self, spec: ModelSpec, reps: dict[str, Replica], now: float) -> Step:
        for role in self.ro.roles:
            try:
                want = role_of(spec.roles, RoleName(role)).replicas
            except KeyError:  # a role the target no longer has: nothing of it to roll
                continue
            old, new = self._split([n for n in self.instances if self.members.get(n) == role], reps)
            new += [Replica(n, "pending", pending_since=self.ro.pending_since.get(n))
                    for n in self.forming if self.members.get(n) == role]
            s = next_step(spec.rollout, want, old, new, now)
            if s.action != DONE:
                return Step(s.action, s.names, f"{role}: {s.reason}", s.fallback, role)
        return Step(DONE, reason=f"every role rolled ({', '.join(self.ro.roles)})")

    async def _take(self, spec: ModelSpec, s: Step, now: float) -> None:
        """Do what the step says, and log it."""
        r = self.ro
        waiting = next((n for n in self.forming if s.role and self.members.get(n) == s.role), None)
        if s.action == FORM:
            await self._form(spec)
            r.forming_since = (r.forming_since or now) if self.waiting else None
            ro.log_step(r, FORM, [n for n in self.instances if r.versions.get(n, 0) == r.version],
                        s.reason + (f"; waiting: {self.waiting}" if self.waiting else ""))
        elif s.action == START or (s.action == WAIT and waiting):  # a member to place (or one placed again)
            name = await self._add_member(spec, RoleName(s.role), waiting)
            ro.log_step(r, START if not self.waiting else WAIT, [name],
                        s.reason + (f"; {name} waits: {self.waiting}" if self.waiting else ""))
        elif s.action == STOP:
            ro.log_step(r, STOP, s.names, s.reason, s.fallback)
            await self._stop(s.names)
        elif s.action == DONE:
            self._roll_done(s.reason)
        elif s.action == ROLLBACK:
            good = ro.roll_back(r, s.reason)
            if good is not None:  # back to the last good spec: the loop applies it
                self.raw, self.dirty = good, True
        else:
            ro.log_step(r, WAIT, [], s.reason)

    def _roll_done(self, reason: str) -> None:
        """The roll is over: every member now runs the target (and is of its generation)."""
        r = self.ro
        ro.done(r, reason, set(self.instances) | set(self.forming) | set(self.stopping))
        r.versions.update({n: r.version for n in [*self.instances, *self.forming]})
        r.forming_since = None
