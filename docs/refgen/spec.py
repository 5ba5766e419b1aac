"""The files' field reference: the model spec, the tenants file and the cluster snapshot, from
their pydantic models (``scheduler/spec.py``, ``scheduler/tenancy/config.py``,
``scheduler/cluster.py``)."""

from __future__ import annotations

from docs.refgen.md import head, table
from docs.refgen.models import rows

HEADER = ("field", "type (bounds)", "default", "meaning")


def merged(rows):
    """Bounds beside the type: four columns read better than five."""
    return [(f, f"{t} ({b})" if b else t, d, m) for f, t, d, b, m in rows]


def files():
    """(title, anchor text, model, what it is)."""
    from scheduler.cluster import ClusterSnapshot
    from scheduler.spec import ModelSpec
    from scheduler.tenancy.config import TenantsFile

    return [
        ("Model spec", ModelSpec, "What `gpuflow deploy SPEC` reads, and the `spec` of a deployment workflow's "
         "input (`scheduler.spec.ModelSpec`)."),
        ("Tenants file", TenantsFile, "What `gpuflow tenants apply FILE` reads "
         "(`scheduler.tenancy.config.TenantsFile`)."),
        ("Cluster snapshot", ClusterSnapshot, "What `gpuflow schedule --cluster` reads, and what "
         "`gpuflow explain --snapshot` writes (`scheduler.cluster.ClusterSnapshot`). A host's inventory file "
         "(`gpuflow agent --inventory`) has a worker's fields without `name`."),
    ]


def page() -> str:
    intro = ("Every field of each file gpuflow reads, with its type, default, bounds and meaning. Files are "
             "YAML or JSON; unknown keys are errors; `bytes` take units (`24 GiB`, `512MiB`, `16GB`). "
             "[File formats](../formats.md) explains the rules with examples.\n")
    parts = [head("Spec, tenants and cluster files", "spec", "the pydantic models", intro)]
    for title, model, what in files():
        parts.append(f"## {title}\n\n{what}\n\n" + table(HEADER, merged(rows(model))))
    return "\n".join(parts)
