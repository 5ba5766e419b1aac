"""The environment's GPUFLOW_ variables, when Settings cannot take them: one line per problem, each
naming the variable that holds it.

- a value its field refuses: ``GPUFLOW_SCHEDULER__PLACEMENT: Input should be a valid number (got 'abc')``;
- a section's JSON that does not parse: ``GPUFLOW_SCHEDULER: not valid JSON: ...``;
- a key that its section does not have: ``GPUFLOW_SCHEDULER__PLACMENT: scheduler has no setting
  'placment'; did you mean GPUFLOW_SCHEDULER__PLACEMENT?``. pydantic-settings would ignore it and
  leave the default in force, which is the mistake nobody finds.

Names match case-insensitively, as pydantic-settings matches them. Top-level names that no field
has are left alone: other GPUFLOW_ variables (GPUFLOW_PUBLISH_ADDRESS) are read elsewhere."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping

from pydantic import BaseModel, ValidationError

from scheduler.errors import InvalidInput

PREFIX = "GPUFLOW_"
DELIM = "__"


def _named(environ: Mapping[str, str]) -> dict[str, str]:
    """lowercased name -> the name as it was set, for the GPUFLOW_ variables."""
    return {k.lower(): k for k in environ if k.upper().startswith(PREFIX)}


def _var(path: tuple) -> str:
    return PREFIX + DELIM.join(str(p) for p in path).upper()


def _source(loc: tuple, named: dict[str, str]) -> tuple[str | None, tuple]:
    """The variable that gave the value at loc (the longest prefix of loc that is set), and the
    rest of loc inside that variable's JSON."""
    for n in range(len(loc), 0, -1):
        name = named.get(_var(loc[:n]).lower())
        if name:
            return name, loc[n:]
    return None, loc


def _line(loc: tuple, problem: str, named: dict[str, str]) -> str:
    var, inside = _source(loc, named)
    under = sorted(n for low, n in named.items() if loc and low.startswith(_var(loc).lower() + DELIM))
    if var is None and under:  # GPUFLOW_SCHEDULER__PLACEMENT__X: keys under a field that takes one value
        return f"  {', '.join(under)}: {problem}; {loc[-1]} takes one value, with no keys under it"
    if var is None:  # passed in code or by a flag, not from the environment
        return f"  {'.'.join(map(str, loc)) or '(settings)'}: {problem}"
    return f"  {var}{': ' + '.'.join(map(str, inside)) if inside else ''}: {problem}"


def _invalid(lines: list[str]) -> InvalidInput:
    return InvalidInput("the environment's settings are invalid:\n" + "\n".join(lines))


def validation_problem(e: ValidationError, environ: Mapping[str, str]) -> InvalidInput:
    named, lines = _named(environ), []
    for err in e.errors(include_url=False):
        msg = err["msg"].removeprefix("Value error, ")
        if "input" in err and not isinstance(err["input"], (dict, BaseModel)):
            msg += f" (got {err['input']!r})"
        lines.append(_line(tuple(err["loc"]), msg, named))
    return _invalid(lines)


_FIELD = re.compile(r'field "([^"]+)"')


def parse_problem(e: Exception, environ: Mapping[str, str]) -> InvalidInput:
    """pydantic-settings' SettingsError: a section's value is not JSON. It names the field only."""
    m = _FIELD.search(str(e))
    if not m:
        return _invalid([f"  {e}"])
    cause = e.__cause__ or e.__context__
    why = f"not valid JSON: {cause}" if cause else str(e)
    return _invalid([_line((m[1],), why, _named(environ))])


def unknown_keys(settings: type[BaseModel], environ: Mapping[str, str]) -> InvalidInput | None:
    """GPUFLOW_<SECTION>__<KEY> where the section is one of the settings' own sections and has no
    such key."""
    lines = []
    for low, name in sorted(_named(environ).items()):
        section, sep, rest = low[len(PREFIX):].partition(DELIM)
        field = settings.model_fields.get(section)
        model = field.annotation if field else None
        if not sep or not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        key = rest.split(DELIM)[0]
        if key in model.model_fields:
            continue
        close = difflib.get_close_matches(key, list(model.model_fields), n=1)
        hint = f"; did you mean {_var((section, close[0]))}?" if close else \
            f"; it has {', '.join(sorted(model.model_fields))}"
        lines.append(f"  {name}: {section} has no setting {key!r}{hint}")
    return _invalid(lines) if lines else None
