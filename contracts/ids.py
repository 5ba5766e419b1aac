"""Workflow ids, and the names of the messages each workflow answers: one home for what a
starter, a signaller or a reader must spell exactly as the workflow does.

A workflow id is ``<kind>/<name>``; the name has passed the name rule (scheduler/naming.py)
before any id is made from it, and each workflow checks its own id again
(workflows/guards.py ``workflow_id``)."""

from __future__ import annotations

# A deployment's workflow starts at this Temporal task queue priority (gpuflow/ops.py ``deploy``): its
# own tasks (its workflow's, and its activities': the limits, the tenant, its save, start_instances)
# go ahead of the replicas' on the control queue (1 first; 3, the default, the replicas keep).
# Without it, a deployment sent while another's replicas were being placed waited behind them for
# every step before its own replicas existed.
DEPLOYMENT_PRIORITY_KEY = 2


def deployment_id(name: str) -> str:
    return f"deployment/{name}"


def instance_id(name: str) -> str:
    return f"instance/{name}"


def host_id(name: str) -> str:
    return f"host/{name}"


def host_logs_id(name: str) -> str:
    return f"host-logs/{name}"


def autoscaler_id(deployment: str) -> str:
    return f"autoscaler/{deployment}"


# The workflow types a client starts or calls by name (gpuflow/ops.py calls them so: importing the
# workflow classes costs each CLI process about 90 ms of CPU, the policy and state machines with them)
DEPLOYMENT_WORKFLOW = "ModelDeploymentWorkflow"
INSTANCE_WORKFLOW = "ModelInstanceWorkflow"
HOST_WORKFLOW = "HostWorkflow"
CLUSTER_WORKFLOW = "ClusterWorkflow"
CLUSTER_READS_WORKFLOW = "ClusterReadsWorkflow"

# ModelInstanceWorkflow (instance/<name>)
INSTANCE_STOP = "stop"  # signal: stop the processes, release, end
INSTANCE_CAPACITY_CHANGED = "capacity_changed"  # signal: a PENDING replica decides again
INSTANCE_PREEMPT = "preempt"  # signal (PreemptNotice): a preemptor took its GPUs
INSTANCE_VICTIM_STOPPED = "victim_stopped"  # signal (VictimStopped; a bare name reads as one): a victim's processes stopped
INSTANCE_HOST_NEWS = "host_news"  # signal (HostNews): a host of its placement was lost or restarted
INSTANCE_STATUS = "status"  # query -> InstanceView

# ModelDeploymentWorkflow (deployment/<name>)
DEPLOYMENT_INSTANCE_ENDED = "instance_ended"  # signal (instance name): one of its replicas ended
DEPLOYMENT_STATUS = "status"  # query -> DeploymentView
DEPLOYMENT_ROLLOUT = "rollout"  # query: the rollout's state
DEPLOYMENT_SCALE = "scale"  # update (replicas) -> DeploymentView
DEPLOYMENT_ACCEPTED = "accepted"  # update -> DeploymentView: the start's input, once its checks passed
DEPLOYMENT_UPDATE_SPEC = "update_spec"  # update (the spec, as JSON) -> DeploymentView
DEPLOYMENT_ROLLOUT_UNDO = "rollout_undo"  # update -> DeploymentView: back to the version before
DEPLOYMENT_DELETE = "delete"  # update -> DeploymentView

# HostWorkflow (host/<name>)
HOST_STATUS = "status"  # query -> HostView
HOST_FORGET = "forget"  # update -> str
HOST_CORDON = "cordon"  # update (CordonAsk) -> str
HOST_UNCORDON = "uncordon"  # update -> str

# AutoscalerWorkflow (autoscaler/<deployment>)
AUTOSCALER_WAKE = "wake"  # signal: a request arrived for a deployment at zero
AUTOSCALER_VIEW = "autoscale"  # query -> AutoscaleView

# ClusterWorkflow (cluster): the cluster's configuration, changed only through its updates
# (workflows/cluster.py; payloads in contracts/cluster.py)
CLUSTER_ID = "cluster"
CLUSTER_APPLY_TENANTS = "apply_tenants"  # update (the tenants file) -> TenantsApplied
CLUSTER_CREATE_KEY = "create_key"  # update (KeyAdd: id, tenant, name, salt, hash; never the secret) -> KeyView
CLUSTER_REVOKE_KEY = "revoke_key"  # update (KeyRevoke: the key's id) -> KeyView
CLUSTER_KEY_LIMITS = "key_limits"  # update (KeyLimits: the key's id, limits to set or clear) -> KeyView
# ClusterReadsWorkflow (cluster-reads): the cluster's reads, as queries a control-plane worker answers
# from the store; none adds to any history (workflows/cluster_reads.py)
CLUSTER_READS_ID = "cluster-reads"
CLUSTER_KEYS = "keys"  # query (Page) -> KeysPage
CLUSTER_KEY_USAGE = "key_usage"  # query (Page) -> UsagePage: requests and tokens per key and tenant, 1 h and 24 h
CLUSTER_TENANTS = "tenants"  # query (Page) -> TenantsPage
CLUSTER_SETTINGS = "settings"  # query (SettingsAsk) -> SettingsView: the cluster's timings and limits
CLUSTER_CLAIMS = "claims"  # query (ClaimsAsk) -> ClaimsView: the learned memory claims (issue 42)
CLUSTER_QUEUE = "queue"  # query (Page) -> QueuePage
CLUSTER_SERVING = "serving"  # query (ServingAsk) -> ServingView: gateways, in flight, PENDING reasons
CLUSTER_BOOKINGS = "bookings"  # query (BookingsAsk) -> HostBookings: the orphan check's read of the ledger (agents)
CLUSTER_AUDIT = "audit"  # query (AuditAsk) -> AuditView: a kept decision replayed, or a deployment's decisions
