"""The one rule for names that become workflow ids, task queues and file names on a host
(deployments, instances, workers), and the one way a file path is built from such a name.

A name arrives from the CLI, but also from anyone who can start a workflow or an activity through
Temporal, so every entry checks it again: workflow inputs, the agent's activity inputs, and every
path made from a name (which is resolved and must still lie directly in its folder)."""

from __future__ import annotations

import os
import re

from scheduler.errors import InvalidInput

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
NAME_MAX = 200  # file names on a host are NAME + a short suffix; most file systems allow 255 bytes
_NAME = re.compile(NAME_PATTERN)


def name_problem(value: object, max_len: int = NAME_MAX) -> str | None:
    """Why ``value`` is not a name (None when it is): a string of letters, digits, '.', '_', '-'
    that starts with a letter or digit, at most ``max_len`` long. No '/', no '..' alone, no NUL."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not value:
        return "is empty"
    if len(value) > max_len:
        return f"is {len(value)} characters long (at most {max_len})"
    if not _NAME.fullmatch(value):
        return "may hold only letters, digits, '.', '_' and '-', and must start with a letter or digit"
    return None


def check_name(kind: str, value: object, max_len: int = NAME_MAX) -> str:
    """``value`` when it is a valid name; InvalidInput naming the ``kind`` and the value otherwise."""
    why = name_problem(value, max_len)
    if why:
        raise InvalidInput(f"{kind} name {value!r} {why}")
    return value  # type: ignore[return-value]


def check_key(key: object) -> str:
    """A process key on a host: an instance name, or ``instance@part`` for one of its helpers."""
    if not isinstance(key, str):
        raise InvalidInput(f"process key {key!r} must be a string")
    inst, at, part = key.partition("@")
    check_name("instance", inst)
    if at:
        check_name("helper part", part, 40)
    return key


def path_in(folder: str, name: str, suffix: str = "") -> str:
    """``folder/name+suffix`` once ``name`` is a valid process key and the resolved path's parent
    is the resolved ``folder`` (so neither the name nor a symlink leads elsewhere)."""
    check_key(name)
    path = os.path.join(folder, name + suffix)
    if os.path.dirname(os.path.realpath(path)) != os.path.realpath(folder):
        raise InvalidInput(f"{name + suffix!r} does not resolve inside {folder}; refused")
    return path


def natural_key(name: str) -> list:
    """'sim-10' after 'sim-9': runs of digits compare as numbers (how every listing orders names)."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name) if p]
