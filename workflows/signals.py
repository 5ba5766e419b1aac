"""Signals whose payload does not validate: refused, logged and counted, never dropped without a word.

Anyone who can reach Temporal can signal our workflows with anything. The handlers take ``*args``
(plain JSON, decoded by nobody: a typed parameter the payload does not fit made the SDK drop the
signal, with only its own log line) and validate here. A refused signal changes nothing; it is

- logged with ``workflow.logger`` (not while a history is replayed), naming the workflow, the
  signal and the problem;
- counted in ``gpuflow_signals_refused`` (labels ``signal``, and the SDK's ``workflow_type``,
  ``task_queue`` and ``namespace``) through ``workflow.metric_meter()``, which counts nothing on
  replay. The control-plane worker's /metrics shows it (gpuflow/metrics_http.py appends the SDK's
  series to ours).

Why a metric rather than a counter in each workflow's status: an operator learns of forged signals
from an alert on one series across every workflow, not by opening each replica's details; and a
workflow's own counter would be reset by continue-as-new, or carried in every input."""

from __future__ import annotations

import re
from typing import TypeVar

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, ValidationError

    from workflows.inputs import compact

M = TypeVar("M", bound=BaseModel)
COUNTER = "gpuflow_signals_refused"


def refuse(signal: str, why: str) -> None:
    """Log and count one refused signal (the caller changes nothing)."""
    workflow.logger.warning(f"{workflow.info().workflow_id}: refused a {signal!r} signal: {why[:300]}; "
                            "nothing changed")
    workflow.metric_meter().create_counter(
        COUNTER, "Signals refused because their payload did not validate (forged, or garbage), by signal",
    ).add(1, {"signal": signal})


def none(signal: str, args: tuple) -> bool:
    """True for a signal that carries nothing, as it should; otherwise refused."""
    if args:
        refuse(signal, f"it takes no argument; it carried {len(args)} ({str(args[0])[:80]!r})")
        return False
    return True


def one(args: tuple, model: type[M], signal: str) -> M | None:
    """The signal's one ``model``, or None (refused, naming the problem). (Its arguments first, as
    workflows/inputs.py ``one_input``: docs/refgen reads the model a handler validates from the call.)"""
    if len(args) != 1:
        refuse(signal, f"it takes one {model.__name__}; it carried {len(args)} arguments")
        return None
    if isinstance(args[0], model):
        return args[0]
    try:
        return model.model_validate(args[0])
    except ValidationError as e:
        refuse(signal, f"its {model.__name__} does not validate: {compact(e)}")
        return None


def of_deployment(instance: str, deployment: str) -> bool:
    """Whether ``instance`` is named as one of ``deployment``'s replicas (``<deployment>-<n>``)."""
    return re.fullmatch(re.escape(deployment) + r"-[0-9]+", instance) is not None


def check(signal: str, ok: bool, why: str) -> bool:
    """``ok``, or refused with ``why``."""
    if not ok:
        refuse(signal, why)
    return ok

