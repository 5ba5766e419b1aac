"""Keep workers that can start a custom spec's command (issue 36). Where the command's first word is
a bare name (``my-server``, ``python3``; a path, or a word with a placeholder, decides nothing
here), a worker whose agent reported the executables on its PATH (scheduler/command_set.py) keeps
the spec only if the name is among them. Such a spec waits PENDING with this reason, naming the host
and the command, instead of being started where it cannot start and going ERROR. A worker that
reported no set is kept: ``gpuflow simulate``'s hosts (they start nothing, so any command does),
an agent without custom commands (the backend filter's business) or an older one (unknown).

The chain runs it only for such a spec and only when some worker of the snapshot reported a set
(``applies``), as the cordon filter: a cluster whose agents report none decides, and records,
exactly what it did before."""

from __future__ import annotations

from scheduler.command_set import holds
from scheduler.filters.chain import verdict
from scheduler.spec import Backend, command_words

NAME = "command"
NAMED = 3  # hosts named in the summary line; the rest counted


def command_of(spec) -> str | None:
    """The bare name a custom spec's command starts (None: not custom, or a path or placeholder)."""
    if spec.backend != Backend.CUSTOM or not spec.run_command:
        return None
    try:
        first = command_words(spec.run_command)[0]
    except (ValueError, IndexError):  # validated specs split; nothing to say of one that does not
        return None
    return None if "/" in first or "{" in first else first


def applies(ctx) -> bool:
    return command_of(ctx.spec) is not None and any(w.commands for w in ctx.snapshot.workers)


def run(ctx, workers):
    cmd = command_of(ctx.spec)
    removed = {w.name: [f"cannot start {cmd!r}: no such command on the host's PATH"]
               for w in workers if w.commands and holds(w.commands, cmd) is False}
    note = None
    if removed:
        names = list(removed)
        more = f" (+{len(names) - NAMED} more)" if len(names) > NAMED else ""
        note = f"{cmd!r} is on the PATH of no host of {', '.join(names[:NAMED])}{more}."
    return verdict(NAME, workers, removed, note)
