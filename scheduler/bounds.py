"""Bounded field types for everything that crosses Temporal or comes from a file: every integer,
string and list in a workflow, update, signal, query or activity input has a bound that fits its
meaning, checked at validation with the field named (tests/test_bounds.py walks every input model
and fails on any field without one).

Anyone who can reach Temporal can send any value, and an unbounded one wedges what reads it: a
1 MiB run_command took 87 s to split and tripped the workflow's deadlock detector; ``restarts`` of
1,030 overflowed the restart backoff's float, and the workflow task was retried forever."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field, Strict

from scheduler.limits import MAX_GPUS, MAX_WAIT_S
from scheduler.naming import NAME_MAX, NAME_PATTERN

MAX_TEXT = 4096  # a reason, a message, a path: more than any of ours is long
MAX_COMMAND = 16384  # a command line (run_command): Linux's own limit per argument is 128 KiB
MAX_WORDS = 512  # words of a command line (backend_parameters)
MAX_ITEMS = 256  # entries of a map or list from a spec (env, selectors, categories)
MAX_COUNT = 10**9  # counts that grow over a lifetime (restarts, the next instance index)
MAX_PID = 2**31 - 1  # pid_t's largest (Linux's pid_max is at most 2^22; the simulator's pids start above it)
MAX_PORT = 65535


def no_nul(v: str) -> str:
    """Files and processes take no NUL byte: refused here, naming the problem, not at exec."""
    if "\x00" in v:
        raise ValueError("holds a NUL byte")
    return v


Name = Annotated[str, Field(min_length=1, max_length=NAME_MAX, pattern=NAME_PATTERN)]
def clip(v: object) -> object:
    """Free text our own workflows write (a reason that quotes a log's tail, say) is cut to
    MAX_TEXT rather than refused: refused inside a workflow, it would fail the workflow task forever."""
    if isinstance(v, str) and len(v) > MAX_TEXT:
        return v[:MAX_TEXT - 40] + f"... ({len(v) - MAX_TEXT + 40} more characters)"
    return v


Text = Annotated[str, BeforeValidator(clip), Field(max_length=MAX_TEXT)]  # free text: reasons, messages
MAX_LINES = 20_000  # lines of a record (a decision's reasons: one per worker a filter removed)


def clip_lines(v: object) -> object:
    """A record's lines past MAX_LINES are cut, saying how many (as ``clip`` does for text)."""
    if isinstance(v, (list, tuple)) and len(v) > MAX_LINES:
        return list(v[:MAX_LINES - 1]) + [f"... and {len(v) - MAX_LINES + 1} more"]
    return v


Lines = Annotated[list[Text], BeforeValidator(clip_lines), Field(max_length=MAX_LINES)]
ShortText = Annotated[str, Field(max_length=256)]  # a word or a short label: a state, a kind, a version
Path = Annotated[str, Field(min_length=1, max_length=MAX_TEXT), AfterValidator(no_nul)]
Word = Annotated[str, Field(max_length=MAX_TEXT), AfterValidator(no_nul)]  # one word of a command line
Command = Annotated[str, Field(min_length=1, max_length=MAX_COMMAND), AfterValidator(no_nul)]
Count = Annotated[int, Strict(), Field(ge=0, le=MAX_COUNT)]
Index = Annotated[int, Field(ge=0, le=MAX_GPUS)]  # a GPU index, a NUMA node
Pid = Annotated[int, Field(ge=0, le=MAX_PID)]
Port = Annotated[int, Field(ge=0, le=MAX_PORT)]
Seconds = Annotated[float, Field(ge=0, le=MAX_WAIT_S)]
Flag = Annotated[bool, Strict()]  # true or false, never 'yes' or 1
Whole = Annotated[int, Strict()]  # a whole number, never true or 1e30 (bound it with Field(le=...))
Indexes = Annotated[list[Index], Field(max_length=MAX_GPUS)]
CpuText = Annotated[str, Field(max_length=MAX_TEXT)]  # a Linux CPU list ("0-31,64-95"): long on a sparse machine
Names = Annotated[list[Name], Field(max_length=MAX_ITEMS)]
# labels (key=value, as Kubernetes' labels; a worker selector too): at most 64, each part at most 253 characters
Labels = Annotated[dict[Annotated[str, Field(min_length=1, max_length=253)], Annotated[str, Field(max_length=253)]],
                   Field(max_length=64)]
