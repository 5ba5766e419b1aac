"""The serving path: one OpenAI-compatible endpoint in front of every RUNNING replica.
``gateway.app.build(engine, settings)`` gives the ASGI app; ``gateway.app.serve`` runs it.

Reads the store (``store/``: the routing table, keys, tenants' limits) and writes only its own
in-flight counts and usage there; wakes an autoscaler through the seam it is handed (``wake.py``:
``gpuflow gateway`` gives one that signals through Temporal). Imports ``scheduler``, ``contracts``
and ``store`` only; the web console (``console/``) is served beside it, never imported by it."""
