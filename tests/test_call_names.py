"""The names gpuflow/ops.py starts and calls the workflows by (contracts/ids.py), and the types it
reads their answers as, are the workflows' own. The CLI does not import the workflow classes (issue
37: about 90 ms of CPU a process), so a rename on either side would fail only in a user's command
without this table."""

from __future__ import annotations

import pytest
from temporalio import workflow

from contracts import ids
from contracts.control import DeploymentView, HostView, InstanceView
from workflows.deployment import ModelDeploymentWorkflow
from workflows.host import HostWorkflow
from workflows.instance import ModelInstanceWorkflow


@pytest.mark.parametrize("cls, name", [
    (ModelDeploymentWorkflow, ids.DEPLOYMENT_WORKFLOW),
    (ModelInstanceWorkflow, ids.INSTANCE_WORKFLOW),
    (HostWorkflow, ids.HOST_WORKFLOW),
])
def test_the_workflow_types_are_named_as_the_client_starts_and_lists_them(cls, name):
    assert workflow._Definition.from_class(cls).name == name


def test_a_deployment_s_result_is_read_as_its_view():  # delete --wait returns it
    assert workflow._Definition.get_name_and_result_type(ModelDeploymentWorkflow.run) == (
        ids.DEPLOYMENT_WORKFLOW, DeploymentView)


@pytest.mark.parametrize("method, name, answer", [
    # (the workflow's handler, the name ops.py calls, the type it reads the answer as)
    (ModelDeploymentWorkflow.status, ids.DEPLOYMENT_STATUS, DeploymentView),
    (ModelInstanceWorkflow.status, ids.INSTANCE_STATUS, InstanceView),
    (HostWorkflow.status, ids.HOST_STATUS, HostView),
])
def test_the_queries_are_named_and_answered_as_the_client_reads_them(method, name, answer):
    d = workflow._QueryDefinition.from_fn(method)
    assert (d.name, d.ret_type) == (name, answer)


@pytest.mark.parametrize("method, name, answer", [
    (ModelDeploymentWorkflow.accepted, ids.DEPLOYMENT_ACCEPTED, DeploymentView),
    (ModelDeploymentWorkflow.update_spec, ids.DEPLOYMENT_UPDATE_SPEC, DeploymentView),
    (ModelDeploymentWorkflow.scale, ids.DEPLOYMENT_SCALE, DeploymentView),
    (ModelDeploymentWorkflow.rollout_undo, ids.DEPLOYMENT_ROLLOUT_UNDO, DeploymentView),
    (ModelDeploymentWorkflow.delete, ids.DEPLOYMENT_DELETE, DeploymentView),
    (HostWorkflow.forget, ids.HOST_FORGET, str),
    (HostWorkflow.cordon, ids.HOST_CORDON, str),
    (HostWorkflow.uncordon, ids.HOST_UNCORDON, str),
])
def test_the_updates_are_named_and_answered_as_the_client_reads_them(method, name, answer):
    assert workflow._UpdateDefinition.get_name_and_result_type(method) == (name, answer)
