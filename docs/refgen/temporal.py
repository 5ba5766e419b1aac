"""The Temporal contracts: each workflow type with its id, task queue and input, the signals,
updates and queries it answers (names and payload types from the SDK's own reading of the
classes), the activities of the control plane and of the agent, the search attributes, and the
fields of every payload model they name (``contracts/``, ``scheduler/``)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

from pydantic import BaseModel

from docs.refgen.md import code, first_line, head, table
from docs.refgen.models import comments, nested, type_name


def workflows() -> list[tuple[type, str, str]]:
    """(class, id, task queue) of every workflow type gpuflow runs."""
    from contracts import ids
    from contracts.host import CONTROL_QUEUE, host_queue
    from gpuflow.server import WORKFLOWS
    from worker_agent.log_reader import HostLogsWorkflow
    from workflows.queue_sweep import SWEEP_ID

    id_of = {"ModelDeploymentWorkflow": ids.deployment_id("<name>"), "ModelInstanceWorkflow": ids.instance_id("<name>"),
             "HostWorkflow": ids.host_id("<worker>"), "AutoscalerWorkflow": ids.autoscaler_id("<deployment>"),
             "ClusterWorkflow": ids.CLUSTER_ID, "ClusterReadsWorkflow": ids.CLUSTER_READS_ID, "QueueSweepWorkflow": SWEEP_ID,
             "HostLogsWorkflow": ids.host_logs_id("<worker>")}
    out = []
    for cls in [*WORKFLOWS, HostLogsWorkflow]:
        name = _definition(cls).name
        if name not in id_of:
            raise ValueError(f"workflow {name} has no id in docs/refgen/temporal.py: add it (contracts/ids.py)")
        queue = host_queue("<worker>") if cls is HostLogsWorkflow else CONTROL_QUEUE
        out.append((cls, id_of[name], queue))
    return out


def _definition(cls):
    from temporalio import workflow

    return workflow._Definition.must_from_class(cls)  # noqa: SLF001  the SDK's reading of the class


def _t(tp) -> str:
    if tp is None or tp is type(None):
        return "-"
    if inspect.isclass(tp) and issubclass(tp, BaseModel):
        return f"[`{tp.__name__}`](#{tp.__name__.lower()})"
    return code(type_name(tp))


def _args(types_) -> str:
    return ", ".join(_t(t) for t in types_ or []) or "-"


VALIDATED = re.compile(r"\bone(?:_input)?\(\s*args\s*,\s*([\w.]+)")


def payload(fn, declared) -> list:
    """A handler's argument types: as declared, or, for one taking ``*args`` that it validates
    itself (workflows/guards.py ``one_input``), the model it validates them as."""
    if declared:
        return list(declared)
    try:
        found = VALIDATED.search(inspect.getsource(fn))
    except (OSError, TypeError):
        found = None
    if found is None:
        return []
    obj = fn.__globals__
    head_, *rest = found.group(1).split(".")
    obj = obj[head_]
    for part in rest:
        obj = getattr(obj, part)
    return [obj]


def _what(cls) -> str:
    """The class's docstring, else its module's, to the first sentence."""
    text = first_line(cls.__doc__) or first_line(inspect.getmodule(cls).__doc__)
    return text.split(". ")[0].rstrip(".") + "." if text else "-"


def run_input(cls) -> list:
    d = _definition(cls)
    return payload(d.run_fn, d.arg_types) or payload(cls.__init__, None)


def handlers(cls) -> list[tuple[str, str, list, object, str]]:
    """(name, kind, argument types, answer type, what) of a workflow's signals, updates, queries."""
    d = _definition(cls)
    out = []
    for kind, found in (("signal", d.signals), ("update", d.updates), ("query", d.queries)):
        for name, h in sorted((n, h) for n, h in found.items() if n is not None):
            out.append((name, kind, payload(h.fn, h.arg_types), getattr(h, "ret_type", None),
                        first_line(inspect.getdoc(h.fn))))
    return out


def activities() -> list[tuple[str, str, str, str, str]]:
    """(process, name, input, result, where) of every activity defined in activities/ and worker_agent/."""
    import activities as control_pkg
    import worker_agent as agent_pkg

    out = []
    for proc, pkg in (("control plane", control_pkg), ("agent", agent_pkg)):
        for m in pkgutil.iter_modules(pkg.__path__):
            mod = importlib.import_module(f"{pkg.__name__}.{m.name}")
            for obj in [*vars(mod).values(), *(v for c in vars(mod).values() if inspect.isclass(c)
                                                  and c.__module__ == mod.__name__ for v in vars(c).values())]:
                d = getattr(obj, "__temporal_activity_definition", None)
                if d is not None and getattr(obj, "__module__", "") == mod.__name__:
                    out.append((proc, d.name, tuple(payload(obj, d.arg_types)), d.ret_type, f"{pkg.__name__}/{m.name}.py"))
    return sorted(set(out), key=lambda a: (a[0] != "control plane", a[1]))


def models(roots: list) -> list[type[BaseModel]]:
    """Every pydantic model reachable from ``roots`` through fields, in first-seen order."""
    seen: dict[type, None] = {}
    todo = [t for t in roots if inspect.isclass(t) and issubclass(t, BaseModel)]
    while todo:
        m = todo.pop(0)
        if m in seen:
            continue
        seen[m] = None
        for f in m.model_fields.values():
            todo += [sub for sub, _ in nested(f.annotation)]
    return list(seen)


def model_section(m: type[BaseModel]) -> str:
    said = comments(m)
    rows = [(code(n), code(type_name(f.annotation, f.metadata)), "required" if f.is_required() else code(repr(f.get_default(call_default_factory=True)))[:80],
             " ".join((f.description or said.get(n) or "").split())) for n, f in m.model_fields.items()]
    return (f"### {m.__name__}\n\n`{m.__module__}`. {first_line(m.__doc__) if m.__doc__ and 'Usage docs' not in m.__doc__ else ''}\n\n"
            + (table(("field", "type", "default", "meaning"), rows) if rows else "No fields.\n"))


def page() -> str:
    from contracts.search import SEARCH_ATTRIBUTES

    intro = ("What crosses Temporal, and the names a starter, a signaller or a reader must spell exactly as gpuflow "
             "does. Every payload is one JSON object, validated where it arrives, every field bounded "
             "(`scheduler/bounds.py`). How to start and drive a deployment from the Temporal CLI or SDK: "
             "[Temporal CLI and SDK](../user-guide/temporal.md).\n")
    parts = [head("Temporal contracts", "temporal", "the workflow and activity definitions and `contracts/`", intro)]
    wfs = workflows()
    parts.append("## Workflows\n\n" + table(("workflow type", "workflow id", "task queue", "input", "what"), [
        (code(_definition(c).name), code(i), code(q), _args(run_input(c)), _what(c)) for c, i, q in wfs]))
    roots: list = [t for c, _, _ in wfs for t in run_input(c)]
    for c, _, _ in wfs:
        rows = handlers(c)
        roots += [t for _, _, args, ret, _ in rows for t in (*args, ret)]
        if rows:
            parts.append(f"### {_definition(c).name}: messages\n\n" + table(
                ("name", "kind", "argument", "answer", "what"),
                [(code(n), k, _args(a), _t(r), w) for n, k, a, r, w in rows]))
    acts = activities()
    parts.append("## Activities\n\nThe control plane's run on `gpuflow-control`, the agent's on its host's queue "
                 "`gpuflow-host-<worker>`.\n\n" + table(("process", "activity", "input", "result", "module"),
                                                        [(p, code(n), _args(i), _t(r), code(w)) for p, n, i, r, w in acts]))
    roots += [t for _, _, i, r, _ in acts for t in (*i, r)]
    parts.append("## Search attributes\n\nRegistered by `gpuflow server` where the namespace lacks them; filter the UI "
                 "and `temporal workflow list --query` on them.\n\n"
                 + table(("attribute", "type"), [(code(a.name), a.indexed_value_type.name.lower())
                                                 for a in SEARCH_ATTRIBUTES]))
    parts.append("## Payload models\n\nThe fields of every model the workflows' inputs and messages and the "
                 "activities take or answer.\n")
    parts += [model_section(m) for m in models(roots)]
    return "\n".join(parts)
