"""Every Temporal contract of gpuflow, in one package: what crosses Temporal between workflows,
activities and the host agent, and the names both sides must agree on.

- ``host.py``: the host task queue's side shared with the agent: ``HostReport``, ``HostInput``,
  the booking update; it re-exports ``timings.py`` (queue names, ``Timings``), ``host_kinds.py``
  and ``kv_connectors.py``, kept apart so the CLI reads them without the rest (issue 37);
- ``agent.py``: the agent's activities' inputs and results (launch, stop, fetch, watch);
- ``launch_parts.py``: how a placement across several hosts becomes one launch request per part;
- ``control.py``: the control plane's workflows' inputs, views and the placement/decision types
  (the deployment's input and view are ``deployment.py``'s, with its messages; re-exported);
- ``activity_names.py``: the names the control plane's activities are registered under;
- ``autoscale.py``, ``rollout.py``: the autoscaler's and the rollout probe's payloads;
- ``search.py``: the search attributes every workflow sets.

Plain pydantic models and constants: no I/O. Imports only ``scheduler``; imported by every other
package (workflows import only this and ``scheduler``)."""
