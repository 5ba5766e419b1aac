"""A group's roles as specs: each role's effective ModelSpec (the deployment's fields with the
role's overrides), what placing one member of that role decides with."""

from __future__ import annotations

from scheduler.groups.spec import RoleName, role_data, role_of
from scheduler.spec import ModelSpec


def role_spec(spec: ModelSpec, role: RoleName) -> ModelSpec:
    """The role's effective spec: the deployment's fields with the role's overrides, its replicas,
    and no group fields. KeyError when the deployment has no such role."""
    data = spec.model_dump(exclude_none=True)
    return ModelSpec.model_validate(role_data(data, role_of(spec.roles, role)))
