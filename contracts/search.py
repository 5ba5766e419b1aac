"""The search attributes gpuflow sets on its workflows (Temporal CLI, SDK and UI filter on them):
the workflows upsert them, and the control plane sets them when it starts an instance workflow."""

from temporalio.common import SearchAttributeKey

SA_MODEL = SearchAttributeKey.for_keyword("GpuflowModel")
SA_DEPLOYMENT = SearchAttributeKey.for_keyword("GpuflowDeployment")
SA_WORKER = SearchAttributeKey.for_keyword("GpuflowWorker")
SA_STATE = SearchAttributeKey.for_keyword("GpuflowState")
SEARCH_ATTRIBUTES = [SA_MODEL, SA_DEPLOYMENT, SA_WORKER, SA_STATE]
