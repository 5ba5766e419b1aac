"""Deterministic Temporal workflows: a model instance's life (``instance.py``), a deployment's
replicas (``deployment.py``), a host's liveness (``host.py``). No I/O here; activities do it."""
