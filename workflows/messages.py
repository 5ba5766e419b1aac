"""Updates' inputs, validated as untrusted: one model per message (contracts/), checked by the
update's validator, so one that does not fit is refused before anything enters the history, naming
the problem; the handler reads it again with the same call (docs/refgen reads the model a handler
validates from the call: ``one(args, Model, ...)``).

The handlers take ``*args`` (plain JSON, decoded by nobody): a typed parameter is decoded by the
data converter, which reads ``true`` and ``"3"`` as numbers. Signals, which cannot be refused to
the sender, are logged and counted instead (workflows/signals.py); a workflow's own input fails the
workflow (workflows/inputs.py)."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from workflows.inputs import MAX_MESSAGE, compact

M = TypeVar("M", bound=BaseModel)


def _takes(model: type[BaseModel], what: str | None) -> str:
    return getattr(model, "TAKES", None) or f"one {what or model.__name__} JSON object"


def one(args: tuple, model: type[M], message: str, what: str | None = None) -> M:
    """The update's one ``model`` (``what`` names it for a reader: "model spec"); ValueError
    naming the problem otherwise (in a validator: the update is refused with it)."""
    if len(args) != 1:
        raise ValueError(f"{message} takes {_takes(model, what)}, got {len(args)} inputs")
    if isinstance(args[0], model):
        return args[0]
    try:
        return model.model_validate(args[0])
    except ValidationError as e:
        raise ValueError(f"{message} takes {_takes(model, what)}: {compact(e)}"[:MAX_MESSAGE]) from None


def none(args: tuple[Any, ...], message: str) -> None:
    """An update that takes no input, given some: refused, saying what it was given."""
    if args:
        raise ValueError(f"{message} takes no input; it was given {len(args)} ({str(args[0])[:80]!r})")
