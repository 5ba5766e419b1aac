"""A workflow's one input, validated inside the workflow rather than by the SDK.

Anyone who can reach Temporal can start our workflows with any input (the Temporal CLI, any
SDK). When the SDK decodes a typed parameter and the input does not fit (``replicas: "many"``,
a list, null, no input at all, two inputs), the workflow task fails and is retried forever: the
workflow sits Running with "Failed decoding arguments" and answers no query. So the workflows
take ``*args`` (plain JSON, decoded by nobody) and call :func:`one_input`, which raises a
non-retryable ``ApplicationError`` that fails the workflow at once with the validation message.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from temporalio.exceptions import ApplicationError

M = TypeVar("M", bound=BaseModel)
MAX_MESSAGE = 2000  # a huge bad input must not make a huge failure message


def invalid(message: str) -> ApplicationError:
    """The failure for input that is the sender's fault: not retried, the message kept short."""
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + f"... ({len(message) - MAX_MESSAGE} more characters)"
    return ApplicationError(message, type="InvalidInput", non_retryable=True)


def one_input(args: tuple, model: type[M], workflow_type: str) -> M:
    """``args`` as exactly one ``model``; anything else fails the workflow, naming the problem."""
    if len(args) != 1:
        raise invalid(f"{workflow_type} takes one input (a {model.__name__} JSON object), got {len(args)}")
    raw = args[0]
    if isinstance(raw, model):
        return raw
    if not isinstance(raw, dict):
        raise invalid(f"{workflow_type}: the input must be a {model.__name__} JSON object, got {_kind(raw)}")
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise invalid(f"{workflow_type}: invalid input: {compact(e)}") from None
    except (ValueError, TypeError, OverflowError) as e:  # a validator's own error, outside pydantic's wrapping
        raise invalid(f"{workflow_type}: invalid input: {e}") from None


def compact(e: ValidationError) -> str:
    """One line per problem: 'replicas: Input should be a valid integer (got 'many')'."""
    out = []
    for err in e.errors()[:10]:
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        got = repr(err.get("input"))
        out.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}"
                   + (f" (got {got[:60]})" if err["type"] not in ("missing", "extra_forbidden") else ""))
    return "; ".join(out) + (f"; and {e.error_count() - 10} more" if e.error_count() > 10 else "")


def _kind(v: Any) -> str:
    return "null" if v is None else {list: "a list", str: "a string", bool: "a boolean"}.get(
        type(v), f"a {type(v).__name__}")
