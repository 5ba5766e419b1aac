"""Linux CPU lists ("0-3,8,10-11", as in /proc/<pid>/status Cpus_allowed_list and sysfs
local_cpulist): parsed to sorted CPU numbers and written back in the same short form."""

from __future__ import annotations

from typing import Any, Iterable

MAX_CPU = 65535  # Linux's NR_CPUS tops out at 8192 today; a bigger number is a mistake (or an attack)


def parse(text: str) -> list[int]:
    """'0-3,8' -> [0, 1, 2, 3, 8]; ValueError naming the bad part."""
    out: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"{text!r} is not a CPU list (example: '0-15,32-47'): bad part {part!r}")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise ValueError(f"{text!r} is not a CPU list: range {part!r} runs backwards")
        if b > MAX_CPU:
            raise ValueError(f"{text!r} is not a CPU list: CPU {b} is above {MAX_CPU}")
        out.update(range(a, b + 1))
    return sorted(out)


def format(cpus: Iterable[int]) -> str:  # noqa: A001  (the inverse of parse)
    """[0, 1, 2, 3, 8] -> '0-3,8'."""
    xs = sorted(set(cpus))
    runs: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        runs.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(runs)


def normalise(v: Any) -> Any:
    """A CPU list given as text or as a list of numbers, in canonical text form ('0-3,8')."""
    if isinstance(v, str):
        return format(parse(v))
    if isinstance(v, (list, tuple)):
        if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_CPU for x in v):
            raise ValueError(f"{v!r} is not a list of CPU numbers (0..{MAX_CPU})")
        return format(v)
    return v
