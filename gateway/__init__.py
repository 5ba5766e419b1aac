"""The serving path: one OpenAI-compatible endpoint in front of every RUNNING replica.
``gateway.app.build(engine, settings)`` gives the ASGI app; ``gateway.app.serve`` runs it.

Reads the store (``store/``: the routing table, keys, tenants' limits) and writes only its own
in-flight counts there; reaches Temporal only to wake an autoscaler (``wake.py``, through
``gpuflow.runtime``). Imports ``scheduler``, ``contracts``, ``store`` and ``gpuflow.runtime``."""
