"""Deterministic Temporal workflows: a model instance's life (``instance.py``), a deployment's
replicas and rollouts (``deployment.py``), a host's liveness (``host.py``), an autoscaler
(``autoscaler.py``) and the PENDING queue's sweep (``queue_sweep.py``).

No I/O here: activities do it, called by the names and with the payloads of ``contracts/``.
Imports only ``contracts``, ``scheduler``, ``temporalio.workflow`` and pydantic; never an HTTP
client, a database library or ``temporalio.client``, even indirectly (tests/test_layout.py)."""
