"""The HTTP API reference: the gateway's routes as ``gateway.app.build`` mounts them (and the web
console's, from ``console``), and every error it answers: each helper of
``gateway/errors.py`` called to see its status, type, code and headers, and each
``errors.error(STATUS, ...)`` the gateway's modules write in place."""

from __future__ import annotations

import ast
import inspect
import json
import pathlib
import typing

from docs.refgen.md import code, first_line, head, table
from docs.refgen.models import notes



class _Float(float):
    """A number argument that prints as its parameter's name: the message reads as a template."""

    name = "n"

    def __format__(self, spec):
        return f"<{self.name}>"

    __str__ = __repr__ = lambda self: f"<{self.name}>"


class _Int(int):
    name = "n"

    def __format__(self, spec):
        return f"<{self.name}>"

    __str__ = __repr__ = lambda self: f"<{self.name}>"


def _placeholder(name: str, tp):
    if typing.get_origin(tp) is not None:
        return []
    if tp in (int, float):
        v = (_Int if tp is int else _Float)(1)
        v.name = name
        return v
    return f"<{name}>"


VARIANTS = {"tenant_limit": [{"reason": "requests_per_s"}, {"reason": "max_concurrent"}]}  # one code each


def _sentence(text: str) -> str:
    return text.split(". ")[0].rstrip(".") + "." if text else ""


def routes() -> list[tuple[str, str, str]]:
    """(path, methods, what) of the API, from the app the gateway serves."""
    import sqlalchemy
    from starlette.routing import Route

    from gateway.app import build

    app = build(sqlalchemy.create_engine("sqlite://"))
    out = []
    for r in app.routes:
        if isinstance(r, Route):
            doc = notes().get(f"route {r.path}") or first_line(inspect.getdoc(r.endpoint))
            if not doc:
                raise ValueError(f"route {r.path} has no meaning to show: give its handler a docstring, or add "
                                 f"'route {r.path}' to docs/refgen/notes.yaml")
            out.append((r.path, ", ".join(sorted(r.methods - {"HEAD"})), doc))
    return out


def console_routes() -> list[tuple[str, str, str]]:
    import console

    out = []
    for mod in console.PAGES:
        for path, _handler, methods in mod.ROUTES:
            out.append((console.PREFIX + path, ", ".join(methods), _sentence(first_line(mod.__doc__))))
    return out


def _args(fn) -> list:
    hints = typing.get_type_hints(fn)
    out = []
    for name, p in inspect.signature(fn).parameters.items():
        if p.default is not inspect.Parameter.empty:
            continue
        out.append(_placeholder(name, hints.get(name, str)))
    return out


def helper_errors() -> list[tuple[str, int, str, str, str, str]]:
    """(helper, status, type, code, Retry-After, message) for each public function of gateway/errors.py."""
    from gateway import errors

    out = []
    for name, fn in inspect.getmembers(errors, inspect.isfunction):
        if fn.__module__ == errors.__name__ and not name.startswith("_") and name != "error":
            out += [e for kw in VARIANTS.get(name, [{}]) if (e := _answer(name, fn, kw)) is not None]
    return out


def _answer(name: str, fn, kw: dict):
    """What one helper answers, called with placeholders (and ``kw``)."""
    from starlette.responses import Response

    args = _args(fn)
    params = [n for n, p in inspect.signature(fn).parameters.items() if p.default is inspect.Parameter.empty]
    for k, v in kw.items():
        args[params.index(k)] = v
    r = fn(*args)
    if isinstance(r, bytes):  # written on the socket itself (a header timeout)
        status, body, retry = int(r.split(b" ", 2)[1]), json.loads(r.split(b"\r\n\r\n", 1)[1]), "-"
    elif isinstance(r, Response):
        status, body, retry = r.status_code, json.loads(r.body), r.headers.get("retry-after", "-")
    else:
        return None
    e = body["error"]
    return (name, status, e["type"], e["code"], retry, e["message"])


def _text(node: ast.expr) -> str:
    """A message argument as its source reads, an f-string's fields as ``<name>``."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else f"<{ast.unparse(v.value)}>" for v in node.values)
    return f"<{ast.unparse(node)}>"


def inline_errors() -> list[tuple[str, int, str, str, str]]:
    """(module, status, type, code, message) for ``errors.error(STATUS, message, type, code)`` and
    ``errors.bad_request(message, code)`` written in place in the gateway's modules."""
    import gateway

    out = set()
    for path in sorted(pathlib.Path(gateway.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "errors"):
                continue
            a = node.args
            if node.func.attr == "error" and len(a) >= 4 and all(isinstance(x, ast.Constant) for x in (a[0], a[2], a[3])):
                out.add((f"gateway/{path.name}", a[0].value, a[2].value, a[3].value, _text(a[1])))
            elif node.func.attr == "bad_request" and len(a) == 2 and isinstance(a[1], ast.Constant):
                out.add((f"gateway/{path.name}", 400, "invalid_request_error", a[1].value, _text(a[0])))
    return sorted(out, key=lambda r: (r[1], r[3], r[0]))


def page() -> str:
    intro = ("The gateway speaks OpenAI's HTTP API: a request's `model` names a deployment. Errors come in OpenAI's "
             "shape, `{\"error\": {\"message\", \"type\", \"param\", \"code\"}}`, with `Retry-After` where waiting "
             "helps. How requests are routed, queued and counted: [Serve and keys](../user-guide/serving.md).\n")
    parts = [head("HTTP API reference", "http", "the gateway's app and `gateway/errors.py`", intro)]
    parts.append("## Routes\n\n" + table(("path", "methods", "what"), [(code(p), m, w) for p, m, w in routes()]))
    parts.append("## The web console's routes\n\nServed by the same process under `/console/` "
                 "([The web console](../user-guide/console.md)).\n\n"
                 + table(("path", "methods", "page"), [(code(p), m, w) for p, m, w in console_routes()]))
    parts.append("## Errors\n\nFrom `gateway/errors.py` (`<name>` stands for what the message fills in):\n\n"
                 + table(("status", "type", "code", "Retry-After", "message"),
                                        [(s, code(t), code(c), r, w) for _, s, t, c, r, w in
                                         sorted(helper_errors(), key=lambda e: (e[1], e[3]))]))
    parts.append("Answered in place by the gateway's modules:\n\n"
                 + table(("status", "type", "code", "message", "where"),
                         [(s, code(t), code(c), m, code(w)) for w, s, t, c, m in inline_errors()]))
    parts.append("A request whose `Host` the gateway does not answer to is refused with **421** Misdirected Request, "
                 "naming the names it answers to (`gateway/host_check.py`; [Security](../operations/security.md)).\n")
    return "\n".join(parts)
