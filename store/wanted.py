"""Which replicas the ledger books: only those their deployment wants (issue 40, M2 and M3). A
replica is wanted when its deployment started it (its row is ``wanted``: store/records.py
create_instances), has not deleted it, and names it ``<deployment>-<n>``; a new booking also needs
that deployment to exist and be active. An instance workflow started by hand writes its own row
(unwanted), or none at all; a workflow of one's own continued as new into one carries a placement
the ledger never booked (store/bookings.py holds_problem). Checked in the booking's transaction
(store/ledger.py), and in every read of a booking (store/bookings.py)."""

from __future__ import annotations

import re

from sqlmodel import Session, select

from scheduler.errors import GpuflowError
from store.tables import DeploymentRow, InstanceRow


class NotWanted(GpuflowError):
    """The instance is not one its deployment wants (``wanted_problem``): nothing is booked, and no
    decision mends it."""


def unwanted(instance: str, row) -> str | None:
    """Why the instance of store row ``row`` (deployment, state, wanted; None: no row) is not one
    its deployment wants, whatever that deployment's state (None: it is)."""
    if row is None:
        return (f"instance {instance} was not started by a deployment (no record of it in the store); replicas are "
                "started by their deployment (gpuflow deploy)")
    if row.state == "deleted":
        return f"instance {instance} of deployment {row.deployment} was deleted"
    if row.wanted is False:
        return (f"instance {instance} was not started by its deployment {row.deployment} (it was started by hand); "
                "replicas are started by their deployment (gpuflow deploy)")
    if not re.fullmatch(re.escape(row.deployment) + r"-[0-9]+", instance):
        return f"instance {instance} is not one of deployment {row.deployment}'s (they are named {row.deployment}-<n>)"
    return None


def wanted_problem(s: Session, instance: str) -> str | None:
    """Why ``instance`` may not be booked now (None: it may): ``unwanted``, or its deployment is
    missing or not active (a deleting one's replicas keep what they hold until they stop)."""
    t, d = InstanceRow.__table__, DeploymentRow.__table__
    row = s.connection().execute(select(t.c.deployment, t.c.state, t.c.wanted).where(t.c.name == instance)).first()
    why = unwanted(instance, row)
    if why:
        return why
    dep = s.connection().execute(select(d.c.state).where(d.c.name == row.deployment)).first()
    if dep is None:
        return f"instance {instance}: its deployment {row.deployment} does not exist"
    if dep.state != "active":
        return f"instance {instance}: its deployment {row.deployment} is {dep.state}"
    return None
